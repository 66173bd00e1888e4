//! `autodb_idle_timeout`: databases made from the `*` entry are forgotten once unused
//! for that long, as in PgBouncer. A multi-tenant setup that reaches thousands of
//! databases through `*` would otherwise keep a pool, a console row and limit counters
//! for every database ever asked for.

use std::collections::HashMap;
use std::sync::Arc;

use super::registry::Pools;
use super::Pool;
use crate::clock::Tick;
use crate::config::Config;

impl Pools {
    /// Forgets the pools of every database made from `*` that has had no client and
    /// no server connection for `autodb_idle_timeout` (0: never), unless paused
    /// (`paused(db)`, as PgBouncer). `clients(db)` is the database's logged-in client
    /// count. Called by the janitor; the time a database became unused is kept here.
    pub fn reclaim_autodbs(
        &self,
        cfg: &Config,
        now: Tick,
        clients: impl Fn(&str) -> u32,
        paused: impl Fn(&str) -> bool,
    ) {
        let timeout = cfg.settings.autodb_idle_timeout;
        let mut unused = self.auto_unused();
        if timeout.is_zero() || cfg.fallback_database.is_none() {
            unused.clear();
            return;
        }
        // Per auto database: whether any of its pools is in use.
        let mut in_use: HashMap<String, bool> = HashMap::new();
        for pool in self.all() {
            let db = &pool.key.database;
            if cfg.databases.contains_key(db) {
                continue;
            }
            let busy = pool_in_use(&pool, 2);
            *in_use.entry(db.clone()).or_default() |= busy;
        }
        unused.retain(|db, _| in_use.get(db) == Some(&false));
        let mut expired = Vec::new();
        for (db, busy) in in_use {
            if busy || clients(&db) > 0 || paused(&db) {
                unused.remove(&db);
                continue;
            }
            let since = *unused.entry(db.clone()).or_insert(now);
            if now.reached(since, timeout) {
                expired.push(db);
            }
        }
        for db in &expired {
            unused.remove(db);
        }
        drop(unused);
        for db in expired {
            let closed = self.forget_database(&db, |pool| pool_in_use(pool, 1));
            if closed > 0 {
                tracing::info!("database {db}: unused for {timeout:?} (autodb_idle_timeout), its {closed} pool(s) freed");
            }
        }
    }
}

/// Whether a pool has a client holding it (a logged-in session keeps its pool), a
/// server connection of any kind, or a waiter. `refs`: the references the caller
/// knows of (the registry's, and its own copy if it made one); any other is a user.
fn pool_in_use(pool: &Arc<Pool>, refs: usize) -> bool {
    let c = pool.counts();
    Arc::strong_count(pool) > refs || c.total > 0 || c.active > 0 || c.idle > 0 || c.waiting > 0
}
