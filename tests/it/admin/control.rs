//! Control commands: SIGUSR1/SIGUSR2, DISABLE/ENABLE, KILL, KILL_CLIENT,
//! RECONNECT/WAIT_CLOSE, RELOAD, SET and the three SHUTDOWNs (PAUSE, RESUME and
//! SUSPEND are pause.rs's).

use std::time::{Duration, Instant};

use super::{builder, console, pooled, psql, psql_err, psql_ok, select1, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{self, wait_until, MD5_PASSWORD, MD5_USER, TEST_DB};

pub(super) fn state(s: &crate::support::Sluice, key: &str) -> Option<String> {
    psql_ok(s, "SHOW STATE").cell("key", key, "value")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_pauses_and_sigusr2_resumes() {
    let mut s = builder().start();
    s.signal(libc::SIGUSR1);
    assert!(wait_until(Duration::from_secs(5), || state(&s, "paused")
        == Some("yes".into())));
    s.signal(libc::SIGUSR2);
    assert!(wait_until(Duration::from_secs(5), || state(&s, "paused")
        == Some("no".into())));
    // A console stays connected: a SUSPEND with none left is lifted (below).
    let _stay = console(&s, ADMIN, ADMIN_PW).await;
    psql_ok(&s, "SUSPEND");
    assert_eq!(state(&s, "suspended"), Some("yes".into()));
    assert_eq!(state(&s, "active"), Some("no".into()));
    psql_ok(&s, "RESUME");
    assert_eq!(state(&s, "active"), Some("yes".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_client_drops_only_that_client() {
    let s = builder().start();
    let victim = pooled(&s, Some("victim")).await;
    select1(&victim).await;
    let bystander = pooled(&s, Some("bystander")).await;
    select1(&bystander).await;
    let id = psql_ok(&s, "SHOW CLIENTS")
        .cell("application_name", "victim", "id")
        .expect("victim listed");
    psql_ok(&s, &format!("KILL_CLIENT {id}"));
    // The idle victim is dropped by the kill alone, before it sends anything.
    assert!(wait_until(Duration::from_secs(5), || psql_ok(
        &s,
        "SHOW CLIENTS"
    )
    .cell("application_name", "victim", "id")
    .is_none()));
    assert!(s.log().contains("admin forced disconnect"), "{}", s.log());
    let err = within(
        Duration::from_secs(10),
        "victim query",
        victim.simple_query("SELECT 1"),
    )
    .await;
    assert!(err.is_err(), "the killed client still works");
    select1(&bystander).await;
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "KILL_CLIENT 999999",
        "client not found",
    );
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "KILL_CLIENT abc",
        "invalid client pointer supplied",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_refuses_new_logins_until_enable() {
    let s = builder().start();
    let old = pooled(&s, None).await;
    psql_err(&s, ADMIN, ADMIN_PW, "DISABLE", "a database is required");
    for verb in ["disable", "enable"] {
        let want = format!("cannot {verb} admin db: pgbouncer");
        psql_err(&s, ADMIN, ADMIN_PW, &format!("{verb} pgbouncer"), &want);
    }
    psql_ok(&s, "DISABLE sluice_test");
    assert_eq!(
        psql_ok(&s, "SHOW DATABASES").cell("name", TEST_DB, "disabled"),
        Some("1".into())
    );
    let refused = support::try_connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    let msg = refused.err().map(|e| format!("{e:?}")).unwrap_or_default();
    assert!(
        msg.contains("database \\\"sluice_test\\\" is disabled") || msg.contains("is disabled"),
        "{msg}"
    );
    // Connected clients keep working.
    select1(&old).await;
    psql_ok(&s, "ENABLE sluice_test");
    let again = pooled(&s, None).await;
    select1(&again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_db_drops_clients_and_pauses_until_resume() {
    let s = builder().start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    psql_ok(&s, "KILL sluice_test");
    let r = within(
        Duration::from_secs(10),
        "killed query",
        c.simple_query("SELECT 1"),
    )
    .await;
    assert!(r.is_err(), "client survived KILL");
    assert!(wait_until(Duration::from_secs(5), || psql_ok(
        &s,
        "SHOW SERVERS"
    )
    .rows
    .is_empty()));
    // Still paused: a new client logs in but its query waits for RESUME.
    let d = pooled(&s, None).await;
    let q = tokio::spawn(async move { d.simple_query("SELECT 1").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!q.is_finished());
    psql_ok(&s, "RESUME sluice_test");
    within(Duration::from_secs(10), "query after RESUME", q)
        .await
        .expect("join")
        .expect("query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_marks_servers_and_wait_close_waits_for_them() {
    // Session mode: the client keeps its server until it disconnects.
    let s = builder().start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    psql_ok(&s, "RECONNECT sluice_test");
    let servers = psql_ok(&s, "SHOW SERVERS");
    assert_eq!(servers.cell("type", "S", "close_needed"), Some("1".into()));
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let wait = tokio::spawn(async move {
        admin
            .simple_query("WAIT_CLOSE sluice_test")
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait.is_finished(),
        "WAIT_CLOSE returned with the old server in use"
    );
    drop(c);
    within(Duration::from_secs(10), "WAIT_CLOSE", wait)
        .await
        .expect("join")
        .expect("WAIT_CLOSE");
    // The old server was closed at release rather than pooled.
    assert!(psql_ok(&s, "SHOW SERVERS").rows.is_empty());
    psql_ok(&s, "RECONNECT");
    psql_ok(&s, "WAIT_CLOSE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_picks_up_changes_and_reports_a_broken_file() {
    let s = builder().setting("default_pool_size", "20").start();
    let ini = std::fs::read_to_string(s.ini_path()).expect("ini");
    s.rewrite_ini(&ini.replace("default_pool_size = 20", "default_pool_size = 9"));
    psql_ok(&s, "RELOAD");
    assert_eq!(
        psql_ok(&s, "SHOW CONFIG").cell("key", "default_pool_size", "value"),
        Some("9".into())
    );
    // A stray argument: PgBouncer's syntax error, quoting the command as typed.
    for typed in ["reload now;", "suspend now;", "shutdown never;"] {
        let want = format!("invalid command '{typed}', use SHOW HELP;");
        psql_err(&s, ADMIN, ADMIN_PW, typed, &want);
    }
    s.rewrite_ini(&format!("{ini}\nlisten_port = abc\n"));
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let err = admin
        .simple_query("RELOAD")
        .await
        .expect_err("RELOAD must fail");
    let db = err.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "F0000");
    assert_eq!(
        db.message(),
        "RELOAD failed, see logs for additional details"
    );
    assert!(
        db.detail().is_some_and(|d| d.contains("listen_port")),
        "{:?}",
        db.detail()
    );
    // The old config stays.
    assert_eq!(
        psql_ok(&s, "SHOW CONFIG").cell("key", "default_pool_size", "value"),
        Some("9".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_changes_the_running_config() {
    let s = builder().start();
    let o = psql_ok(&s, "SET default_pool_size = 7");
    assert_eq!(
        psql_ok(&s, "SHOW CONFIG").cell("key", "default_pool_size", "value"),
        Some("7".into())
    );
    assert!(o.ok);
    psql_ok(&s, "SET query_timeout = '0.5'");
    assert_eq!(
        psql_ok(&s, "SHOW CONFIG").cell("key", "query_timeout", "value"),
        Some("0.5".into())
    );
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "SET default_pool_size = lots",
        "SET failed",
    );
    psql_err(&s, ADMIN, ADMIN_PW, "SET no_such_setting = 1", "SET failed");
    psql_err(&s, ADMIN, ADMIN_PW, "SET listen_port = 1", "SET failed");
    // A new pool uses the new size.
    assert_eq!(
        psql_ok(&s, "SHOW DATABASES").cell("name", TEST_DB, "pool_size"),
        Some("7".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_exits_at_once() {
    let mut s = builder().start();
    let o = psql(&s, "SHUTDOWN");
    assert!(o.ok, "{}", o.stderr);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "still running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_wait_for_clients_waits_for_the_last_client() {
    let mut s = builder().start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    psql_ok(&s, "SHUTDOWN WAIT_FOR_CLIENTS");
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.is_running(), "exited with a client connected");
    // A shutdown is not for RESUME to lift (PgBouncer's answer).
    let e = admin
        .simple_query("RESUME")
        .await
        .expect_err("RESUME in a shutdown");
    let text = e.as_db_error().map(|d| d.message().to_owned());
    assert_eq!(text.as_deref(), Some("pooler is shutting down"), "{e:?}");
    drop(admin);
    drop(c);
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "did not exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_wait_for_servers_waits_for_the_transaction() {
    let mut s = builder().setting("pool_mode", "transaction").start();
    let c = pooled(&s, None).await;
    c.simple_query("BEGIN").await.expect("BEGIN");
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    within(
        Duration::from_secs(10),
        "SHUTDOWN",
        admin.simple_query("SHUTDOWN WAIT_FOR_SERVERS"),
    )
    .await
    .expect("SHUTDOWN WAIT_FOR_SERVERS");
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.is_running(), "exited with a server lent");
    // The pooler is paused meanwhile, as PgBouncer's is.
    let rows = admin.simple_query("SHOW STATE").await.expect("SHOW STATE");
    let paused = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("paused") => {
            r.get(1).map(str::to_owned)
        }
        _ => None,
    });
    assert_eq!(paused.as_deref(), Some("yes"));
    let e = admin
        .simple_query("PAUSE")
        .await
        .expect_err("PAUSE while stopping");
    let text = e.as_db_error().map(|d| d.message().to_owned());
    assert_eq!(text.as_deref(), Some("already suspended/paused"));
    let started = Instant::now();
    c.simple_query("COMMIT").await.expect("COMMIT");
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "did not exit"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}
