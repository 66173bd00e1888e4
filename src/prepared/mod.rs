//! Protocol-level named prepared statements in transaction and statement pooling.
//!
//! A client's statement names mean nothing on the server it happens to get next, so
//! Sluice keeps the statements itself:
//! - [`Registry`] (one per instance) gives each distinct (query text, parameter types)
//!   one [`Statement`] with a Sluice-owned server-side name `SLUICE_<id>`;
//! - [`ClientStatements`] maps one client's names to those statements;
//! - [`ServerStatements`] (one per server connection) remembers which statements that
//!   server has prepared, least recently used first out beyond
//!   `max_prepared_statements`.
//!
//! The relay rewrites Parse/Bind/Describe/Close on the way in (`rewrite.rs`) and fixes
//! the response stream on the way out (`responses.rs`): responses to Parses it injected
//! are swallowed, and ParseComplete for Parses it did not need to send is synthesized,
//! each in its place in the stream.

mod copy;
pub mod deferred;
mod inject;
mod names;
pub mod responses;
pub mod rewrite;
pub mod sql;
mod undo;

#[cfg(test)]
mod hostile_tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustc_hash::FxHashMap;

/// Largest number of statement names one client may hold at once; Parse beyond it
/// gets an error. Bounds a client's memory whatever it sends.
pub const MAX_CLIENT_STATEMENTS: usize = 10_000;

/// Key prefix for SQL-level statements: a Parse body starts with query text, which
/// cannot hold a NUL, so the two kinds never collide.
const SQL_KEY: &[u8] = b"\0sql:";

/// Entries the registry keeps before dropping statements no client holds any more.
const REGISTRY_SOFT_LIMIT: usize = 10_000;

/// Whether a statement name is in Sluice's namespace on the servers: `SLUICE_<id>`,
/// `sluice_<id>` and the names of Sluice's own throwaway statements. A client that
/// does not hold such a name must not reach the server's statement by it (another
/// client's), so the rewriter answers it as PostgreSQL answers a name never prepared.
pub fn is_sluice_name(name: &[u8]) -> bool {
    name.starts_with(b"SLUICE_") || name.starts_with(b"sluice_")
}

/// One distinct statement, shared by every client that prepared the same text.
#[derive(Debug)]
pub struct Statement {
    pub id: u64,
    /// The name used on servers: `SLUICE_<id>` for protocol-level statements,
    /// `sluice_<id>` (a plain SQL identifier) for SQL-level ones.
    pub server_name: String,
    /// Prepared with SQL `PREPARE` (body is the text after the name).
    pub sql: bool,
    /// Query text and parameter types as the Parse body holds them after the name.
    pub body: Bytes,
}

/// Statements are identified by id.
impl PartialEq for Statement {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Statement {}

impl Statement {
    /// The message that prepares this statement on a server: a Parse, or a Query
    /// with `PREPARE` for SQL-level statements.
    pub fn parse_message(&self, out: &mut bytes::BytesMut) {
        use bytes::BufMut;
        if self.sql {
            let text = self.prepare_text();
            out.put_u8(b'Q');
            out.put_u32((4 + text.len() + 1) as u32);
            out.extend_from_slice(text.as_bytes());
            out.put_u8(0);
            return;
        }
        out.put_u8(b'P');
        out.put_u32((4 + self.server_name.len() + 1 + self.body.len()) as u32);
        out.extend_from_slice(self.server_name.as_bytes());
        out.put_u8(0);
        out.extend_from_slice(&self.body);
    }
}

impl Statement {
    /// `PREPARE <server name> <text>` for an SQL-level statement.
    pub fn prepare_text(&self) -> String {
        let text = self.body.get(SQL_KEY.len()..).unwrap_or_default();
        format!(
            "PREPARE {} {}",
            self.server_name,
            String::from_utf8_lossy(text)
        )
    }
}

/// All statements of one Sluice instance, deduplicated by text and parameter types.
#[derive(Debug, Default)]
pub struct Registry {
    map: Mutex<HashMap<Bytes, Arc<Statement>>>,
    next_id: AtomicU64,
}

impl Registry {
    /// The statement for a Parse body (after its name), created on first sight.
    pub fn intern(&self, body: Bytes) -> Arc<Statement> {
        self.intern_kind(body, false)
    }

    /// The statement for an SQL `PREPARE name <rest>`.
    pub fn intern_sql(&self, rest: &str) -> Arc<Statement> {
        let mut key = Vec::with_capacity(SQL_KEY.len() + rest.len());
        key.extend_from_slice(SQL_KEY);
        key.extend_from_slice(rest.as_bytes());
        self.intern_kind(Bytes::from(key), true)
    }

