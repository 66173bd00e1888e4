//! Sleeping clients. A client idle for a while (just logged in and quiet, or found
//! idle by the janitor's sweep) gives up its tokio task and socket registration: its
//! socket waits in an epoll set of the keeper's own and its `Session` in a slab
//! slot, 24 bytes beside the session itself (the socket, its TLS session if any,
//! the session's box). When the socket turns readable (a
//! request, or the client leaving), the client is killed, or its client_idle_timeout
//! runs out, the keeper spawns a task that registers the socket with tokio again and
//! drives the session on from its idle loop. See docs/architecture.md.
//!
//! This is what keeps an idle client near PgBouncer's cost: a task and a registration
//! alone are 640 bytes, and the futures an idle session waits in about 600 more.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, Notify};

use super::relay::FRESH_SLEEP;
use super::{drive, Session};
use crate::app::App;
use crate::clock::Tick;
use crate::net::{Socket, Stream};
use crate::stats::conns::{ClientInfo, Slept};

/// How long a client must have been idle (since its last request began) before the
/// janitor's sweep asks it to sleep, at first: see [`sweep_idle`].
pub const SWEEP_IDLE: Duration = Duration::from_secs(2);

/// A client put to sleep by the sweep that sends again within this long of its last
/// request was not idle, only between requests: it is let idle twice as long before
/// the next sweep asks it, up to [`SWEEP_IDLE`] << [`MAX_SWEEP_SHIFT`] (32 s). One
/// that slept longer starts again from [`SWEEP_IDLE`]. A sleep and a wake cost ~4
/// `epoll_ctl`, two `epoll_wait` and a task; for clients that send every few seconds
/// that was 1.2-1.5x PgBouncer's CPU per transaction (docs/performance.md, twenty-ninth
/// round), where an awake idle client costs only its memory (~1.2 KB more).
pub const CAME_BACK: Duration = Duration::from_secs(60);
/// The longest wait is [`SWEEP_IDLE`] times 2 to this power (32 s).
pub const MAX_SWEEP_SHIFT: u8 = 4;

/// A client that slept quiet after its login and sends its first request within this
/// long of connecting was slow to start, not idle: the wait before a new client sleeps
/// ([`FRESH_SLEEP`], 10 ms) doubles for the clients after it, up to 320 ms, as an
/// application that connects per request and queries some tens of milliseconds later
/// otherwise pays a sleep and a wake per connection (docs/performance.md, twenty-ninth
/// round). It halves again after [`FRESH_DECAY_SWEEPS`] janitor sweeps (5 s) in which
/// no new client came back so soon. Clients that log in and stay quiet (a pool's idle
/// connections, the bench's idle clients) never come back soon, so they keep the
/// 10 ms that keeps a burst of logins from leaving heap holes.
pub const FRESH_BACK: Duration = Duration::from_secs(1);
pub const MAX_FRESH_SHIFT: u8 = 5;
pub const FRESH_DECAY_SWEEPS: usize = 10;

/// How long the sweep lets a client with this `shift` idle before asking it to sleep.
pub fn sweep_idle(shift: u8) -> Duration {
    SWEEP_IDLE * (1u32 << shift.min(MAX_SWEEP_SHIFT))
}

/// The sweep's next `shift` for a client put to sleep by the sweep that wakes `idle`
/// after its last request began.
fn next_shift(shift: u8, idle: Duration) -> u8 {
    if idle < CAME_BACK {
        (shift + 1).min(MAX_SWEEP_SHIFT)
    } else {
        0
    }
}

/// A sleeping client is awake again: see [`CAME_BACK`] and [`FRESH_BACK`].
/// Nothing for a new session (`Slept::No`): no clock read per connection.
pub(super) fn came_back(keeper: &Keeper, info: &ClientInfo, slept: Slept) {
    // Since its last request, or since it connected if it has sent none.
    let idle = || info.request_age(Tick::now());
    match slept {
        Slept::WhenAsked => info.set_sweep_shift(next_shift(info.sweep_shift(), idle())),
        Slept::OnItsOwn => keeper.fresh_came_back(idle()),
        Slept::No => {}
    }
}

/// A sleeping client.
struct Sleeper {
    socket: Socket,
    session: Box<Session>,
}

/// The keeper's handle in [`App`]: sessions are put to sleep through it.
#[derive(Debug)]
pub struct Keeper {
    tx: mpsc::UnboundedSender<Sleeper>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Sleeper>>>,
    /// Set while the keeper task runs; sessions sleep only then.
    running: AtomicBool,
    /// Woken after a KILL, to wake killed sleepers.
    kick: Notify,
    asleep: AtomicUsize,
    /// How long a new client may stay quiet before it sleeps, as a shift of
    /// [`FRESH_SLEEP`] (see [`FRESH_BACK`]).
    fresh_shift: AtomicU8,
    /// Whether a new client that slept came back soon since the janitor's last sweep,
    /// and the sweeps since one last did.
    fresh_back: AtomicBool,
    sweeps_without: AtomicUsize,
}

impl std::fmt::Debug for Sleeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sleeper")
    }
}

