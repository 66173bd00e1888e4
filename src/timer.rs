//! Sleeps and timeouts on a `timerfd`, in place of tokio's time driver.
//!
//! With tokio's timers enabled, every park of the event loop goes through its time
//! driver: two locks, two clock reads and two scans of the timer wheel, whether or not
//! a timer is due (~350-500 instructions a park; a pooled transaction of seven
//! statements parks about seven times). Here the loop parks in the I/O driver alone:
//! the timers of a thread live in one ordered map, and a `timerfd` armed for the
//! earliest of them is one more socket-like file for epoll. A timer costs nothing
//! until it is polled, a lock and an insertion when it is, and a system call only
//! when it becomes the earliest (so the usual later-than-all-others insertions make
//! none); the timerfd fires at most once per distinct deadline reached.
//!
//! Each thread that polls a timer gets its own set (made at first use, in the
//! runtime of that moment); a timer keeps the set it was registered in, so a task
//! moved to another worker thread is still woken. A set whose driving task is gone
//! (its runtime shut down) is replaced at the next use.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::clock::Tick;

/// A future that completes at a point in time. `Unpin`, and 32 bytes: it can sit in
/// a session's future without a box.
#[derive(Debug)]
pub struct Sleep {
    at: Tick,
    reg: Reg,
}

/// Where a sleep waits to be woken.
#[derive(Debug)]
enum Reg {
    /// Not yet polled (or reset since).
    None,
    /// In a thread's set, under this id.
    Set(Arc<Timers>, u64),
    /// No timerfd could be made (out of file descriptors): a blocking thread sleeps
    /// until the deadline and wakes the task.
    Thread,
}

/// Sleeps for `d`.
pub fn sleep(d: Duration) -> Sleep {
    sleep_until(Tick::now() + d)
}

/// Sleeps until `at`.
pub fn sleep_until(at: Tick) -> Sleep {
    Sleep { at, reg: Reg::None }
}

impl Sleep {
    /// Moves the deadline; the next poll registers the new one.
    pub fn reset(&mut self, at: Tick) {
        if at != self.at {
            self.deregister();
            self.at = at;
        }
    }

    /// Whether its deadline has passed.
    pub fn passed(&self) -> bool {
        Tick::now() >= self.at
    }

