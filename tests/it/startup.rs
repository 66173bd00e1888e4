//! The startup phase over raw sockets: database lookup, startup parameters,
//! SSL/GSS refusals, protocol version negotiation, malformed packets, the login
//! timeout and clients vanishing mid-login.

use std::time::{Duration, Instant};

use super::auth::{login_error, whoami};
use crate::support::raw::{self, Msg, RawConn, RawError};
use crate::support::{self, Sluice, SluiceBuilder};

const T: Duration = Duration::from_secs(10);

/// auth_type=trust, clients reach PostgreSQL as themselves; `sluice_trust` listed.
fn trust_builder() -> SluiceBuilder {
    SluiceBuilder::new()
        .setting("auth_type", "trust")
        .userlist(support::TRUST_USER, "")
}

fn trust_params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("user", support::TRUST_USER),
        ("database", support::TEST_DB),
    ]
}

fn first_error(msgs: &[Msg]) -> Option<(String, String)> {
    msgs.iter().find_map(Msg::error)
}

/// Sends `bytes` as the first thing on a new connection and expects an
/// ErrorResponse with `code`/`message` and a close.
fn expect_refused(sluice: &Sluice, bytes: &[u8], code: &str, message: &str) {
    let mut c = RawConn::tcp(sluice.port());
    c.send(bytes).unwrap();
    let msgs = c.expect_closed(T).unwrap();
    assert_eq!(
        first_error(&msgs),
        Some((code.to_owned(), message.to_owned())),
        "{msgs:?}"
    );
}

/// A normal trust login plus a query, as proof that Sluice still serves clients.
fn assert_serves(sluice: &Sluice) {
    let mut c = RawConn::tcp(sluice.port());
    c.login_no_password(&trust_params()).unwrap();
    assert_eq!(
        c.simple_query("SELECT 6 * 7").unwrap(),
        vec![Some("42".into())]
    );
    c.send(&raw::terminate_message()).unwrap();
}

#[tokio::test]
async fn startup_unknown_database_is_refused() {
    let sluice = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .start();
    let (code, msg) =
        login_error(&sluice.config(support::MD5_USER, support::MD5_PASSWORD, "nosuchdb")).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("3D000", "no such database: nosuchdb")
    );
    // Told only after the password, as PgBouncer tells it: a client that cannot log
    // in learns nothing of which databases exist.
    let (code, msg) = login_error(&sluice.config(support::MD5_USER, "wrong", "nosuchdb")).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("28P01", "password authentication failed"),
        "{}",
        sluice.diagnostics()
    );
    let (_, msg) = login_error(&sluice.config("nobody", "wrong", "nosuchdb")).await;
    assert_eq!(msg, "password authentication failed");
    // PgBouncer's line, with the client's prefix.
    let log = sluice.log();
    let line = log.lines().find(|l| l.contains("no such user: nobody"));
    assert!(
        line.is_some_and(|l| l.contains(": nosuchdb/nobody@127.0.0.1:")),
        "{line:?}\n{}",
        sluice.diagnostics()
    );
    assert!(
        sluice
            .log()
            .contains("login failed: db=nosuchdb user=sluice_md5"),
        "{}",
        sluice.diagnostics()
    );
    // Without a database parameter the user name is the database name.
    let sluice = trust_builder().start();
    expect_refused(
        &sluice,
        &raw::startup_packet(raw::PROTOCOL_3_0, &[("user", support::TRUST_USER)]),
        "3D000",
        "no such database: sluice_trust",
    );
}

#[test]
fn startup_unsupported_parameter_is_refused() {
    let sluice = trust_builder().start();
    let mut params = trust_params();
    params.push(("foo", "bar"));
    expect_refused(
        &sluice,
        &raw::startup_packet(raw::PROTOCOL_3_0, &params),
        "08P01",
        "unsupported startup parameter: foo",
    );
    let mut params = trust_params();
    params.push(("extra_float_digits", "2"));
    expect_refused(
        &sluice,
        &raw::startup_packet(raw::PROTOCOL_3_0, &params),
        "08P01",
        "unsupported startup parameter: extra_float_digits",
    );
    assert_serves(&sluice);
}

/// A client of the old V2 protocol is told so, in PgBouncer's words.
#[test]
fn startup_v2_protocol_is_named() {
    let sluice = trust_builder().start();
    let v2 = raw::startup_packet(2 << 16, &[("user", support::TRUST_USER)]);
    expect_refused(&sluice, &v2, "08P01", "old V2 protocol not supported");
    assert_serves(&sluice);
}

