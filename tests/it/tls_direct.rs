//! Direct TLS (PostgreSQL 17's `sslnegotiation=direct`, taken by PgBouncer 1.25): a
//! client that starts the TLS handshake at once, with ALPN `postgresql`, instead of
//! sending an SSLRequest first. The installed libpq (15) cannot do it, so the client
//! is rustls, driven as libpq 17 drives it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use rustls_pki_types::pem::PemObject;

use crate::support::raw;
use crate::support::{self, TRUST_USER};
use crate::tls::Certs;

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `port` started at once, offering `alpn`.
fn direct(certs: &Certs, port: u16, alpn: &[&[u8]]) -> Tls {
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(certs.path("ca.pem")).expect("CA"))
        .expect("root");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from("localhost").expect("name");
    let conn = ClientConnection::new(Arc::new(config), name).expect("client");
    StreamOwned::new(conn, tcp)
}

/// Messages up to ReadyForQuery (or the end of the stream): (tag, body) pairs.
fn messages(s: &mut impl Read) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut head = [0u8; 5];
        if s.read_exact(&mut head).is_err() {
            return out;
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if s.read_exact(&mut body).is_err() {
            return out;
        }
        out.push((head[0], body.clone()));
        if head[0] == b'Z' {
            return out;
        }
    }
}

/// Whether a startup packet sent over `tls` gets no message back (the handshake or
/// the connection failed).
fn gets_nothing(mut tls: Tls) -> bool {
    tls.write_all(&startup())
        .and_then(|()| tls.flush())
        .is_err()
        || messages(&mut tls).is_empty()
}

fn startup() -> Vec<u8> {
    raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", TRUST_USER), ("database", support::TEST_DB)],
    )
}

#[test]
fn a_direct_tls_client_logs_in_and_queries() {
    let certs = Certs::new();
    let s = certs.trusting("require").start();
    let mut tls = direct(&certs, s.port(), &[b"postgresql"]);
    tls.write_all(&startup()).expect("startup");
    let login = messages(&mut tls);
    assert!(
        login.last().is_some_and(|(t, _)| *t == b'Z'),
        "{login:?}\n{}",
        s.diagnostics()
    );
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"postgresql"[..]));
    tls.write_all(&raw::query_message("SELECT 40 + 2"))
        .expect("query");
    let answer = messages(&mut tls);
    let row = answer.iter().find(|(t, _)| *t == b'D').expect("a row");
    // DataRow: column count (2), then the value's length (4) and bytes.
    assert_eq!(&row.1[6..], b"42", "{answer:?}");
    // The console shows the client as a TLS one.
    assert!(s.log().contains("TLSv1.3"), "{}", s.log());
}

#[test]
fn direct_tls_needs_alpn_and_client_tls() {
    let certs = Certs::new();
    let s = certs.trusting("prefer").start();
    // No ALPN: refused after the handshake, with PostgreSQL's words.
    let mut tls = direct(&certs, s.port(), &[]);
    tls.write_all(&startup()).expect("startup");
    let refused = messages(&mut tls);
    let text = String::from_utf8_lossy(&refused.first().expect("an error").1).into_owned();
    assert_eq!(refused[0].0, b'E', "{refused:?}");
    assert!(text.contains("without ALPN"), "{text}");
    // Another protocol's ALPN: the handshake fails.
    assert!(gets_nothing(direct(&certs, s.port(), &[b"h2"])));

    // With client TLS off, a ClientHello is not taken.
    let plain = support::SluiceBuilder::new()
        .setting("auth_type", "trust")
        .userlist(TRUST_USER, "")
        .start();
    assert!(gets_nothing(direct(&certs, plain.port(), &[b"postgresql"])));
    assert!(
        plain.log().contains("client TLS is disabled"),
        "{}",
        plain.log()
    );
}
