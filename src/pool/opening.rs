//! Server connections being opened: SHOW SERVERS lists them as `new` (SOCKETS as
//! `sv_login`) from the connect until the login is done or has failed, as PgBouncer
//! lists its `new_server_list`. Kept apart from the pool's hot state: a login is rare
//! next to the checkouts and releases that lock that.

use std::sync::{Mutex, MutexGuard};

use super::{Pool, ServerAddr};
use crate::clock::Tick;

/// A server connection being opened.
#[derive(Debug, Clone)]
pub struct Opening {
    /// Its `S-<id>`.
    pub id: u64,
    /// The host it is trying.
    pub addr: ServerAddr,
    pub since: Tick,
}

/// The pool's connections being opened.
#[derive(Debug, Default)]
pub(crate) struct Openings(Mutex<Vec<Opening>>);

impl Openings {
    fn lock(&self) -> MutexGuard<'_, Vec<Opening>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Lists a connection being opened until dropped.
pub(crate) struct OpeningMark<'a> {
    openings: &'a Openings,
    id: u64,
}

impl Drop for OpeningMark<'_> {
    fn drop(&mut self) {
        self.openings.lock().retain(|o| o.id != self.id);
    }
}

impl Pool {
    /// Lists connection `id` as being opened to `addr` until the mark is dropped.
    pub(crate) fn opening(&self, id: u64, addr: &ServerAddr) -> OpeningMark<'_> {
        self.openings.lock().push(Opening {
            id,
            addr: addr.clone(),
            since: Tick::now(),
        });
        OpeningMark {
            openings: &self.openings,
            id,
        }
    }

    /// The connections being opened, oldest first.
    pub fn openings(&self) -> Vec<Opening> {
        self.openings.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opening_is_listed_until_its_mark_is_dropped() {
        let pool = Pool::one_slot_for_tests();
        let addr = ServerAddr::for_host("127.0.0.1", 1);
        let a = pool.opening(7, &addr);
        let b = pool.opening(8, &addr);
        let ids = |p: &Pool| p.openings().iter().map(|o| o.id).collect::<Vec<_>>();
        assert_eq!(ids(&pool), [7, 8]);
        drop(a);
        assert_eq!(ids(&pool), [8]);
        drop(b);
        assert!(pool.openings().is_empty());
    }
}
