//! Signals against the real `sluice` binary: SIGHUP reloads (ini and userlist) without
//! disturbing connected clients, and the three shutdown modes (SIGQUIT at once,
//! SIGTERM after the clients, SIGINT after the servers) plus a second SIGTERM.

use crate::support::{self, pg, wait_until, Sluice, SluiceBuilder};
use std::time::Duration;

fn md5_sluice() -> SluiceBuilder {
    SluiceBuilder::new().userlist(support::MD5_USER, support::MD5_PASSWORD)
}

async fn connect_md5(s: &Sluice, db: &str) -> tokio_postgres::Client {
    support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, db)).await
}

async fn select(client: &tokio_postgres::Client, n: i32) {
    let got: i32 = client
        .query_one("SELECT $1::int4", &[&n])
        .await
        .unwrap_or_else(|e| panic!("SELECT {n}: {e}"))
        .get(0);
    assert_eq!(got, n);
}

fn count(s: &Sluice, needle: &str) -> usize {
    s.log().matches(needle).count()
}

/// Sends SIGHUP and waits until the logfile shows the reload finished, one way or
/// the other (`config reloaded` or `reload failed`).
fn hup_and_wait(s: &mut Sluice, outcome: &str) {
    let before = count(s, outcome);
    s.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || count(s, outcome) > before),
        "no {outcome:?} after SIGHUP\n{}",
        s.diagnostics()
    );
}

/// The ini text with `line` added at the end of its `[databases]` section.
fn with_database(ini: &str, line: &str) -> String {
    ini.replacen("[databases]\n", &format!("[databases]\n{line}\n"), 1)
}

