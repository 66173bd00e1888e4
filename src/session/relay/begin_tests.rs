use super::*;

/// A message of `tag` with `body`.
fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn answer() -> Vec<u8> {
    [msg(b'C', b"BEGIN\0"), msg(b'Z', b"T")].concat()
}

fn owed() -> Relay {
    let mut r = Relay::default();
    r.begin = Begin::Owed;
    r
}

/// Reads `bytes` as one server read would, and strips.
fn read(r: &mut Relay, bytes: &[u8]) -> Result<bool, ProtocolError> {
    let start = r.s2c.len();
    r.s2c.extend_from_slice(bytes);
    r.strip_begin(start)
}

#[test]
fn the_answer_to_the_begin_is_cut_and_what_follows_it_stays() {
    let rest = [msg(b'C', b"INSERT 0 1\0"), msg(b'Z', b"T")].concat();
    let mut r = owed();
    assert_eq!(read(&mut r, &[answer(), rest.clone()].concat()), Ok(true));
    assert_eq!(&r.s2c[..], &rest[..]);
    assert_eq!(r.begin, Begin::No);
}

#[test]
fn messages_the_server_sends_on_its_own_stay_where_they_are() {
    let param = msg(b'S', b"TimeZone\0UTC\0");
    let notice = msg(b'N', b"SNOTICE\0Mhi\0\0");
    let bytes = [
        param.clone(),
        msg(b'C', b"BEGIN\0"),
        notice.clone(),
        msg(b'Z', b"T"),
        msg(b'I', b""),
    ]
    .concat();
    let mut r = owed();
    assert_eq!(read(&mut r, &bytes), Ok(true));
    assert_eq!(&r.s2c[..], &[param, notice, msg(b'I', b"")].concat()[..]);
}

#[test]
fn an_answer_cut_anywhere_waits_for_the_rest() {
    let whole = [answer(), msg(b'I', b"")].concat();
    for at in 1..answer().len() {
        let mut r = owed();
        assert_eq!(read(&mut r, &whole[..at]), Ok(false), "cut at {at}");
        assert!(r.s2c.is_empty(), "nothing goes on before it: cut at {at}");
        assert_eq!(read(&mut r, &whole[at..]), Ok(true), "cut at {at}");
        assert_eq!(&r.s2c[..], &msg(b'I', b"")[..], "cut at {at}");
        assert!(r.begin_head.is_empty());
    }
}

#[test]
fn anything_else_in_its_place_is_an_error() {
    let bad = [
        [msg(b'E', b"SERROR\0C25001\0Mno\0\0"), msg(b'Z', b"I")].concat(),
        [msg(b'C', b"COMMIT\0"), msg(b'Z', b"I")].concat(),
        [msg(b'C', b"BEGIN\0"), msg(b'Z', b"I")].concat(),
        [msg(b'C', b"BEGIN\0"), msg(b'C', b"BEGIN\0")].concat(),
        msg(b'Z', b"T"),
        vec![b'C', 0, 0, 0, 3],
    ];
    for bytes in bad {
        assert!(read(&mut owed(), &bytes).is_err(), "{bytes:?}");
    }
}

/// A relay holding `bytes` as a client's request, as read and scanned.
fn with_request(bytes: &[u8]) -> Relay {
    let mut r = Relay::default();
    r.status = b'I';
    r.max_packet = 1 << 20;
    r.c2s.extend_from_slice(bytes);
    r.scan_client(0).expect("scan");
    r
}

#[test]
fn a_begin_alone_is_answered_only_when_the_client_would_wait() {
    let begin = msg(b'Q', b"begin;\0");
    let mut r = with_request(&begin);
    assert_eq!(
        r.take_begin(None, || false),
        Taken::No,
        "a free server takes it"
    );
    assert_eq!(&r.c2s[..], &begin[..]);
    assert_eq!(r.take_begin(None, || true), Taken::Begin(Modes::PLAIN));
    assert!(r.c2s.is_empty() && r.pending == 0);
    assert_eq!(&r.s2c[..], &answer()[..]);
    assert_eq!(r.stats.counts.queries, 1);
    // Answered: the next request carries a BEGIN ahead of it.
    r.s2c.clear();
    r.hold_begin(Modes::PLAIN);
    r.c2s.extend_from_slice(&msg(b'Q', b"SELECT 1\0"));
    r.put_begin_ahead();
    let ahead = [msg(b'Q', b"BEGIN\0"), msg(b'Q', b"SELECT 1\0")].concat();
    assert_eq!(&r.c2s[..], &ahead[..]);
    assert_eq!(r.begin, Begin::Owed);

    let start = msg(b'Q', b" START TRANSACTION READ ONLY \0");
    let mut r = with_request(&start);
    let Taken::Begin(modes) = r.take_begin(None, || true) else {
        panic!("not taken");
    };
    let tag = [msg(b'C', b"START TRANSACTION\0"), msg(b'Z', b"T")].concat();
    assert_eq!(&r.s2c[..], &tag[..]);
    // Its modes go with the BEGIN ahead of the next request.
    r.s2c.clear();
    r.hold_begin(modes);
    r.c2s.extend_from_slice(&msg(b'Q', b"SELECT 1\0"));
    r.put_begin_ahead();
    let ahead = [msg(b'Q', b"BEGIN READ ONLY\0"), msg(b'Q', b"SELECT 1\0")].concat();
    assert_eq!(&r.c2s[..], &ahead[..]);
}