    fn deregister(&mut self) {
        if let Reg::Set(timers, id) = std::mem::replace(&mut self.reg, Reg::None) {
            timers.lock().map.remove(&(self.at, id));
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Tick::now() >= this.at {
            this.deregister();
            return Poll::Ready(());
        }
        match &this.reg {
            Reg::Thread => {}
            Reg::Set(timers, id) => {
                let mut inner = timers.lock();
                match inner.map.get_mut(&(this.at, *id)) {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    Some(w) => *w = cx.waker().clone(),
                    // Taken by the driver an instant before the deadline as this
                    // thread reads the clock: put back, it fires at the next turn.
                    None => inner.insert(&timers.fd, this.at, *id, cx.waker()),
                }
            }
            Reg::None => match Timers::current() {
                Some(timers) => {
                    let id = {
                        let mut inner = timers.lock();
                        let id = inner.next_id;
                        inner.next_id += 1;
                        inner.insert(&timers.fd, this.at, id, cx.waker());
                        id
                    };
                    this.reg = Reg::Set(timers, id);
                }
                None => {
                    let (d, waker) = (this.at.since(Tick::now()), cx.waker().clone());
                    tokio::task::spawn_blocking(move || {
                        std::thread::sleep(d);
                        waker.wake();
                    });
                    this.reg = Reg::Thread;
                }
            },
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// The deadline passed before the future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline has elapsed")]
pub struct Elapsed;

/// Runs `fut` for at most `d`.
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    timeout_at(Tick::now() + d, fut).await
}

/// Runs `fut` until `at` at most.
pub async fn timeout_at<F: Future>(at: Tick, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let mut sleep = sleep_until(at);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(&mut sleep).poll(cx).map(|()| Err(Elapsed))
    })
    .await
}

/// Ticks every `period`, skipping the ticks missed while the owner was busy (tokio's
/// `MissedTickBehavior::Skip`); the first tick is at once.
#[derive(Debug)]
pub struct Interval {
    period: Duration,
    next: Tick,
}

pub fn interval(period: Duration) -> Interval {
    Interval {
        period,
        next: Tick::now(),
    }
}

impl Interval {
    pub async fn tick(&mut self) {
        sleep_until(self.next).await;
        let now = Tick::now();
        self.next = self.next + self.period;
        if self.next <= now {
            self.next = now + self.period;
        }
    }
}

/// One thread's timers.
#[derive(Debug)]
struct Timers {
    inner: Mutex<Inner>,
    /// The timerfd, armed for the earliest timer (or later: see `Inner::armed`).
    fd: OwnedFd,
    /// Cleared when the driving task is dropped with its runtime.
    alive: AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    /// By deadline, then registration order (ids are never reused).
    map: BTreeMap<(Tick, u64), Waker>,
    next_id: u64,
    /// What the timerfd is set to; None once it fired (a one-shot timerfd disarms
    /// itself). Timers removed early leave it set: a fire that finds nothing due
    /// costs less than a system call per removal.
    armed: Option<Tick>,
}

thread_local! {
    // Per thread, like tokio's own runtime context: each runtime thread drives its own
    // set, and nothing is shared between threads that do not share a timer.
    static CURRENT: RefCell<Option<Arc<Timers>>> = const { RefCell::new(None) };
}

impl Timers {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data; a panic elsewhere cannot leave the map inconsistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This thread's set, made (with its driving task) if there is none or its
    /// runtime is gone. None if no timerfd can be made.
    fn current() -> Option<Arc<Timers>> {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(t) = c.as_ref().filter(|t| t.alive.load(Ordering::Acquire)) {
                return Some(t.clone());
            }
            let t = Timers::start().ok()?;
            *c = Some(t.clone());
            Some(t)
        })
    }

    fn start() -> std::io::Result<Arc<Timers>> {
        #[cfg(test)]
        if tests::NO_TIMERFD.get() {
            return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        }
        // SAFETY: timerfd_create takes no pointers; a non-negative result is a new
        // file descriptor that nothing else owns, so OwnedFd may take it.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: see above.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let timers = Arc::new(Timers {
            inner: Mutex::new(Inner::default()),
            fd,
            alive: AtomicBool::new(true),
        });
        // SAFETY: `Driven` holds the set, whose OwnedFd keeps the timerfd open and the
        // same (it is never replaced) for as long as the AsyncFd owns the `Driven`.
        let io = unsafe {
            AsyncFd::register_with_interest(Driven(timers.clone()), tokio::io::Interest::READABLE)
        }?;
        tokio::spawn(drive(io));
        Ok(timers)
    }

    /// Wakes the timers that are due and arms the timerfd for the next.
    fn fire(&self) {
        let mut due: [Option<Waker>; 32] = Default::default();
        loop {
            let now = Tick::now();
            let mut n = 0;
            let more = {
                let mut inner = self.lock();
                inner.armed = None;
                while n < due.len() {
                    match inner.map.first_entry() {
                        Some(e) if e.key().0 <= now => {
                            due[n] = Some(e.remove());
                            n += 1;
                        }
                        _ => break,
                    }
                }
                if n < due.len() {
                    if let Some(&(at, _)) = inner.map.keys().next() {
                        inner.arm(&self.fd, at);
                    }
                }
                n == due.len()
            };
            // Woken outside the lock: a woken task may run (and register) at once on
            // another thread.
            due.iter_mut()
                .take(n)
                .filter_map(Option::take)
                .for_each(Waker::wake);
            if !more {
                return;
            }
        }
    }
}

impl Inner {
    fn insert(&mut self, fd: &OwnedFd, at: Tick, id: u64, waker: &Waker) {
        self.map.insert((at, id), waker.clone());
        if self.armed.is_none_or(|a| at < a) {
            self.arm(fd, at);
        }
    }

