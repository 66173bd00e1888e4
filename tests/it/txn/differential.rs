//! Through Sluice in transaction mode, an extended-protocol conversation is answered
//! exactly as PostgreSQL answers it on a direct connection. Each client replays one
//! seeded random conversation twice, on a direct connection and through Sluice, and
//! the two answer streams must match message for message: named and unnamed
//! statements, portals, Describe, Close, Flush, Execute with a row limit, errors in
//! the middle of a pipeline, transactions, and SQL-level PREPARE/EXECUTE/DEALLOCATE,
//! across the two kinds (EXECUTE of a Parsed statement, Bind of a PREPAREd one).
//!
//! Many clients share a pool of two servers that each keep fewer statements than a
//! client names, so statements move between servers and are evicted under the
//! clients' feet. What cannot match by design is never generated: the unnamed
//! statement and portals outlive a Sync on a direct connection but not across
//! servers, so they are only reused within a batch or a transaction (and one a
//! client did not make may be another client's on a server).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

use super::common::*;
use crate::support::probe::within;
use crate::support::wire::{frame, query_msg};

use crate::support::{pg, SluiceBuilder, MD5_PASSWORD, MD5_USER};

mod converse;
mod msgs;
use converse::{converse, part_sizes, Batch};
use msgs::*;
pub(super) use msgs::{bind, execute, function_call, parse};

const CLIENTS: u64 = 8;
const BATCHES: u64 = 120;
const POOL: u32 = 2;
/// Below the five statement names a client uses, so servers evict statements.
const CACHE: u32 = 3;

/// What one client believes exists, to make most requests meaningful. It may be
/// wrong after an error (a skipped Parse); the direct connection is the judge.
struct Model {
    rng: Rng,
    statements: HashMap<String, usize>,
    unnamed: Option<usize>,
    portals: HashMap<String, usize>,
    sql_level: HashSet<u64>,
    in_tx: bool,
    /// The transaction failed. Three answers differ then, by design, and are not
    /// asked for: a Bind with the wrong number of parameters of a statement the
    /// server lacks fails at the Parse Sluice sends first (25P02, where PostgreSQL
    /// checks the count first), so no Bind is sent; a Describe of a statement
    /// without result (BEGIN, say) the server lacks fails the same way (PostgreSQL
    /// describes it), so no Describe of a statement is sent; and a PREPARE of a
    /// name in use gets 42P05 (PostgreSQL: 25P02), so no PREPARE is sent.
    aborted: bool,
    /// Named statements, of either kind (not without prepared-statement tracking in
    /// transaction mode, where they stay on the server that made them).
    named: bool,
}

