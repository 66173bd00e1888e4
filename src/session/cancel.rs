//! Cancel keys: each client gets its own (pid, key) at login; a CancelRequest carrying
//! it is forwarded to the backend currently serving that client, and ignored otherwise.
//!
//! With `peer_id` set, processes sharing a port (`so_reuseport`) pass each other the
//! cancels meant for one another: the kernel may hand a cancel's new connection to
//! any of them. A key then carries its process's peer id and how many more times it
//! may be passed on (3 as issued, so that peers that disagree about who is who cannot
//! pass one around for ever), where PgBouncer 1.21 and later put them, so that Sluice
//! and such PgBouncers can be each other's peers. Of the eight bytes the client sees
//! (the pid's four, then the key's, each big-endian), the second and third hold the
//! peer id, low byte first (bits 16-23 and 8-15 of `pid`), and the last byte's two
//! low bits the hops left (bits 0-1 of `key`). 45 bits stay random, as in PgBouncer.

mod on_way;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::pool::ServerAddr;
use crate::protocol::startup::cancel_request;
use crate::stats::conns::ClientInfo;
use crate::timer;
use crate::tls::server::ServerTls;
use crate::tls::TlsInfo;
pub use on_way::{CameOn, CancelView, Target};
use on_way::{CancelReq, OnWay};

/// The bits of `pid` that carry the peer id (its second and third bytes).
const PEER_BITS: u32 = 0x00ff_ff00;
/// The bits of `key` that count the hops left (its last byte's low two), all set as
/// issued.
const HOPS: u32 = 0b11;

/// `pid` with `peer` in PgBouncer's place: low byte in bits 16-23, high in 8-15.
fn with_peer(pid: u32, peer: u16) -> u32 {
    let [lo, hi] = peer.to_le_bytes();
    (pid & !PEER_BITS) | (u32::from(lo) << 16) | (u32::from(hi) << 8)
}

/// The peer id a `pid` carries.
fn peer_of(pid: u32) -> u16 {
    u16::from_le_bytes([(pid >> 16) as u8, (pid >> 8) as u8])
}

/// All live client cancel keys, each with its client's console entry, which knows the
/// server the client is linked to right now (if any).
#[derive(Debug, Default)]
pub struct CancelRegistry {
    // Fx: the keys are ours (random), a peer only looks them up.
    map: Mutex<FxHashMap<(u32, u32), Arc<ClientInfo>>>,
    /// Cancel requests on their way (SHOW CLIENTS, SERVERS, POOLS, PEER_POOLS).
    on_way: OnWay,
    /// Slots for the cancels in flight to each peer, and their number.
    peer_slots: Mutex<FxHashMap<u16, (u32, Arc<Semaphore>)>>,
    /// This process's `peer_id` (0: no peering).
    peer_id: u16,
}

/// A client's cancel key; its owner removes it from the registry when the client
/// goes away ([`CancelRegistry::remove`]).
#[derive(Debug, Clone, Copy)]
pub struct CancelKey {
    pub pid: u32,
    pub key: u32,
}

/// Where a cancel request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// One of this process's clients (the key as issued).
    Local { pid: u32, key: u32 },
    /// Peer `peer`'s, passed on with one hop fewer.
    Peer { peer: u16, pid: u32, key: u32 },
    /// Another process's, but passed on too often already.
    Spent,
}

