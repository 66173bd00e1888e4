//! Helpers shared by the transaction/statement pooling tests.
//!
//! Each test gets a PostgreSQL database of its own ([`fresh_db`]), so its server
//! connections can be counted by `datname` in `pg_stat_activity` while other tests
//! run in parallel (application_name cannot be used: psql and pgbench set their
//! own, which Sluice applies to the servers).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::support::probe::{unique_marker, within, Observer};
use crate::support::wire::{first_column, frame, TAG_READY};
pub use crate::support::wire::{first_error, RawClient, RawMsg};
use crate::support::{self, pg, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER};

/// Bound for one ordinary step of a test.
pub const STEP: Duration = Duration::from_secs(20);

/// Creates a database owned by `sluice_md5` on the shared PostgreSQL and returns its
/// name (unique to the call).
pub fn fresh_db(prefix: &str) -> String {
    let name = unique_marker(prefix);
    pg().psql(&format!("CREATE DATABASE {name} OWNER {MD5_USER}"));
    name
}

/// Runs `sql` as `postgres` in `db` directly on PostgreSQL (psql, unix socket).
pub fn direct(db: &str, sql: &str) -> String {
    pg().psql_db(db, sql)
}

/// The connection string of a `[databases]` entry for `db` on the shared server.
pub fn connstr(db: &str, extra: &str) -> String {
    format!("host=127.0.0.1 port=@PG_PORT@ dbname={db} {extra}")
}

/// A Sluice serving `db` (same name on both sides) to `sluice_md5`, with
/// `pool_mode = transaction` globally.
pub fn txn_sluice(db: &str) -> SluiceBuilder {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(db, &connstr(db, ""))
        .setting("pool_mode", "transaction")
}

/// A Sluice serving `sluice_test` of a private PostgreSQL (one a test may stop and
/// restart) to `sluice_md5`, with `pool_mode = transaction` and a pool of 2.
pub fn private_txn_sluice(private: &crate::support::pg::PrivatePg) -> SluiceBuilder {
    let db = crate::support::TEST_DB;
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(
            db,
            &format!("host=127.0.0.1 port={} dbname={db}", private.port()),
        )
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
}

/// A tokio-postgres client of Sluice as `sluice_md5`.
pub async fn client(s: &Sluice, db: &str) -> Client {
    let cfg = s.config(MD5_USER, MD5_PASSWORD, db);
    within(STEP, "connect to sluice", support::connect(&cfg)).await
}

/// Runs a simple query and returns the first column of each row (NULL as "NULL").
/// Simple queries avoid named prepared statements, which transaction pooling
/// cannot follow from server to server.
pub async fn rows(c: &Client, sql: &str) -> Vec<String> {
    let msgs = within(STEP, sql, c.simple_query(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e} ({e:?})"));
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_owned()),
            _ => None,
        })
        .collect()
}

/// [`rows`] expecting exactly one row.
pub async fn one(c: &Client, sql: &str) -> String {
    let mut r = rows(c, sql).await;
    assert_eq!(r.len(), 1, "{sql}: {r:?}");
    r.remove(0)
}

/// The backend pid serving `c` for this statement.
pub async fn backend_pid(c: &Client) -> i32 {
    one(c, "SELECT pg_backend_pid()").await.parse().unwrap()
}

/// Client backends connected to database `db`.
pub async fn backends(obs: &Observer, db: &str) -> i64 {
    obs.client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND datname = $1",
            &[&db],
        )
        .await
        .expect("count backends")
        .get(0)
}

/// Pids of the client backends connected to database `db`.
pub async fn backend_pids(obs: &Observer, db: &str) -> Vec<i32> {
    pids_where(obs, db, "").await
}

/// [`backend_pids`] of the backends done logging in (a state reported).
pub async fn logged_in_pids(obs: &Observer, db: &str) -> Vec<i32> {
    pids_where(obs, db, " AND state IS NOT NULL").await
}

