//! Live client connections, for the admin console (SHOW CLIENTS/SERVERS/POOLS,
//! KILL_CLIENT) and the metrics endpoint.
//!
//! Each logged-in client owns one [`ClientInfo`], registered for the life of its
//! session. The session updates it only where its state changes (waiting for a server,
//! linked to one, unlinked), never per message, so the relay's hot path pays nothing;
//! the console reads it whenever asked.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::SystemTime;

use crate::clock::Tick;
use crate::net::PeerAddr;
use crate::pool::ServerIdent;

pub use super::clients::{ClientRegistry, Registered};

/// Where a client stands, as SHOW CLIENTS words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientState {
    /// Logged in, holding no server.
    Idle,
    /// Has sent a request and waits for a server (or for PAUSE to end).
    Waiting,
    /// Linked to a server.
    Active,
}

impl ClientState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Idle => "idle",
            ClientState::Waiting => "waiting",
            ClientState::Active => "active",
        }
    }
}

/// A socket address in 20 bytes rather than `SocketAddr`'s 32 (no IPv6 flow or scope,
/// which the console does not show): every idle client keeps one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactAddr {
    pub ip: IpAddr,
    pub port: u16,
}

impl From<SocketAddr> for CompactAddr {
    fn from(a: SocketAddr) -> CompactAddr {
        CompactAddr {
            ip: a.ip(),
            port: a.port(),
        }
    }
}

/// What is known about a client when it registers; fixed for its life.
#[derive(Debug, Clone)]
pub struct ClientMeta {
    pub id: u64,
    /// The user the client logged in as.
    pub user: Arc<str>,
    pub database: Arc<str>,
    /// The user of the pool it uses (the forced user, else `user`).
    pub pool_user: Arc<str>,
    pub peer: PeerAddr,
    pub local_addr: Option<CompactAddr>,
    pub application_name: Box<str>,
    /// A pooled client, a replication one, or a console connection. One byte, in
    /// what was padding: an idle client's console entry is no larger.
    pub kind: ClientKind,
    /// What its TLS session negotiated; all zero for plaintext.
    pub tls: crate::tls::TlsInfo,
}

/// What a client is, for the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    Pooled,
    /// A replication connection (a server of its own).
    Replication(crate::protocol::startup::Replication),
    /// A connection to the admin console.
    Console,
}

impl ClientMeta {
    /// A console connection rather than a pooled one.
    pub fn is_admin(&self) -> bool {
        self.kind == ClientKind::Console
    }

    /// A replication connection's kind (SHOW CLIENTS and SERVERS `replication`).
    pub fn replication(&self) -> Option<crate::protocol::startup::Replication> {
        match self.kind {
            ClientKind::Replication(r) => Some(r),
            _ => None,
        }
    }
}

/// Why a client was killed (the reason it is told, and the log's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KillReason {
    /// KILL_CLIENT.
    AdminForced = 1,
    /// KILL of its database (or of all).
    DatabaseRemoved = 2,
    /// Its server was retired (RECONNECT, a reload) while it sat between
    /// transactions with `server_fast_close`, or it is a replication client.
    ConfigChanged = 3,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::AdminForced => "admin forced disconnect",
            KillReason::DatabaseRemoved => "database removed",
            KillReason::ConfigChanged => "database configuration changed",
        }
    }

    fn from_u8(v: u8) -> Option<KillReason> {
        match v {
            1 => Some(KillReason::AdminForced),
            2 => Some(KillReason::DatabaseRemoved),
            3 => Some(KillReason::ConfigChanged),
            _ => None,
        }
    }
}

/// How a client woken by the keeper had gone to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slept {
    /// It had not: a new session.
    No,
    /// Quiet after its login (no request yet).
    OnItsOwn,
    /// Asked to, by the janitor's sweep.
    WhenAsked,
}

/// `ClientInfo::state` of a linked client between transactions (session mode).
const READY: u8 = 3;

