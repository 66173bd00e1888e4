//! `pool_idle_timeout` (PgBouncer after 1.25.2): a pool that has had no client, no
//! server connection and no waiting client for that long is freed. A setup whose
//! users come and go (a new user name per deployment, say) would otherwise keep a
//! pool, a SHOW POOLS row and limit counters for every (database, user) ever seen.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::autodb::pool_in_use;
use super::registry::{PoolKey, Pools};
use super::Pool;
use crate::clock::Tick;

impl Pools {
    /// Frees every pool unused for `timeout` (0: never). A pool's servers close first
    /// by `server_idle_timeout`, and `min_pool_size` keeps a used pool's, so such a
    /// pool stays. Called by the janitor; when each pool became unused is kept here.
    /// Returns how many pools were freed.
    pub fn reclaim_idle_pools(&self, timeout: Duration, now: Tick) -> usize {
        let mut unused = self.pools_unused();
        if timeout.is_zero() {
            unused.clear();
            return 0;
        }
        // `all()`'s copy and the registry's: any other reference is a user.
        let idle: HashSet<PoolKey> = self
            .all()
            .iter()
            .filter(|p| !pool_in_use(p, 2))
            .map(|p| p.key.clone())
            .collect();
        // A pool in use again has its time start over when it is next unused.
        unused.retain(|k, _| idle.contains(k));
        let mut expired = Vec::new();
        for key in idle {
            let since = *unused.entry(key.clone()).or_insert(now);
            if now.reached(since, timeout) {
                unused.remove(&key);
                expired.push(key);
            }
        }
        drop(unused);
        if expired.is_empty() {
            return 0;
        }
        let freed = self.forget_pools(&expired);
        for p in &freed {
            tracing::debug!(
                "pool {}/{}: unused for {timeout:?} (pool_idle_timeout), freed",
                p.key.database,
                p.key.user
            );
            p.close();
        }
        if !freed.is_empty() {
            tracing::info!(
                "{} pool(s) unused for {timeout:?} freed (pool_idle_timeout)",
                freed.len()
            );
        }
        freed.len()
    }

    /// Removes the pools named by `keys` that are still unused, checked under the
    /// registry's lock so that no login takes one meanwhile (a later login makes a new
    /// pool). The limit counters of a database or user left without pools go too.
    fn forget_pools(&self, keys: &[PoolKey]) -> Vec<Arc<Pool>> {
        let mut map = self.lock();
        let mut freed = Vec::new();
        for key in keys {
            if map.get(key).is_some_and(|p| !pool_in_use(p, 1)) {
                freed.extend(map.remove(key));
            }
        }
        if freed.is_empty() {
            return freed;
        }
        let (dbs, users) =
            map.keys()
                .fold((HashSet::new(), HashSet::new()), |(mut d, mut u), k| {
                    d.insert(k.database.as_str());
                    u.insert(k.user.as_str());
                    (d, u)
                });
        // Under the registry's lock, as `get_or_create` takes a counter: a new pool
        // cannot be handed one being dropped here.
        let prune = |limits: &mut HashMap<String, Arc<super::limits::ConnLimit>>,
                     kept: &HashSet<&str>| {
            limits.retain(|name, l| kept.contains(name.as_str()) || l.count() > 0);
        };
        prune(&mut self.db_limits(), &dbs);
        prune(&mut self.user_limits(), &users);
        freed
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::pool::autodb::tests::{names, pool};

    fn config() -> Config {
        let ini = "[databases]\nd = host=127.0.0.1 port=1\ne = host=127.0.0.1 port=1\n";
        Config::from_ini_str(ini, Path::new("test.ini")).expect("config")
    }

    #[test]
    fn a_pool_unused_for_the_timeout_is_freed_and_one_held_stays() {
        let cfg = config();
        let pools = Pools::new();
        for (db, user) in [("d", "u"), ("d", "v"), ("e", "v")] {
            pool(&pools, &cfg, db, user);
        }
        let held = pool(&pools, &cfg, "e", "w");
        let t = Duration::from_secs(2);
        let t0 = Tick::now();
        assert_eq!(pools.reclaim_idle_pools(t, t0), 0);
        assert_eq!(pools.reclaim_idle_pools(t, t0 + Duration::from_secs(1)), 0);
        assert_eq!(names(&pools).len(), 4, "gone before the timeout");
        assert_eq!(pools.reclaim_idle_pools(t, t0 + Duration::from_secs(3)), 3);
        assert_eq!(names(&pools), ["e/w"]);
        // The counters of the database and users left without a pool went with them.
        assert!(!pools.db_limits().contains_key("d"));
        assert!(!pools.user_limits().contains_key("u"));
        assert!(pools.user_limits().contains_key("w"));
        // Once its holder lets go, its unused time starts then.
        let t1 = t0 + Duration::from_secs(10);
        pools.reclaim_idle_pools(t, t1);
        drop(held);
        pools.reclaim_idle_pools(t, t1 + Duration::from_secs(1));
        assert_eq!(pools.reclaim_idle_pools(t, t1 + Duration::from_secs(2)), 0);
        assert_eq!(pools.reclaim_idle_pools(t, t1 + Duration::from_secs(3)), 1);
        assert!(names(&pools).is_empty());
        // A pool asked for again is made anew.
        pool(&pools, &cfg, "d", "u");
        assert_eq!(names(&pools), ["d/u"]);
    }

    #[test]
    fn a_zero_timeout_keeps_every_pool() {
        let cfg = config();
        let pools = Pools::new();
        pool(&pools, &cfg, "d", "u");
        let t0 = Tick::now();
        for s in [0, 5, 100_000] {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(pools.reclaim_idle_pools(Duration::ZERO, at), 0);
        }
        assert_eq!(names(&pools), ["d/u"]);
    }
}