#[test]
fn startup_ignored_parameter_is_accepted() {
    let sluice = trust_builder()
        .setting("ignore_startup_parameters", "extra_float_digits, foo")
        .start();
    let mut params = trust_params();
    params.push(("extra_float_digits", "2"));
    params.push(("FOO", "bar"));
    let mut c = RawConn::tcp(sluice.port());
    let msgs = c.login_no_password(&params).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "{msgs:?}");
    assert_eq!(
        c.simple_query("SELECT current_user").unwrap(),
        vec![Some(support::TRUST_USER.into())]
    );
}

/// `options` (libpq's, `PGOPTIONS`) as PgBouncer reads it: `-c`/`--` settings of
/// tracked parameters are taken (and reach the server in transaction pooling too);
/// any other setting, or another switch, is refused, unless
/// `ignore_startup_parameters` names `options`.
#[test]
fn startup_options_set_tracked_parameters() {
    let sluice = trust_builder().setting("pool_mode", "transaction").start();
    let show = |options: &str, sql: &str| {
        let mut params = trust_params();
        params.push(("options", options));
        let mut c = RawConn::tcp(sluice.port());
        c.login_no_password(&params).unwrap();
        c.simple_query(sql).unwrap()
    };
    let options = "-c timezone=Portugal  -c    datestyle=German,\\ YMD";
    assert_eq!(
        show(options, "SHOW timezone"),
        vec![Some("Portugal".into())]
    );
    assert_eq!(
        show(options, "SHOW DateStyle"),
        vec![Some("German, YMD".into())]
    );
    assert_eq!(
        show("--TimeZone=Europe/Lisbon", "SHOW timezone"),
        vec![Some("Europe/Lisbon".into())]
    );
    for (options, message) in [
        ("-c enable_seqscan=off", "unsupported startup parameter in options: enable_seqscan"),
        (
            "-d",
            "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed",
        ),
    ] {
        let mut params = trust_params();
        params.push(("options", options));
        expect_refused(&sluice, &raw::startup_packet(raw::PROTOCOL_3_0, &params), "08P01", message);
    }
    assert_serves(&sluice);

    // Named in ignore_startup_parameters: what cannot be taken is ignored.
    let lenient = trust_builder()
        .setting("ignore_startup_parameters", "options")
        .start();
    let mut params = trust_params();
    params.push(("options", "-c enable_seqscan=off -c timezone=Portugal"));
    let mut c = RawConn::tcp(lenient.port());
    c.login_no_password(&params).unwrap();
    assert_eq!(
        c.simple_query("SHOW enable_seqscan").unwrap(),
        vec![Some("on".into())]
    );
    assert_eq!(
        c.simple_query("SHOW timezone").unwrap(),
        vec![Some("Portugal".into())]
    );
}

#[test]
fn startup_missing_user_is_refused() {
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("database", support::TEST_DB)],
    ))
    .unwrap();
    let msgs = c.expect_closed(T).unwrap();
    let (code, _) = first_error(&msgs).expect("an error");
    assert_eq!(code, "08P01", "{msgs:?}");
}

#[test]
fn startup_ssl_request_is_refused_then_login_works() {
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::ssl_request()).unwrap();
    assert_eq!(c.read_byte(T).unwrap(), b'N');
    // A second request on the same socket is answered too (libpq tries GSS then SSL).
    c.send(&raw::gssenc_request()).unwrap();
    assert_eq!(c.read_byte(T).unwrap(), b'N');
    let msgs = c.login_no_password(&trust_params()).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "{msgs:?}");
    assert!(
        msgs.iter().any(|m| m.tag == b'K'),
        "BackendKeyData: {msgs:?}"
    );
    assert_eq!(c.simple_query("SELECT 1").unwrap(), vec![Some("1".into())]);
}

#[test]
fn startup_gssenc_request_is_refused_then_login_works() {
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::gssenc_request()).unwrap();
    assert_eq!(c.read_byte(T).unwrap(), b'N');
    let msgs = c.login_no_password(&trust_params()).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "{msgs:?}");
    assert_eq!(c.simple_query("SELECT 2").unwrap(), vec![Some("2".into())]);
}

