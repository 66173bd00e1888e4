//! Checks that the harness itself works: the shared PostgreSQL accepts each
//! auth method over TCP and psql over its unix socket.

use crate::support::{self, pg, SluiceBuilder};
use std::time::Duration;

async fn select_1_direct(user: &str) {
    let client = support::connect(&pg().tcp_config(user, support::TEST_DB)).await;
    let row = client
        .query_one("SELECT 1::int4", &[])
        .await
        .unwrap_or_else(|e| panic!("SELECT 1 as {user}: {e}"));
    assert_eq!(row.get::<_, i32>(0), 1);
    let who: String = client
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("current_user")
        .get(0);
    assert_eq!(who, user);
}

#[tokio::test]
async fn pg_md5_user_over_tcp() {
    select_1_direct(support::MD5_USER).await;
}

#[tokio::test]
async fn pg_scram_user_over_tcp() {
    select_1_direct(support::SCRAM_USER).await;
}

#[tokio::test]
async fn pg_plain_password_user_over_tcp() {
    select_1_direct(support::PLAIN_USER).await;
}

#[tokio::test]
async fn pg_trust_user_over_tcp() {
    select_1_direct(support::TRUST_USER).await;
}

#[tokio::test]
async fn pg_wrong_password_is_rejected() {
    let mut cfg = pg().tcp_config(support::SCRAM_USER, support::TEST_DB);
    cfg.password("wrong");
    let err = match support::try_connect(&cfg).await {
        Ok(_) => panic!("connected with a wrong password"),
        Err(e) => e,
    };
    let db_err = err.as_db_error().expect("a server error");
    assert_eq!(db_err.code().code(), "28P01", "{db_err:?}");
}

#[test]
fn pg_md5_password_is_stored_as_md5() {
    let out = pg().psql(
        "SELECT rolname || ':' || split_part(rolpassword, '$', 1) FROM pg_authid \
         WHERE rolname IN ('sluice_md5', 'sluice_scram') ORDER BY rolname",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("sluice_md5:md5"), "{out}");
    assert_eq!(lines[1], "sluice_scram:SCRAM-SHA-256", "{out}");
}

#[test]
fn psql_over_unix_socket() {
    let server = pg();
    assert_eq!(server.psql("SELECT 40 + 2").trim(), "42");
    assert_eq!(
        server
            .psql_db(support::TEST_DB, "SELECT current_database()")
            .trim(),
        support::TEST_DB
    );
    let mut cmd = support::psql_cmd(
        server.port(),
        &server.socket_dir().to_string_lossy(),
        support::TRUST_USER,
        support::TEST_DB,
    );
    cmd.args(["-c", "SELECT current_user"]);
    let out = support::run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        support::TRUST_USER
    );
}

#[test]
fn psql_over_tcp_with_password() {
    let server = pg();
    let mut cmd = support::psql_cmd_pw(
        server.port(),
        "127.0.0.1",
        support::MD5_USER,
        support::TEST_DB,
        support::MD5_PASSWORD,
    );
    cmd.args([
        "-c",
        "CREATE TEMP TABLE t(x int); INSERT INTO t VALUES (7); SELECT x FROM t",
    ]);
    let out = support::run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "7");
}

#[test]
fn pgbench_runs_against_pg() {
    let server = pg();
    let dir = support::TempDir::new("sluice-pgbench");
    let script = dir.write("select.sql", "SELECT 1;\n");
    let script = script.to_string_lossy();
    let run = support::pgbench(
        "127.0.0.1",
        server.port(),
        "postgres",
        support::TEST_DB,
        None,
        &["-n", "-c", "2", "-t", "20", "-f", &script],
        Duration::from_secs(60),
    );
    assert!(run.success(), "{}\n{}", run.stdout, run.stderr);
    assert!(run.tps.is_some_and(|t| t > 0.0), "{}", run.stdout);
}

#[test]
fn harness_helpers() {
    let a = support::free_port();
    let b = support::free_port();
    assert_ne!(a, b);
    assert_eq!(
        support::parse_tps(
            "latency average = 1 ms\ntps = 1234.5 (without initial connection time)\n"
        ),
        Some(1234.5)
    );
    let path = {
        let d = support::TempDir::new("sluice-tmpcheck");
        d.write("x", "y");
        assert!(d.join("x").exists());
        d.path().to_path_buf()
    };
    if std::env::var_os("SLUICE_KEEP_TMP").is_none() {
        assert!(!path.exists(), "TempDir not removed");
    }
}

#[tokio::test]
async fn sluice_starts_and_serves_select_1() {
    let sluice = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .start();
    let client = support::connect(&sluice.config(
        support::MD5_USER,
        support::MD5_PASSWORD,
        support::TEST_DB,
    ))
    .await;
    let row = client
        .query_one("SELECT 1::int4", &[])
        .await
        .expect("SELECT 1");
    assert_eq!(row.get::<_, i32>(0), 1);
}