impl Default for Keeper {
    fn default() -> Keeper {
        let (tx, rx) = mpsc::unbounded_channel();
        Keeper {
            tx,
            rx: Mutex::new(Some(rx)),
            running: AtomicBool::new(false),
            kick: Notify::new(),
            asleep: AtomicUsize::new(0),
            fresh_shift: AtomicU8::new(0),
            fresh_back: AtomicBool::new(false),
            sweeps_without: AtomicUsize::new(0),
        }
    }
}

impl Keeper {
    /// Whether sessions may sleep (the keeper task runs).
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Clients asleep now.
    pub fn asleep(&self) -> usize {
        self.asleep.load(Ordering::Relaxed)
    }

    /// How long a client that has just logged in may stay quiet before it sleeps.
    pub fn fresh_sleep(&self) -> Duration {
        FRESH_SLEEP * (1u32 << self.fresh_shift.load(Ordering::Relaxed))
    }

    /// A client that slept quiet after its login sent its first request `since`
    /// after it connected.
    fn fresh_came_back(&self, since: Duration) {
        if since < FRESH_BACK {
            self.fresh_back.store(true, Ordering::Relaxed);
            let _ = self
                .fresh_shift
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    Some((s + 1).min(MAX_FRESH_SHIFT))
                });
        }
    }

    /// At each sweep: the wait shrinks back after [`FRESH_DECAY_SWEEPS`] sweeps in
    /// which no new client came back soon.
    fn fresh_sweep(&self) {
        if self.fresh_back.swap(false, Ordering::Relaxed) {
            self.sweeps_without.store(0, Ordering::Relaxed);
            return;
        }
        if self.sweeps_without.fetch_add(1, Ordering::Relaxed) + 1 >= FRESH_DECAY_SWEEPS {
            self.sweeps_without.store(0, Ordering::Relaxed);
            let shift = self.fresh_shift.load(Ordering::Relaxed);
            self.fresh_shift
                .store(shift.saturating_sub(1), Ordering::Relaxed);
        }
    }

    /// Wakes sleepers that were killed (KILL, KILL_CLIENT, a removed database).
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// Puts a session to sleep, its socket taken out of tokio.
    pub(super) fn put(&self, socket: Socket, session: Box<Session>) {
        self.asleep.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::error::SendError(s)) = self.tx.send(Sleeper { socket, session }) {
            // The keeper is gone (shutting down): the client stays awake.
            tokio::spawn(wake(s));
        }
    }
}

/// Wakes a sleeping client in a task of its own.
async fn wake(s: Sleeper) {
    let Sleeper { socket, session } = s;
    session.app().keeper.asleep.fetch_sub(1, Ordering::Relaxed);
    match Stream::from_std(socket) {
        Ok(stream) => Box::pin(drive(stream, session, None)).await,
        Err(e) => {
            if session.log_disconnections {
                let age = session.info.age().as_secs();
                tracing::info!(
                    "{} closing because: client I/O error: {e} (age={age}s)",
                    session.tag()
                );
            }
        }
    }
}

/// The sleepers by token, with a free list.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<Sleeper>>,
    free: Vec<usize>,
    /// Sleepers with a client_idle_timeout: the tick looks for due ones only if any.
    with_deadline: usize,
}

impl Slab {
    fn add(&mut self, poll: &Poll, s: Sleeper) -> Result<(), Sleeper> {
        let i = self.free.pop().unwrap_or(self.slots.len());
        let fd = s.socket.as_raw_fd();
        // mio registers edge-triggered; a socket already readable reports at once.
        if poll
            .registry()
            .register(&mut SourceFd(&fd), Token(i), Interest::READABLE)
            .is_err()
        {
            if i < self.slots.len() {
                self.free.push(i);
            }
            return Err(s);
        }
        self.with_deadline += usize::from(s.session.idle_deadline().is_some());
        if i == self.slots.len() {
            self.slots.push(Some(s));
        } else {
            self.slots[i] = Some(s);
        }
        Ok(())
    }

    fn take(&mut self, poll: &Poll, i: usize) -> Option<Sleeper> {
        let s = self.slots.get_mut(i)?.take()?;
        let _ = poll
            .registry()
            .deregister(&mut SourceFd(&s.socket.as_raw_fd()));
        self.free.push(i);
        self.with_deadline -= usize::from(s.session.idle_deadline().is_some());
        Some(s)
    }

    /// Takes every sleeper for which `wake` is true.
    fn take_where(&mut self, poll: &Poll, wake: impl Fn(&Session) -> bool) -> Vec<Sleeper> {
        let hits: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].as_ref().is_some_and(|s| wake(&s.session)))
            .collect();
        hits.into_iter()
            .filter_map(|i| self.take(poll, i))
            .collect()
    }
}

