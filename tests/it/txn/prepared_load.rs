//! Named prepared statements (`max_prepared_statements`) while many clients share a
//! small pool in transaction mode and the pool's servers are retired (RECONNECT) or
//! killed under them. Every client uses the same statement names for statements of
//! its own, one of them redefined again and again, and the servers' caches are
//! smaller than the statements in use, so they evict all the time. A client must
//! always run its own statement: never another client's of the same name, never one
//! a server lost when it was replaced, and never "does not exist".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::{within, Observer};
use crate::support::wire::{frame, TAG_ERROR};
use crate::support::{Sluice, MD5_PASSWORD, MD5_USER};

const CLIENTS: u64 = 10;
const POOL: u32 = 2;
/// Smaller than the statements in use (one shared, two per client).
const CACHE: &str = "4";
const MAX_STEPS: u64 = 3_000;
const SIZES: [usize; 3] = [0, 3_000, 40_000];

/// A client's definition of statement `name` (generation `gen` for the redefined one).
fn text(id: u64, name: &str, gen: u64) -> String {
    match name {
        "shared" => "SELECT $1::text, repeat('x', $2::int)".to_owned(),
        "own" => format!("SELECT $1::text || '/{id}', repeat('y', $2::int)"),
        _ => format!("SELECT $1::text || '/{id}/{gen}', repeat('z', $2::int)"),
    }
}

/// What the definition of `text` answers to ($1, $2).
fn expected(id: u64, name: &str, gen: u64, tag: &str, size: usize) -> (String, String) {
    let (suffix, fill) = match name {
        "shared" => (String::new(), "x"),
        "own" => (format!("/{id}"), "y"),
        _ => (format!("/{id}/{gen}"), "z"),
    };
    (format!("{tag}{suffix}"), fill.repeat(size))
}

/// A Parse of statement `name` (no parameter types).
pub(super) fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for part in [name, sql] {
        body.extend_from_slice(part.as_bytes());
        body.push(0);
    }
    body.extend_from_slice(&0u16.to_be_bytes());
    frame(b'P', &body)
}

fn close(name: &str) -> Vec<u8> {
    let mut body = vec![b'S'];
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    frame(b'C', &body)
}

/// Bind (two text parameters) and Execute of statement `name`, unnamed portal.
fn run(name: &str, tag: &str, size: usize) -> Vec<u8> {
    let mut bind = vec![0u8];
    bind.extend_from_slice(name.as_bytes());
    bind.push(0);
    bind.extend_from_slice(&0u16.to_be_bytes());
    bind.extend_from_slice(&2u16.to_be_bytes());
    for p in [tag.to_owned(), size.to_string()] {
        bind.extend_from_slice(&(p.len() as u32).to_be_bytes());
        bind.extend_from_slice(p.as_bytes());
    }
    bind.extend_from_slice(&0u16.to_be_bytes());
    let mut out = frame(b'B', &bind);
    out.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    out
}

/// Reads to ReadyForQuery: `Err` with the error's text (or the close) if one came.
async fn answer(c: &mut RawClient, ctx: &str) -> Result<Vec<RawMsg>, String> {
    let mut msgs = Vec::new();
    loop {
        let m = within(STEP, ctx, c.try_recv(STEP))
            .await
            .unwrap_or_else(|()| panic!("{ctx}: no answer"));
        let Some(m) = m else {
            let said: Vec<String> = msgs.iter().filter_map(|m: &RawMsg| m.field(b'M')).collect();
            return Err(format!("closed ({})", said.join("; ")));
        };
        let ready = m.tag == b'Z';
        msgs.push(m);
        if ready {
            break;
        }
    }
    match msgs.iter().find(|m| m.tag == TAG_ERROR) {
        Some(e) => Err(e.field(b'M').unwrap_or_default()),
        None => Ok(msgs),
    }
}

/// One client's connection and the generation of its redefined statement.
struct Prepared {
    c: RawClient,
    id: u64,
    gen: u64,
}

impl Prepared {
    async fn open(s: &Sluice, db: &str, id: u64, gen: u64) -> Result<Prepared, String> {
        let c = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, db, &[]).await?;
        let mut p = Prepared { c, id, gen };
        let mut batch = Vec::new();
        for name in ["shared", "own", "redefined"] {
            batch.extend(parse(name, &text(id, name, gen)));
        }
        batch.extend(sync_msg());
        p.send(&batch).await?;
        p.answer("prepare").await.map(drop)?;
        Ok(p)
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.c.send(bytes).await.map_err(|e| e.to_string())
    }

    async fn answer(&mut self, ctx: &str) -> Result<Vec<RawMsg>, String> {
        answer(&mut self.c, &format!("client {}: {ctx}", self.id)).await
    }

    /// One step: one or two statements run in one batch (every fourth step redefines
    /// `redefined` first); each answer is checked to be exactly this client's.
    async fn step(&mut self, step: u64) -> Result<(), String> {
        let id = self.id;
        let mut batch = Vec::new();
        if step % 4 == 3 {
            self.gen += 1;
            batch.extend(close("redefined"));
            batch.extend(parse("redefined", &text(id, "redefined", self.gen)));
        }
        let names = ["shared", "own", "redefined"];
        let first = names[(step % 3) as usize];
        let mut asked = vec![(first, format!("c{id}s{step}a"))];
        if step % 2 == 0 {
            asked.push((names[((step + 1) % 3) as usize], format!("c{id}s{step}b")));
        }
        let size = SIZES[(step % SIZES.len() as u64) as usize];
        for (name, tag) in &asked {
            batch.extend(run(name, tag, size));
        }
        batch.extend(sync_msg());
        self.send(&batch).await?;
        let ctx = format!("step {step} {asked:?} ({size} bytes)");
        let msgs = self.answer(&ctx).await?;
        let rows: Vec<_> = msgs.iter().filter(|m| m.tag == b'D').collect();
        assert_eq!(rows.len(), asked.len(), "client {id} {ctx}: {msgs:?}");
        for ((name, tag), row) in asked.iter().zip(rows) {
            let cols = row.columns();
            let got = (
                cols[0].clone().unwrap_or_default(),
                cols[1].clone().unwrap_or_default(),
            );
            let want = expected(id, name, self.gen, tag, size);
            assert_eq!(got.0, want.0, "client {id} {ctx}: another statement ran");
            assert!(got.1 == want.1, "client {id} {ctx}: a mangled answer");
        }
        Ok(())
    }
}