/// One registered client.
#[derive(Debug)]
// The fields every request reads or writes first (`repr(C)`), next to the Arc's
// counts, so that a request touches one or two of its cache lines (see
// `session::relay::Relay`).
#[repr(C)]
pub struct ClientInfo {
    /// The same moment as `connect_us` on the monotonic clock: request times are kept
    /// relative to it, so marking a request needs no wall-clock read.
    connected_at: Tick,
    /// Microseconds from `connected_at` to the last request (when it started waiting).
    request_us: AtomicU64,
    /// The server it holds (shared with that connection: linking copies a pointer);
    /// cancel requests for the client go to it.
    link: Mutex<Option<Arc<ServerIdent>>>,
    /// Prepared statements the client holds (transaction pooling), for SHOW CLIENTS.
    prepared: std::sync::atomic::AtomicU32,
    state: AtomicU8,
    /// Set once by the first kill; read without a lock at every wake-up of the
    /// session. A [`KillReason`], 0 if none.
    kill_reason: AtomicU8,
    /// 0: awake; 1: asked to sleep (woken through `waker`); 2: asleep in the keeper,
    /// without a task; 3: the same, after being asked (the janitor's sweep).
    sleep: AtomicU8,
    /// How long the sweep lets it idle before asking it to sleep, as a shift of the
    /// shortest wait (`session::keeper::sweep_idle`); raised each time it comes back
    /// soon after being put to sleep.
    sweep_shift: AtomicU8,
    /// The waker of the session's task while it waits in [`ClientInfo::killed`]:
    /// a kill or a request to sleep wakes it. A plain slot, set once per task, where
    /// a `Notify` queued and unqueued a waiter under its lock (~160 instructions per
    /// connection against ~420).
    waker: Mutex<Option<Waker>>,
    /// When it connected, in microseconds since the Unix epoch (8 bytes, not a
    /// `SystemTime`'s 16: every idle client keeps one).
    connect_us: u64,
    pub meta: ClientMeta,
}

impl ClientInfo {
    pub fn new(meta: ClientMeta) -> ClientInfo {
        ClientInfo {
            meta,
            connect_us: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            connected_at: Tick::now(),
            state: AtomicU8::new(0),
            request_us: AtomicU64::new(0),
            link: Mutex::new(None),
            prepared: std::sync::atomic::AtomicU32::new(0),
            waker: Mutex::new(None),
            kill_reason: AtomicU8::new(0),
            sleep: AtomicU8::new(0),
            sweep_shift: AtomicU8::new(0),
        }
    }

    pub fn state(&self) -> ClientState {
        match self.state.load(Ordering::Relaxed) {
            1 => ClientState::Waiting,
            2 | READY => ClientState::Active,
            _ => ClientState::Idle,
        }
    }

    /// A session-mode client that holds its server waits for its next request
    /// outside a transaction (`server_fast_close` may end it then); or, with
    /// `false`, its request came. Only while linked.
    pub fn set_ready(&self, ready: bool) {
        self.state
            .store(if ready { READY } else { 2 }, Ordering::Relaxed);
    }

