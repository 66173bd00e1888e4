//! Tests of the relay's prepared-statement mode.

use super::*;
use crate::clock::Tick;

fn plain_state() -> PreparedState {
    let kept = Box::new(ClientPrepared::new(Arc::new(Registry::default()), 10));
    let mut p = PreparedState::new(kept, BytesMut::new());
    p.mode = Mode::Plain;
    p
}

#[test]
fn a_tracker_that_saw_server_bytes_is_looked_at_and_reset() {
    let mut p = plain_state();
    // Plain, with no statements on either side: nothing to watch.
    assert!(!p.watches(false) && p.is_idle());
    // The server holds statements, so the answer goes through the tracker, and
    // this chunk ends inside a ReadyForQuery's header.
    assert!(p.watches(true));
    let mut chunk = BytesMut::from(&b"C\0\0\0\x0dSELECT 1\0Z\0\0"[..]);
    let mut server = ServerStatements::default();
    let mut framer = Framer::default();
    p.process_server_chunk(&mut framer, &mut chunk, &mut server, |_| Body::Skip)
        .expect("a well-formed chunk");
    // Held back: the tracker must keep watching, and the request is not over.
    assert!(p.tracker.mid_message(), "the split header is held");
    assert!(p.watches(false), "a held header keeps the tracker watching");
    assert!(!p.is_idle());
    p.tracker.can_retry = true;
    p.restart();
    assert!(!p.watched && p.mode == Mode::Fresh);
    assert!(
        !p.tracker.can_retry,
        "a watched tracker starts the next request blank"
    );
    assert!(!p.tracker.mid_message() && p.is_idle());
    p.mode = Mode::Plain;
    assert!(!p.watches(false), "nothing held over into the next request");
}

#[test]
fn a_plain_request_left_in_line_takes_its_input_buffer_and_no_other() {
    let mut r = Relay::default();
    r.max_packet = 1 << 20;
    r.prepared = Some(plain_state());
    let query = b"Q\0\0\0\x0dSELECT 1\0";
    let p = r.prepared.as_mut().expect("prepared mode");
    p.mode = Mode::Fresh;
    p.input = crate::net::bufpool::take();
    p.input.extend_from_slice(query);
    let at = p.input.as_ptr();
    let request = r.take_request().expect("a whole Query").expect("a request");
    assert_eq!(&request[..], query);
    assert_eq!(request.as_ptr(), at, "moved, not copied");
    let p = r.prepared.as_ref().expect("prepared mode");
    assert_eq!(p.mode, Mode::Plain);
    assert_eq!(p.input.capacity(), 0, "a waiting client holds one buffer");
    assert_eq!(r.c2s.capacity(), 0);
}

#[test]
fn a_request_left_in_line_keeps_its_box_for_the_clients_next_one() {
    let client = |id| Arc::new(ClientInfo::new(crate::stats::conns::test_meta(id)));
    let (info, stranger) = (client(1), client(2));
    let (params, other) = (Arc::new(ParamSet::default()), Arc::new(ParamSet::default()));
    let mut r = Relay::default();
    let mut first = r.line_request(BytesMut::from("Q1"), &params, &info);
    // The line wrote part of it, and the client sent more meanwhile.
    bytes::Buf::advance(&mut first.bytes, 1);
    (first.sent, first.more, first.granted) = (true, true, Some(Tick::now()));
    r.c2s.extend_from_slice(b"Q3");
    r.restore_line_request(first);
    assert_eq!(&r.c2s[..], b"1Q3", "what was not written goes first");
    // (A relay is its client's, so a kept box is never another client's.)
    let next = r.line_request(BytesMut::from("Q2"), &other, &stranger);
    assert!(
        Arc::ptr_eq(&next.client, &info),
        "the same box, not a new one"
    );
    assert_eq!(&next.bytes[..], b"Q2");
    assert!(!next.sent && !next.more && next.granted.is_none());
    assert!(
        Arc::ptr_eq(&next.params, &other),
        "this request's parameters"
    );
    r.restore_line_request(next);
    // A relay put away drops it (it names its client).
    super::super::spare::put(Box::new(r));
    let spare = super::super::spare::take().expect("the spare relay");
    assert!(spare.line_request.is_none());
    assert_eq!(Arc::strong_count(&info), 1);
}
