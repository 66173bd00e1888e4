//! Clients still logging in, for SHOW SOCKETS (PgBouncer's `cl_login` list).
//!
//! A login is registered only once it waits: its first poll did not finish it (a
//! startup packet not read yet, a password exchange, an `auth_query`). A login over
//! in its first poll (trust, the startup packet read with the accept) never touches
//! the registry; one that waits pays a lock, an insert and a remove, and no
//! allocation (docs/performance.md, forty-seventh round).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use super::conns::{lock, CompactAddr};
use crate::clock::Tick;
use crate::net::PeerAddr;
use crate::tls::TlsInfo;

/// One login under way. Kept in the registry's table itself: registering allocates
/// nothing but the table's growth.
#[derive(Debug, Clone)]
pub struct LoginEntry {
    pub id: u64,
    pub peer: PeerAddr,
    pub local: Option<CompactAddr>,
    /// When it was registered: within a loop turn of the accept.
    pub since: Tick,
    /// What its startup packet named, once read.
    pub names: Option<LoginNames>,
}

/// A login's database and user, and its TLS session.
#[derive(Debug, Clone)]
pub struct LoginNames {
    pub database: Box<str>,
    pub user: Box<str>,
    pub tls: TlsInfo,
}

/// Every registered login, by client id.
#[derive(Debug, Default)]
pub struct LoginRegistry {
    // Fx: the ids are ours (sequential), nothing a peer picks.
    map: Mutex<FxHashMap<u64, LoginEntry>>,
}

impl LoginRegistry {
    /// Every registered login, ordered by id.
    pub fn all(&self) -> Vec<LoginEntry> {
        let mut v: Vec<_> = lock(&self.map).values().cloned().collect();
        v.sort_by_key(|e| e.id);
        v
    }

    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`LoginWatch`]'s states.
const UNLISTED: u8 = 0;
const LISTED: u8 = 1;
const NAMED: u8 = 2;

/// One client's login, registered on [`LoginWatch::waits`] and taken out of the
/// registry when dropped (the login is over, whatever its end).
#[derive(Debug)]
pub struct LoginWatch<'a> {
    registry: &'a LoginRegistry,
    id: u64,
    peer: &'a PeerAddr,
    local: Option<SocketAddr>,
    state: AtomicU8,
}

impl<'a> LoginWatch<'a> {
    pub fn new(
        registry: &'a LoginRegistry,
        id: u64,
        peer: &'a PeerAddr,
        local: Option<SocketAddr>,
    ) -> LoginWatch<'a> {
        LoginWatch {
            registry,
            id,
            peer,
            local,
            state: AtomicU8::new(UNLISTED),
        }
    }

    /// The login waits, since `at` (a time the caller has anyway): registers it if
    /// not yet.
    pub fn waits(&self, at: Tick) {
        if self.state.load(Relaxed) == UNLISTED {
            self.list(|| at, || None);
        }
    }

    /// The login waits, its startup packet read: registers it if not yet, and names
    /// it with what `names` gives if it has no names yet.
    pub fn waits_named(&self, names: impl FnOnce() -> Option<LoginNames>) {
        if self.state.load(Relaxed) != NAMED {
            self.list(Tick::now, names);
        }
    }

    fn list(&self, at: impl FnOnce() -> Tick, names: impl FnOnce() -> Option<LoginNames>) {
        let mut map = lock(&self.registry.map);
        let entry = map.entry(self.id).or_insert_with(|| LoginEntry {
            id: self.id,
            peer: self.peer.clone(),
            local: self.local.map(Into::into),
            since: at(),
            names: None,
        });
        if entry.names.is_none() {
            entry.names = names();
        }
        let state = if entry.names.is_some() { NAMED } else { LISTED };
        self.state.store(state, Relaxed);
    }
}

impl Drop for LoginWatch<'_> {
    fn drop(&mut self) {
        if *self.state.get_mut() != UNLISTED {
            let mut map = lock(&self.registry.map);
            map.remove(&self.id);
            // A burst of logins grows the table; it is given back as they end, so
            // that it does not stay with the idle clients they became.
            let len = map.len();
            if map.capacity() > 64 && len * 4 < map.capacity() {
                map.shrink_to(len * 2);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(db: &str) -> impl FnOnce() -> Option<LoginNames> + '_ {
        move || {
            Some(LoginNames {
                database: db.into(),
                user: "u".into(),
                tls: TlsInfo::default(),
            })
        }
    }

    #[test]
    fn a_login_is_listed_from_its_first_wait_until_it_ends() {
        let reg = LoginRegistry::default();
        let peer = PeerAddr::Unix;
        let w = LoginWatch::new(&reg, 7, &peer, None);
        assert!(reg.is_empty(), "not before it waits");
        w.waits(Tick::now());
        w.waits(Tick::now());
        assert_eq!(reg.len(), 1);
        assert!(reg.all()[0].names.is_none(), "no startup packet yet");
        w.waits_named(names("db"));
        // The first names stay: the startup packet is read once.
        w.waits_named(names("other"));
        let listed = reg.all();
        assert_eq!(listed[0].id, 7);
        assert_eq!(
            listed[0].names.clone().map(|n| n.database),
            Some("db".into())
        );
        let v = LoginWatch::new(&reg, 3, &peer, None);
        v.waits(Tick::now());
        let ids: Vec<u64> = reg.all().iter().map(|e| e.id).collect();
        assert_eq!(ids, [3, 7], "ordered by id");
        drop(w);
        drop(v);
        assert!(reg.is_empty(), "taken out when the login ends");
    }

    #[test]
    fn the_table_shrinks_after_a_burst() {
        let reg = LoginRegistry::default();
        let peer = PeerAddr::Unix;
        let burst: Vec<_> = (0..1000)
            .map(|id| LoginWatch::new(&reg, id, &peer, None))
            .collect();
        burst.iter().for_each(|w| w.waits(Tick::now()));
        assert_eq!(reg.len(), 1000);
        drop(burst);
        assert!(reg.is_empty());
        assert!(lock(&reg.map).capacity() <= 64, "given back");
    }

    #[test]
    fn a_login_that_never_waited_leaves_nothing_to_take_out() {
        let reg = LoginRegistry::default();
        let peer = PeerAddr::Unix;
        let other = LoginWatch::new(&reg, 1, &peer, None);
        other.waits(Tick::now());
        drop(LoginWatch::new(&reg, 2, &peer, None));
        assert_eq!(reg.len(), 1, "the other login is still listed");
    }
}