    /// Whether [`ClientInfo::set_ready`] marked it ready.
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Relaxed) == READY
    }

    /// A request that arrived at `at` makes the client wait for a server.
    pub fn set_waiting(&self, at: Tick) {
        self.mark_request(at);
        self.state.store(1, Ordering::Relaxed);
    }

    /// Marks an admin client busy running a command (no server is involved).
    pub fn set_active(&self) {
        self.mark_request(Tick::now());
        self.state.store(2, Ordering::Relaxed);
    }

    fn mark_request(&self, at: Tick) {
        let us = at.micros_since(self.connected_at);
        self.request_us.store(us, Ordering::Relaxed);
    }

    /// The client got a server, which holds `prepared` statements.
    pub fn link(&self, server: &Arc<ServerIdent>, prepared: u32) {
        server.set_prepared(prepared);
        *lock(&self.link) = Some(server.clone());
        self.state.store(2, Ordering::Relaxed);
    }

    /// Records how many prepared statements the client holds.
    pub fn set_prepared(&self, n: u32) {
        self.prepared.store(n, Ordering::Relaxed);
    }

    /// Prepared statements the client holds.
    pub fn prepared(&self) -> u32 {
        self.prepared.load(Ordering::Relaxed)
    }

    /// The client gave its server back.
    pub fn unlink(&self) {
        self.state.store(0, Ordering::Relaxed);
        // Dropped after the lock is let go.
        let _gone = lock(&self.link).take();
    }

    /// The linked server, if any.
    pub fn linked(&self) -> Option<Arc<ServerIdent>> {
        lock(&self.link).clone()
    }

    /// The linked server, if any, counted as the target of a cancel request until the
    /// result is dropped: under the link lock, so that the unlink before the server
    /// goes back sees the count (pool/canceled.rs).
    pub fn aim_cancel(&self) -> Option<crate::pool::CancelAim> {
        let link = lock(&self.link);
        link.as_ref()
            .map(|s| crate::pool::CancelAim::new(s.clone()))
    }

    /// How long ago the client connected.
    pub fn age(&self) -> std::time::Duration {
        self.connected_at.elapsed()
    }

    /// How long ago the last request started (or the client connected, if it has
    /// sent none).
    pub fn request_age(&self, now: Tick) -> std::time::Duration {
        let since = now.since(self.connected_at);
        since.saturating_sub(std::time::Duration::from_micros(
            self.request_us.load(Ordering::Relaxed),
        ))
    }

    /// When the last request started.
    pub fn request_time(&self) -> SystemTime {
        self.connect_time()
            + std::time::Duration::from_micros(self.request_us.load(Ordering::Relaxed))
    }

    /// How long it has been waiting for a server (zero unless waiting).
    pub fn waited(&self) -> std::time::Duration {
        if self.state() != ClientState::Waiting {
            return std::time::Duration::ZERO;
        }
        SystemTime::now()
            .duration_since(self.request_time())
            .unwrap_or_default()
    }

    /// Asks the client's session to end with `reason` (KILL, KILL_CLIENT).
    pub fn kill(&self, reason: KillReason) {
        // The first reason stands if the client is killed twice.
        let _ = self.kill_reason.compare_exchange(
            0,
            reason as u8,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        // A session not waiting right now sees the reason when it next looks.
        self.wake();
    }

    /// Wakes the task waiting in [`ClientInfo::killed`], if any. Taking the lock
    /// after the flag was set is what makes a waiter that registers meanwhile see it.
    fn wake(&self) {
        if let Some(w) = lock(&self.waker).as_ref() {
            w.wake_by_ref();
        }
    }

    /// The kill reason, if the client was killed.
    pub fn kill_reason(&self) -> Option<&'static str> {
        KillReason::from_u8(self.kill_reason.load(Ordering::Relaxed)).map(KillReason::as_str)
    }

    /// When it connected (wall clock).
    pub fn connect_time(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(self.connect_us)
    }

    /// Asks an awake client's session to sleep at its next idle moment (nothing if it
    /// was asked already or sleeps).
    pub fn ask_to_sleep(&self) {
        let asked = self
            .sleep
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if asked {
            // Wakes the session's task, which is waiting in `killed` too.
            self.wake();
        }
    }

    pub fn asked_to_sleep(&self) -> bool {
        self.sleep.load(Ordering::Relaxed) == 1
    }

    /// Marks the client asleep: its session went to the keeper.
    pub fn set_asleep(&self) {
        let asked = self.asked_to_sleep();
        self.sleep
            .store(if asked { 3 } else { 2 }, Ordering::Relaxed);
    }

    /// Marks the client awake; says how it had slept, if it had.
    pub fn set_awake(&self) -> Slept {
        match self.sleep.swap(0, Ordering::Relaxed) {
            2 => Slept::OnItsOwn,
            3 => Slept::WhenAsked,
            _ => Slept::No,
        }
    }

    pub fn is_asleep(&self) -> bool {
        self.sleep.load(Ordering::Relaxed) >= 2
    }

    /// See `sweep_shift`.
    pub fn sweep_shift(&self) -> u8 {
        self.sweep_shift.load(Ordering::Relaxed)
    }

    pub fn set_sweep_shift(&self, shift: u8) {
        self.sweep_shift.store(shift, Ordering::Relaxed);
    }

    /// Resolves with the reason once the client is killed. One waiter at a time
    /// (the session's task): a second would take the first's place.
    ///
    /// It is polled at every wake-up of the client's task, so only its first poll
    /// takes the lock (to leave the task's waker, which stays valid for the task's
    /// whole life); later polls read the reason alone. A request to sleep wakes the
    /// task through the same waker, for the session to see.
    pub fn killed(&self) -> Killed<'_> {
        Killed {
            info: self,
            registered: false,
        }
    }
}