async fn pids_where(obs: &Observer, db: &str, and: &str) -> Vec<i32> {
    let sql = format!(
        "SELECT pid FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND datname = $1{and}"
    );
    obs.client
        .query(&sql, &[&db])
        .await
        .expect("list backends")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Polls until `cond(backends(db))` holds; returns the count, or panics after `limit`.
pub async fn wait_backends(
    obs: &Observer,
    db: &str,
    limit: Duration,
    cond: impl Fn(i64) -> bool,
) -> i64 {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let n = backends(obs, db).await;
        if cond(n) {
            return n;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("backend count of {db} stuck at {n} after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Polls `count` until it is `want`; panics after `limit` with the last count and
/// `what` (and `s`'s diagnostics).
pub async fn settles<F, Fut>(s: &Sluice, limit: Duration, what: &str, want: i64, count: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let n = count().await;
        if n == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {n}, not {want}, after {limit:?}\n{}",
            s.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a [`Sampler`] counts.
enum Source {
    /// Client backends of a database in `pg_stat_activity`.
    Backends(String),
    /// Sluice's (pid) established TCP connections to a PostgreSQL port: the
    /// pooler's own view, free of the delay with which a closed backend leaves
    /// `pg_stat_activity`.
    Sockets(u32, u16),
}

/// Counts the established TCP connections of process `pid` to remote `port` on
/// 127.0.0.1: the socket inodes in /proc/<pid>/fd matched against `ss` (netlink,
/// filtered in the kernel), else against /proc/net/tcp, which is slow to read when
/// many sockets linger in TIME_WAIT.
pub fn established_to(pid: u32, port: u16) -> i64 {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(i.to_owned());
                }
            }
        }
    }
    // Distinct inodes: a non-atomic listing may show a socket twice.
    let mut seen = std::collections::HashSet::new();
    let ss = std::process::Command::new("ss")
        .args(["-Htne", "state", "established", "dst"])
        .arg(format!("127.0.0.1:{port}"))
        .output();
    match ss {
        Ok(out) if out.status.success() => {
            for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(ino) = word.strip_prefix("ino:") {
                    if inodes.contains(ino) {
                        seen.insert(ino.to_owned());
                    }
                }
            }
        }
        _ => {
            let needle = format!(":{port:04X}");
            let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() > 9 && f[2].ends_with(&needle) && f[3] == "01" && inodes.contains(f[9]) {
                    seen.insert(f[9].to_owned());
                }
            }
        }
    }
    seen.len() as i64
}

/// Samples a count in the background, keeping the maximum.
pub struct Sampler {
    max: Arc<AtomicI64>,
    samples: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Samples the backends of `db` every `every` with its own observer connection.
    pub async fn start(db: &str, every: Duration) -> Sampler {
        Sampler::spawn(Source::Backends(db.to_owned()), every).await
    }

    /// Samples the server connections Sluice holds open to the shared PostgreSQL.
    pub async fn sockets(s: &Sluice, every: Duration) -> Sampler {
        Sampler::spawn(Source::Sockets(s.pid(), pg().port()), every).await
    }

    async fn spawn(source: Source, every: Duration) -> Sampler {
        let obs = match source {
            Source::Backends(_) => Some(Observer::new().await),
            Source::Sockets(..) => None,
        };
        let (max, samples, stop) = (
            Arc::new(AtomicI64::new(0)),
            Arc::new(AtomicI64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (m, n, s) = (max.clone(), samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                let c = match (&source, &obs) {
                    (Source::Backends(db), Some(obs)) => backends(obs, db).await,
                    (Source::Sockets(pid, port), _) => established_to(*pid, *port),
                    _ => unreachable!(),
                };
                m.fetch_max(c, Ordering::Relaxed);
                n.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(every).await;
            }
        });
        Sampler {
            max,
            samples,
            stop,
            task,
        }
    }

    /// Stops sampling; returns (max, number of samples).
    pub async fn finish(self) -> (i64, i64) {
        self.stop.store(true, Ordering::Relaxed);
        within(STEP, "sampler stop", self.task)
            .await
            .expect("sampler task");
        (
            self.max.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }
}

/// The message of a tokio-postgres error: the server's message if it sent one,
/// else the error's text.
pub fn err_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => format!("{e} {e:?}"),
    }
}

