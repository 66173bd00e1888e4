//! `ldap` logins (`auth_type = ldap`, or an `ldap` rule of `auth_hba_file`): the
//! client's cleartext password is checked by binding to an LDAP server as the user,
//! as PostgreSQL and PgBouncer 1.25 do, with OpenLDAP's libldap (opened at run time,
//! `auth/dl.rs`). The options are `auth/ldap_options.rs`'s.
//!
//! libldap's calls block, so a check runs on a blocking thread, one at a time
//! (PgBouncer has one LDAP thread); waiting logins wait as futures. Each check opens
//! its own connections: a 3 s connect timeout (PgBouncer's) and, unlike PgBouncer, a
//! 10 s limit on each operation, so a server that accepts and never answers cannot
//! hold every later LDAP login.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::sync::OnceLock;

use super::dl::Library;
use super::LdapOptions;

const LDAP_SUCCESS: c_int = 0;
const LDAP_OPT_PROTOCOL_VERSION: c_int = 0x0011;
const LDAP_OPT_TIMEOUT: c_int = 0x5002;
const LDAP_OPT_NETWORK_TIMEOUT: c_int = 0x5005;
const LDAP_VERSION3: c_int = 3;

/// `struct berval`.
#[repr(C)]
struct BerVal {
    bv_len: c_ulong,
    bv_val: *mut c_char,
}

type Ld = *mut c_void;
type Msg = *mut c_void;
type InitializeFn = unsafe extern "C" fn(*mut Ld, *const c_char) -> c_int;
type SetOptionFn = unsafe extern "C" fn(Ld, c_int, *const c_void) -> c_int;
type StartTlsFn = unsafe extern "C" fn(Ld, *mut c_void, *mut c_void) -> c_int;
type SaslBindFn = unsafe extern "C" fn(
    Ld,
    *const c_char,
    *const c_char,
    *const BerVal,
    *mut c_void,
    *mut c_void,
    *mut *mut BerVal,
) -> c_int;
type SearchFn = unsafe extern "C" fn(
    Ld,
    *const c_char,
    c_int,
    *const c_char,
    *const *const c_char,
    c_int,
    *mut c_void,
    *mut c_void,
    *mut libc::timeval,
    c_int,
    *mut Msg,
) -> c_int;
type CountFn = unsafe extern "C" fn(Ld, Msg) -> c_int;
type FirstFn = unsafe extern "C" fn(Ld, Msg) -> Msg;
type GetDnFn = unsafe extern "C" fn(Ld, Msg) -> *mut c_char;
type MemFreeFn = unsafe extern "C" fn(*mut c_void);
type MsgFreeFn = unsafe extern "C" fn(Msg) -> c_int;
type UnbindFn = unsafe extern "C" fn(Ld, *mut c_void, *mut c_void) -> c_int;
type Err2StringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type Dn2DomainFn = unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> c_int;
type Domain2HostsFn = unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> c_int;

/// libldap's entry points.
struct Lib {
    initialize: InitializeFn,
    set_option: SetOptionFn,
    start_tls: StartTlsFn,
    bind: SaslBindFn,
    search: SearchFn,
    count: CountFn,
    first: FirstFn,
    get_dn: GetDnFn,
    memfree: MemFreeFn,
    msgfree: MsgFreeFn,
    unbind: UnbindFn,
    err2string: Err2StringFn,
    dn2domain: Option<Dn2DomainFn>,
    domain2hosts: Option<Domain2HostsFn>,
    serial: tokio::sync::Semaphore,
}

fn lib() -> Result<&'static Lib, &'static str> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(String::as_str)
}

