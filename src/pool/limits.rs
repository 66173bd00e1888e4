//! Server-connection limits shared by several pools: `max_db_connections` (all pools of
//! one database) and `max_user_connections` (all pools of one user).
//!
//! A [`LimitToken`] is held by every server connection counted against a limit and
//! gives its unit back on drop, waking one client waiting for that limit.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use super::{Pool, ServerConn};

/// One shared counter with its waiters and the pools that count against it.
#[derive(Debug, Default)]
pub struct ConnLimit {
    count: Mutex<u32>,
    freed: Notify,
    /// Clients waiting for a unit: only then do idle connections need announcing.
    waiting: std::sync::atomic::AtomicU32,
    members: Mutex<Vec<Weak<Pool>>>,
}

impl ConnLimit {
    /// Registers a pool whose idle connections may be closed to make room.
    pub fn add_member(&self, pool: &Arc<Pool>) {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|w| w.strong_count() > 0);
        m.push(Arc::downgrade(pool));
    }

    /// Takes an idle connection from some member pool, to be closed by the caller.
    pub fn evict_idle(&self) -> Option<ServerConn> {
        let members: Vec<Arc<Pool>> = {
            let m = self.members.lock().unwrap_or_else(|p| p.into_inner());
            m.iter().filter_map(Weak::upgrade).collect()
        };
        members.iter().find_map(|p| p.evict_idle())
    }

    /// Takes one unit if fewer than `max` are in use (`max` 0 means unlimited).
    pub fn try_take(self: &Arc<Self>, max: u32) -> Option<LimitToken> {
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if max != 0 && *c >= max {
            return None;
        }
        *c += 1;
        Some(LimitToken {
            limit: self.clone(),
        })
    }

    /// Connections currently counted.
    pub fn count(&self) -> u32 {
        *self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves when a unit is given back or a connection under this limit goes
    /// idle (and so could be closed to make room), after a failed `try_take`.
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// Marks the caller as waiting for a unit until the guard drops.
    pub fn wait_guard(&self) -> WaitGuard<'_> {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        WaitGuard(self)
    }

    /// A connection under this limit went idle: wake a waiter so it can evict it.
    pub fn idle_available(&self) {
        if self.waiting.load(std::sync::atomic::Ordering::Acquire) > 0 {
            self.freed.notify_one();
        }
    }
}

/// Counts a waiter in [`ConnLimit::wait_guard`].
#[derive(Debug)]
pub struct WaitGuard<'a>(&'a ConnLimit);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// One unit of a [`ConnLimit`], returned on drop.
#[derive(Debug)]
pub struct LimitToken {
    limit: Arc<ConnLimit>,
}

impl Drop for LimitToken {
    fn drop(&mut self) {
        {
            let mut c = self.limit.count.lock().unwrap_or_else(|p| p.into_inner());
            *c = c.saturating_sub(1);
        }
        // notify_one stores a permit when nobody waits yet, so a waiter that checked
        // just before this drop still wakes.
        self.limit.freed.notify_one();
    }
}

/// The limits that apply to one pool's new connections.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    pub db: Arc<ConnLimit>,
    pub user: Arc<ConnLimit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_frees() {
        let l = Arc::new(ConnLimit::default());
        let a = l.try_take(2);
        let b = l.try_take(2);
        assert!(a.is_some() && b.is_some());
        assert!(l.try_take(2).is_none());
        drop(a);
        assert_eq!(l.count(), 1);
        assert!(l.try_take(2).is_some());
        assert!(l.try_take(0).is_some());
    }
}