/// A raw wire-protocol client of Sluice as `sluice_md5`, logged in.
pub async fn raw(s: &Sluice, db: &str, extra: &[(&str, &str)]) -> RawClient {
    within(
        STEP,
        "raw login",
        RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, db, extra),
    )
    .await
    .unwrap_or_else(|e| panic!("raw login refused: {e}\n{}", s.diagnostics()))
}

/// The transaction status byte of the last ReadyForQuery in `msgs`.
pub fn status(msgs: &[RawMsg]) -> u8 {
    let rfq = msgs
        .iter()
        .rev()
        .find(|m| m.tag == TAG_READY)
        .unwrap_or_else(|| panic!("no ReadyForQuery in {msgs:?}"));
    rfq.body[0]
}

/// The DataRow first columns of `msgs`, NULL as "NULL".
pub fn col(msgs: &[RawMsg]) -> Vec<String> {
    first_column(msgs)
        .into_iter()
        .map(|v| v.unwrap_or_else(|| "NULL".into()))
        .collect()
}

/// Parse (unnamed) + Bind + Describe portal + Execute for `sql`, no Sync.
pub fn extended(sql: &str) -> Vec<u8> {
    let mut parse = vec![0u8];
    parse.extend_from_slice(sql.as_bytes());
    parse.extend_from_slice(&[0, 0, 0]);
    let bind = [0u8, 0, 0, 0, 0, 0, 0, 0];
    let mut out = frame(b'P', &parse);
    out.extend(frame(b'B', &bind));
    out.extend(frame(b'D', b"P\0"));
    out.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    out
}

pub fn sync_msg() -> Vec<u8> {
    frame(b'S', &[])
}

pub fn flush_msg() -> Vec<u8> {
    frame(b'H', &[])
}

/// Reads `n` messages (any tags), panicking on a close or after `limit`.
pub async fn read_n(c: &mut RawClient, n: usize, limit: Duration) -> Vec<RawMsg> {
    let mut out = Vec::new();
    while out.len() < n {
        match c.recv(limit).await {
            Some(m) => out.push(m),
            None => panic!("closed after {out:?}"),
        }
    }
    out
}

/// Waits for the peer to send a FATAL error containing `needle` (case-insensitive)
/// and close; returns the error message.
pub async fn expect_fatal_close(c: &mut RawClient, needle: &str, limit: Duration) -> String {
    let msgs = c.until_closed(limit).await;
    let err = first_error(&msgs).unwrap_or_else(|| panic!("no error before close: {msgs:?}"));
    let text = err.field(b'M').unwrap_or_default();
    assert!(
        text.to_lowercase().contains(&needle.to_lowercase()),
        "expected an error containing {needle:?}, got {text:?} ({msgs:?})"
    );
    text
}

/// xorshift64*: a fixed sequence per seed, so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The sockets of a pooler just started, before any client: its listeners. The
/// fewest seen over 200 ms, since the harness's readiness probe (a connection of its
/// own) may not be closed yet when the test begins.
pub fn listening_sockets(s: &Sluice) -> usize {
    let mut fewest = s.open_sockets();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(20));
        fewest = fewest.min(s.open_sockets());
    }
    fewest
}

/// Waits until the pooler holds no socket but its listeners (`at_start`, from
/// [`listening_sockets`]) and its servers still established to `pg_port`. A
/// client's or server's socket kept after its peer left would stay, in CLOSE_WAIT,
/// and fail this.
pub fn nothing_left_open(s: &Sluice, at_start: usize, pg_port: u16) {
    let mut seen = (0, 0);
    let settled = support::wait_until(STEP, || {
        let servers = established_to(s.pid(), pg_port);
        seen = (s.open_sockets(), usize::try_from(servers).unwrap_or(0));
        seen.0 == at_start + seen.1
    });
    assert!(
        settled,
        "{} sockets open with {} servers established, {at_start} at start\n{}",
        seen.0,
        seen.1,
        s.diagnostics()
    );
}