#[test]
fn startup_protocol_3_2_is_negotiated_down_to_3_0() {
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    let mut params = trust_params();
    params.push(("_pq_.test_option", "1"));
    c.send(&raw::startup_packet(raw::PROTOCOL_3_2, &params))
        .unwrap();
    let v = c.read_msg(T).unwrap();
    assert_eq!(v.tag, b'v', "{v:?}");
    let b = &v.body;
    let minor = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    assert_eq!(minor, 0, "newest minor version supported: {v:?}");
    let count = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    assert_eq!(count, 1, "{v:?}");
    assert_eq!(&b[8..], b"_pq_.test_option\0");
    let msgs = c.read_until(b'Z', T).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "{msgs:?}");
    assert_eq!(c.simple_query("SELECT 3").unwrap(), vec![Some("3".into())]);

    // Plain 3.2 without options: 'v' with an empty option list.
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(raw::PROTOCOL_3_2, &trust_params()))
        .unwrap();
    let v = c.read_msg(T).unwrap();
    assert_eq!(v.tag, b'v', "{v:?}");
    assert_eq!(v.body, [0, 0, 0, 0, 0, 0, 0, 0], "minor 0, no options");
    c.read_until(b'Z', T).unwrap();
}

#[test]
fn startup_malformed_packets_are_refused_without_harm() {
    // A packet that announces more bytes than it sends waits for them, so the login
    // timeout bounds those cases.
    let sluice = trust_builder().setting("client_login_timeout", "2").start();
    let mut unterminated = raw::startup_packet(raw::PROTOCOL_3_0, &trust_params());
    unterminated.truncate(unterminated.len() - 2);
    let n = unterminated.len() as u32;
    unterminated[..4].copy_from_slice(&n.to_be_bytes());
    let mut no_final_nul = raw::startup_packet(raw::PROTOCOL_3_0, &trust_params());
    no_final_nul.pop();
    let n = no_final_nul.len() as u32;
    no_final_nul[..4].copy_from_slice(&n.to_be_bytes());
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("length 4", vec![0, 0, 0, 4, 0, 3, 0, 0]),
        ("length 0", vec![0, 0, 0, 0]),
        ("length 7", vec![0, 0, 0, 7, 0, 3, 0]),
        ("length > 10000", {
            let mut p = 10_001u32.to_be_bytes().to_vec();
            p.extend_from_slice(&raw::PROTOCOL_3_0.to_be_bytes());
            p
        }),
        ("negative length", vec![0xff, 0xff, 0xff, 0xf0, 0, 3, 0, 0]),
        (
            "protocol 2.0",
            raw::startup_packet(2 << 16, &[("user", support::TRUST_USER)]),
        ),
        (
            "protocol 4.0",
            raw::startup_packet(4 << 16, &[("user", support::TRUST_USER)]),
        ),
        ("unterminated string", unterminated),
        ("no final NUL", no_final_nul),
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "short ssl request",
            raw::untagged(raw::SSL_REQUEST_CODE, &[1]),
        ),
        (
            "short cancel",
            raw::untagged(raw::CANCEL_REQUEST_CODE, &[1, 2, 3]),
        ),
        (
            "invalid utf-8",
            raw::untagged(raw::PROTOCOL_3_0, b"user\0\xff\xfe\0\0"),
        ),
    ];
    // Pseudo-random garbage, deterministic.
    let mut x: u32 = 0x1234_5678;
    for i in 0..8 {
        let bytes: Vec<u8> = (0..64 + i * 13)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        if i % 2 == 0 {
            cases.push(("random bytes", bytes));
        } else {
            // A well-framed 3.0 startup packet with a random parameter list.
            cases.push((
                "random parameters",
                raw::untagged(raw::PROTOCOL_3_0, &bytes),
            ));
        }
    }
    for (what, bytes) in &cases {
        let started = Instant::now();
        let mut c = RawConn::tcp(sluice.port());
        let _ = c.send(bytes);
        let msgs = match c.expect_closed(T) {
            Ok(m) => m,
            Err(e) => panic!("{what}: {e}"),
        };
        assert!(started.elapsed() < T, "{what}");
        // Whatever came back is an ErrorResponse (the 'N' of an SSL request aside).
        for m in &msgs {
            assert_eq!(m.tag, b'E', "{what}: {msgs:?}");
            assert_eq!(m.field(b'C').as_deref(), Some("08P01"), "{what}: {msgs:?}");
        }
    }
    assert_serves(&sluice);
}