#[test]
fn the_end_of_a_held_transaction_is_answered_at_once() {
    for (text, tag) in [
        (&b"COMMIT\0"[..], &b"COMMIT\0"[..]),
        (b"abort;\0", b"ROLLBACK\0"),
    ] {
        let mut r = with_request(&msg(b'Q', text));
        // Only once a BEGIN was held; then whether a server is free does not matter.
        assert_eq!(r.take_begin(None, || true), Taken::No);
        let free = || panic!("not asked");
        assert_eq!(r.take_begin(Some(Modes::PLAIN), free), Taken::End);
        assert!(r.c2s.is_empty() && r.pending == 0);
        assert_eq!(&r.s2c[..], &[msg(b'C', tag), msg(b'Z', b"I")].concat()[..]);
        assert_eq!((r.stats.counts.queries, r.stats.counts.xacts), (1, 1));
    }
    // Anything else goes to a server, the BEGIN ahead of it (a second BEGIN too).
    for text in [
        &b"BEGIN\0"[..],
        b"SELECT 1\0",
        b"COMMIT; SELECT 1\0",
        b"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE\0",
        b"SET TRANSACTION READ WRITE\0",
        b"SET TRANSACTION\0",
        b"SET LOCAL TRANSACTION READ ONLY\0",
    ] {
        let mut r = with_request(&msg(b'Q', text));
        assert_eq!(
            r.take_begin(Some(Modes::PLAIN), || true),
            Taken::No,
            "{text:?}"
        );
    }
}

#[test]
fn anything_but_a_begin_alone_goes_to_a_server() {
    let begin = msg(b'Q', b"BEGIN\0");
    for request in [
        msg(b'Q', b"BEGIN ISOLATION LEVEL SERIALIZABLE\0"),
        msg(b'Q', b"BEGIN READ WRITE\0"),
        msg(b'Q', b"BEGIN; SELECT 1\0"),
        msg(b'Q', b"SELECT 1\0"),
        [begin.clone(), msg(b'Q', b"SELECT 1\0")].concat(),
        begin[..begin.len() - 1].to_vec(),
    ] {
        let mut r = with_request(&request);
        assert_eq!(r.take_begin(None, || true), Taken::No, "{request:?}");
        assert_eq!(&r.c2s[..], &request[..]);
    }
}

#[test]
fn a_set_transaction_after_a_held_begin_is_answered_and_carried() {
    let set = msg(b'Q', b"set transaction isolation level repeatable read;\0");
    let mut r = with_request(&set);
    // Not without a held BEGIN: outside a transaction the server warns.
    assert_eq!(r.take_begin(None, || true), Taken::No);
    let free = || panic!("not asked");
    let held = Modes::PLAIN;
    let Taken::Set(modes) = r.take_begin(Some(held), free) else {
        panic!("not taken");
    };
    assert!(r.c2s.is_empty() && r.pending == 0);
    assert_eq!(
        &r.s2c[..],
        &[msg(b'C', b"SET\0"), msg(b'Z', b"T")].concat()[..]
    );
    assert_eq!((r.stats.counts.queries, r.stats.counts.xacts), (1, 0));
    r.s2c.clear();
    r.hold_begin(modes);
    r.c2s.extend_from_slice(&msg(b'Q', b"SELECT 1\0"));
    r.put_begin_ahead();
    let ahead = [
        msg(b'Q', b"BEGIN ISOLATION LEVEL REPEATABLE READ\0"),
        msg(b'Q', b"SELECT 1\0"),
    ];
    assert_eq!(&r.c2s[..], &ahead.concat()[..]);
}