    fn intern_kind(&self, body: Bytes, sql: bool) -> Arc<Statement> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(&body) {
            return s.clone();
        }
        if map.len() >= REGISTRY_SOFT_LIMIT {
            // Only the registry holds these: no client can name them any more. A
            // server may still have one prepared; a later client gets a new name.
            map.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let s = Arc::new(Statement {
            id,
            server_name: if sql {
                format!("sluice_{id}")
            } else {
                format!("SLUICE_{id}")
            },
            sql,
            body: body.clone(),
        });
        map.insert(body, s.clone());
        s
    }

    /// Replaces a statement whose plan went stale (its result type changed): the
    /// same text gets a new id and server name from now on.
    pub fn replace(&self, stale: &Statement) -> Arc<Statement> {
        {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if map.get(&stale.body).is_some_and(|s| s.id == stale.id) {
                map.remove(&stale.body);
            }
        }
        self.intern_kind(stale.body.clone(), stale.sql)
    }

    /// Statements currently known (for SHOW and tests).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One client's statement names: protocol-level (Parse) and SQL-level (PREPARE, the
/// name folded as an SQL identifier) in one namespace, as in PostgreSQL, so that
/// EXECUTE runs a Parsed statement and Bind binds a PREPAREd one.
#[derive(Debug, Default)]
pub struct ClientStatements {
    names: HashMap<String, Arc<Statement>>,
    /// The name [`ClientStatements::find`] found last, and its statement: a driver
    /// binds one statement over and over, and comparing its name costs less than
    /// hashing it (SipHash: the names are the client's). Cleared by every change.
    last_name: Vec<u8>,
    last: Option<Arc<Statement>>,
}

impl ClientStatements {
    pub fn get(&self, name: &str) -> Option<&Arc<Statement>> {
        self.names.get(name)
    }

    /// The statement a name as sent (not yet checked for UTF-8) is bound to, for a
    /// Bind or Describe; `Err` if the name is not UTF-8.
    pub fn find(&mut self, name: &[u8]) -> Result<Option<Arc<Statement>>, std::str::Utf8Error> {
        if let Some(st) = self.last.as_ref().filter(|_| self.last_name == name) {
            return Ok(Some(st.clone()));
        }
        let found = self.names.get(std::str::from_utf8(name)?).cloned();
        if let Some(st) = &found {
            self.last_name.clear();
            self.last_name.extend_from_slice(name);
            self.last = Some(st.clone());
        }
        Ok(found)
    }