#[test]
fn startup_bad_packet_header_is_named_as_pgbouncer_names_it() {
    // A length no startup packet can have: the first eight bytes in hex, to the
    // client and in the log's closing line, as PgBouncer reports it.
    let sluice = trust_builder().setting("log_disconnections", "1").start();
    let cases: [(&[u8], &str); 3] = [
        (&[0, 0, 0, 4, 0, 3, 0, 0], "0000000400030000"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "474554202f204854"),
        (&[0, 1, 0, 0, 0, 3, 0, 0, 1, 2], "0001000000030000"),
    ];
    for (bytes, hex) in cases {
        let why = format!("bad packet header: '{hex}'");
        expect_refused(&sluice, bytes, "08P01", &why);
        let closing = "(nodb)/(nouser)@127.0.0.1:";
        let line = format!("closing because: {why} (age=0s)");
        assert!(
            support::wait_until(T, || sluice
                .log()
                .lines()
                .any(|l| l.contains(" LOG C-") && l.contains(closing) && l.ends_with(&line))),
            "{}",
            sluice.diagnostics()
        );
    }
    assert_serves(&sluice);
}

#[test]
fn startup_ssl_answer_is_a_single_byte_before_the_error() {
    // SSL request followed by pipelined bytes: PostgreSQL refuses this to avoid a
    // plaintext injection. Whatever Sluice does, it must not log the client in.
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    let mut p = raw::ssl_request();
    p.extend(raw::startup_packet(raw::PROTOCOL_3_0, &trust_params()));
    c.send(&p).unwrap();
    let mut got = Vec::new();
    loop {
        match c.read_byte(T) {
            Ok(b) => got.push(b),
            Err(RawError::Closed) => break,
            Err(e) => panic!("{e:?} after {got:?}"),
        }
    }
    assert!(
        !got.contains(&b'Z'),
        "logged in after pipelined SSLRequest: {got:?}"
    );
    assert_serves(&sluice);
}

#[test]
fn startup_client_login_timeout_closes_idle_clients() {
    // tcp_defer_accept off (Sluice's default; PgBouncer's is on for Linux): with it
    // the kernel keeps a silent connection from the pooler until its first bytes.
    let sluice = trust_builder()
        .setting("client_login_timeout", "1")
        .setting("tcp_defer_accept", "0")
        .start();
    // Silent client, and one that stops in the middle of its startup packet.
    let mut silent = RawConn::tcp(sluice.port());
    let mut partial = RawConn::tcp(sluice.port());
    partial.send(&[0, 0, 0, 40, 0, 3]).unwrap();
    // And one that stops after the authentication request.
    let md5 = SluiceBuilder::new()
        .setting("client_login_timeout", "1")
        .userlist("alice", "alicepw")
        .start();
    let mut mid_auth = RawConn::tcp(md5.port());
    mid_auth
        .send(&raw::startup_packet(
            raw::PROTOCOL_3_0,
            &[("user", "alice"), ("database", support::TEST_DB)],
        ))
        .unwrap();
    assert_eq!(mid_auth.read_msg(T).unwrap().auth_code(), Some(5));

    let started = Instant::now();
    for (what, c) in [
        ("silent", &mut silent),
        ("partial", &mut partial),
        ("mid-auth", &mut mid_auth),
    ] {
        let msgs = c
            .expect_closed(Duration::from_secs(8))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if let Some((code, msg)) = first_error(&msgs) {
            assert_eq!(code, "08P01", "{what}: {msg}");
        }
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // With its age, as PgBouncer logs it: the second it waited.
    let line = "(nodb)/(nouser)@127.0.0.1:";
    let why = "closing because: client_login_timeout (age=1s)";
    assert!(
        support::wait_until(T, || sluice
            .log()
            .lines()
            .any(|l| l.contains(line) && l.ends_with(why))),
        "{}",
        sluice.diagnostics()
    );
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );
    assert_serves(&sluice);
}

