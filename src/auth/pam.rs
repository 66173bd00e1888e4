//! `auth_type = pam`: a client's cleartext password is checked by PAM, service
//! `pgbouncer`, as PgBouncer does: `pam_authenticate`, then `pam_acct_mgmt` (expiry,
//! access hours), both `PAM_SILENT`, with `PAM_RHOST` set to the client's address.
//!
//! libpam is opened at run time (`dlopen` of `libpam.so.0`), the first time a login
//! needs it, so Sluice builds without PAM's headers and runs where no PAM is
//! installed as long as nobody asks for it. PAM modules block (a directory lookup, a
//! slow `/etc/shadow` hash), so a check runs on a blocking thread, and checks run one
//! at a time (PgBouncer has one PAM thread): not every module is thread-safe.
//!
//! `SLUICE_PAM_CONFDIR`, when set, is the directory the service's file is read from
//! (`pam_start_confdir`, Linux-PAM 1.4 on) instead of `/etc/pam.d`: for tests, which
//! must not write system files.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The PAM service name, PgBouncer's.
const SERVICE: &CStr = c"pgbouncer";

const PAM_SUCCESS: c_int = 0;
const PAM_BUF_ERR: c_int = 5;
const PAM_CONV_ERR: c_int = 19;
const PAM_RHOST: c_int = 4;
const PAM_SILENT: c_int = 0x8000;
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_PROMPT_ECHO_ON: c_int = 2;
const PAM_ERROR_MSG: c_int = 3;

/// `struct pam_message` (`security/pam_appl.h`).
#[repr(C)]
struct Message {
    msg_style: c_int,
    msg: *const c_char,
}

/// `struct pam_response`: the module frees `resp` and the array with `free`.
#[repr(C)]
struct Response {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn =
    unsafe extern "C" fn(c_int, *mut *const Message, *mut *mut Response, *mut c_void) -> c_int;

/// `struct pam_conv`.
#[repr(C)]
struct Conv {
    conv: Option<ConvFn>,
    appdata_ptr: *mut c_void,
}

type StartFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const Conv, *mut *mut c_void) -> c_int;
type StartConfdirFn = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const Conv,
    *const c_char,
    *mut *mut c_void,
) -> c_int;
type HandleFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type SetItemFn = unsafe extern "C" fn(*mut c_void, c_int, *const c_void) -> c_int;
type StrerrorFn = unsafe extern "C" fn(*mut c_void, c_int) -> *const c_char;

/// libpam's entry points, looked up once.
struct Lib {
    start: StartFn,
    start_confdir: Option<StartConfdirFn>,
    end: HandleFn,
    authenticate: HandleFn,
    acct_mgmt: HandleFn,
    set_item: SetItemFn,
    strerror: StrerrorFn,
    /// One check at a time. A waiting login waits here as a future, not as a
    /// blocking thread; the permit goes with the check onto its thread, so a login
    /// that gives up (`client_login_timeout`) does not let a second check start
    /// beside one still running.
    serial: tokio::sync::Semaphore,
}

/// The library, opened on first use; the error says why it could not be.
fn lib() -> Result<&'static Lib, &'static str> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(String::as_str)
}

fn open() -> Result<Lib, String> {
    let lib = super::dl::Library::open(&[c"libpam.so.0"])?;
    // SAFETY (each call): the type is that of libpam's function of that name, its C
    // prototype in security/pam_appl.h (Linux-PAM).
    unsafe {
        Ok(Lib {
            start: lib.function(c"pam_start")?,
            start_confdir: lib.function(c"pam_start_confdir").ok(),
            end: lib.function(c"pam_end")?,
            authenticate: lib.function(c"pam_authenticate")?,
            acct_mgmt: lib.function(c"pam_acct_mgmt")?,
            set_item: lib.function(c"pam_set_item")?,
            strerror: lib.function(c"pam_strerror")?,
            serial: tokio::sync::Semaphore::new(1),
        })
    }
}

/// What the conversation answers with.
struct Ask {
    password: CString,
    user: CString,
}

