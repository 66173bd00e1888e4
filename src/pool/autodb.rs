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
            if !cfg.databases.contains_key(db) {
                *in_use.entry(db.clone()).or_default() |= pool_in_use(&pool, 2);
            }
        }
        in_use.retain(|db, busy| !*busy && clients(db) == 0 && !paused(db));
        // What is left is unused now; one that was not has its time start now.
        unused.retain(|db, _| in_use.contains_key(db));
        let mut expired = Vec::new();
        for db in in_use.into_keys() {
            let since = *unused.entry(db.clone()).or_insert(now);
            if now.reached(since, timeout) {
                unused.remove(&db);
                expired.push(db);
            }
        }
        drop(unused);
        for db in expired {
            let closed = self.forget_database(&db, |pool| pool_in_use(pool, 1));
            if closed > 0 {
                // PgBouncer's words when it drops a database, for either cause.
                tracing::warn!(
                    "dropping database '{db}' as it does not exist anymore or inactive auto-database"
                );
                tracing::info!("database {db}: unused for {timeout:?} (autodb_idle_timeout), its {closed} pool(s) freed");
            }
        }
    }
}

/// Whether a pool has a client holding it (a logged-in session keeps its pool), a
/// server connection of any kind, or a waiter. `refs`: the references the caller
/// knows of (the registry's, and its own copy if it made one); any other is a user.
pub(super) fn pool_in_use(pool: &Arc<Pool>, refs: usize) -> bool {
    let c = pool.counts();
    // `total` counts every connection: idle, lent out and connecting.
    Arc::strong_count(pool) > refs || c.total > 0 || c.waiting > 0
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::pool::PoolConfig;

    fn config(timeout: u32) -> Config {
        let ini = format!(
            "[databases]\nnamed = host=127.0.0.1 port=1\n* = host=127.0.0.1 port=1\n\
             [pgbouncer]\nautodb_idle_timeout = {timeout}\n"
        );
        Config::from_ini_str(&ini, Path::new("test.ini")).expect("config")
    }

    pub(in crate::pool) fn pool(pools: &Pools, cfg: &Config, db: &str, user: &str) -> Arc<Pool> {
        let entry = cfg.database_entry(db).expect("entry");
        pools.get_or_create(db, user, || PoolConfig::new(cfg, &entry, db, user))
    }

    /// The pools' `database/user` names, sorted.
    pub(in crate::pool) fn names(pools: &Pools) -> Vec<String> {
        let mut v: Vec<String> = pools
            .all()
            .iter()
            .map(|p| format!("{}/{}", p.key.database, p.key.user))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_auto_database_goes_with_all_its_pools_once_unused_for_the_timeout() {
        let cfg = config(2);
        let pools = Pools::new();
        for (db, user) in [("auto", "u"), ("auto", "v"), ("named", "u"), ("kept", "u")] {
            pool(&pools, &cfg, db, user);
        }
        let held = pool(&pools, &cfg, "held", "u");
        let none = |_: &str| 0;
        let paused = |db: &str| db == "kept";
        let t0 = Tick::now();
        pools.reclaim_autodbs(&cfg, t0, none, paused);
        pools.reclaim_autodbs(&cfg, t0 + Duration::from_secs(1), none, paused);
        assert_eq!(names(&pools).len(), 5, "gone before the timeout");
        pools.reclaim_autodbs(&cfg, t0 + Duration::from_secs(3), none, paused);
        // The configured database, the paused one and the one a session holds stay.
        assert_eq!(names(&pools), ["held/u", "kept/u", "named/u"]);
        assert!(
            !pools.db_limits().contains_key("auto"),
            "its counter stayed"
        );
        // A database with a logged-in client stays too, however long.
        let clients = |db: &str| u32::from(db == "held");
        drop(held);
        let t1 = t0 + Duration::from_secs(10);
        pools.reclaim_autodbs(&cfg, t1, clients, paused);
        pools.reclaim_autodbs(&cfg, t1 + Duration::from_secs(3), clients, paused);
        assert!(names(&pools).contains(&"held/u".to_owned()));
        // Once it has none, its unused time starts then.
        let t2 = t1 + Duration::from_secs(4);
        pools.reclaim_autodbs(&cfg, t2, none, paused);
        assert!(names(&pools).contains(&"held/u".to_owned()));
        pools.reclaim_autodbs(&cfg, t2 + Duration::from_secs(3), none, paused);
        assert_eq!(names(&pools), ["kept/u", "named/u"]);
    }

    #[test]
    fn a_zero_timeout_keeps_auto_databases() {
        let cfg = config(0);
        let pools = Pools::new();
        pool(&pools, &cfg, "auto", "u");
        let t0 = Tick::now();
        for s in [0, 5, 100_000] {
            pools.reclaim_autodbs(&cfg, t0 + Duration::from_secs(s), |_| 0, |_| false);
        }
        assert_eq!(names(&pools), ["auto/u"]);
    }
}