/// A client stepping until `stop`, logging in and preparing again after an error.
/// Returns (answers, errors).
async fn client_at_work(
    s: Arc<Sluice>,
    db: String,
    id: u64,
    stop: Arc<AtomicBool>,
) -> (u64, Vec<String>) {
    let (mut ok, mut errors) = (0, Vec::new());
    let mut gen = 0;
    let mut conn = None;
    for step in 0..MAX_STEPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let p = match conn.as_mut() {
            Some(p) => p,
            None => match Prepared::open(&s, &db, id, gen).await {
                Ok(p) => conn.insert(p),
                Err(e) => {
                    errors.push(format!("login: {e}"));
                    continue;
                }
            },
        };
        match p.step(step).await {
            Ok(()) => ok += 1,
            Err(e) => {
                errors.push(e);
                gen = p.gen + 1;
                conn = None;
            }
        }
    }
    (ok, errors)
}

/// [`CLIENTS`]-many clients of named statements at work until [`Load::finish`].
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<(u64, Vec<String>)>>,
}

impl Load {
    pub(super) fn start(s: &Arc<Sluice>, db: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..CLIENTS)
            .map(|id| tokio::spawn(client_at_work(s.clone(), db.to_owned(), id, stop.clone())))
            .collect();
        Load { stop, clients }
    }

    /// Stops the clients; returns (answers, errors) summed, after logging each one's.
    pub(super) async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut ok, mut errors) = (0, Vec::new());
        for (id, c) in self.clients.into_iter().enumerate() {
            let (n, e) = within(Duration::from_secs(60), "a client at work", c)
                .await
                .unwrap_or_else(|e| panic!("client {id}: {e}"));
            eprintln!("client {id}: {n} answers, {} errors: {e:?}", e.len());
            ok += n;
            errors.extend(e);
        }
        (ok, errors)
    }
}

fn prepared_sluice(db: &str) -> Arc<Sluice> {
    Arc::new(
        txn_sluice(db)
            .userlist(ADMIN, ADMIN_PW)
            .setting("default_pool_size", &POOL.to_string())
            .setting("max_prepared_statements", CACHE)
            .setting("query_wait_timeout", "30")
            .start(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn named_statements_outlive_servers_retired_under_load() {
    let db = fresh_db("txn_prep_retired");
    let s = prepared_sluice(&db);
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let load = Load::start(&s, &db);
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(120)).await;
        let sql = if round % 2 == 0 {
            "RECONNECT".to_owned()
        } else {
            format!("RECONNECT {db}")
        };
        within(STEP, &sql, admin.simple_query(&sql))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", err_text(&e)));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ok, errors) = load.finish().await;
    // Servers retired between transactions cost no client anything: the statements
    // are prepared again on the servers that replace them.
    assert!(errors.is_empty(), "{errors:?}\n{}", s.diagnostics());
    assert!(ok >= CLIENTS * 4, "only {ok} answers\n{}", s.diagnostics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn named_statements_outlive_servers_killed_under_load() {
    let db = fresh_db("txn_prep_killed");
    let s = prepared_sluice(&db);
    let obs = Observer::new().await;
    let load = Load::start(&s, &db);
    let mut rng = Rng::new(11);
    let mut killed = 0u64;
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let pids = backend_pids(&obs, &db).await;
        if pids.is_empty() {
            continue;
        }
        let pid = pids[rng.below(pids.len() as u64) as usize];
        killed += u64::from(obs.try_terminate(pid).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, errors) = load.finish().await;
    eprintln!(
        "{} client errors from {killed} servers killed",
        errors.len()
    );
    // A kill costs at most the client its server was serving; a statement a killed
    // server took with it is never missed by the next one ("does not exist").
    for e in &errors {
        assert!(!e.contains("does not exist"), "{e}\n{}", s.diagnostics());
    }
    assert!(
        errors.len() as u64 <= killed,
        "{} errors from {killed} kills: {errors:?}\n{}",
        errors.len(),
        s.diagnostics()
    );
    assert!(
        killed >= 8,
        "only {killed} backends killed\n{}",
        s.diagnostics()
    );
    assert!(ok >= CLIENTS * 4, "only {ok} answers\n{}", s.diagnostics());
}
