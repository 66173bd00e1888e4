//! Server login against a scripted fake PostgreSQL: misbehaving servers must give the
//! client a bounded, clear error and never a session.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::auth::login_error;
use crate::support::SluiceBuilder;

/// What the fake server does after reading the StartupMessage.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// Offers SCRAM, reads the client's first message, then says AuthenticationOk
    /// without the server's final message (skipping mutual authentication).
    SkipScramFinal,
    /// Asks for GSSAPI (7), which Sluice cannot do.
    AskGss,
    /// Sends bytes that are not protocol messages.
    Garbage,
    /// Says nothing and keeps the socket open.
    Silent,
    /// Asks for a cleartext password; records it, then refuses.
    Cleartext,
    /// Logs in at once (trust), then sends a FATAL error with its ReadyForQuery, as
    /// a backend terminated as it logs in does; reports each startup.
    DiesAfterLogin,
}

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn auth(code: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = code.to_be_bytes().to_vec();
    b.extend_from_slice(payload);
    msg(b'R', &b)
}

fn read_exact_or_eof(s: &mut TcpStream, n: usize) -> Option<Vec<u8>> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).ok().map(|_| v)
}

/// Reads the untagged StartupMessage, answering `N` to an SSLRequest before it (as a
/// server without TLS does; Sluice asks first under the default `prefer`).
fn read_startup(s: &mut TcpStream) -> Option<Vec<u8>> {
    loop {
        let len = read_exact_or_eof(s, 4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let body = read_exact_or_eof(s, len.checked_sub(4)?)?;
        if body != 80877103u32.to_be_bytes() {
            return Some(body);
        }
        s.write_all(b"N").ok()?;
    }
}

/// Reads one tagged frontend message.
fn read_msg(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let h = read_exact_or_eof(s, 5)?;
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    Some((h[0], read_exact_or_eof(s, len.checked_sub(4)?)?))
}

fn serve(mut s: TcpStream, script: Script, seen: std::sync::mpsc::Sender<Vec<u8>>) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    if read_startup(&mut s).is_none() {
        return;
    }
    match script {
        Script::SkipScramFinal => {
            let _ = s.write_all(&auth(10, b"SCRAM-SHA-256\0\0"));
            if read_msg(&mut s).is_none() {
                return;
            }
            let mut out = auth(0, &[]);
            out.extend(msg(b'S', b"server_version\x0099.0\0"));
            out.extend(msg(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
            out.extend(msg(b'Z', b"I"));
            let _ = s.write_all(&out);
        }
        Script::AskGss => {
            let _ = s.write_all(&auth(7, &[]));
        }
        Script::Garbage => {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot postgres at all");
        }
        Script::Silent => {
            std::thread::sleep(Duration::from_secs(20));
            return;
        }
        Script::DiesAfterLogin => {
            let _ = seen.send(Vec::new());
            let mut out = auth(0, &[]);
            out.extend(msg(b'S', b"server_version\x0099.0\0"));
            out.extend(msg(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
            out.extend(msg(b'Z', b"I"));
            let mut e =
                b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0"
                    .to_vec();
            e.push(0);
            out.extend(msg(b'E', &e));
            let _ = s.write_all(&out);
        }
        Script::Cleartext => {
            let _ = s.write_all(&auth(3, &[]));
            if let Some((_, body)) = read_msg(&mut s) {
                let _ = seen.send(body);
            }
            let mut e = b"SFATAL\0VFATAL\0C28P01\0Mfake refusal\0".to_vec();
            e.push(0);
            let _ = s.write_all(&msg(b'E', &e));
        }
    }
    // Let Sluice read what was sent before the socket closes.
    std::thread::sleep(Duration::from_millis(500));
}

/// Starts a fake server; returns its port and a channel of password bodies received.
fn fake_server(script: Script) -> (u16, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake server");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || serve(s, script, tx));
        }
    });
    (port, rx)
}

/// Logs a client in through Sluice to the fake server; returns the client's error.
async fn login_via_fake(script: Script, password: &str) -> (String, String, Duration) {
    let (port, _rx) = fake_server(script);
    let mut db = format!("host=127.0.0.1 port={port} dbname=fake user=fake");
    if !password.is_empty() {
        db.push_str(&format!(" password={password}"));
    }
    let sluice = SluiceBuilder::new()
        .no_default_database()
        .setting("auth_type", "any")
        .setting("server_connect_timeout", "2")
        .database("fake", &db)
        .start();
    let started = Instant::now();
    let (code, message) = login_error(&sluice.config("anyone", "", "fake")).await;
    (code, message, started.elapsed())
}

#[tokio::test]
async fn auth_server_fake_scram_without_server_final_is_refused() {
    let (code, msg, _) = login_via_fake(Script::SkipScramFinal, "secretpw").await;
    assert_eq!(code, "28000", "{msg}");
    assert!(msg.contains("SCRAM"), "{msg}");
}

#[tokio::test]
async fn auth_server_fake_unsupported_method_is_refused() {
    let (code, msg, _) = login_via_fake(Script::AskGss, "secretpw").await;
    assert_eq!(code, "28000", "{msg}");
    assert!(msg.contains("unsupported authentication"), "{msg}");
}

#[tokio::test]
async fn auth_server_fake_garbage_is_a_connection_failure() {
    let (code, msg, took) = login_via_fake(Script::Garbage, "secretpw").await;
    assert_eq!(code, "08006", "{msg}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test]
async fn auth_server_fake_silent_server_times_out() {
    let (code, msg, took) = login_via_fake(Script::Silent, "secretpw").await;
    assert_eq!(code, "08006", "{msg}");
    assert!(msg.contains("timed out"), "{msg}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

#[tokio::test]
async fn auth_server_fake_cleartext_sends_the_configured_password() {
    let (port, rx) = fake_server(Script::Cleartext);
    let sluice = SluiceBuilder::new()
        .no_default_database()
        .setting("auth_type", "any")
        .database(
            "fake",
            &format!("host=127.0.0.1 port={port} dbname=fake user=fake password=s3cret"),
        )
        .start();
    let (code, msg) = login_error(&sluice.config("anyone", "", "fake")).await;
    assert_eq!((code.as_str(), msg.as_str()), ("28P01", "fake refusal"));
    let body = rx.recv_timeout(Duration::from_secs(5)).expect("a password");
    assert_eq!(body, b"s3cret\0");
}

/// A server that dies right after each login (its FATAL error with its ReadyForQuery)
/// fails the client it was for, but is no refused login: the next client gets a login
/// of its own, not the first one's error at once for `server_login_retry` (PgBouncer
/// counts such a server as connected and fails nobody fast for it).
#[tokio::test]
async fn auth_server_fake_a_server_dying_after_login_fails_no_one_fast() {
    let (port, startups) = fake_server(Script::DiesAfterLogin);
    let sluice = SluiceBuilder::new()
        .no_default_database()
        .setting("auth_type", "any")
        .setting("server_login_retry", "30")
        .database(
            "fake",
            &format!("host=127.0.0.1 port={port} dbname=fake user=fake"),
        )
        .start();
    for attempt in 1..=2 {
        let (code, msg) = login_error(&sluice.config("anyone", "", "fake")).await;
        assert!(!code.is_empty(), "attempt {attempt}: {msg}");
        let seen = startups.try_iter().count();
        assert_eq!(
            seen, 1,
            "attempt {attempt}: {seen} server logins ({code} {msg})"
        );
    }
}