impl CancelRegistry {
    /// A registry issuing keys for the process with this `peer_id`.
    pub fn new(peer_id: u16) -> CancelRegistry {
        CancelRegistry {
            map: Mutex::default(),
            on_way: OnWay::default(),
            peer_slots: Mutex::default(),
            peer_id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<(u32, u32), Arc<ClientInfo>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancel requests on their way, waiting for their connection and sent: for the
    /// clients of each pool, and passed on to each peer.
    pub fn in_flight(&self) -> FxHashMap<Target, [u32; 2]> {
        self.on_way.counts()
    }

    /// Cancel requests on their way, as SHOW CLIENTS and SERVERS list them.
    pub fn on_way(&self) -> Vec<CancelView> {
        self.on_way.views()
    }

    /// The slots for cancels in flight to `peer`: `size` of them (at least one),
    /// made anew when the peer's `pool_size` changed (those in flight keep theirs).
    fn peer_slots(&self, peer: u16, size: u32) -> Arc<Semaphore> {
        let size = size.max(1);
        let mut m = self.peer_slots.lock().unwrap_or_else(|p| p.into_inner());
        let e = m
            .entry(peer)
            .or_insert_with(|| (size, Arc::new(Semaphore::new(size as usize))));
        if e.0 != size {
            *e = (size, Arc::new(Semaphore::new(size as usize)));
        }
        e.1.clone()
    }

    /// Forgets a client's key.
    pub fn remove(&self, pid: u32, key: u32) {
        self.lock().remove(&(pid, key));
    }

    /// Issues a fresh random key for a new client.
    pub fn register(&self, client: &Arc<ClientInfo>) -> CancelKey {
        let mut map = self.lock();
        loop {
            // A positive pid, as PostgreSQL's are (some clients mind).
            let (mut pid, mut key) = (rand::random::<u32>() & 0x7fff_ffff, rand::random::<u32>());
            if self.peer_id != 0 {
                pid = with_peer(pid, self.peer_id);
                key |= HOPS;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry((pid, key)) {
                e.insert(client.clone());
                return CancelKey { pid, key };
            }
        }
    }

    /// Whose key (pid, key) is.
    pub fn route(&self, pid: u32, key: u32) -> Route {
        if self.peer_id == 0 {
            return Route::Local { pid, key };
        }
        let peer = peer_of(pid);
        let hops = key & HOPS;
        if peer == self.peer_id {
            // As issued: the hops it has used are put back.
            Route::Local {
                pid,
                key: key | HOPS,
            }
        } else if hops == 0 {
            Route::Spent
        } else {
            Route::Peer {
                peer,
                pid,
                key: key - 1,
            }
        }
    }

    /// Handles a CancelRequest for (pid, key) that came on `came`: forwards it to the
    /// backend of the local client holding it, if that client holds a server, or to
    /// the peer whose key it is, on a connection numbered `server_id`. Returns how it
    /// ended.
    pub async fn cancel(
        &self,
        (pid, key): (u32, u32),
        cfg: &Config,
        came: CameOn<'_>,
        server_id: u64,
    ) -> CancelEnd {
        let timeout = cfg.settings.cancel_wait_timeout;
        let logs = |names: &dyn std::fmt::Display, addr: &ServerAddr| ServerLog {
            tag: format!("S-{server_id}: {names}@{addr}"),
            connections: cfg.settings.log_connections,
            disconnections: cfg.settings.log_disconnections,
        };
        let view = |target, user, to: &ServerAddr, backend_pid, server_tls| CancelView {
            target,
            user,
            client_id: came.id,
            peer: came.peer.clone(),
            local: came.local,
            tls: came.tls,
            arrived: crate::clock::Tick::now(),
            server_id,
            to: to.clone(),
            backend_pid,
            server_tls,
            connecting: false,
            sent: None,
        };
        match self.route(pid, key) {
            Route::Local { pid, key } => {
                let Some(client) = self.lock().get(&(pid, key)).cloned() else {
                    return CancelEnd::NoClient;
                };
                if client.meta.is_admin() {
                    // Nothing to forward: the caller lifts a pause (PgBouncer's ^C on
                    // the console).
                    return CancelEnd::Console;
                }
                // Held off the pool until the cancel is done, so that it cannot cancel
                // the query of a client the server went to meanwhile.
                let Some(server) = client.aim_cancel() else {
                    return CancelEnd::Idle;
                };
                // Over TLS when the server connection is, as libpq 17 does: the key
                // would otherwise cross the network in clear.
                let tls = cfg.server_tls.as_deref().filter(|_| server.tls.is_tls());
                let pool = (client.meta.database.clone(), client.meta.pool_user.clone());
                let log = logs(&format_args!("{}/{}", pool.0, pool.1), &server.addr);
                let user = Some(client.meta.user.clone());
                drop(client);
                let (spid, skey) = (server.backend_pid, server.backend_key);
                let stls = if tls.is_some() {
                    server.tls
                } else {
                    TlsInfo::default()
                };
                let req =
                    self.on_way
                        .start(view(Target::Pool(pool), user, &server.addr, spid, stls));
                let to = Dest {
                    addr: &server.addr,
                    ip: server.peer_addr,
                };
                send_cancel(to, (spid, skey), timeout, tls, &req, log).await
            }
            Route::Peer { peer, pid, key } => match cfg.peers.get(&peer) {
                Some(p) => {
                    let addr = ServerAddr::for_host(&p.host, p.port);
                    let to = Dest {
                        addr: &addr,
                        ip: None,
                    };
                    let target = Target::Peer(peer);
                    let req = self
                        .on_way
                        .start(view(target, None, &addr, pid, TlsInfo::default()));
                    // At most the peer's `pool_size` at once, as PgBouncer's peer pool
                    // has; the others wait their turn (`waiting_cancel_req`).
                    let size = p.pool_size.unwrap_or(cfg.settings.default_pool_size);
                    let slots = self.peer_slots(peer, size);
                    let Ok(Ok(_slot)) = timer::timeout(limit(timeout), slots.acquire_owned()).await
                    else {
                        tracing::warn!(
                            "cancel request to peer {peer} timed out waiting for a slot (pool_size {size})"
                        );
                        return CancelEnd::TimedOut;
                    };
                    let log = logs(&"(nodb)/(nouser)", to.addr);
                    send_cancel(to, (pid, key), timeout, None, &req, log).await
                }
                None => CancelEnd::UnknownPeer,
            },
            Route::Spent => CancelEnd::Spent,
        }
    }
}

/// How a cancel request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelEnd {
    /// Delivered, and the other end closed the connection.
    Sent,
    /// No client holds the key.
    NoClient,
    /// Its client holds no server: nothing runs to cancel.
    Idle,
    /// A console client's (psql's ^C), which the caller answers by lifting a pause.
    Console,
    /// The connection onwards failed.
    Failed,
    /// `cancel_wait_timeout` passed first.
    TimedOut,
    /// The key names a peer that is not in `[peers]`.
    UnknownPeer,
    /// Passed on too often already.
    Spent,
}

impl CancelEnd {
    /// PgBouncer's words for it, for the request's `closing because:` line.
    pub fn reason(self) -> &'static str {
        match self {
            CancelEnd::Sent => "successfully sent cancel request",
            CancelEnd::NoClient | CancelEnd::Failed => "failed cancel request",
            CancelEnd::Idle => "cancel request for idle client",
            CancelEnd::Console => "cancel request for console client",
            CancelEnd::TimedOut => "cancel_wait_timeout",
            CancelEnd::UnknownPeer => "could not find peer to forward request to",
            CancelEnd::Spent => "failed to forward cancel request because its TTL was exhausted",
        }
    }
}

/// The log lines of a cancel request's connection onwards, as for a server
/// connection: `tag` is `S-<id>: db/user@addr`.
struct ServerLog {
    tag: String,
    connections: bool,
    disconnections: bool,
}

/// How long a cancel may wait for its turn, and then for its delivery:
/// `cancel_wait_timeout`, or 15 s when that is 0 (a cancel never waits for ever).
fn limit(timeout: Duration) -> Duration {
    if timeout.is_zero() {
        Duration::from_secs(15)
    } else {
        timeout
    }
}

/// Where a cancel goes: a server connection's own address when it is known, else
/// `addr` as configured (looked up afresh). `addr` names it in logs and for TLS.
#[derive(Clone, Copy)]
struct Dest<'a> {
    addr: &'a ServerAddr,
    ip: Option<std::net::SocketAddr>,
}

