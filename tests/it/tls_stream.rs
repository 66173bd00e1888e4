//! The TLS session kept in the connection's own stream (`net/tls.rs`): what it holds
//! must follow the connection wherever it goes, including into the idle-client
//! keeper and back.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use crate::admin::psql_ok;
use crate::support::{wait_until, Sluice};
use crate::tls::{psql_require, Certs};

fn asleep(s: &Sluice) -> u64 {
    psql_ok(s, "SHOW MEM")
        .cell("name", "asleep_client_cache", "used")
        .and_then(|v| v.parse().ok())
        .expect("SHOW MEM lists asleep_client_cache")
}

/// A psql over TLS fed its queries one at a time on stdin, its answers read line by
/// line (`-At`: one line per row).
struct Feeder {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Feeder {
    fn start(s: &Sluice) -> Feeder {
        let mut cmd = psql_require(s);
        cmd.args(["-At", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("psql");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Feeder { child, out }
    }

    /// Sends `sql` and returns the one line it answers, within 30 s.
    fn ask(&mut self, sql: &str) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{sql};").expect("write to psql");
        stdin.flush().expect("flush");
        let (tx, rx) = std::sync::mpsc::channel();
        let mut line = String::new();
        std::thread::scope(|scope| {
            let out = &mut self.out;
            scope.spawn(move || {
                let _ = tx.send(out.read_line(&mut line).map(|_| line));
            });
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(r) => r.expect("psql output").trim().to_owned(),
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("psql did not answer {sql}");
                }
            }
        })
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_tls_client_sleeps_and_wakes_with_its_session() {
    let certs = Certs::new();
    // Transaction pooling: a session-mode client holding its server stays awake.
    let s = certs
        .sluice("prefer")
        .setting("pool_mode", "transaction")
        .start();
    let mut c = Feeder::start(&s);
    assert_eq!(c.ask("SELECT 'first'"), "first");
    assert!(
        wait_until(Duration::from_secs(10), || asleep(&s) == 1),
        "an idle TLS client did not sleep\n{}",
        s.diagnostics()
    );
    // Woken by its next query: the session's keys and sequence numbers came back with
    // the socket, or this answer would not decrypt.
    assert_eq!(c.ask("SELECT 'second'"), "second");
    assert!(wait_until(Duration::from_secs(10), || asleep(&s) == 1));
    // Large enough to pass through many TLS records each way after the wake-up.
    let big = "x".repeat(200_000);
    let answer = c.ask(&format!("SELECT length('{big}' || repeat('y', 300000))"));
    assert_eq!(answer, "500000", "{}", s.diagnostics());
    assert_eq!(c.ask("SELECT repeat('z', 300000)"), "z".repeat(300_000));
}