fn tcp_refused(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_database_and_keeps_clients() {
    let mut s = md5_sluice().start();
    let old = connect_md5(&s, support::TEST_DB).await;
    select(&old, 1).await;
    assert!(
        support::try_connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, "added_db"))
            .await
            .is_err()
    );

    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    let entry = format!(
        "added_db = host=127.0.0.1 port={} dbname={}",
        pg().port(),
        support::TEST_DB
    );
    s.rewrite_ini(&with_database(&ini, &entry));
    hup_and_wait(&mut s, "config reloaded");

    let new = connect_md5(&s, "added_db").await;
    let db: String = new
        .query_one("SELECT current_database()::text", &[])
        .await
        .expect("query")
        .get(0);
    assert_eq!(db, support::TEST_DB);
    // The client connected before the reload was not dropped.
    select(&old, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_userlist() {
    let mut s = md5_sluice().start();
    let old = connect_md5(&s, support::TEST_DB).await;
    let scram = s.config(
        support::SCRAM_USER,
        support::SCRAM_PASSWORD,
        support::TEST_DB,
    );
    assert!(
        support::try_connect(&scram).await.is_err(),
        "user not in the userlist got in"
    );
    let list = format!(
        "\"{}\" \"{}\"\n\"{}\" \"{}\"\n",
        support::MD5_USER,
        support::MD5_PASSWORD,
        support::SCRAM_USER,
        support::SCRAM_PASSWORD
    );
    std::fs::write(s.userlist_path(), list).expect("write userlist");
    hup_and_wait(&mut s, "config reloaded");
    let c = support::connect(&scram).await;
    let who: String = c
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("query")
        .get(0);
    assert_eq!(who, support::SCRAM_USER);
    select(&old, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_raises_default_pool_size() {
    let mut s = md5_sluice().setting("default_pool_size", "1").start();
    // Session mode: `a` keeps the only server once it has run a query.
    let a = connect_md5(&s, support::TEST_DB).await;
    select(&a, 1).await;
    let b = connect_md5(&s, support::TEST_DB).await;
    let blocked = tokio::time::timeout(Duration::from_millis(700), select(&b, 2)).await;
    assert!(blocked.is_err(), "pool_size 1 lent a second server");

    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    s.rewrite_ini(&ini.replace("default_pool_size = 1", "default_pool_size = 2"));
    hup_and_wait(&mut s, "config reloaded");
    let c = connect_md5(&s, support::TEST_DB).await;
    tokio::time::timeout(Duration::from_secs(5), select(&c, 3))
        .await
        .unwrap_or_else(|_| panic!("pool did not grow after reload\n{}", s.diagnostics()));
    select(&a, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_broken_ini_keeps_the_old_config() {
    let mut s = md5_sluice().start();
    let old = connect_md5(&s, support::TEST_DB).await;
    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    s.rewrite_ini(&format!("{ini}this is not a setting\nlisten_port = abc\n"));
    hup_and_wait(&mut s, "reload failed");
    assert!(s.is_running(), "exited on a broken reload");
    let log = s.log();
    let line = log
        .lines()
        .find(|l| l.contains("reload failed"))
        .unwrap_or_default();
    assert!(line.contains("] ERROR "), "not logged as an error: {line}");
    assert!(line.contains("sluice.ini:"), "no file:line: {line}");
    select(&old, 1).await;
    let new = connect_md5(&s, support::TEST_DB).await;
    select(&new, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_exits_at_once_with_a_client_connected() {
    let mut s = md5_sluice().start();
    let c = connect_md5(&s, support::TEST_DB).await;
    select(&c, 1).await;
    s.signal(libc::SIGQUIT);
    let status = s.wait_exit(Duration::from_secs(3));
    assert!(status.is_some(), "still running\n{}", s.diagnostics());
    assert!(c.query_one("SELECT 1", &[]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_clients_then_exits() {
    waits_for_the_client_then_exits(
        md5_sluice().start(),
        libc::SIGTERM,
        "with a client connected",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_exits_at_once() {
    let mut s = md5_sluice().start();
    let c = connect_md5(&s, support::TEST_DB).await;
    select(&c, 1).await;
    s.signal(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(3), || tcp_refused(s.port())),
        "first SIGTERM not handled\n{}",
        s.diagnostics()
    );
    assert!(s.is_running());
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(3));
    assert!(status.is_some(), "still running\n{}", s.diagnostics());
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_waits_for_servers_then_exits() {
    // In session mode the server stays linked to the client after its first query.
    let s = md5_sluice().setting("pool_mode", "session").start();
    waits_for_the_client_then_exits(s, libc::SIGINT, "while a client held a server").await;
}

/// A graceful shutdown signal: new connections are refused at once, the connected
/// client keeps working, and the process exits cleanly once that client leaves.
async fn waits_for_the_client_then_exits(mut s: Sluice, signal: i32, holding: &str) {
    let c = connect_md5(&s, support::TEST_DB).await;
    select(&c, 1).await;
    s.signal(signal);
    assert!(
        wait_until(Duration::from_secs(3), || tcp_refused(s.port())),
        "new TCP connections still accepted\n{}",
        s.diagnostics()
    );
    assert!(
        s.wait_exit(Duration::from_secs(1)).is_none(),
        "exited {holding}\n{}",
        s.diagnostics()
    );
    select(&c, 2).await;
    drop(c);
    let status = s.wait_exit(Duration::from_secs(5));
    assert!(
        status.is_some_and(|st| st.success()),
        "{status:?}\n{}",
        s.diagnostics()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_broken_userlist_keeps_the_old_users() {
    let mut s = md5_sluice().start();
    std::fs::write(
        s.userlist_path(),
        format!(
            "\"{}\" \"{}\"\nbroken\n",
            support::SCRAM_USER,
            support::SCRAM_PASSWORD
        ),
    )
    .expect("write userlist");
    hup_and_wait(&mut s, "reload failed");
    assert!(s.is_running());
    assert!(s.log().contains("userlist.txt:2:"), "{}", s.log());
    // The old userlist (md5 user only) is still in force.
    let c = connect_md5(&s, support::TEST_DB).await;
    select(&c, 1).await;
    let scram = s.config(
        support::SCRAM_USER,
        support::SCRAM_PASSWORD,
        support::TEST_DB,
    );
    assert!(support::try_connect(&scram).await.is_err());
}

#[test]
fn sighup_reopens_the_logfile() {
    let mut s = md5_sluice().start();
    let log = s.dir().join("sluice.log");
    let rotated = s.dir().join("sluice.log.1");
    std::fs::rename(&log, &rotated).expect("rotate logfile");
    s.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || support::read_lossy(&log)
            .contains("config reloaded")),
        "nothing logged to the reopened logfile\nrotated:\n{}\n{}",
        support::read_lossy(&rotated),
        s.diagnostics()
    );
}

#[test]
fn sigusr_signals_do_not_stop_the_process() {
    let mut s = md5_sluice().start();
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        s.signal(sig);
    }
    assert!(
        wait_until(Duration::from_secs(5), || s.log().contains("SIGUSR2")),
        "{}",
        s.diagnostics()
    );
    assert!(s.is_running(), "{}", s.diagnostics());
}

#[test]
fn socket_removed_after_sigint() {
    let mut s = md5_sluice().start();
    let path = s.socket_dir().join(format!(".s.PGSQL.{}", s.port()));
    assert!(path.exists());
    s.signal(libc::SIGINT);
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "still running"
    );
    assert!(!path.exists(), "socket file left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_max_client_conn() {
    let mut s = md5_sluice().setting("max_client_conn", "1").start();
    let a = connect_md5(&s, support::TEST_DB).await;
    let cfg = s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    assert!(support::try_connect(&cfg).await.is_err());
    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    s.rewrite_ini(&ini.replace("max_client_conn = 1", "max_client_conn = 2"));
    hup_and_wait(&mut s, "config reloaded");
    let b = support::connect(&cfg).await;
    select(&b, 1).await;
    select(&a, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_keeps_the_listen_port_and_warns() {
    let mut s = md5_sluice().start();
    let old_port = s.port();
    let new_port = support::free_port();
    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    s.rewrite_ini(&ini.replace(
        &format!("listen_port = {old_port}"),
        &format!("listen_port = {new_port}"),
    ));
    hup_and_wait(&mut s, "config reloaded");
    assert!(
        s.log()
            .contains("\"listen_port\" cannot be changed by a reload"),
        "{}",
        s.log()
    );
    let c = connect_md5(&s, support::TEST_DB).await;
    select(&c, 1).await;
    assert!(tcp_refused(new_port), "now also listening on {new_port}");
}

/// A database taken out of the ini is dropped at the reload, as PgBouncer drops it:
/// its clients are disconnected with `database removed`, idle, in a transaction or
/// in session pooling alike, and its servers closed; other databases' clients go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_removing_a_database_drops_its_clients() {
    for mode in ["session", "transaction"] {
        removing_a_database_drops_its_clients(mode).await;
    }
}

async fn removing_a_database_drops_its_clients(mode: &str) {
    use crate::support::wire::RawClient;
    let connstr = format!("host=127.0.0.1 port=@PG_PORT@ dbname={}", support::TEST_DB);
    let mut s = md5_sluice()
        .setting("pool_mode", mode)
        .setting("default_pool_size", "1")
        .database("doomed_db", &connstr)
        .start();
    let (user, pw) = (support::MD5_USER, support::MD5_PASSWORD);
    let port = s.port();
    let login = |db: &'static str| RawClient::login(port, user, pw, db, &[]);
    let mut in_txn = login("doomed_db").await.expect("login to doomed_db");
    in_txn.simple("BEGIN", Duration::from_secs(10)).await;
    let mut idle = login("doomed_db").await.expect("login to doomed_db");
    // Waits for the one server, held by the transaction.
    let mut waiting = login("doomed_db").await.expect("login to doomed_db");
    waiting.query("SELECT 1").await.expect("send a query");
    let other = connect_md5(&s, support::TEST_DB).await;
    select(&other, 1).await;

    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    let kept: Vec<&str> = ini
        .lines()
        .filter(|l| !l.starts_with("doomed_db"))
        .collect();
    s.rewrite_ini(&(kept.join("\n") + "\n"));
    hup_and_wait(&mut s, "config reloaded");

    let clients = [
        ("idle", &mut idle),
        ("in a transaction", &mut in_txn),
        ("waiting", &mut waiting),
    ];
    for (what, c) in clients {
        let m = c.recv(Duration::from_secs(5)).await;
        let m = m.unwrap_or_else(|| panic!("{mode}, {what}: closed without a word"));
        assert_eq!(m.tag, b'E', "{mode}, {what}: {m:?}");
        assert_eq!(
            m.field(b'M').as_deref(),
            Some("database removed"),
            "{what}: {m:?}"
        );
        assert!(
            c.recv(Duration::from_secs(5)).await.is_none(),
            "{what}: still open"
        );
    }
    select(&other, 2).await;
    let log = s.log();
    assert!(
        log.contains("dropping database 'doomed_db' as it does not exist anymore"),
        "{}",
        s.diagnostics()
    );
    assert!(
        log.contains("closing because: database removed"),
        "{}",
        s.diagnostics()
    );
    let again = login("doomed_db")
        .await
        .expect_err("logged in to a removed database");
    assert!(again.contains("no such database"), "{again}");
}

/// SIGINT in transaction pooling, as PgBouncer's WAIT_FOR_SERVERS: nothing more is
/// lent, so a client waiting in line for the one server, and a client that asks
/// later, are told `server shutting down` at once; the transaction under way ends
/// normally, and the process exits once its server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_tells_waiting_clients_the_server_is_shutting_down() {
    use crate::support::wire::RawClient;
    let mut s = md5_sluice()
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start();
    let (user, pw, db) = (support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    let mut holder = RawClient::login(s.port(), user, pw, db, &[])
        .await
        .expect("login");
    holder.simple("BEGIN", Duration::from_secs(10)).await;
    let mut later = RawClient::login(s.port(), user, pw, db, &[])
        .await
        .expect("login");
    let mut waiting = RawClient::login(s.port(), user, pw, db, &[])
        .await
        .expect("login");
    waiting.query("SELECT 1").await.expect("send");
    tokio::time::sleep(Duration::from_millis(200)).await;

    s.signal(libc::SIGINT);
    let told = |m: Option<crate::support::wire::RawMsg>, who: &str| {
        let m = m.unwrap_or_else(|| panic!("{who}: closed without a word"));
        assert_eq!(m.tag, b'E', "{who}: {m:?}");
        assert_eq!(
            m.field(b'M').as_deref(),
            Some("server shutting down"),
            "{who}"
        );
    };
    told(
        waiting.recv(Duration::from_secs(3)).await,
        "the client in line",
    );
    later.query("SELECT 2").await.expect("send");
    told(
        later.recv(Duration::from_secs(3)).await,
        "a client asking later",
    );

    // The transaction under way ends normally; then the process exits.
    let msgs = holder.simple("SELECT 3", Duration::from_secs(10)).await;
    let rows = crate::support::wire::first_column(&msgs);
    assert_eq!(rows, [Some("3".to_owned())], "{msgs:?}");
    holder.simple("COMMIT", Duration::from_secs(10)).await;
    let status = s.wait_exit(Duration::from_secs(5));
    assert!(
        status.is_some_and(|st| st.success()),
        "{status:?}\n{}",
        s.diagnostics()
    );
}
