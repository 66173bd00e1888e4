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

    /// Turns TLS on: writes `files` (name, PEM) into the data directory, owned by the
    /// server's user and readable by it alone, puts `hba` before the harness's own
    /// pg_hba.conf lines, sets `settings` (`ssl = on`, the file names) and reloads,
    /// waiting until new sessions see `ssl` on.
    pub fn enable_tls(&self, files: &[(&str, &str)], hba: &str, settings: &[(&str, &str)]) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = &self.server.data_dir;
        let owner = std::fs::metadata(dir).expect("data dir");
        for (name, pem) in files {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write a TLS file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).expect("chown");
        }
        let hba_path = dir.join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba_path).expect("read pg_hba.conf");
        std::fs::write(&hba_path, format!("{hba}\n{old}")).expect("write pg_hba.conf");
        let mut sql = String::new();
        for (k, v) in settings {
            sql.push_str(&format!("ALTER SYSTEM SET {k} = '{v}';\n"));
        }
        sql.push_str("SELECT pg_reload_conf();\n");
        self.server.psql(&sql);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.server.psql("SHOW ssl").trim() != "on" {
            assert!(
                std::time::Instant::now() < deadline,
                "ssl still off\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
