//! The registry of pools, keyed by (database, user) as the client named them.

use std::collections::HashMap;
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
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
}

impl Pools {
    pub fn new() -> Pools {
        Pools {
            map: Mutex::new(HashMap::new()),
            ids: Arc::new(AtomicU64::new(1)),
            db_limits: Mutex::new(HashMap::new()),
            user_limits: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Arc<Pool>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool for `key`, created with `make()` if it does not exist yet.
    pub fn get_or_create(&self, key: &PoolKey, make: impl FnOnce() -> PoolConfig) -> Arc<Pool> {
        let mut map = self.lock();
        if let Some(p) = map.get(key) {
            return p.clone();
        }
        let limits = PoolLimits {
            db: limit_for(&self.db_limits, &key.database),
            user: limit_for(&self.user_limits, &key.user),
        };
        let pool = Arc::new(Pool::new(
            key.clone(),
            make(),
            self.ids.clone(),
            limits.clone(),
        ));
        limits.db.add_member(&pool);
        limits.user.add_member(&pool);
        map.insert(key.clone(), pool.clone());
        pool
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

    /// Periodic upkeep: closes idle connections past their limits and keeps
    /// `min_pool_size` warm.
    pub fn maintain(&self) {
        let now = crate::clock::Tick::now();
        for p in self.all() {
            p.expire_waiters(now);
            p.close_expired_idle();
            p.fill_min();
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