/// The keeper task: holds sleeping clients until something happens to them. Runs
/// until the process exits; its sleepers are then closed.
pub async fn run(app: Arc<App>) {
    let keeper = &app.keeper;
    let rx = keeper.rx.lock().unwrap_or_else(|p| p.into_inner()).take();
    let Some(mut rx) = rx else {
        return;
    };
    // SAFETY: `Poll` owns its epoll descriptor, keeps it open until dropped and always
    // returns that same descriptor from `as_raw_fd`; the `AsyncFd` owns the `Poll`, so
    // the descriptor outlives the registration.
    let registered = Poll::new().and_then(|p| unsafe {
        AsyncFd::register_with_interest(p, tokio::io::Interest::READABLE).map_err(Into::into)
    });
    let poll = match registered {
        Ok(p) => p,
        Err(e) => {
            // Clients stay awake, each in its task.
            tracing::warn!("idle clients cannot sleep: {e}");
            return;
        }
    };
    keeper.running.store(true, Ordering::Relaxed);
    let mut poll = poll;
    let mut slab = Slab::default();
    let mut events = Events::with_capacity(256);
    let mut tick = crate::timer::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            s = rx.recv() => {
                let Some(s) = s else { return };
                // A kill that came while it was on its way here found no sleeper to
                // wake: it wakes now.
                if s.session.info.kill_reason().is_some() {
                    tokio::spawn(wake(s));
                } else if let Err(s) = slab.add(poll.get_ref(), s) {
                    tokio::spawn(wake(s));
                }
            }
            r = poll.readable_mut() => {
                let Ok(mut guard) = r else { return };
                loop {
                    let p = guard.get_inner_mut();
                    match p.poll(&mut events, Some(Duration::ZERO)) {
                        // Events left unread would never be reported again: the
                        // keeper's own registration is edge-triggered.
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                        Ok(()) if events.is_empty() => break,
                        Ok(()) => {}
                    }
                    let mut n = 0;
                    for ev in events.iter() {
                        n += 1;
                        if let Some(s) = slab.take(p, ev.token().0) {
                            tokio::spawn(wake(s));
                        }
                    }
                    // A buffer not filled held every ready event: asking again would
                    // find none (one `epoll_wait` per wake saved).
                    if n < events.capacity() {
                        break;
                    }
                }
                guard.clear_ready();
            }
            _ = keeper.kick.notified() => {
                for s in slab.take_where(poll.get_ref(), |s| s.info.kill_reason().is_some()) {
                    tokio::spawn(wake(s));
                }
            }
            _ = tick.tick(), if slab.with_deadline > 0 => {
                let now = Tick::now();
                let due = |s: &Session| s.idle_deadline().is_some_and(|d| d <= now);
                for s in slab.take_where(poll.get_ref(), due) {
                    tokio::spawn(wake(s));
                }
            }
        }
    }
}

/// The janitor's sweep: asks clients idle for [`SWEEP_IDLE`] or more to sleep.
pub fn sweep(app: &App) {
    if !app.keeper.running() {
        return;
    }
    app.keeper.fresh_sweep();
    let now = Tick::now();
    app.client_reg.for_each(|c| {
        if !c.meta.is_admin()
            && !c.is_asleep()
            && c.state() == crate::stats::conns::ClientState::Idle
            && c.request_age(now) >= sweep_idle(c.sweep_shift())
        {
            c.ask_to_sleep();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_that_comes_back_soon_is_let_idle_longer() {
        assert_eq!(sweep_idle(0), SWEEP_IDLE);
        let back_soon = Duration::from_secs(3);
        let mut shift = 0;
        for want in [4, 8, 16, 32, 32] {
            shift = next_shift(shift, back_soon);
            assert_eq!(sweep_idle(shift), Duration::from_secs(want));
        }
        // Back only after a long sleep: idle again, from the start.
        assert_eq!(next_shift(shift, CAME_BACK), 0);
        assert_eq!(next_shift(2, CAME_BACK + back_soon), 0);
        // A shift out of range is held to the longest wait.
        assert_eq!(sweep_idle(u8::MAX), sweep_idle(MAX_SWEEP_SHIFT));
    }

    #[test]
    fn new_clients_that_come_back_soon_make_the_next_ones_wait_longer() {
        let k = Keeper::default();
        assert_eq!(k.fresh_sleep(), FRESH_SLEEP);
        // Quiet for a second or more after the login: idle, no change.
        k.fresh_came_back(FRESH_BACK);
        assert_eq!(k.fresh_sleep(), FRESH_SLEEP);
        let soon = Duration::from_millis(25);
        for ms in [20, 40, 80, 160, 320, 320] {
            k.fresh_came_back(soon);
            assert_eq!(k.fresh_sleep(), Duration::from_millis(ms));
        }
        // Sweeps with a client back soon keep it; then it halves every 10 without.
        k.fresh_sweep();
        for _ in 0..FRESH_DECAY_SWEEPS - 1 {
            k.fresh_sweep();
        }
        assert_eq!(k.fresh_sleep(), Duration::from_millis(320));
        k.fresh_sweep();
        assert_eq!(k.fresh_sleep(), Duration::from_millis(160));
        for _ in 0..FRESH_DECAY_SWEEPS * 8 {
            k.fresh_sweep();
        }
        assert_eq!(k.fresh_sleep(), FRESH_SLEEP);
    }
}