fn open() -> Result<Lib, String> {
    // OpenLDAP 2.6 (Debian 13), 2.5 (Debian 12), 2.4.
    let l = Library::open(&[
        c"libldap.so.2",
        c"libldap-2.5.so.0",
        c"libldap_r-2.4.so.2",
        c"libldap-2.4.so.2",
    ])?;
    // SAFETY (each call): the type is that of libldap's function of that name, its
    // C prototype in ldap.h (OpenLDAP 2.4 to 2.6).
    unsafe {
        Ok(Lib {
            initialize: l.function(c"ldap_initialize")?,
            set_option: l.function(c"ldap_set_option")?,
            start_tls: l.function(c"ldap_start_tls_s")?,
            bind: l.function(c"ldap_sasl_bind_s")?,
            search: l.function(c"ldap_search_ext_s")?,
            count: l.function(c"ldap_count_entries")?,
            first: l.function(c"ldap_first_entry")?,
            get_dn: l.function(c"ldap_get_dn")?,
            memfree: l.function(c"ldap_memfree")?,
            msgfree: l.function(c"ldap_msgfree")?,
            unbind: l.function(c"ldap_unbind_ext_s")?,
            err2string: l.function(c"ldap_err2string")?,
            dn2domain: l.function(c"ldap_dn2domain").ok(),
            domain2hosts: l.function(c"ldap_domain2hostlist").ok(),
            serial: tokio::sync::Semaphore::new(1),
        })
    }
}

/// Whether libldap can be used here: why not, if not.
pub fn available() -> Result<(), &'static str> {
    lib().map(|_| ())
}

/// Checks `user`'s `password` against the LDAP server `opts` names, on a blocking
/// thread. `Err` says why it failed, for the log; the client is told only that
/// authentication failed.
pub async fn check(opts: &LdapOptions, user: &str, password: &str) -> Result<(), String> {
    // An empty password would be an unauthenticated bind, which servers accept.
    if password.is_empty() {
        return Err("empty password".into());
    }
    let (Ok(c_user), Ok(c_password)) = (CString::new(user), CString::new(password)) else {
        return Err("a user name or password with a NUL byte".into());
    };
    let lib = lib()?;
    let one = lib
        .serial
        .acquire()
        .await
        .map_err(|_| "LDAP checks are closed".to_string())?;
    let opts = opts.clone();
    let user = user.to_owned();
    tokio::task::spawn_blocking(move || {
        let _one = one;
        run(lib, &opts, &user, &c_user, &c_password)
    })
    .await
    .map_err(|e| format!("LDAP check did not finish: {e}"))?
}

/// A connection, unbound (and freed) when dropped.
struct Conn<'a> {
    lib: &'a Lib,
    ld: Ld,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // SAFETY: `ld` came from ldap_initialize and is released once, here.
        unsafe { (self.lib.unbind)(self.ld, std::ptr::null_mut(), std::ptr::null_mut()) };
    }
}

fn run(
    lib: &Lib,
    o: &LdapOptions,
    user: &str,
    c_user: &CStr,
    password: &CStr,
) -> Result<(), String> {
    let server = o.server.as_deref().unwrap_or("");
    let dn = match &o.basedn {
        Some(basedn) => {
            // Characters a filter would need escaped have no place in a user name;
            // refusing them keeps a name from widening the search.
            if user.contains(['*', '(', ')', '\\', '/']) {
                return Err("invalid character in user name for LDAP authentication".into());
            }
            let conn = connect(lib, o)?;
            let binddn = o.binddn.as_deref().unwrap_or("");
            let bindpw = o.bindpasswd.as_deref().unwrap_or("");
            bind(&conn, binddn, bindpw).map_err(|e| {
                format!(
                    "could not perform initial LDAP bind for ldapbinddn \"{binddn}\" on server \"{server}\": {e}"
                )
            })?;
            let filter = o.filter(user);
            search(&conn, o, basedn, &filter).map_err(|e| {
                format!("LDAP search for filter \"{filter}\" on server \"{server}\": {e}")
            })?
        }
        None => format!(
            "{}{}{}",
            o.prefix.as_deref().unwrap_or(""),
            c_user.to_string_lossy(),
            o.suffix.as_deref().unwrap_or("")
        ),
    };
    let conn = connect(lib, o)?;
    let pw = password
        .to_str()
        .map_err(|_| "password is not UTF-8".to_string())?;
    bind(&conn, &dn, pw)
        .map_err(|e| format!("LDAP login failed for user \"{dn}\" on server \"{server}\": {e}"))
}