/// The conversation: the password for a hidden prompt, the user name for a visible
/// one; PAM's error messages are logged.
///
/// # Safety
/// Called by libpam only, during `check`'s `pam_authenticate` or `pam_acct_mgmt`,
/// with `data` the `Ask` that `check` passed to `pam_start` (alive until `pam_end`),
/// `msgs` an array of `n` message pointers and `out` where the responses go.
unsafe extern "C" fn converse(
    n: c_int,
    msgs: *mut *const Message,
    out: *mut *mut Response,
    data: *mut c_void,
) -> c_int {
    let Ok(count) = usize::try_from(n) else {
        return PAM_CONV_ERR;
    };
    if count == 0 || msgs.is_null() || out.is_null() || data.is_null() {
        return PAM_CONV_ERR;
    }
    // SAFETY: see the function's contract: `data` points at a live `Ask`.
    let ask = unsafe { &*(data as *const Ask) };
    // Zeroed: every `resp` starts NULL (no answer), as PAM expects for messages
    // that need none. The caller frees the array with `free`, so it comes from malloc.
    // SAFETY: calloc with a non-zero count; the result is checked for NULL.
    let rs = unsafe { libc::calloc(count, std::mem::size_of::<Response>()) } as *mut Response;
    if rs.is_null() {
        return PAM_BUF_ERR;
    }
    for i in 0..count {
        // SAFETY: `msgs` has `count` entries (the contract); each is NULL or points
        // at a message PAM keeps alive for this call (Linux-PAM's array of pointers).
        let m = unsafe { *msgs.add(i) };
        if m.is_null() {
            continue;
        }
        // SAFETY: non-NULL, as checked.
        let (style, text) = unsafe { ((*m).msg_style, (*m).msg) };
        let answer = match style {
            PAM_PROMPT_ECHO_OFF => Some(&ask.password),
            PAM_PROMPT_ECHO_ON => Some(&ask.user),
            PAM_ERROR_MSG if !text.is_null() => {
                // SAFETY: PAM's message text is NUL-terminated.
                let t = unsafe { CStr::from_ptr(text) };
                tracing::warn!("PAM error: {}", t.to_string_lossy());
                None
            }
            _ => None,
        };
        if let Some(a) = answer {
            // SAFETY: `a` is NUL-terminated; strdup allocates with malloc, which is
            // what the module frees it with.
            let copy = unsafe { libc::strdup(a.as_ptr()) };
            if copy.is_null() {
                for j in 0..i {
                    // SAFETY: entries before `i` are NULL or strdup's.
                    unsafe { libc::free((*rs.add(j)).resp as *mut c_void) };
                }
                // SAFETY: from calloc above, not handed out.
                unsafe { libc::free(rs as *mut c_void) };
                return PAM_BUF_ERR;
            }
            // SAFETY: `i < count`, within the array.
            unsafe { (*rs.add(i)).resp = copy };
        }
    }
    // SAFETY: `out` is non-NULL (checked); PAM takes the array.
    unsafe { *out = rs };
    PAM_SUCCESS
}

/// Checks `user`'s `password` with PAM, on a blocking thread. `rhost` is the
/// client's address (none for a UNIX-socket client). `Err` says why it failed, for
/// the log; the client is told only that authentication failed.
pub async fn check(user: &str, password: &str, rhost: Option<String>) -> Result<(), String> {
    let (Ok(user), Ok(password)) = (CString::new(user), CString::new(password)) else {
        return Err("a user name or password with a NUL byte".into());
    };
    let rhost = rhost.and_then(|h| CString::new(h).ok());
    let confdir = std::env::var_os("SLUICE_PAM_CONFDIR")
        .and_then(|d| CString::new(d.into_encoded_bytes()).ok());
    let lib = lib()?;
    let one = lib
        .serial
        .acquire()
        .await
        .map_err(|_| "PAM checks are closed".to_string())?;
    tokio::task::spawn_blocking(move || {
        let _one = one;
        let ask = Ask { password, user };
        run(lib, &ask, rhost.as_deref(), confdir.as_deref())
    })
    .await
    .map_err(|e| format!("PAM check did not finish: {e}"))?
}

/// One PAM transaction: start, set the remote host, authenticate, check the account,
/// end.
fn run(lib: &Lib, ask: &Ask, rhost: Option<&CStr>, confdir: Option<&CStr>) -> Result<(), String> {
    let conv = Conv {
        conv: Some(converse),
        appdata_ptr: ask as *const Ask as *mut c_void,
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and, with `conv` and `ask`, outlive the
    // PAM handle (ended below on every path). `h` receives the handle.
    let rc = unsafe {
        match (confdir, lib.start_confdir) {
            (Some(dir), Some(start)) => start(
                SERVICE.as_ptr(),
                ask.user.as_ptr(),
                &conv,
                dir.as_ptr(),
                &mut h,
            ),
            (Some(_), None) => return Err("SLUICE_PAM_CONFDIR needs Linux-PAM 1.4 or later".into()),
            (None, _) => (lib.start)(SERVICE.as_ptr(), ask.user.as_ptr(), &conv, &mut h),
        }
    };
    if rc != PAM_SUCCESS || h.is_null() {
        return Err(format!(
            "pam_start() failed: {}",
            strerror(lib, std::ptr::null_mut(), rc)
        ));
    }
    let mut last = PAM_SUCCESS;
    let mut step = |what: &str, rc: c_int| -> Result<(), String> {
        last = rc;
        if rc == PAM_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}() failed: {}", strerror(lib, h, rc)))
        }
    };
    let mut outcome = Ok(());
    if let Some(r) = rhost {
        // SAFETY: `h` is live; PAM copies the string.
        let rc = unsafe { (lib.set_item)(h, PAM_RHOST, r.as_ptr() as *const c_void) };
        outcome = step("pam_set_item", rc);
    }
    if outcome.is_ok() {
        // SAFETY: `h` is live; the conversation's data (`ask`) outlives it.
        outcome = step("pam_authenticate", unsafe {
            (lib.authenticate)(h, PAM_SILENT)
        });
    }
    if outcome.is_ok() {
        // SAFETY: as above.
        outcome = step("pam_acct_mgmt", unsafe { (lib.acct_mgmt)(h, PAM_SILENT) });
    }
    // SAFETY: `h` came from pam_start and is ended once, with the last status.
    unsafe { (lib.end)(h, last) };
    outcome
}

/// PAM's text for `rc`.
fn strerror(lib: &Lib, h: *mut c_void, rc: c_int) -> String {
    // SAFETY: pam_strerror takes a handle or NULL and returns a static string or NULL.
    let p = unsafe { (lib.strerror)(h, rc) };
    if p.is_null() {
        return format!("error {rc}");
    }
    // SAFETY: non-NULL and NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Whether libpam can be used here: the reason it cannot, if not.
pub fn available() -> Result<(), &'static str> {
    lib().map(|_| ())
}