    fn arm(&mut self, fd: &OwnedFd, at: Tick) {
        // A zero it_value would disarm: the clock's origin is long past anyway.
        let ns = at.nanos_since(Tick::default()).max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `fd` is an open timerfd (owned by the set), `spec` a valid
        // itimerspec that outlives the call, and a null old-value pointer is allowed.
        let r = unsafe {
            libc::timerfd_settime(
                fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        // It cannot fail for a valid fd and spec; if it did, leave `armed` unset so
        // the next insertion tries again.
        if r == 0 {
            self.armed = Some(at);
        }
    }
}

/// The set's timerfd as the driving task registers it with the I/O driver.
struct Driven(Arc<Timers>);

impl AsRawFd for Driven {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

/// Waits for the timerfd and fires what is due, for as long as the runtime runs.
async fn drive(io: AsyncFd<Driven>) {
    loop {
        let Ok(mut ready) = io.readable().await else {
            return;
        };
        let mut count = [0u8; 8];
        // SAFETY: `count` is 8 writable bytes, what a timerfd read returns; the fd
        // is open while `io` is.
        let r = unsafe { libc::read(io.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        // Read or not (EAGAIN: a stale readiness), it is not readable now; a later
        // expiry is a new event, which `clear_ready` does not clear.
        ready.clear_ready();
        if r == 8 {
            io.get_ref().0.fire();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Makes this thread's timerfd fail, as out of file descriptors.
        pub(super) static NO_TIMERFD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    #[test]
    fn sleeps_fire_in_order_without_tokios_timers() {
        // No time driver in this runtime: tokio's own sleep would panic here.
        rt().block_on(async {
            let start = Tick::now();
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for ms in [60u64, 20, 40] {
                let order = order.clone();
                tasks.push(tokio::spawn(async move {
                    sleep(Duration::from_millis(ms)).await;
                    order.lock().unwrap().push(ms);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(*order.lock().unwrap(), vec![20, 40, 60]);
            assert!(start.elapsed() >= Duration::from_millis(60));
        });
    }

    #[test]
    fn timeouts_elapse_or_pass_the_value_through() {
        rt().block_on(async {
            let slow = timeout(Duration::from_millis(20), sleep(Duration::from_secs(30)));
            assert_eq!(slow.await, Err(Elapsed));
            let fast = timeout(Duration::from_secs(30), async { 7 });
            assert_eq!(fast.await, Ok(7));
            // What the docs promise of a sleep kept in a session's future.
            assert!(std::mem::size_of::<Sleep>() <= 32);
            // A dropped timer leaves the set: the long one above is gone.
            let timers = Timers::current().unwrap();
            assert!(timers.lock().map.is_empty());
        });
    }

    #[test]
    fn a_reset_sleep_fires_at_its_new_deadline() {
        rt().block_on(async {
            let start = Tick::now();
            let mut s = sleep(Duration::from_secs(30));
            // Registered at the far deadline, then moved close.
            assert!(futures_poll_once(&mut s).await.is_pending());
            s.reset(Tick::now() + Duration::from_millis(30));
            s.await;
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(10));
        });
    }

    #[test]
    fn a_new_runtime_on_the_same_thread_gets_a_new_set() {
        let first = rt().block_on(async {
            sleep(Duration::from_millis(5)).await;
            Timers::current().unwrap()
        });
        // Its runtime is gone, and with it the task that read its timerfd.
        assert!(!first.alive.load(Ordering::Acquire));
        rt().block_on(async {
            // The old set would never wake this sleep.
            let second = Timers::current().unwrap();
            assert!(!Arc::ptr_eq(&first, &second));
            sleep(Duration::from_millis(5)).await;
        });
    }

    #[test]
    fn intervals_skip_missed_ticks() {
        rt().block_on(async {
            let mut i = interval(Duration::from_millis(10));
            i.tick().await; // at once
            std::thread::sleep(Duration::from_millis(50)); // five periods missed
            let before = Tick::now();
            i.tick().await; // the overdue tick, at once
            i.tick().await; // then a whole period later, not a burst
            assert!(before.elapsed() >= Duration::from_millis(9));
        });
    }

    #[test]
    fn timers_wake_tasks_that_move_between_worker_threads() {
        // Run apart, so that a timer never woken fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_io()
                .build()
                .unwrap();
            let ok = rt.block_on(async {
                let tasks: Vec<_> = (0..64u64)
                    .map(|i| {
                        tokio::spawn(async move {
                            // Registered in one thread's set, then polled wherever the
                            // task runs next.
                            let mut s = sleep(Duration::from_millis(5 + i % 20));
                            let _ = futures_poll_once(&mut s).await;
                            tokio::task::yield_now().await;
                            s.await;
                            let long = sleep(Duration::from_secs(30));
                            timeout(Duration::from_millis(10), long).await.is_err()
                        })
                    })
                    .collect();
                let mut all = true;
                for t in tasks {
                    all &= t.await.unwrap_or(false);
                }
                all
            });
            let _ = tx.send(ok);
        });
        let ok = rx.recv_timeout(Duration::from_secs(30));
        assert_eq!(ok, Ok(true), "every sleep and timeout fired");
    }

    #[test]
    fn without_a_timerfd_sleeps_fall_back_to_a_blocking_thread() {
        NO_TIMERFD.set(true);
        let rt = rt();
        rt.block_on(async {
            assert!(Timers::current().is_none());
            let start = Tick::now();
            sleep(Duration::from_millis(20)).await;
            assert!(start.elapsed() >= Duration::from_millis(20));
            let slow = timeout(Duration::from_millis(20), sleep(Duration::from_secs(30)));
            assert_eq!(slow.await, Err(Elapsed));
        });
        // Not waiting for the blocking thread still sleeping out the 30 s.
        rt.shutdown_background();
        NO_TIMERFD.set(false);
    }

    /// Polls once, returning whether it was ready.
    async fn futures_poll_once(s: &mut Sleep) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *s).poll(cx))).await
    }
}
