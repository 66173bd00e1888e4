//! Helpers for end-to-end relay/pooling tests:
//!
//! * [`marked_sluice`]: a Sluice whose server connections log in with a unique
//!   `application_name`, so a test counts its own backends in `pg_stat_activity`
//!   while other tests run in parallel (clients must not set `application_name`).
//! * [`Observer`]: a direct superuser connection to the shared PostgreSQL.
//! * [`within`]: an await bounded in time, panicking with a description.
//! * [`connect_with_messages`]: a tokio-postgres client whose notices and
//!   notifications are delivered to a channel instead of being dropped.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::{pg, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

/// A name unique to this test process and call, usable as an identifier.
pub fn unique_marker(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A builder for a Sluice serving `sluice_test` to `sluice_md5` whose server
/// connections carry `application_name = marker` (see [`Observer::count`]).
pub fn marked_sluice(marker: &str) -> SluiceBuilder {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(
            TEST_DB,
            &format!("host=127.0.0.1 port=@PG_PORT@ dbname={TEST_DB} application_name={marker}"),
        )
}

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Connects with tokio-postgres and drives the connection in a task that forwards
/// every notice and notification to the returned channel.
pub async fn connect_with_messages(
    cfg: &Config,
) -> (Client, mpsc::UnboundedReceiver<AsyncMessage>) {
    let (client, mut conn) = within(Duration::from_secs(15), "connect", cfg.connect(NoTls))
        .await
        .unwrap_or_else(|e| panic!("connect {cfg:?}: {e}"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            let _ = tx.send(m);
        }
    });
    (client, rx)
}

/// A direct superuser connection to the shared PostgreSQL (unix socket, trust).
pub struct Observer {
    pub client: Client,
}

impl Observer {
    pub async fn new() -> Observer {
        let cfg = pg().socket_config("postgres", "postgres");
        let client = within(
            Duration::from_secs(15),
            "observer connect",
            super::connect(&cfg),
        )
        .await;
        Observer { client }
    }

    /// Client backends whose application_name is `marker`.
    pub async fn count(&self, marker: &str) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND application_name = $1",
                &[&marker],
            )
            .await
            .expect("count backends")
            .get(0)
    }

    /// Pids of the client backends whose application_name is `marker`.
    pub async fn pids(&self, marker: &str) -> Vec<i32> {
        self.client
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND application_name = $1 ORDER BY pid",
                &[&marker],
            )
            .await
            .expect("list backends")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Whether backend `pid` still exists.
    pub async fn alive(&self, pid: i32) -> bool {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .expect("look up backend")
            .get::<_, i64>(0)
            > 0
    }

    /// Polls until `cond(count(marker))` holds; returns the last count, or panics
    /// after `limit`.
    pub async fn wait_count(
        &self,
        marker: &str,
        limit: Duration,
        cond: impl Fn(i64) -> bool,
    ) -> i64 {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let n = self.count(marker).await;
            if cond(n) {
                return n;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("backend count for {marker} stuck at {n} after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `n` backends of `marker` are idle right after the reset query
    /// (`DISCARD ALL`), i.e. back in Sluice's pool, plus a short grace for Sluice
    /// to file them.
    pub async fn wait_pooled(&self, marker: &str, n: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let idle: i64 = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND application_name = $1 \
                       AND state = 'idle' AND query = 'DISCARD ALL'",
                    &[&marker],
                )
                .await
                .expect("count pooled backends")
                .get(0);
            if idle >= n {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("only {idle} of {n} backends of {marker} were reset and pooled in 10 s");
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    /// `pg_terminate_backend(pid)`.
    pub async fn terminate(&self, pid: i32) {
        let ok = self.try_terminate(pid).await;
        assert!(ok, "pg_terminate_backend({pid}) returned false");
    }

    /// `pg_terminate_backend(pid)`: false if there was no such backend.
    pub async fn try_terminate(&self, pid: i32) -> bool {
        self.client
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .expect("pg_terminate_backend")
            .get(0)
    }
}

/// A backend stopped with SIGSTOP, continued when dropped (a test that fails must not
/// leave the shared PostgreSQL with a frozen backend). Signalled by `kill`: the
/// tests run as PostgreSQL's user or as root.
pub struct Frozen(i32);

impl Frozen {
    pub fn new(pid: i32) -> Frozen {
        assert!(signal("-STOP", pid), "kill -STOP {pid}");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // No panic here (it may run while a test unwinds); a backend gone is fine.
        signal("-CONT", self.0);
    }
}

/// Sends `sig` to `pid` with kill(1); whether it was sent.
fn signal(sig: &str, pid: i32) -> bool {
    std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}
