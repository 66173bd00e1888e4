//! TLS towards PostgreSQL (`server_tls_*`), against a private server with `ssl = on`
//! whose certificate names `localhost` only. The server itself reports whether a
//! session is encrypted (`pg_stat_ssl`), so nothing here trusts Sluice's word.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::pg::PrivatePg;
use crate::support::{self, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};
use crate::tls::Certs;

/// `ssl` and `version` of the server session that runs the query.
const WHICH: &str = "SELECT ssl::text || ' ' || coalesce(version, '') \
                     FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

/// A private server with TLS on: sluice_scram may log in over TLS only, and
/// sluice_plain only with a client certificate for its name.
pub(crate) fn tls_server(certs: &Certs) -> PrivatePg {
    let pg = PrivatePg::start();
    pg.enable_tls(
        &[
            ("server.crt", &certs.pem("localhost.pem")),
            ("server.key", &certs.pem("localhost.key")),
            ("root.crt", &certs.pem("ca.pem")),
        ],
        "hostnossl all sluice_scram 127.0.0.1/32 reject\n\
         hostssl all sluice_plain 127.0.0.1/32 cert",
        &[
            ("ssl", "on"),
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
            ("ssl_ca_file", "root.crt"),
        ],
    );
    pg
}

/// [`tls_server`] with certificates of its own, started off the async workers.
async fn started() -> (PrivatePg, Certs) {
    tokio::task::spawn_blocking(|| {
        let certs = Certs::new();
        (tls_server(&certs), certs)
    })
    .await
    .expect("server")
}

/// A Sluice for `pg` under the name `host`, with `settings`.
fn sluice(pg: &PrivatePg, host: &str, settings: &[(&str, &str)]) -> Sluice {
    sluice_env(pg, host, settings, &[])
}

/// [`sluice`] with environment variables for the Sluice process.
fn sluice_env(
    pg: &PrivatePg,
    host: &str,
    settings: &[(&str, &str)],
    env: &[(&str, &str)],
) -> Sluice {
    let mut b = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .userlist(support::PLAIN_USER, "unused")
        .userlist(crate::admin::ADMIN, crate::admin::ADMIN_PW)
        .database(
            TEST_DB,
            &format!("host={host} port={} dbname={TEST_DB}", pg.port()),
        );
    for (k, v) in settings {
        b = b.setting(k, v);
    }
    for (k, v) in env {
        b = b.env(k, v);
    }
    b.start()
}

/// What [`WHICH`] says for `user` through `s`, or the error the client got.
async fn which(s: &Sluice, user: &str, password: &str) -> Result<String, String> {
    let cfg = s.config(user, password, TEST_DB);
    let connect = tokio::time::timeout(Duration::from_secs(20), cfg.connect(tokio_postgres::NoTls));
    let (client, conn) = match connect.await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(message(&e)),
        Err(_) => return Err("login timed out".into()),
    };
    tokio::spawn(conn);
    let row = client
        .query_one(WHICH, &[])
        .await
        .map_err(|e| message(&e))?;
    Ok(row.get(0))
}

/// The server's (or Sluice's) message, not tokio-postgres's "db error".
fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or(e.to_string(), |d| d.message().to_owned())
}

