//! The registry of pools, keyed by (database, user) as the client named them.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::limits::{ConnLimit, PoolLimits};
use super::{Pool, PoolConfig};

/// The shared limit for `name`, created on first use.
fn limit_for(map: &Mutex<HashMap<String, Arc<ConnLimit>>>, name: &str) -> Arc<ConnLimit> {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(name.to_owned()).or_default().clone()
}
use crate::config::Config;

/// A pool's identity: the client-side database and user names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
}

/// The (database, user) names a pool is found by, owned ([`PoolKey`]) or borrowed
/// (`(&str, &str)`): a login looks its pool up by the names it read, and copies them
/// only to make a new pool. Both hash and compare alike, through [`Names::names`].
trait Names {
    fn names(&self) -> (&str, &str);
}

impl Names for PoolKey {
    fn names(&self) -> (&str, &str) {
        (&self.database, &self.user)
    }
}

impl Names for (&str, &str) {
    fn names(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> Borrow<dyn Names + 'a> for PoolKey {
    fn borrow(&self) -> &(dyn Names + 'a) {
        self
    }
}

impl Hash for dyn Names + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

impl PartialEq for dyn Names + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for dyn Names + '_ {}

// By hand, not derived: a map keyed by `PoolKey` and searched by `dyn Names` needs
// the two hashes to agree.
impl Hash for PoolKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.names().hash(h);
    }
}

/// All pools of one Sluice instance. Owned by the app state; nothing global.
#[derive(Debug, Default)]
pub struct Pools {
    map: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// Server connection ids, shared by all pools.
    ids: Arc<AtomicU64>,
    /// `max_db_connections` counters by database name.
    db_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    /// `max_user_connections` counters by user name.
    user_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    /// Databases made from `*` with no client or server, since when (pool/autodb.rs).
    auto_unused: Mutex<HashMap<String, crate::clock::Tick>>,
    /// Pools with no client or server, since when (pool/idle_pools.rs).
    pools_unused: Mutex<HashMap<PoolKey, crate::clock::Tick>>,
}

