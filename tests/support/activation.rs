//! Listening sockets handed to Sluice as systemd's socket activation hands them: as
//! descriptors 3, 4 ..., with `LISTEN_FDS` and `LISTEN_PID`.

use std::os::fd::RawFd;
use std::process::Command;

/// `bin`, or with `passed` sockets a `sh` that sets systemd's variables and execs it
/// (the arguments that follow are `bin`'s).
pub fn command(bin: &str, passed: &[RawFd]) -> Command {
    if passed.is_empty() {
        return Command::new(bin);
    }
    let mut cmd = Command::new("/bin/sh");
    let n = passed.len();
    cmd.arg("-c")
        .arg(format!("LISTEN_PID=$$ LISTEN_FDS={n} exec \"$0\" \"$@\""))
        .arg(bin);
    let mut fds = [0; 8];
    fds[..n].copy_from_slice(passed);
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes only async-signal-safe
    // calls (fcntl, dup2) on descriptors the test keeps open, and allocates
    // nothing. The copies above 100 close at exec; 3.. stay open across it.
    unsafe {
        cmd.pre_exec(move || {
            let mut high = [0; 8];
            for i in 0..n {
                high[i] = libc::fcntl(fds[i], libc::F_DUPFD_CLOEXEC, 100);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in high.iter().enumerate().take(n) {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}
