//! Process-level operations: daemonizing, switching user, the pid file.

use std::ffi::CString;
use std::io;
use std::path::Path;

/// Forks into the background: the parent exits, the child gets a new session and
/// /dev/null for stdio. Must be called before any thread is started.
pub fn daemonize() -> io::Result<()> {
    // SAFETY: called from main before the tokio runtime or any other thread exists,
    // so the child inherits a consistent single-threaded process.
    match unsafe { libc::fork() } {
        -1 => return Err(io::Error::last_os_error()),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: setsid has no memory-safety preconditions.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    use std::os::unix::io::AsRawFd;
    for fd in 0..=2 {
        // SAFETY: both descriptors are valid: `null` is open and 0..=2 are the standard
        // descriptors, which dup2 atomically replaces.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The name of OS user `uid` (for `peer` authentication); None if it has none.
/// Reentrant (`getpwuid_r`): it runs while other threads serve clients.
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        // SAFETY: a zeroed passwd is a valid value of this plain C struct (integers and
        // null pointers); getpwuid_r only writes to it, to `buf` (whose length it is
        // given) and to `found`.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: see above; all four pointers are valid for the call.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        // SAFETY: on success pw_name points to a NUL-terminated string inside `buf`,
        // which outlives this borrow; it is copied out before `buf` is dropped.
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        return name.to_str().ok().map(str::to_owned);
    }
}

/// Switches the process to `user` (its uid and primary gid).
pub fn switch_user(user: &str) -> io::Result<()> {
    let name = CString::new(user)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad user name"))?;
    // SAFETY: `name` is a valid NUL-terminated string; getpwnam returns NULL or a
    // pointer to static storage that we read at once, before any other getpw* call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("unknown user: {user}"),
        ));
    }
    // SAFETY: `pw` is non-null and points to a valid passwd record (see above).
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    // SAFETY: plain syscalls with integer arguments; groups first while still root.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 && libc::geteuid() == 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Writes our pid to `path`, refusing if a live process already owns it.
pub fn write_pidfile(path: &Path) -> io::Result<()> {
    if let Ok(old) = std::fs::read_to_string(path) {
        if let Ok(pid) = old.trim().parse::<i32>() {
            // SAFETY: kill with signal 0 only checks for existence.
            if pid > 0 && unsafe { libc::kill(pid, 0) } == 0 && pid as u32 != std::process::id() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "pidfile {} exists and process {pid} is running",
                        path.display()
                    ),
                ));
            }
        }
    }
    std::fs::write(path, format!("{}\n", std::process::id()))
}

/// Puts every thread's allocations in one glibc malloc arena, unless the user chose a
/// number (`MALLOC_ARENA_MAX`, or `arena_max` in `GLIBC_TUNABLES`). By default glibc
/// gives threads that meet at the allocator arenas of their own, up to 8 per core:
/// clients logged in across 16 workers left their memory in 16 heaps, each keeping the
/// free holes of its share of a login burst, and an idle client cost 1.84 KB against
/// 1.16 KB with one arena (10,000 clients, 16 cores; docs/performance.md). The relay
/// allocates next to nothing per request, and what it does comes from glibc's
/// per-thread cache, so the shared arena's lock did not show in tps or CPU there.
/// Must be called before any thread is started.
pub fn share_malloc_arena() {
    if !wants_one_arena(
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
        std::env::var("GLIBC_TUNABLES").ok().as_deref(),
    ) {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads
    // exist, it races with no allocation. A refusal (return 0) leaves the default.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn wants_one_arena(arena_env: bool, tunables: Option<&str>) -> bool {
    !arena_env && !tunables.is_some_and(|t| t.contains("malloc.arena_max"))
}

#[cfg(test)]
mod tests {
    use super::wants_one_arena;

    #[test]
    fn one_arena_unless_the_user_set_a_number() {
        assert!(wants_one_arena(false, None));
        assert!(wants_one_arena(false, Some("glibc.malloc.tcache_count=0")));
        assert!(!wants_one_arena(true, None));
        assert!(!wants_one_arena(
            false,
            Some("glibc.malloc.arena_max=4:glibc.malloc.tcache_count=0")
        ));
    }
}