async fn md5(s: &Sluice) -> Result<String, String> {
    which(s, MD5_USER, MD5_PASSWORD).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_modes_and_certificate_checks() {
    let (pg, certs) = started().await;

    // prefer, PgBouncer's default: encrypted, and the console shows it.
    let s = sluice(&pg, "127.0.0.1", &[]);
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.3"));
    let servers = crate::admin::psql(&s, "SHOW SERVERS");
    let col = servers.header.iter().position(|h| h == "tls");
    let cells: Vec<&str> = (servers.rows.iter())
        .filter_map(|r| col.and_then(|c| r.get(c)).map(String::as_str))
        .collect();
    assert!(
        cells.len() == 1 && cells[0].starts_with("TLSv1.3/TLS_"),
        "{servers:?}"
    );
    drop(s);

    // disable: plaintext, which the server refuses sluice_scram.
    let s = sluice(&pg, "127.0.0.1", &[("server_tls_sslmode", "disable")]);
    assert_eq!(md5(&s).await.as_deref(), Ok("false "));
    let err = which(&s, support::SCRAM_USER, support::SCRAM_PASSWORD).await;
    assert!(
        err.as_ref().is_err_and(|e| e.contains("no encryption")),
        "{err:?}"
    );
    drop(s);

    // require, TLS 1.2 only.
    let s = sluice(
        &pg,
        "127.0.0.1",
        &[
            ("server_tls_sslmode", "require"),
            ("server_tls_protocols", "tlsv1.2"),
        ],
    );
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.2"));
    drop(s);

    // verify-ca checks the chain but not the name; verify-full checks both.
    let ca = certs.path("ca.pem");
    fn verify<'a>(mode: &'a str, ca: &'a str) -> [(&'a str, &'a str); 2] {
        [("server_tls_sslmode", mode), ("server_tls_ca_file", ca)]
    }
    let s = sluice(&pg, "127.0.0.1", &verify("verify-ca", &ca));
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.3"));
    drop(s);
    let s = sluice(&pg, "localhost", &verify("verify-full", &ca));
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.3"));
    drop(s);
    let s = sluice(&pg, "127.0.0.1", &verify("verify-full", &ca));
    assert!(md5(&s).await.is_err());
    assert!(s.log().contains("TLS handshake failed"), "{}", s.log());
    assert!(s.log().contains("not valid for name"), "{}", s.log());
    drop(s);
    let other = certs.path("other-ca.pem");
    let s = sluice(&pg, "127.0.0.1", &verify("verify-ca", &other));
    assert!(md5(&s).await.is_err());
    assert!(
        s.log().contains("invalid peer certificate: UnknownIssuer"),
        "{}",
        s.log()
    );
    drop(s);

    // Without server_tls_ca_file, the system's CA bundle is trusted (SSL_CERT_FILE
    // names it here, as OpenSSL reads it).
    let full = [("server_tls_sslmode", "verify-full")];
    let s = sluice_env(&pg, "localhost", &full, &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(
        md5(&s).await.as_deref(),
        Ok("true TLSv1.3"),
        "{}",
        s.diagnostics()
    );
    drop(s);
    let s = sluice_env(&pg, "localhost", &full, &[("SSL_CERT_FILE", &other)]);
    assert!(md5(&s).await.is_err());
    assert!(s.log().contains("UnknownIssuer"), "{}", s.log());
    drop(s);

    // A client certificate for servers that ask for one.
    let s = sluice(
        &pg,
        "127.0.0.1",
        &[
            ("server_tls_key_file", &certs.path("plain.key")),
            ("server_tls_cert_file", &certs.path("plain.pem")),
        ],
    );
    let got = which(&s, support::PLAIN_USER, "unused").await;
    assert_eq!(got.as_deref(), Ok("true TLSv1.3"), "{}", s.diagnostics());
}

/// `require` against a server without TLS: the client is told, and nothing goes
/// over plaintext.
#[tokio::test]
async fn require_fails_against_a_server_without_tls() {
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("server_tls_sslmode", "require")
        .start();
    let err = md5(&s).await.expect_err("logged in over plaintext");
    assert!(err.contains("server refused SSL"), "{err}");
    // prefer falls back to plaintext there.
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .start();
    assert_eq!(md5(&s).await.as_deref(), Ok("false "));
}

/// A reload that changes `server_tls_sslmode` replaces the pools' connections; one
/// that leaves it alone keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changing_server_tls_reconnects() {
    let (pg, _certs) = started().await;
    // One server, lent per transaction: the pid tells whether it is the same one.
    let settings = [
        ("server_tls_sslmode", "disable"),
        ("pool_mode", "transaction"),
        ("default_pool_size", "1"),
    ];
    let mut s = sluice(&pg, "127.0.0.1", &settings);
    assert_eq!(md5(&s).await.as_deref(), Ok("false "));
    s.reload_replacing(
        "server_tls_sslmode = disable",
        "server_tls_sslmode = require",
    );
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.3"));
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(conn);
    let before = backend_pid(&client).await;
    // Nothing changed: the same connection serves on, transaction after transaction.
    s.reload_replacing("server_tls_sslmode", "server_tls_sslmode");
    assert_eq!(
        backend_pid(&client).await,
        before,
        "the same server connection"
    );
    assert_eq!(
        backend_pid(&client).await,
        before,
        "the same server connection"
    );
}

/// The backend pid of the server connection `client`'s next transaction runs on.
async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    let row = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("query");
    row.get(0)
}