impl Model {
    fn pick<'a>(&mut self, from: &'a [&'a str]) -> &'a str {
        from[self.rng.below(from.len() as u64) as usize]
    }

    fn params(&mut self, sql: usize) -> Vec<String> {
        let mut n = SQL[sql].1;
        if self.rng.below(20) == 0 && !self.aborted {
            n += 1;
        }
        (0..n).map(|_| self.rng.below(5).to_string()).collect()
    }

    /// Parse under a name; a name in use is mostly closed first, as drivers do.
    fn parse(&mut self, b: &mut Batch) -> (String, usize) {
        let name = if self.rng.below(10) < 3 || !self.named {
            String::new()
        } else {
            format!("s{}", self.rng.below(5))
        };
        if self.statements.contains_key(&name) && self.rng.below(8) != 0 {
            b.push(named(b'C', b'S', &name), format!("Close S {name}"));
            self.statements.remove(&name);
        }
        let sql = self.rng.below(SQL.len() as u64) as usize;
        b.push(
            parse(&name, sql),
            format!("Parse {name:?} {:?}", SQL[sql].0),
        );
        if name.is_empty() {
            self.unnamed = Some(sql);
        } else {
            self.statements.insert(name.clone(), sql);
        }
        (name, sql)
    }

    /// A statement believed to exist (or, now and then, one that does not).
    fn existing(&mut self) -> Option<(String, usize)> {
        let mut all: Vec<(String, usize)> = self
            .statements
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        all.sort();
        // PREPAREd ones too: one namespace for both kinds, as in PostgreSQL.
        let mut sql_level: Vec<u64> = self.sql_level.iter().copied().collect();
        sql_level.sort_unstable();
        all.extend(sql_level.into_iter().map(|k| (format!("q{k}"), 0)));
        if let Some(u) = self.unnamed {
            all.push((String::new(), u));
        }
        if all.is_empty() || self.rng.below(20) == 0 {
            return (self.rng.below(4) == 0).then(|| ("s9".to_owned(), 0));
        }
        Some(all[self.rng.below(all.len() as u64) as usize].clone())
    }

    /// A statement name believed to exist, or one that does not. Never the unnamed
    /// statement unless this batch or transaction made it: on a server another
    /// client's may be there (as through PgBouncer).
    fn existing_or_unknown(&mut self) -> String {
        self.existing().map_or_else(|| "s9".to_owned(), |(n, _)| n)
    }

    fn bind_execute(&mut self, b: &mut Batch, stmt: &str, sql: usize) {
        let portal = self.pick(&["", "", "p0", "p1"]).to_owned();
        let params = self.params(sql);
        b.push(
            bind(&portal, stmt, &params),
            format!("Bind {portal:?} {stmt:?} {params:?}"),
        );
        if !self.aborted {
            // (In a failed transaction the Parse before it fails, or ends the
            // transaction: no portal to come back to either way.)
            self.portals.insert(portal.clone(), sql);
        }
        if self.rng.below(3) == 0 {
            b.push(named(b'D', b'P', &portal), format!("Describe P {portal:?}"));
        }
        let max = [0, 0, 1, 2][self.rng.below(4) as usize];
        b.push(execute(&portal, max), format!("Execute {portal:?} {max}"));
    }

    /// One to four units of work, with Flushes between some, then Sync.
    fn extended(&mut self) -> Batch {
        let mut b = Batch::default();
        for _ in 0..=self.rng.below(4) {
            match self.rng.below(12) {
                0..=3 => {
                    let (name, sql) = self.parse(&mut b);
                    self.bind_execute(&mut b, &name, sql);
                }
                // (No Bind in a failed transaction: see `aborted`.)
                0..=6 if self.aborted => drop(self.parse(&mut b)),
                4..=6 => match self.existing() {
                    Some((name, sql)) => self.bind_execute(&mut b, &name, sql),
                    None => drop(self.parse(&mut b)),
                },
                7 => drop(self.parse(&mut b)),
                // (None in a failed transaction: see `aborted`.)
                8 if !self.aborted => {
                    let name = self.existing_or_unknown();
                    b.push(named(b'D', b'S', &name), format!("Describe S {name:?}"));
                }
                9 => {
                    if self.rng.below(2) == 0 {
                        let name = self.existing_or_unknown();
                        b.push(named(b'C', b'S', &name), format!("Close S {name:?}"));
                        self.forget(&name);
                    } else {
                        let portal = self.pick(&["", "p0", "p1"]).to_owned();
                        b.push(named(b'C', b'P', &portal), format!("Close P {portal:?}"));
                        self.portals.remove(&portal);
                    }
                }
                // Execute a portal again: the rest of a suspended one.
                _ => {
                    let mut open: Vec<String> = self.portals.keys().cloned().collect();
                    open.sort();
                    let portal = if open.is_empty() {
                        "p9".to_owned()
                    } else {
                        open[self.rng.below(open.len() as u64) as usize].clone()
                    };
                    b.push(execute(&portal, 1), format!("Execute {portal:?} 1"));
                }
            }
            if self.rng.below(4) == 0 {
                b.flush();
            }
        }
        // Now and then a simple Query or a FunctionCall before the Sync (after the
        // answers to the batch's first parts, if it has Flushes), or a COPY FROM
        // STDIN to end a batch sent whole.
        if b.parts.len() == 1 && self.rng.below(10) == 0 {
            let copy = format!("COPY {COPY_TABLE} FROM STDIN");
            b.push(parse_text("", &copy), format!("Parse \"\" {copy:?}"));
            b.push(bind("", "", &[]), "Bind \"\" \"\" []".into());
            b.push(execute("", 0), "Execute \"\" 0".into());
            // Not bound again: the model forgets the unnamed statement and portal.
            self.unnamed = None;
            self.portals.remove("");
            b.copy = Some(Vec::new());
        } else if self.rng.below(8) == 0 {
            let answered = b.parts.last().map_or(0, |p| p.1);
            if self.rng.below(3) == 0 {
                self.function_call(&mut b);
            } else {
                let sql = self.pick(&["SELECT 'mid'", "SELECT 1/0"]).to_owned();
                b.push(query_msg(&sql), format!("Query {sql:?}"));
            }
            b.query_after = Some(answered);
        }
        b.sync();
        if let Some(data) = &mut b.copy {
            let (bytes, what) = self.copy_data();
            *data = bytes;
            data.extend(frame(b'S', &[]));
            b.desc.push(format!("then {what}, Sync"));
        }
        b
    }

    /// A FunctionCall (libpq's `PQfn`): `int4pl`, or `int4div` by zero now and then.
    fn function_call(&mut self, b: &mut Batch) {
        let v = self.rng.below(5).to_string();
        let (oid, name, by) = match self.rng.below(3) {
            0 => (INT4DIV, "int4div", "0"),
            _ => (INT4PL, "int4pl", "1"),
        };
        let args = [v, by.to_owned()];
        b.push(
            function_call(oid, &args),
            format!("FunctionCall {name}{args:?}"),
        );
    }

    /// What a COPY's client sends after CopyInResponse: rows and CopyDone (a bad row
    /// now and then), or CopyFail.
    fn copy_data(&mut self) -> (Vec<u8>, &'static str) {
        let mut out = Vec::new();
        let (rows, what) = match self.rng.below(4) {
            0 => (None, "CopyFail"),
            1 => (Some("1\nnot a number\n3\n"), "CopyData (bad), CopyDone"),
            _ => (Some("1\n2\n3\n"), "CopyData, CopyDone"),
        };
        match rows {
            Some(rows) => {
                out.extend(frame(b'd', rows.as_bytes()));
                out.extend(frame(b'c', &[]));
            }
            None => out.extend(frame(b'f', b"client gave up\0")),
        }
        (out, what)
    }

    /// A simple Query, mostly of SQL-level prepared statements; or a FunctionCall or
    /// a COPY.
    fn simple(&mut self, tag: &str) -> Batch {
        if self.rng.below(8) == 0 {
            let mut b = Batch::default();
            if self.rng.below(2) == 0 {
                self.function_call(&mut b);
            } else {
                let copy = format!("COPY {COPY_TABLE} FROM STDIN");
                b.push(query_msg(&copy), format!("Query {copy:?}"));
                let (bytes, what) = self.copy_data();
                b.copy = Some(bytes);
                b.desc.push(format!("then {what}"));
            }
            self.unnamed = None;
            return b;
        }
        let k = self.rng.below(3);
        let v = self.rng.below(5);
        let sql = match self.rng.below(12) {
            0 => format!("SELECT '{tag}'"),
            1 => "BEGIN".to_owned(),
            2 => "COMMIT".to_owned(),
            3 => "ROLLBACK".to_owned(),
            4 => format!("SELECT '{tag}'; SELECT 1/0; SELECT 2"),
            5 | 6 if !self.aborted && self.named => {
                self.sql_level.insert(k);
                format!("PREPARE q{k} AS SELECT $1::int4 * {}", k + 2)
            }
            // A Parsed statement, by SQL.
            7 if self.rng.below(2) == 0 && !self.statements.is_empty() => {
                let mut have: Vec<(String, usize)> = self
                    .statements
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                have.sort();
                let (name, sql) = have[self.rng.below(have.len() as u64) as usize].clone();
                let args: Vec<String> = (0..self.params(sql).len())
                    .map(|i| (v + i as u64).to_string())
                    .collect();
                match args.len() {
                    0 => format!("EXECUTE {name}"),
                    _ => format!("EXECUTE {name}({})", args.join(", ")),
                }
            }
            9 if self.rng.below(3) == 0 && !self.statements.is_empty() => {
                let mut have: Vec<String> = self.statements.keys().cloned().collect();
                have.sort();
                let name = have[self.rng.below(have.len() as u64) as usize].clone();
                self.forget(&name);
                format!("DEALLOCATE {name}")
            }
            7 | 8 => {
                // Mostly one that was prepared.
                let mut have: Vec<u64> = self.sql_level.iter().copied().collect();
                have.sort_unstable();
                let k = match have.len() {
                    0 => k,
                    n if self.rng.below(5) != 0 => have[self.rng.below(n as u64) as usize],
                    _ => k,
                };
                format!("EXECUTE q{k}({v})")
            }
            9 => {
                self.sql_level.remove(&k);
                format!("DEALLOCATE q{k}")
            }
            10 => {
                self.sql_level.clear();
                "DEALLOCATE ALL".to_owned()
            }
            _ => format!("SELECT {v} + 1 AS n"),
        };
        let mut b = Batch::default();
        b.push(query_msg(&sql), format!("Query {sql:?}"));
        if sql == "DEALLOCATE ALL" {
            self.statements.clear();
        }
        self.unnamed = None;
        b
    }

    /// A statement name closed or deallocated, of either kind.
    fn forget(&mut self, name: &str) {
        self.statements.remove(name);
        if let Some(k) = name.strip_prefix('q').and_then(|k| k.parse().ok()) {
            self.sql_level.remove(&k);
        }
    }

    /// What a batch leaves behind, known from the direct connection's answer.
    fn after(&mut self, answer: &[String]) {
        let status = answer.iter().rev().find(|m| m.starts_with('Z'));
        self.in_tx = status.is_some_and(|z| !z.ends_with('I'));
        let was_aborted = self.aborted;
        self.aborted = status.is_some_and(|z| z.ends_with('E'));
        if self.aborted && !was_aborted {
            // PostgreSQL 15 may crash executing, in a failed transaction, a portal
            // made before the failure (its plan is released at the abort), so those
            // portals are not named again.
            self.portals.clear();
        }
        if !self.in_tx {
            // Gone with the transaction on a direct connection too (portals), or
            // not carried from server to server (the unnamed statement).
            self.unnamed = None;
            self.portals.clear();
        }
    }
}

/// Other conversations than the usual ones: `SLUICE_DIFF_SEED=n` (by hand only; the
/// suite runs seed 0).
fn seed_base() -> u64 {
    let seed = std::env::var("SLUICE_DIFF_SEED").ok();
    seed.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1000
}

/// Runs one client's conversation; then, still connected, waits at `done` while the
/// test checks that no server is held, and at `done` again before it leaves.
async fn run_client(id: u64, port: u16, db: String, named: bool, done: Arc<Barrier>) {
    let mut direct = RawClient::login(pg().port(), MD5_USER, MD5_PASSWORD, &db, &[])
        .await
        .expect("direct login");
    let mut pooled = RawClient::login(port, MD5_USER, MD5_PASSWORD, &db, &[])
        .await
        .expect("login through Sluice");
    let mut m = Model {
        rng: Rng::new(id + 101 + seed_base()),
        statements: HashMap::new(),
        unnamed: None,
        portals: HashMap::new(),
        sql_level: HashSet::new(),
        in_tx: false,
        aborted: false,
        named,
    };
    let mut history: Vec<String> = Vec::new();
    for n in 0..=BATCHES {
        let batch = if n == BATCHES {
            // End every client's transaction, so the servers go back.
            let mut b = Batch::default();
            b.push(query_msg("ROLLBACK"), "Query ROLLBACK".into());
            b
        } else if m.rng.below(5) == 0 {
            m.simple(&format!("c{id}b{n}"))
        } else {
            m.extended()
        };
        let want = converse(&mut direct, &batch, None).await;
        let sizes = part_sizes(&want);
        let got = converse(&mut pooled, &batch, Some(&sizes)).await;
        history.push(format!(
            "{}\n      => {}",
            batch.desc.join(", "),
            want.join(" ")
        ));
        assert_eq!(
            got,
            want,
            "client {id} batch {n}: through Sluice (left) and direct (right) differ\n\
             the batches so far, last first:\n  {}",
            history
                .iter()
                .rev()
                .take(12)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ")
        );
        m.after(&want);
    }
    done.wait().await;
    done.wait().await;
    drop(pooled);
}

/// The servers the pool of `db` lends out now (SHOW POOLS' `sv_active`).
async fn servers_lent(s: &crate::support::Sluice, db: &str) -> String {
    use crate::admin::{console, ADMIN, ADMIN_PW};
    use tokio_postgres::SimpleQueryMessage;
    let admin = console(s, ADMIN, ADMIN_PW).await;
    let msgs = within(STEP, "SHOW POOLS", admin.simple_query("SHOW POOLS"))
        .await
        .expect("SHOW POOLS");
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("database") == Some(db) => {
                r.get("sv_active").map(str::to_owned)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no pool for {db}"))
}

/// Runs the conversations through a Sluice set up by `setup` (`pool_mode`, pool
/// size, statement tracking). With `lent_after` the pool must lend out that many
/// servers once they are over, the clients still connected.
async fn differential(
    prefix: &str,
    setup: impl FnOnce(SluiceBuilder) -> SluiceBuilder,
    named: bool,
    lent_after: &str,
) {
    let db = fresh_db(prefix);
    // Generic plans on both sides: a custom plan folds `10 / $1` bound to 0 at Bind,
    // a generic one fails at Execute, and which one a statement gets depends on how
    // often it ran on that connection (a statement moves between servers).
    direct(
        &db,
        &format!("ALTER DATABASE {db} SET plan_cache_mode = force_generic_plan"),
    );
    let oids = direct(
        &db,
        "SELECT 'int4pl'::regproc::oid || ' ' || 'int4div'::regproc::oid",
    );
    assert_eq!(oids.trim(), format!("{INT4PL} {INT4DIV}"));
    direct(
        &db,
        &format!("CREATE TABLE {COPY_TABLE} (v int4); GRANT ALL ON {COPY_TABLE} TO {MD5_USER}"),
    );
    let s = setup(txn_sluice(&db).userlist(crate::admin::ADMIN, crate::admin::ADMIN_PW)).start();
    let done = Arc::new(Barrier::new(CLIENTS as usize + 1));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(run_client(id, s.port(), db.clone(), named, done.clone())))
        .collect();
    // Every client has ended its conversation (its last request a ROLLBACK) and is
    // still connected: in transaction mode none may hold a server (a ReadyForQuery
    // counted that never comes would keep one for good).
    within(Duration::from_secs(120), "the conversations", done.wait()).await;
    let lent = servers_lent(&s, &db).await;
    done.wait().await;
    assert_eq!(lent, lent_after, "servers lent out\n{}", s.diagnostics());
    for t in tasks {
        within(Duration::from_secs(120), "a differential client", t)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", s.diagnostics()));
    }
}

/// Transaction mode with statement tracking: eight clients over two servers that
/// keep three statements each.
#[tokio::test]
async fn an_extended_protocol_conversation_is_answered_as_postgres_answers_it() {
    let setup = |b: SluiceBuilder| {
        b.setting("default_pool_size", &POOL.to_string())
            .setting("max_prepared_statements", &CACHE.to_string())
    };
    differential("txn_diff", setup, true, "0").await;
}

/// Transaction mode without statement tracking (`max_prepared_statements = 0`, the
/// relay's plain path only): unnamed statements and portals, COPY, FunctionCalls,
/// Queries inside batches.
#[tokio::test]
async fn without_statement_tracking_the_unnamed_conversation_is_answered_the_same() {
    let setup = |b: SluiceBuilder| {
        b.setting("default_pool_size", &POOL.to_string())
            .setting("max_prepared_statements", "0")
    };
    differential("txn_diff_plain", setup, false, "0").await;
}

/// Session mode: each client keeps its server, so everything goes, through the
/// plain path (a server per client: all eight lent out at the end).
#[tokio::test]
async fn in_session_mode_the_conversation_is_answered_the_same() {
    let setup = |b: SluiceBuilder| {
        b.setting("pool_mode", "session")
            .setting("default_pool_size", &CLIENTS.to_string())
    };
    differential("session_diff", setup, true, &CLIENTS.to_string()).await;
}