/// Opens a connection to the configured servers (or those DNS SRV names for the
/// base DN's domain), protocol 3, with StartTLS when `ldaptls=1`.
fn connect<'a>(lib: &'a Lib, o: &LdapOptions) -> Result<Conn<'a>, String> {
    let uris = match o.uris() {
        Some(u) => u,
        None => srv_uris(lib, o)?,
    };
    let c_uris = CString::new(uris).map_err(|_| "LDAP server with a NUL byte".to_string())?;
    let mut ld: Ld = std::ptr::null_mut();
    // SAFETY: `ld` receives a handle; the URI string is NUL-terminated.
    let r = unsafe { (lib.initialize)(&mut ld, c_uris.as_ptr()) };
    if r != LDAP_SUCCESS || ld.is_null() {
        return Err(format!("could not initialize LDAP: {}", err(lib, r)));
    }
    let conn = Conn { lib, ld };
    let version = LDAP_VERSION3;
    let connect_limit = libc::timeval {
        tv_sec: 3,
        tv_usec: 0,
    };
    let op_limit = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    for (opt, value, what) in [
        (
            LDAP_OPT_PROTOCOL_VERSION,
            &version as *const c_int as *const c_void,
            "protocol version",
        ),
        (
            LDAP_OPT_NETWORK_TIMEOUT,
            &connect_limit as *const libc::timeval as *const c_void,
            "timeout",
        ),
        (
            LDAP_OPT_TIMEOUT,
            &op_limit as *const libc::timeval as *const c_void,
            "timeout",
        ),
    ] {
        // SAFETY: live handle; each value points at the type the option takes (an
        // int, a struct timeval), copied by libldap.
        let r = unsafe { (lib.set_option)(conn.ld, opt, value) };
        if r != LDAP_SUCCESS {
            return Err(format!("could not set LDAP {what}: {}", err(lib, r)));
        }
    }
    if o.tls {
        // SAFETY: live handle; no controls.
        let r = unsafe { (lib.start_tls)(conn.ld, std::ptr::null_mut(), std::ptr::null_mut()) };
        if r != LDAP_SUCCESS {
            return Err(format!(
                "could not start LDAP TLS session: {}, server: {}, port: {}",
                err(lib, r),
                o.server.as_deref().unwrap_or(""),
                o.port()
            ));
        }
    }
    Ok(conn)
}