#[tokio::test]
async fn startup_clients_vanishing_mid_auth_do_not_disturb_others() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "scram-sha-256")
        .database("sluice_test", super::auth::DB_AS_TRUST_USER)
        .userlist("alice", "alicepw")
        .userlist(
            "carol",
            &postgres_protocol::password::scram_sha_256(b"carolpw"),
        )
        .start();
    let port = sluice.port();
    // Clients that leave at each point of the login, from blocking threads.
    let quitters = std::thread::spawn(move || {
        for round in 0..10 {
            for user in ["alice", "carol", "nobody"] {
                let mut c = RawConn::tcp(port);
                c.send(&raw::startup_packet(
                    raw::PROTOCOL_3_0,
                    &[("user", user), ("database", support::TEST_DB)],
                ))
                .unwrap();
                if round % 3 == 0 {
                    c.close();
                    continue;
                }
                let m = c.read_msg(T).expect("SASL request");
                assert_eq!(m.auth_code(), Some(10), "{m:?}");
                if round % 3 == 1 {
                    c.close();
                    continue;
                }
                // A SASLInitialResponse, then vanish before the final message.
                let first = b"n,,n=,r=abcdefghijklmnopqrstuvwx";
                let mut body = b"SCRAM-SHA-256\0".to_vec();
                body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                body.extend_from_slice(first);
                c.send(&raw::tagged(b'p', &body)).unwrap();
                let m = c.read_msg(T).expect("SASL continue");
                assert_eq!(m.auth_code(), Some(11), "{m:?}");
                c.close();
            }
        }
    });
    for _ in 0..5 {
        let who = whoami(&sluice.config("carol", "carolpw", support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER);
        let who = whoami(&sluice.config("alice", "alicepw", support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER);
    }
    tokio::task::spawn_blocking(move || quitters.join())
        .await
        .unwrap()
        .expect("quitter thread panicked");
    let who = whoami(&sluice.config("carol", "carolpw", support::TEST_DB)).await;
    assert_eq!(who, support::TRUST_USER);
}

#[test]
fn startup_cancel_request_with_unknown_key_is_closed_silently() {
    let sluice = trust_builder().start();
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::cancel_request(12345, 67890)).unwrap();
    let msgs = c.expect_closed(T).unwrap();
    assert!(msgs.is_empty(), "{msgs:?}");
    assert_serves(&sluice);
}

#[test]
fn startup_packets_long_in_pieces_or_followed_by_a_query_log_in() {
    // The first read of a packet goes to a 512-byte stack buffer (session/login.rs):
    // a longer packet, one that comes in pieces, one sent only after a pause, and
    // one with a query behind it in the same segment each take another path from
    // there.
    let sluice = trust_builder().start();
    let long_name = "a".repeat(900);
    let mut long = trust_params();
    long.push(("application_name", &long_name));
    let mut c = RawConn::tcp(sluice.port());
    let msgs = c.login_no_password(&long).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "long packet: {msgs:?}");
    assert_eq!(c.simple_query("SELECT 1").unwrap(), vec![Some("1".into())]);

    let packet = raw::startup_packet(raw::PROTOCOL_3_0, &trust_params());
    let mut c = RawConn::tcp(sluice.port());
    for piece in [&packet[..3], &packet[3..20], &packet[20..]] {
        c.send(piece).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    let msgs = c.read_until(b'Z', T).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "in pieces: {msgs:?}");
    assert_eq!(c.simple_query("SELECT 2").unwrap(), vec![Some("2".into())]);

    // Quiet at first: the first read, tried before any wait, finds nothing and the
    // login waits for the packet.
    let mut c = RawConn::tcp(sluice.port());
    std::thread::sleep(Duration::from_millis(100));
    c.send(&packet).unwrap();
    let msgs = c.read_until(b'Z', T).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "quiet at first: {msgs:?}");
    assert_eq!(c.simple_query("SELECT 3").unwrap(), vec![Some("3".into())]);

    // The same two on the UNIX socket (its own accept loop).
    for pause in [0, 100] {
        let mut c = RawConn::unix(sluice.socket_dir(), sluice.port());
        std::thread::sleep(Duration::from_millis(pause));
        c.send(&packet).unwrap();
        let msgs = c.read_until(b'Z', T).unwrap();
        assert_eq!(msgs[0].auth_code(), Some(0), "unix, {pause} ms: {msgs:?}");
        assert_eq!(c.simple_query("SELECT 4").unwrap(), vec![Some("4".into())]);
    }

    let mut c = RawConn::tcp(sluice.port());
    let mut both = packet.clone();
    both.extend(raw::query_message("SELECT 6 * 7"));
    c.send(&both).unwrap();
    let msgs = c.read_until(b'Z', T).unwrap();
    assert_eq!(msgs[0].auth_code(), Some(0), "with a query: {msgs:?}");
    let rows = c.read_until(b'Z', T).unwrap();
    let row = rows.iter().find(|m| m.tag == b'D').expect("a DataRow");
    assert!(row.body.ends_with(b"42"), "{rows:?}");
}
