//! The registry of pools, keyed by (database, user) as the client named them.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::{Pool, PoolConfig};
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
}

impl Pools {
    pub fn new() -> Pools {
        Pools {
            map: Mutex::new(HashMap::new()),
            ids: Arc::new(AtomicU64::new(1)),
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
        let pool = Arc::new(Pool::new(key.clone(), make(), self.ids.clone()));
        map.insert(key.clone(), pool.clone());
        pool
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

    /// Periodic upkeep: closes idle connections past their limits.
    pub fn maintain(&self) {
        for p in self.all() {
            p.close_expired_idle();
        }
    }

    /// Total connections lent to clients across all pools.
    pub fn active_servers(&self) -> u32 {
        self.all().iter().map(|p| p.counts().active).sum()
    }
}