/// The future of [`ClientInfo::killed`]; takes its waker back when dropped, so that a
/// session that ends or sleeps leaves nothing of its task behind.
pub struct Killed<'a> {
    info: &'a ClientInfo,
    registered: bool,
}

impl Future for Killed<'_> {
    type Output = &'static str;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
        if !self.registered {
            *lock(&self.info.waker) = Some(cx.waker().clone());
            self.registered = true;
        }
        // After the lock: a kill whose wake found no waker set its reason before
        // taking the lock, and so before this read.
        match self.info.kill_reason() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Drop for Killed<'_> {
    fn drop(&mut self) {
        if self.registered {
            // Dropped after the lock is let go.
            let _gone = lock(&self.info.waker).take();
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind these locks; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client of user `u` on database `d`, over the UNIX socket, for unit tests.
#[cfg(test)]
pub(crate) fn test_meta(id: u64) -> ClientMeta {
    ClientMeta {
        id,
        user: "u".into(),
        database: "d".into(),
        pool_user: "u".into(),
        peer: PeerAddr::Unix,
        local_addr: None,
        application_name: "".into(),
        kind: ClientKind::Pooled,
        tls: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_state_and_unregister() {
        let r = Arc::new(ClientRegistry::default());
        {
            let g = r.register(test_meta(7));
            assert_eq!(r.len(), 1);
            assert_eq!(g.state(), ClientState::Idle);
            g.set_waiting(Tick::now());
            assert_eq!(g.state(), ClientState::Waiting);
            let server = Arc::new(ServerIdent::new(
                3,
                (42, 43),
                crate::pool::ServerAddr::Unix("/tmp".into(), 5432),
                0,
            ));
            g.link(&server, 2);
            assert_eq!(r.get(7).unwrap().linked().unwrap().id, 3);
            assert_eq!(server.prepared(), 2);
            assert_eq!(g.state(), ClientState::Active);
            assert!(g.waited().is_zero());
            g.unlink();
            assert!(g.linked().is_none());
        }
        assert!(r.is_empty());
    }

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_request_to_sleep_wakes_the_waiter_a_kill_ends_it_and_its_drop_lets_go() {
        let r = Arc::new(ClientRegistry::default());
        let g = r.register(test_meta(1));
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut killed = Box::pin(g.killed());
        assert!(killed.as_mut().poll(&mut cx).is_pending());
        // The slot holds a clone of the waker.
        assert_eq!(Arc::strong_count(&count), 3);
        g.ask_to_sleep();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(killed.as_mut().poll(&mut cx).is_pending());
        g.kill(KillReason::AdminForced);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(
            killed.as_mut().poll(&mut cx),
            Poll::Ready("admin forced disconnect")
        );
        drop(killed);
        // Nothing of the task is kept once the wait is over.
        assert_eq!(Arc::strong_count(&count), 2);
        g.kill(KillReason::AdminForced);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kill_from_another_thread_wakes_a_waiting_session() {
        let r = Arc::new(ClientRegistry::default());
        for i in 0..200 {
            // A new client each time: the first reason stands for good.
            let g = Arc::new(r.register(test_meta(i)));
            let (waiting, info) = (g.clone(), g);
            let task = tokio::spawn(async move { waiting.killed().await });
            tokio::task::yield_now().await;
            let killer = std::thread::spawn(move || info.kill(KillReason::AdminForced));
            let why = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
            assert_eq!(
                why.ok().and_then(|r| r.ok()),
                Some("admin forced disconnect")
            );
            let _ = killer.join();
        }
    }

    #[tokio::test]
    async fn kill_wakes_the_session_even_if_sent_first() {
        let r = Arc::new(ClientRegistry::default());
        let g = r.register(test_meta(1));
        g.kill(KillReason::AdminForced);
        assert_eq!(g.killed().await, "admin forced disconnect");
    }
}