    /// Whether `name` is taken.
    pub fn holds(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Binds `name` to a statement; false when the client already holds too many.
    pub fn insert(&mut self, name: String, stmt: Arc<Statement>) -> bool {
        if self.len() >= MAX_CLIENT_STATEMENTS && !self.names.contains_key(&name) {
            return false;
        }
        self.last = None;
        self.names.insert(name, stmt);
        true
    }

    pub fn remove(&mut self, name: &str) {
        self.last = None;
        self.names.remove(name);
    }

    /// Points every name bound to statement `old` at `new`.
    pub fn repoint(&mut self, old: u64, new: &Arc<Statement>) {
        self.last = None;
        for v in self.names.values_mut() {
            if v.id == old {
                *v = new.clone();
            }
        }
    }

    pub fn clear(&mut self) {
        self.last = None;
        self.names.clear();
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Which statements one server connection has prepared, with use ticks for LRU.
#[derive(Debug, Default)]
pub struct ServerStatements {
    /// Statement id to (server name, last use tick).
    /// (Fx: the ids are ours.)
    entries: FxHashMap<u64, (String, u64)>,
    tick: u64,
}

/// A statement taken out of a server's cache to make room: closed on the server,
/// unless that Close is skipped after an error, when it goes back in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evicted {
    pub id: u64,
    pub server_name: String,
    tick: u64,
}

impl ServerStatements {
    /// Whether the server has `stmt`; marks it used.
    pub fn touch(&mut self, stmt: &Statement) -> bool {
        self.tick += 1;
        match self.entries.get_mut(&stmt.id) {
            Some(e) => {
                e.1 = self.tick;
                true
            }
            None => false,
        }
    }

    /// Takes out the least recently used statement if the cache is at `max` (0: no
    /// limit), before an insert. (A portal built on it stays open: PostgreSQL keeps
    /// a portal whose statement is closed.)
    pub fn evict_for_one_more(&mut self, max: usize) -> Option<Evicted> {
        if max == 0 || self.entries.len() < max {
            return None;
        }
        let (&id, _) = self.entries.iter().min_by_key(|(_, e)| e.1)?;
        let (server_name, tick) = self.entries.remove(&id)?;
        Some(Evicted {
            id,
            server_name,
            tick,
        })
    }

    /// Puts back a statement whose eviction never reached the server.
    pub fn reinstate(&mut self, e: Evicted) {
        self.entries.entry(e.id).or_insert((e.server_name, e.tick));
    }

    /// Records that `stmt` is being prepared (after [`Self::evict_for_one_more`]).
    pub fn insert(&mut self, stmt: &Statement) {
        self.tick += 1;
        self.entries
            .insert(stmt.id, (stmt.server_name.clone(), self.tick));
    }

    /// Forgets a statement whose Parse did not happen (error or skipped).
    pub fn forget(&mut self, id: u64) {
        self.entries.remove(&id);
    }

    /// Forgets everything (after DISCARD ALL or DEALLOCATE ALL ran on the server).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One session's statement state, and a rewriter context over it (a cache of 2
/// statements per server): for the rewriter's tests and the `prepared` fuzz target.
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, Default)]
pub struct TestState {
    pub registry: Registry,
    pub client: ClientStatements,
    pub server: ServerStatements,
    pub tracker: responses::ResponseTracker,
    pub parses: u64,
    /// The server's transaction failed (see [`rewrite::Ctx::aborted`]).
    pub aborted: bool,
}

#[cfg(any(test, feature = "fuzzing"))]
impl TestState {
    pub fn ctx(&mut self) -> rewrite::Ctx<'_> {
        rewrite::Ctx {
            registry: &self.registry,
            client: &mut self.client,
            server: &mut self.server,
            tracker: &mut self.tracker,
            max_prepared: 2,
            server_parses: &mut self.parses,
            aborted: self.aborted,
            deferred: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_dedups_by_body() {
        let r = Registry::default();
        let a = r.intern(Bytes::from_static(b"select 1\0\0\0"));
        let b = r.intern(Bytes::from_static(b"select 1\0\0\0"));
        let c = r.intern(Bytes::from_static(b"select 2\0\0\0"));
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(a.server_name, format!("SLUICE_{}", a.id));
    }

    #[test]
    fn server_cache_evicts_least_recently_used() {
        let r = Registry::default();
        let s: Vec<_> = (0..3)
            .map(|i| r.intern(Bytes::from(format!("q{i}\0\0\0"))))
            .collect();
        let mut c = ServerStatements::default();
        let add = |c: &mut ServerStatements, st: &Statement| {
            let out = c.evict_for_one_more(2).map(|e| e.server_name);
            c.insert(st);
            out
        };
        assert_eq!(add(&mut c, &s[0]), None);
        assert_eq!(add(&mut c, &s[1]), None);
        assert!(c.touch(&s[0]));
        assert_eq!(add(&mut c, &s[2]), Some(s[1].server_name.clone()));
        assert!(!c.touch(&s[1]));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn an_eviction_undone_puts_the_statement_back() {
        let r = Registry::default();
        let s: Vec<_> = (0..2)
            .map(|i| r.intern(Bytes::from(format!("q{i}\0\0\0"))))
            .collect();
        let mut c = ServerStatements::default();
        c.insert(&s[0]);
        let e = c.evict_for_one_more(1).expect("an eviction");
        assert_eq!(e.server_name, s[0].server_name);
        c.insert(&s[1]);
        assert!(!c.touch(&s[0]));
        c.reinstate(e);
        assert!(c.touch(&s[0]));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn parse_message_bytes() {
        let r = Registry::default();
        let s = r.intern(Bytes::from_static(b"select 1\0\0\0"));
        let mut out = bytes::BytesMut::new();
        s.parse_message(&mut out);
        let len = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!(len + 1, out.len());
        assert!(out.ends_with(b"\0select 1\0\0\0"));
    }

    #[test]
    fn a_name_found_again_follows_every_change_to_it() {
        let r = Registry::default();
        let (s1, s2) = (
            r.intern(Bytes::from_static(b"q1\0\0\0")),
            r.intern(Bytes::from_static(b"q2\0\0\0")),
        );
        let mut c = ClientStatements::default();
        let id = |c: &mut ClientStatements, n: &[u8]| c.find(n).expect("UTF-8").map(|s| s.id);
        assert!(c.insert("a".into(), s1.clone()));
        assert_eq!(id(&mut c, b"a"), Some(s1.id));
        assert_eq!(id(&mut c, b"a"), Some(s1.id), "found again");
        assert_eq!(id(&mut c, b"b"), None);
        // Rebound, repointed, removed, cleared: the name found last is not kept.
        assert!(c.insert("a".into(), s2.clone()));
        assert_eq!(id(&mut c, b"a"), Some(s2.id));
        let s3 = r.replace(&s2);
        c.repoint(s2.id, &s3);
        assert_eq!(id(&mut c, b"a"), Some(s3.id));
        c.remove("a");
        assert_eq!(id(&mut c, b"a"), None);
        assert!(c.insert("a".into(), s1.clone()));
        assert_eq!(id(&mut c, b"a"), Some(s1.id));
        c.clear();
        assert_eq!(id(&mut c, b"a"), None);
        assert!(c.find(b"\xff").is_err(), "not UTF-8");
    }
}