impl Pools {
    pub fn new() -> Pools {
        Pools {
            map: Mutex::new(HashMap::new()),
            ids: Arc::new(AtomicU64::new(1)),
            db_limits: Mutex::new(HashMap::new()),
            user_limits: Mutex::new(HashMap::new()),
            auto_unused: Mutex::new(HashMap::new()),
            pools_unused: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn pools_unused(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<PoolKey, crate::clock::Tick>> {
        self.pools_unused.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn db_limits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ConnLimit>>> {
        self.db_limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn user_limits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ConnLimit>>> {
        self.user_limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn auto_unused(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, crate::clock::Tick>> {
        self.auto_unused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes every pool of `database` and closes them, unless `in_use` says one of
    /// them is (checked under the registry's lock, so no login can take one meanwhile:
    /// a later login makes a new pool). Returns how many were removed.
    pub(super) fn forget_database(
        &self,
        database: &str,
        in_use: impl Fn(&Arc<Pool>) -> bool,
    ) -> usize {
        let removed: Vec<Arc<Pool>> = {
            let mut map = self.lock();
            let mine = || map.iter().filter(|(k, _)| k.database == database);
            if mine().any(|(_, p)| in_use(p)) {
                return 0;
            }
            let keys: Vec<PoolKey> = mine().map(|(k, _)| k.clone()).collect();
            let removed = keys.iter().filter_map(|k| map.remove(k)).collect();
            // Under the registry's lock, as `get_or_create` takes a counter: a login
            // meanwhile cannot make a pool holding the counter dropped here, which
            // would count the database's connections in two counters.
            let mut limits = self.db_limits();
            if limits.get(database).is_some_and(|l| l.count() == 0) {
                limits.remove(database);
            }
            removed
        };
        for p in &removed {
            p.close();
        }
        removed.len()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Arc<Pool>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool for (`database`, `user`), created with `make()` if it does not exist
    /// yet.
    pub fn get_or_create(
        &self,
        database: &str,
        user: &str,
        make: impl FnOnce() -> PoolConfig,
    ) -> Arc<Pool> {
        let mut map = self.lock();
        if let Some(p) = map.get(&(database, user) as &dyn Names) {
            return p.clone();
        }
        let key = PoolKey {
            database: database.to_owned(),
            user: user.to_owned(),
        };
        let limits = PoolLimits {
            db: limit_for(&self.db_limits, database),
            user: limit_for(&self.user_limits, user),
        };
        let pool = Arc::new(Pool::new(
            key.clone(),
            make(),
            self.ids.clone(),
            limits.clone(),
        ));
        limits.db.add_member(&pool);
        limits.user.add_member(&pool);
        map.insert(key, pool.clone());
        pool
    }

    /// The pool for (`database`, `user`), if there is one.
    pub fn get(&self, database: &str, user: &str) -> Option<Arc<Pool>> {
        self.lock().get(&(database, user) as &dyn Names).cloned()
    }

    /// A fresh server connection id (`S-<id>`), for a connection no pool owns: a
    /// cancel request's.
    pub fn next_server_id(&self) -> u64 {
        self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The welcome parameters of another pool reaching the same server database, for
    /// a new pool that cannot open a connection yet (a shared limit is full). The
    /// client's own server values are applied when it gets a server.
    pub fn sibling_welcome(&self, pool: &Pool) -> Option<Arc<Vec<(String, String)>>> {
        let cfg = pool.config();
        self.all().into_iter().find_map(|p| {
            let c = p.config();
            (c.addr == cfg.addr && c.dbname == cfg.dbname)
                .then(|| p.welcome())
                .flatten()
        })
    }

    /// Every pool, for maintenance and the console.
    pub fn all(&self) -> Vec<Arc<Pool>> {
        self.lock().values().cloned().collect()
    }

    /// Applies a reloaded config: pools whose database is gone are closed, the others
    /// take their new settings (retiring connections whose server side changed).
    pub fn reconfigure(&self, cfg: &Config) {
        let mut closed = Vec::new();
        {
            let mut map = self.lock();
            map.retain(|key, pool| {
                let db = cfg
                    .databases
                    .get(&key.database)
                    .or(cfg.fallback_database.as_ref());
                match db {
                    Some(db) => {
                        pool.reconfigure(PoolConfig::new(cfg, db, &key.database, &key.user));
                        true
                    }
                    None => {
                        closed.push(pool.clone());
                        false
                    }
                }
            });
        }
        for p in closed {
            p.close();
        }
    }

    /// Periodic upkeep: closes idle connections past their limits, lets clients
    /// waiting in line log in new servers where there is room (pool/login_hold.rs),
    /// and keeps `min_pool_size` warm, except in the databases `paused` names: a
    /// PAUSE leaves its databases without servers until RESUME (the old primary of a
    /// failover, say), as PgBouncer keeps none during a pause (its janitor closes
    /// any it finds).
    pub fn maintain(&self, paused: impl Fn(&str) -> bool) {
        let now = crate::clock::Tick::now();
        for p in self.all() {
            p.expire_waiters(now);
            p.close_expired_idle();
            p.grant_room_to_waiters();
            if !paused(&p.key.database) {
                p.fill_min();
            }
        }
    }

    /// Server connections open to a database (all its pools), for limits and SHOW.
    pub fn db_connections(&self, database: &str) -> u32 {
        let m = self.db_limits.lock().unwrap_or_else(|p| p.into_inner());
        m.get(database).map_or(0, |l| l.count())
    }

    /// Total connections lent to clients across all pools.
    pub fn active_servers(&self) -> u32 {
        self.all().iter().map(|p| p.counts().active).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_pool_is_found_by_the_names_it_was_made_for() {
        let ini = "[databases]\na = host=127.0.0.1 port=1\nb = host=127.0.0.1 port=1\nab = host=127.0.0.1 port=1\n";
        let cfg = Config::from_ini_str(ini, Path::new("test.ini")).expect("config");
        let pools = Pools::new();
        let mut made = 0;
        let mut get = |db: &str, user: &str| {
            let entry = cfg.database_entry(db).expect("entry");
            pools.get_or_create(db, user, || {
                made += 1;
                PoolConfig::new(&cfg, &entry, db, user)
            })
        };
        let a_u = get("a", "u");
        assert!(Arc::ptr_eq(&a_u, &get("a", "u")));
        let a_v = get("a", "v");
        let b_u = get("b", "u");
        assert!(!Arc::ptr_eq(&a_u, &a_v) && !Arc::ptr_eq(&a_u, &b_u));
        // Names that run together alike are still told apart.
        let ab = get("a", "bu");
        assert!(!Arc::ptr_eq(&ab, &get("ab", "u")));
        assert_eq!(made, 5);
        assert_eq!(
            (a_v.key.database.as_str(), a_v.key.user.as_str()),
            ("a", "v")
        );
    }
}
