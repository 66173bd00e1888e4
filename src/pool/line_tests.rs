//! Tests of a pool's line.

use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use super::*;
use crate::pool::slot::SlotToken;
use crate::pool::Checkout;

fn pool() -> Arc<Pool> {
    Pool::one_slot_for_tests()
}

fn queue(p: &Arc<Pool>) -> Ticket {
    join(p, &mut p.lock_state(), Tick::now(), Waker::noop())
}

#[test]
fn a_slot_given_up_before_it_is_taken_goes_to_the_next_in_line() {
    let p = pool();
    p.lock_state().total = 1;
    let (first, mut second) = (queue(&p), queue(&p));
    assert_eq!(p.counts().waiting, 2);
    assert!(second.poll_answer(&mut || {}).is_pending());
    // The one connection's slot frees: the oldest waiter is answered...
    drop(SlotToken::counted(p.clone()));
    assert_eq!(p.counts().waiting, 1);
    // ... but has gone before taking it: the slot passes on, not lost.
    drop(first);
    let Poll::Ready(Answer::Granted(Grant::Slot(slot))) = second.poll_answer(&mut || {}) else {
        panic!("the next waiter got no slot");
    };
    assert_eq!(p.counts().total, 1);
    drop(second);
    // With nobody waiting, a freed slot lowers the count.
    drop(slot);
    assert_eq!(p.counts().total, 0);
    assert!(p.lock_state().answers.is_empty());
}

#[test]
fn checkout_follows_a_reload_of_the_pool_size() {
    let p = pool();
    // Its one connection is lent out: the next client waits in line.
    p.lock_state().total = 1;
    let now = Tick::now();
    assert!(matches!(
        p.checkout(now, Waker::noop()),
        Checkout::Queued(_)
    ));
    // A reload raises the pool size; checkout reads its copy under the lock, which
    // must follow: there is room to connect now.
    let mut cfg = (*p.config()).clone();
    cfg.pool_size = 2;
    p.reconfigure(cfg);
    assert!(matches!(p.checkout(now, Waker::noop()), Checkout::Slow));
}

fn request(text: &str) -> Box<Request> {
    let meta = crate::stats::conns::test_meta(1);
    Request::new(
        BytesMut::from(text),
        Arc::default(),
        Arc::new(ClientInfo::new(meta)),
    )
}

#[test]
fn a_request_left_in_line_comes_back_with_any_answer_but_a_server() {
    let p = pool();
    p.lock_state().total = 1;
    let (mut first, mut second) = (queue(&p), queue(&p));
    assert!(first.leave_request(request("one")).is_ok());
    assert!(second.leave_request(request("two")).is_ok());
    // A slot (no server to write to) comes with the request as it was.
    drop(SlotToken::counted(p.clone()));
    let Poll::Ready(Answer::Granted(Grant::Slot(slot))) = first.poll_answer(&mut || {}) else {
        panic!("the first in line got no slot");
    };
    let r = first.take_request().expect("the request comes back");
    assert_eq!((&r.bytes[..], r.sent), (&b"one"[..], false));
    // So does a refusal.
    p.close();
    assert!(matches!(
        second.poll_answer(&mut || {}),
        Poll::Ready(Answer::Refused)
    ));
    assert_eq!(&second.take_request().expect("back").bytes[..], b"two");
    // A place that was answered takes no request.
    assert!(second.leave_request(request("late")).is_err());
    drop((slot, first, second));
    assert!(p.lock_state().answers.is_empty());
}

#[test]
fn a_place_given_up_leaves_the_line_and_a_closed_pool_refuses_the_rest() {
    let p = pool();
    p.lock_state().total = 1;
    let (gone, mut left) = (queue(&p), queue(&p));
    drop(gone);
    assert_eq!(p.counts().waiting, 1, "a dropped ticket leaves the line");
    p.close();
    assert!(matches!(
        left.poll_answer(&mut || {}),
        Poll::Ready(Answer::Refused)
    ));
    assert_eq!(p.counts().waiting, 0);
    drop(left);
    assert!(p.lock_state().answers.is_empty());
}

#[test]
fn a_long_wait_is_told_once_and_only_past_query_wait_notify() {
    let p = pool();
    p.lock_state().total = 1;
    let start = Tick::now();
    // One statement each: a guard lives to the end of its statement.
    let mut old = join(&p, &mut p.lock_state(), start, Waker::noop());
    let later = start + Duration::from_secs(3);
    let mut young = join(&p, &mut p.lock_state(), later, Waker::noop());
    let notify = Duration::from_secs(5);
    let told = std::cell::Cell::new(0);
    let mut note = || told.set(told.get() + 1);
    // At 6 s only the first has waited 5 s.
    p.notify_waiters(start + Duration::from_secs(6), notify);
    assert!(old.poll_answer(&mut note).is_pending());
    assert_eq!(told.get(), 1);
    assert!(young.poll_answer(&mut note).is_pending());
    assert_eq!(told.get(), 1);
    // Later both have: the first is not told again.
    p.notify_waiters(start + Duration::from_secs(9), notify);
    assert!(old.poll_answer(&mut note).is_pending());
    assert!(young.poll_answer(&mut note).is_pending());
    assert_eq!(told.get(), 2);
    // Zero: never.
    p.notify_waiters(start + Duration::from_secs(60), Duration::ZERO);
    assert!(p.lock_state().notices.is_empty());
    // A notice owed to a waiter that leaves goes with it.
    p.notify_waiters(start + Duration::from_secs(9), Duration::from_secs(1));
    assert!(p.lock_state().notices.is_empty(), "both were told already");
    let mut third = join(
        &p,
        &mut p.lock_state(),
        start + Duration::from_secs(4),
        Waker::noop(),
    );
    p.notify_waiters(start + Duration::from_secs(9), notify);
    assert_eq!(p.lock_state().notices.len(), 1);
    third.leave(&mut p.lock_state());
    assert!(p.lock_state().notices.is_empty());
}

#[tokio::test]
async fn a_request_that_binds_prepared_statements_goes_only_to_a_server_that_has_them() {
    use std::io::Read;
    let p = pool();
    let (mut conn, mut peer) = crate::pool::testing::lent(&p);
    let registry = crate::prepared::Registry::default();
    let stmt = registry.intern(bytes::Bytes::from_static(b"select 1\0\0\0"));
    let meta = crate::stats::conns::test_meta(1);
    let info = Arc::new(crate::stats::conns::ClientInfo::new(meta));
    let mut r = Request::new(BytesMut::from("B..."), Arc::default(), info);
    r.needs.push(stmt.clone());
    // The server lacks it: the request stays, for the waiter's relay to prepare it.
    r.send_on(&mut conn);
    assert!(!r.sent && &r.bytes[..] == b"B...");
    conn.prepared.insert(&stmt);
    r.send_on(&mut conn);
    assert!(r.sent && r.bytes.is_empty());
    let mut got = [0; 4];
    peer.read_exact(&mut got).expect("the request");
    assert_eq!(&got, b"B...");
}