/// Megabytes each way through a TLS server link (the tunnel as a TLS client), and a
/// server killed in the middle of a client's transaction: that client gets an error,
/// the next one a new encrypted connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_data_and_a_dying_server_over_tls() {
    let (pg, _certs) = started().await;
    let settings = [
        ("server_tls_sslmode", "require"),
        ("pool_mode", "transaction"),
        ("default_pool_size", "2"),
    ];
    let s = sluice(&pg, "127.0.0.1", &settings);
    let psql = |sql: &str, input: Option<&str>| {
        let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, TEST_DB);
        cmd.args(["-c", sql]);
        let out =
            support::run_bounded(&mut cmd, input, Duration::from_secs(60)).expect("psql hung");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{sql}: {err}\n{}", s.diagnostics());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let data: String = (0..20000)
        .map(|k| format!("{k}\t{}\n", "v".repeat(250 + k % 7)))
        .collect();
    psql("CREATE TABLE big (k int, v text)", None);
    psql("COPY big FROM STDIN", Some(&data));
    let back = psql("COPY (SELECT k, v FROM big ORDER BY k) TO STDOUT", None);
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());

    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (holder, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(conn);
    holder
        .batch_execute("BEGIN; SELECT 1")
        .await
        .expect("begin");
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE usename = 'sluice_md5' AND state = 'idle in transaction'",
    );
    let lost = tokio::time::timeout(Duration::from_secs(20), holder.batch_execute("SELECT 2"));
    assert!(
        lost.await.expect("an answer").is_err(),
        "the killed server answered"
    );
    assert_eq!(md5(&s).await.as_deref(), Ok("true TLSv1.3"));
}

/// A TCP forwarder to `port` that passes only connections opening with an
/// SSLRequest, as a network that lets nothing through in clear; others are closed
/// and counted. Stops accepting after `life`.
fn tls_only_gate(port: u16, life: Duration) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let gate = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let refused = Arc::new(AtomicUsize::new(0));
    let counted = refused.clone();
    std::thread::spawn(move || {
        let until = Instant::now() + life;
        while Instant::now() < until {
            let Ok((mut inbound, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let _ = inbound.set_nonblocking(false);
            let _ = inbound.set_read_timeout(Some(Duration::from_secs(10)));
            let mut first = [0u8; 8];
            if inbound.read_exact(&mut first).is_err() || first[4..] != 80877103u32.to_be_bytes() {
                counted.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let _ = inbound.set_read_timeout(None);
            let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let _ = outbound.write_all(&first);
            let pipe = |mut from: TcpStream, mut to: TcpStream| {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                })
            };
            if let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) {
                pipe(a, outbound);
                pipe(b, inbound);
            }
        }
    });
    (gate, refused)
}

/// A cancel for a client whose server link is TLS goes over TLS too: through a
/// network that passes nothing in clear, the query is still cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_use_tls_when_the_server_link_does() {
    let (pg, _certs) = started().await;
    let (gate, refused) = tls_only_gate(pg.port(), Duration::from_secs(120));
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(
            TEST_DB,
            &format!("host=127.0.0.1 port={gate} dbname={TEST_DB}"),
        )
        .setting("server_tls_sslmode", "require")
        .start();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(conn);
    let token = client.cancel_token();
    let sleeping = tokio::spawn(async move { client.batch_execute("SELECT pg_sleep(60)").await });
    let started = Instant::now();
    let asleep = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'";
    while pg.psql(asleep).trim() != "1" {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the query never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel sent to Sluice");
    let r = tokio::time::timeout(Duration::from_secs(20), sleeping).await;
    let err = r
        .expect("the query was not cancelled")
        .expect("task")
        .expect_err("ran");
    assert!(message(&err).contains("canceling statement"), "{err}");
    assert_eq!(refused.load(Ordering::SeqCst), 0, "something went in clear");
}

/// `server_tls13_ciphers` picks the suite Sluice offers PostgreSQL, which reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_cipher_settings_pick_the_suite() {
    let (pg, _certs) = started().await;
    let s = sluice(
        &pg,
        "127.0.0.1",
        &[
            ("server_tls_sslmode", "require"),
            ("server_tls13_ciphers", "TLS_AES_128_GCM_SHA256"),
        ],
    );
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (client, conn) =
        tokio::time::timeout(Duration::from_secs(20), cfg.connect(tokio_postgres::NoTls))
            .await
            .expect("login timed out")
            .expect("login");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("query");
    assert_eq!(
        row.get::<_, String>(0),
        "TLS_AES_128_GCM_SHA256",
        "{}",
        s.diagnostics()
    );
}
