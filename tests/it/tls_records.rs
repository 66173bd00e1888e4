//! The size of the TLS records Sluice sends a client, read off the wire by a rustls
//! client of the test's own: no record may carry more than 8 kB of plaintext, or
//! libpq's asynchronous API can hang (`tls::MAX_RECORD_PLAINTEXT`). The same client
//! counts the session tickets it is sent: none (libpq never resumes a session).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::client::{Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::NamedGroup;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use rustls_pki_types::pem::PemObject;

use crate::support::raw;
use crate::support::{self, TRUST_USER};
use crate::tls::Certs;

/// A TCP stream that keeps a copy of every byte read from it.
struct Tee {
    tcp: TcpStream,
    seen: Vec<u8>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.tcp.read(buf)?;
        self.seen.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// rustls's own client session cache, counting the TLS 1.3 tickets it is given.
#[derive(Debug)]
struct Tickets {
    cache: ClientSessionMemoryCache,
    count: AtomicUsize,
}

impl ClientSessionStore for Tickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.cache.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.cache.kx_hint(name)
    }
    fn set_tls12_session(&self, name: ServerName<'static>, v: Tls12ClientSessionValue) {
        self.cache.set_tls12_session(name, v)
    }
    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.cache.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.cache.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(&self, name: ServerName<'static>, v: Tls13ClientSessionValue) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.cache.insert_tls13_ticket(name, v)
    }
    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.cache.take_tls13_ticket(name)
    }
}

/// Reads messages until ReadyForQuery; the tags seen, and the longest message.
fn read_to_ready(s: &mut impl Read) -> std::io::Result<(Vec<u8>, usize)> {
    let (mut tags, mut longest) = (Vec::new(), 0);
    loop {
        let mut head = [0u8; 5];
        s.read_exact(&mut head)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        s.read_exact(&mut body)?;
        tags.push(head[0]);
        longest = longest.max(len);
        if head[0] == b'Z' {
            return Ok((tags, longest));
        }
    }
}

#[test]
fn records_carry_at_most_8_kb() {
    let certs = Certs::new();
    let s = certs.trusting("require").start();

    let tcp = TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut tee = Tee {
        tcp,
        seen: Vec::new(),
    };
    tee.write_all(&raw::ssl_request()).expect("SSLRequest");
    let mut answer = [0u8; 1];
    tee.read_exact(&mut answer).expect("answer");
    assert_eq!(answer[0], b'S');
    tee.seen.clear();

    let mut roots = RootCertStore::empty();
    let ca = CertificateDer::from_pem_file(certs.path("ca.pem")).expect("CA");
    roots.add(ca).expect("root");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tickets = Arc::new(Tickets {
        cache: ClientSessionMemoryCache::new(8),
        count: AtomicUsize::new(0),
    });
    config.resumption = Resumption::store(tickets.clone());
    let name = ServerName::try_from("localhost").expect("name");
    let conn = ClientConnection::new(Arc::new(config), name).expect("client");
    let mut tls = StreamOwned::new(conn, tee);

    let startup = raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", TRUST_USER), ("database", support::TEST_DB)],
    );
    tls.write_all(&startup).expect("startup");
    let (tags, _) =
        read_to_ready(&mut tls).unwrap_or_else(|e| panic!("login: {e}\n{}", s.diagnostics()));
    assert!(!tags.contains(&b'E'), "login failed: {tags:?}");
    tls.write_all(&raw::query_message("SELECT repeat('x', 300000)"))
        .expect("query");
    let (tags, longest) = read_to_ready(&mut tls).expect("answer");
    assert!(
        tags.contains(&b'D') && longest > 300000,
        "{tags:?} {longest}"
    );

    // Every record: type, version, length, then that many bytes. Under TLS 1.3 a
    // record's length is its plaintext plus the inner content type and a 16-byte tag.
    let wire = &tls.sock.seen;
    let (mut at, mut lengths) = (0, Vec::new());
    while at + 5 <= wire.len() {
        let len = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
        lengths.push(len);
        at += 5 + len;
    }
    assert_eq!(at, wire.len(), "the bytes read end inside a record");
    let biggest = lengths.iter().max().copied().unwrap_or(0);
    assert!(
        biggest <= 8192 + 17,
        "a record of {biggest} bytes carries more than 8 kB"
    );
    assert!(
        biggest > 8000,
        "records were cut smaller than needed: {biggest}"
    );
    assert!(
        lengths.len() > 36,
        "300 kB in only {} records",
        lengths.len()
    );
    // Tickets come right after the handshake, long before this answer's end.
    assert_eq!(
        tickets.count.load(Ordering::Relaxed),
        0,
        "session tickets sent"
    );
}