/// URIs for the LDAP servers of the base DN's domain, from DNS SRV records.
fn srv_uris(lib: &Lib, o: &LdapOptions) -> Result<String, String> {
    let (Some(dn2domain), Some(domain2hosts)) = (lib.dn2domain, lib.domain2hosts) else {
        return Err("LDAP server not specified, and this libldap cannot look one up".into());
    };
    let basedn = o.basedn.as_deref().unwrap_or("");
    let c_dn = CString::new(basedn).map_err(|_| "ldapbasedn with a NUL byte".to_string())?;
    let mut domain: *mut c_char = std::ptr::null_mut();
    // SAFETY: NUL-terminated input; `domain` receives a string libldap allocated.
    if unsafe { dn2domain(c_dn.as_ptr(), &mut domain) } != 0 || domain.is_null() {
        return Err("could not extract domain name from ldapbasedn".into());
    }
    // SAFETY: non-NULL, NUL-terminated; copied before it is freed.
    let name = unsafe { CStr::from_ptr(domain) }
        .to_string_lossy()
        .into_owned();
    let mut hosts: *mut c_char = std::ptr::null_mut();
    // SAFETY: `domain` is live; `hosts` receives a string libldap allocated.
    let r = unsafe { domain2hosts(domain, &mut hosts) };
    // SAFETY: allocated by libldap, freed once.
    unsafe { (lib.memfree)(domain as *mut c_void) };
    if r != 0 || hosts.is_null() {
        return Err(format!(
            "LDAP authentication could not find DNS SRV records for \"{name}\""
        ));
    }
    // SAFETY: non-NULL, NUL-terminated; copied before it is freed.
    let list = unsafe { CStr::from_ptr(hosts) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated by libldap, freed once.
    unsafe { (lib.memfree)(hosts as *mut c_void) };
    let uris: Vec<String> = list
        .split(' ')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{}://{h}", o.scheme))
        .collect();
    Ok(uris.join(" "))
}

/// A simple bind as `dn` with `password`.
fn bind(c: &Conn<'_>, dn: &str, password: &str) -> Result<(), String> {
    let c_dn = CString::new(dn).map_err(|_| "DN with a NUL byte".to_string())?;
    let cred = BerVal {
        bv_len: password.len() as c_ulong,
        bv_val: password.as_ptr() as *mut c_char,
    };
    // SAFETY: live handle; the DN is NUL-terminated; the credentials point at
    // `password`'s bytes, only read, for the call's duration; a NULL mechanism is
    // LDAP_SASL_SIMPLE; no controls, no server credentials wanted.
    let r = unsafe {
        (c.lib.bind)(
            c.ld,
            c_dn.as_ptr(),
            std::ptr::null(),
            &cred,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if r == LDAP_SUCCESS {
        Ok(())
    } else {
        Err(err(c.lib, r))
    }
}

/// The DN of the one entry under `basedn` that `filter` finds.
fn search(c: &Conn<'_>, o: &LdapOptions, basedn: &str, filter: &str) -> Result<String, String> {
    let lib = c.lib;
    let nul = |_| "a NUL byte in the search".to_string();
    let (c_base, c_filter) = (
        CString::new(basedn).map_err(nul)?,
        CString::new(filter).map_err(nul)?,
    );
    // Without a filter, ask for the attribute matched; with one, for no attribute
    // ("1.1"): only the DN is wanted.
    let attr = CString::new(if o.searchfilter.is_some() {
        "1.1"
    } else {
        o.attribute()
    })
    .map_err(nul)?;
    let attrs = [attr.as_ptr(), std::ptr::null()];
    let mut res: Msg = std::ptr::null_mut();
    // SAFETY: live handle; NUL-terminated strings and a NULL-terminated attribute
    // list that outlive the call; `res` receives a result chain freed below.
    let r = unsafe {
        (lib.search)(
            c.ld,
            c_base.as_ptr(),
            o.scope as c_int,
            c_filter.as_ptr(),
            attrs.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            &mut res,
        )
    };
    let found = (|| {
        if r != LDAP_SUCCESS {
            return Err(err(lib, r));
        }
        // SAFETY: live handle and a result chain from the search.
        let n = unsafe { (lib.count)(c.ld, res) };
        match n {
            1 => {}
            0 => return Err("returned no entries (no such user)".into()),
            n => return Err(format!("returned {n} entries (user not unique)")),
        }
        // SAFETY: as above; the entry belongs to the chain.
        let entry = unsafe { (lib.first)(c.ld, res) };
        // SAFETY: a live entry; the DN is allocated by libldap.
        let dn = if entry.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { (lib.get_dn)(c.ld, entry) }
        };
        if dn.is_null() {
            return Err("could not get the DN of the entry found".into());
        }
        // SAFETY: non-NULL, NUL-terminated; copied before it is freed once.
        let s = unsafe { CStr::from_ptr(dn) }.to_string_lossy().into_owned();
        // SAFETY: allocated by ldap_get_dn.
        unsafe { (lib.memfree)(dn as *mut c_void) };
        Ok(s)
    })();
    if !res.is_null() {
        // SAFETY: the search's result chain, freed once (also after an error,
        // which may come with one).
        unsafe { (lib.msgfree)(res) };
    }
    found
}

/// libldap's text for `rc`.
fn err(lib: &Lib, rc: c_int) -> String {
    // SAFETY: returns a static string (or NULL) for any code.
    let p = unsafe { (lib.err2string)(rc) };
    if p.is_null() {
        return format!("LDAP error {rc}");
    }
    // SAFETY: non-NULL, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
