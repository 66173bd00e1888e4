//! The registry of live clients: every logged-in client's [`ClientInfo`], by id, for
//! the console and the metrics endpoint to read.

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::conns::{lock, ClientInfo, ClientMeta};

/// Every registered client, by id.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    // Fx: the ids are ours (sequential), nothing a peer picks.
    map: Mutex<FxHashMap<u64, Arc<ClientInfo>>>,
}

/// Keeps a client registered until dropped.
#[derive(Debug)]
pub struct Registered {
    registry: Arc<ClientRegistry>,
    pub info: Arc<ClientInfo>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(self.info.meta.id);
    }
}

impl std::ops::Deref for Registered {
    type Target = ClientInfo;
    fn deref(&self) -> &ClientInfo {
        &self.info
    }
}

impl ClientRegistry {
    /// Registers a client for as long as the returned guard lives.
    pub fn register(self: &Arc<Self>, meta: ClientMeta) -> Registered {
        let info = Arc::new(ClientInfo::new(meta));
        self.add(&info);
        Registered {
            registry: self.clone(),
            info,
        }
    }

    /// Registers a client until [`ClientRegistry::remove`] (its owner's drop).
    pub fn add(&self, info: &Arc<ClientInfo>) {
        lock(&self.map).insert(info.meta.id, info.clone());
    }

    pub fn remove(&self, id: u64) {
        lock(&self.map).remove(&id);
    }

    /// Calls `f` on every registered client, in no order, under the registry's lock.
    pub fn for_each(&self, mut f: impl FnMut(&ClientInfo)) {
        for c in lock(&self.map).values() {
            f(c);
        }
    }

    /// Every registered client, ordered by id.
    pub fn all(&self) -> Vec<Arc<ClientInfo>> {
        let mut v: Vec<_> = lock(&self.map).values().cloned().collect();
        v.sort_by_key(|c| c.meta.id);
        v
    }

    pub fn get(&self, id: u64) -> Option<Arc<ClientInfo>> {
        lock(&self.map).get(&id).cloned()
    }

    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
