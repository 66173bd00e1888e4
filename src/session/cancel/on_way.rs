//! Cancel requests on their way: each from its arrival until the server (or peer) it
//! was passed to has closed the connection it went on. SHOW CLIENTS lists the
//! requests (`waiting_cancel_req`, `active_cancel_req`), SHOW SERVERS the connections
//! they went on (`active_cancel`), SHOW POOLS and PEER_POOLS count them.
//!
//! Kept in the registry rather than on each client, which would cost every idle one;
//! a request is the rare case, so a lock and a map entry per request is cheap.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::clock::Tick;
use crate::net::PeerAddr;
use crate::pool::ServerAddr;
use crate::tls::TlsInfo;

/// (database, pool user).
pub type PoolKey = (Arc<str>, Arc<str>);

/// What a cancel request is counted for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The pool of the client it cancels for (this process's own).
    Pool(PoolKey),
    /// The peer it is passed on to.
    Peer(u16),
}

/// The connection a cancel request came on.
#[derive(Debug, Clone, Copy)]
pub struct CameOn<'a> {
    /// The connection's `C-<id>`.
    pub id: u64,
    pub peer: &'a PeerAddr,
    pub local: Option<SocketAddr>,
    pub tls: TlsInfo,
}

/// One cancel request on its way, as the console shows it.
#[derive(Debug, Clone)]
pub struct CancelView {
    pub target: Target,
    /// The user of the client it cancels for; none for one passed on to a peer.
    pub user: Option<Arc<str>>,
    /// The connection it came on.
    pub client_id: u64,
    pub peer: PeerAddr,
    pub local: Option<SocketAddr>,
    pub tls: TlsInfo,
    pub arrived: Tick,
    /// Its own connection onwards: `S-<id>`, where it goes, the backend pid it
    /// names, and what TLS it uses.
    pub server_id: u64,
    pub to: ServerAddr,
    pub backend_pid: u32,
    pub server_tls: TlsInfo,
    /// Whether its connection onwards is being made (or was): a request passed on
    /// to a peer may first wait for its turn.
    pub connecting: bool,
    /// Set once the request went out: when, and that connection's local end.
    pub sent: Option<(Tick, Option<SocketAddr>)>,
}

/// Every cancel request on its way, by the id of the connection it came on, and the
/// peers one has ever been passed on to (PgBouncer keeps a peer's pool once made).
#[derive(Debug, Default)]
pub struct OnWay {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    // Fx: the keys are our own connection ids.
    requests: FxHashMap<u64, CancelView>,
    peers: Vec<u16>,
}

impl OnWay {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The requests on their way, oldest connection first.
    pub fn views(&self) -> Vec<CancelView> {
        let mut v: Vec<CancelView> = self.lock().requests.values().cloned().collect();
        v.sort_unstable_by_key(|r| r.client_id);
        v
    }

    /// Requests on their way, waiting for their connection and sent: for the clients
    /// of each pool that has some, and for every peer one was ever passed on to.
    pub fn counts(&self) -> FxHashMap<Target, [u32; 2]> {
        let inner = self.lock();
        let mut m: FxHashMap<Target, [u32; 2]> = inner
            .peers
            .iter()
            .map(|&p| (Target::Peer(p), [0, 0]))
            .collect();
        for r in inner.requests.values() {
            m.entry(r.target.clone()).or_default()[usize::from(r.sent.is_some())] += 1;
        }
        m
    }

    /// Counts `view` in until the returned guard is dropped.
    pub fn start(&self, view: CancelView) -> CancelReq<'_> {
        let id = view.client_id;
        let mut inner = self.lock();
        if let Target::Peer(p) = view.target {
            if !inner.peers.contains(&p) {
                inner.peers.push(p);
            }
        }
        inner.requests.insert(id, view);
        CancelReq { on_way: self, id }
    }
}

/// A cancel request, listed until dropped: `waiting_cancel_req` while its connection
/// is made, then `active_cancel_req` (with its connection `active_cancel`) until the
/// other end has answered by closing it.
pub struct CancelReq<'a> {
    on_way: &'a OnWay,
    id: u64,
}

impl CancelReq<'_> {
    /// Its connection onwards is being made.
    pub fn connecting(&self) {
        if let Some(r) = self.on_way.lock().requests.get_mut(&self.id) {
            r.connecting = true;
        }
    }

    /// The request went out on a connection whose local end is `local`; the other
    /// end's closing it is awaited.
    pub fn sent(&self, local: Option<SocketAddr>) {
        if let Some(r) = self.on_way.lock().requests.get_mut(&self.id) {
            r.sent.get_or_insert((Tick::now(), local));
        }
    }
}

impl Drop for CancelReq<'_> {
    fn drop(&mut self) {
        // Dropped after the lock is let go.
        let _gone = self.on_way.lock().requests.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, target: Target) -> CancelView {
        CancelView {
            target,
            user: None,
            client_id: id,
            peer: PeerAddr::Unix,
            local: None,
            tls: TlsInfo::default(),
            arrived: Tick::now(),
            server_id: 100 + id,
            to: ServerAddr::for_host("127.0.0.1", 5432),
            backend_pid: 42,
            server_tls: TlsInfo::default(),
            connecting: false,
            sent: None,
        }
    }

    #[test]
    fn cancels_on_their_way_are_listed_and_counted_until_dropped() {
        let on_way = OnWay::default();
        let pool = Target::Pool(("d".into(), "u".into()));
        let a = on_way.start(view(1, pool.clone()));
        let b = on_way.start(view(2, pool.clone()));
        assert_eq!(on_way.counts().get(&pool), Some(&[2, 0]));
        a.sent(None);
        a.sent(None);
        assert_eq!(on_way.counts().get(&pool), Some(&[1, 1]));
        let ids: Vec<_> = on_way.views().iter().map(|v| v.client_id).collect();
        assert_eq!(ids, [1, 2]);
        drop(b);
        assert_eq!(on_way.counts().get(&pool), Some(&[0, 1]));
        assert_eq!(on_way.views().len(), 1);
        drop(a);
        assert!(on_way.counts().is_empty());
        assert!(on_way.views().is_empty());
        // A peer's entry stays, as a peer pool would.
        drop(on_way.start(view(3, Target::Peer(3))));
        assert_eq!(on_way.counts().get(&Target::Peer(3)), Some(&[0, 0]));
        assert!(on_way.views().is_empty());
    }
}