/// Sends a CancelRequest for (pid, key) to `to` (a server or a peer) and waits
/// until it closes the connection (PostgreSQL does once it has read the request, a
/// peer once it has passed it on), so the cancel is delivered before we report success.
/// With `tls`, the server is asked for TLS first, as for a server connection.
async fn send_cancel(
    to: Dest<'_>,
    (pid, key): (u32, u32),
    timeout: Duration,
    tls: Option<&ServerTls>,
    req: &CancelReq<'_>,
    log: ServerLog,
) -> CancelEnd {
    let addr = to.addr;
    let started = crate::clock::Tick::now();
    let send = async {
        req.connecting();
        // A connection that lives for one packet: no keepalive or buffer options.
        let tcp = crate::net::TcpTuning::default();
        let mut stream = match to.ip {
            Some(ip) => crate::pool::connect_ip(ip, &tcp).await?,
            None => crate::pool::connect_to(addr, &tcp).await?,
        };
        if log.connections {
            tracing::info!("{} new connection to server", log.tag);
        }
        if let Some(tls) = tls {
            crate::pool::negotiate_tls(&mut stream, addr, tls)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        stream.write_all(&cancel_request(pid, key)).await?;
        req.sent(stream.local_addr());
        let mut buf = bytes::BytesMut::with_capacity(16);
        let _ = stream.read_buf(&mut buf).await;
        Ok::<_, std::io::Error>(())
    };
    match timer::timeout(limit(timeout), send).await {
        Ok(Ok(())) => {
            if log.disconnections {
                let age = started.elapsed().as_secs();
                let why = CancelEnd::Sent.reason();
                tracing::info!("{} closing because: {why} (age={age}s)", log.tag);
            }
            CancelEnd::Sent
        }
        Ok(Err(e)) => {
            tracing::warn!("cancel request to {addr} failed: {e}");
            CancelEnd::Failed
        }
        Err(_) => {
            tracing::warn!("cancel request to {addr} timed out");
            CancelEnd::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(reg: &CancelRegistry) -> CancelKey {
        let info = Arc::new(ClientInfo::new(crate::stats::conns::ClientMeta {
            id: 1,
            user: "u".into(),
            database: "d".into(),
            pool_user: "u".into(),
            peer: crate::net::PeerAddr::Unix,
            local_addr: None,
            application_name: "".into(),
            kind: crate::stats::conns::ClientKind::Pooled,
            tls: Default::default(),
        }));
        reg.register(&info)
    }

    #[test]
    fn without_peering_every_key_is_local_and_random() {
        let reg = CancelRegistry::new(0);
        let k = key_of(&reg);
        assert!(k.pid < 1 << 31, "a positive pid");
        assert_eq!(
            reg.route(k.pid, k.key),
            Route::Local {
                pid: k.pid,
                key: k.key
            }
        );
        assert_eq!(
            reg.route(1, 0xffff_ffff),
            Route::Local {
                pid: 1,
                key: 0xffff_ffff
            }
        );
    }

    /// The eight bytes of BackendKeyData as PgBouncer 1.21+ fills them for a peer:
    /// the peer id in the second and third, low byte first; the hops in the last
    /// byte's low bits.
    #[test]
    fn keys_are_laid_out_as_pgbouncer_lays_out_its_peers() {
        // PgBouncer with peer_id 258 (0x0102), its key as it sends it.
        let bytes: [u8; 8] = [0x3a, 0x02, 0x01, 0x9c, 0x11, 0x22, 0x33, 0x47];
        let pid = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let key = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        // A Sluice peer of it passes the cancel on, one hop used in the last byte.
        let ours = CancelRegistry::new(5);
        let next = 0x1122_3346;
        assert_eq!(
            ours.route(pid, key),
            Route::Peer {
                peer: 258,
                pid,
                key: next
            }
        );
        // And a Sluice with that id issues keys the PgBouncer peer reads the same way.
        let k = key_of(&CancelRegistry::new(258));
        let b = [k.pid.to_be_bytes(), k.key.to_be_bytes()].concat();
        assert_eq!((b[1], b[2], b[7] & 0b11), (0x02, 0x01, 0b11));
        assert!(b[0] < 0x80, "a positive pid");
    }

    #[test]
    fn a_peer_key_names_its_process_and_loses_a_hop_per_pass() {
        let (a, b) = (CancelRegistry::new(7), CancelRegistry::new(16383));
        let k = key_of(&a);
        assert_eq!(peer_of(k.pid), 7);
        assert_eq!(k.key & HOPS, HOPS);
        assert!(k.pid < 1 << 31, "a positive pid");
        // Its own process finds it as issued.
        assert_eq!(
            a.route(k.pid, k.key),
            Route::Local {
                pid: k.pid,
                key: k.key
            }
        );
        // Another passes it on, each time with a hop fewer, then stops.
        let mut key = k.key;
        for _ in 0..3 {
            match b.route(k.pid, key) {
                Route::Peer {
                    peer: 7,
                    pid,
                    key: next,
                } => {
                    assert_eq!(pid, k.pid);
                    assert_eq!(next & !HOPS, k.key & !HOPS);
                    assert_eq!(next & HOPS, (key & HOPS) - 1);
                    // Wherever it lands, its own process still knows it.
                    assert_eq!(
                        a.route(pid, next),
                        Route::Local {
                            pid: k.pid,
                            key: k.key
                        }
                    );
                    key = next;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(b.route(k.pid, key), Route::Spent);
    }
}
