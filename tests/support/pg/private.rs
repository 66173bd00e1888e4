//! A PostgreSQL server of a test's own, which the test may stop, start again and
//! restart (the shared [`pg()`](super::pg) must never be). Same roles, passwords and
//! `sluice_test` database as the shared one. Stopped and removed on drop.

use super::{read_lossy, start, tail, PgServer};
use std::time::Duration;

/// A private PostgreSQL server; derefs to [`PgServer`] for ports, psql and configs.
#[derive(Debug)]
pub struct PrivatePg {
    server: PgServer,
}

impl PrivatePg {
    /// initdb + start + the test roles and database (a few seconds). Panics with the
    /// server log tail if that fails.
    pub fn start() -> PrivatePg {
        match start() {
            Ok(server) => PrivatePg { server },
            Err(e) => panic!("cannot start a private PostgreSQL: {e}"),
        }
    }

    /// `pg_ctl stop -m <mode>` (`fast` or `immediate`), waiting for it to finish.
    pub fn stop(&self, mode: &str) {
        let mut cmd = self.server.server_cmd("pg_ctl");
        cmd.arg("-D")
            .arg(&self.server.data_dir)
            .args(["-m", mode, "-w", "-t", "30", "stop"]);
        if let Err(e) = self
            .server
            .run_server_cmd(cmd, "pg_ctl stop", Duration::from_secs(40))
        {
            panic!("{e}\n--- log tail ---\n{}", self.log_tail());
        }
    }

    /// Starts the stopped server again on the same port.
    pub fn start_again(&self) {
        let mut cmd = self.server.server_cmd("pg_ctl");
        cmd.arg("-D")
            .arg(&self.server.data_dir)
            .arg("-l")
            .arg(&self.server.log_path)
            .args(["-w", "-t", "60", "-o"])
            .arg(format!("-p {}", self.server.port))
            .arg("start");
        if let Err(e) = self
            .server
            .run_server_cmd(cmd, "pg_ctl start", Duration::from_secs(90))
        {
            panic!("{e}\n--- log tail ---\n{}", self.log_tail());
        }
    }

    /// `stop(mode)` then `start_again()`.
    pub fn restart(&self, mode: &str) {
        self.stop(mode);
        self.start_again();
    }

    fn log_tail(&self) -> String {
        tail(&read_lossy(&self.server.log_path), 30)
    }
}

impl std::ops::Deref for PrivatePg {
    type Target = PgServer;
    fn deref(&self) -> &PgServer {
        &self.server
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}
