//! Tracked session parameters follow their client in transaction mode: each client
//! always sees its own TimeZone, DateStyle, application_name and IntervalStyle
//! (tracked by default through `track_extra_parameters`), whoever used the server
//! before it.

use std::time::Duration;

use super::common::*;
use crate::support::run_bounded;
use crate::support::{MD5_PASSWORD, MD5_USER};

const SHOW: &str = "SHOW TimeZone; SHOW DateStyle; \
                    SELECT current_setting('application_name'); SHOW IntervalStyle; \
                    SELECT pg_backend_pid()";

/// (TimeZone, DateStyle, application_name, IntervalStyle, backend pid).
async fn show(c: &mut RawClient) -> (String, String, String, String, String) {
    let msgs = c.simple(SHOW, STEP).await;
    assert!(first_error(&msgs).is_none(), "{msgs:?}");
    let v = col(&msgs);
    assert_eq!(v.len(), 5, "{msgs:?}");
    (
        v[0].clone(),
        v[1].clone(),
        v[2].clone(),
        v[3].clone(),
        v[4].clone(),
    )
}

#[tokio::test]
async fn startup_parameters_follow_each_client_over_one_server() {
    let db = fresh_db("txn_params");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let a_params = [
        ("TimeZone", "America/New_York"),
        ("DateStyle", "SQL, DMY"),
        ("application_name", "client_a"),
        ("IntervalStyle", "iso_8601"),
    ];
    let b_params = [
        ("timezone", "Asia/Tokyo"),
        ("datestyle", "German, DMY"),
        ("application_name", "client_b"),
        ("intervalstyle", "sql_standard"),
    ];
    let mut a = raw(&s, &db, &a_params).await;
    // Logs in with the same values as the client before it, so it takes that client's
    // parameter set as it is (session/params.rs, `SharedParams::reuse`).
    let mut a2 = raw(&s, &db, &a_params).await;
    let mut b = raw(&s, &db, &b_params).await;
    let mut plain = raw(&s, &db, &[]).await;
    // What the client was told at login is its own value.
    assert_eq!(a.param("TimeZone"), Some("America/New_York"), "{a:?}");
    assert_eq!(b.param("application_name"), Some("client_b"), "{b:?}");
    let default_tz = plain
        .param("TimeZone")
        .expect("TimeZone at login")
        .to_owned();
    let default_ds = plain
        .param("DateStyle")
        .expect("DateStyle at login")
        .to_owned();

    let mut pids = std::collections::HashSet::new();
    for round in 0..4 {
        let (tz, ds, app, is, pid) = show(&mut a).await;
        assert_eq!(
            (tz.as_str(), ds.as_str(), app.as_str(), is.as_str()),
            ("America/New_York", "SQL, DMY", "client_a", "iso_8601"),
            "client A, round {round}"
        );
        pids.insert(pid);
        let (tz, ds, app, is, pid) = show(&mut b).await;
        assert_eq!(
            (tz.as_str(), ds.as_str(), app.as_str(), is.as_str()),
            ("Asia/Tokyo", "German, DMY", "client_b", "sql_standard"),
            "client B, round {round}"
        );
        pids.insert(pid);
        let (tz, ds, _app, is, pid) = show(&mut plain).await;
        assert_eq!(
            (tz.as_str(), ds.as_str(), is.as_str()),
            (default_tz.as_str(), default_ds.as_str(), "postgres"),
            "client without parameters, round {round}"
        );
        pids.insert(pid);
    }
    assert_eq!(pids.len(), 1, "a pool of one used {pids:?}");

    // SET outside a transaction is tracked too (the server reports it).
    let r = a.simple("SET TimeZone = 'Europe/Paris'", STEP).await;
    assert!(first_error(&r).is_none());
    show(&mut b).await;
    assert_eq!(show(&mut a).await.0, "Europe/Paris");
    assert_eq!(show(&mut b).await.0, "Asia/Tokyo");
    // The client that shared A's set keeps its own values.
    let (tz, ds, app, is, _) = show(&mut a2).await;
    assert_eq!(
        (tz.as_str(), ds.as_str(), app.as_str(), is.as_str()),
        ("America/New_York", "SQL, DMY", "client_a", "iso_8601")
    );
    assert_eq!(show(&mut a).await.0, "Europe/Paris");
    // A SET rolled back with its transaction leaves the earlier value.
    let r = a
        .simple("BEGIN; SET TimeZone = 'UTC'; ROLLBACK", STEP)
        .await;
    assert_eq!(status(&r), b'I');
    show(&mut b).await;
    assert_eq!(show(&mut a).await.0, "Europe/Paris");
    // SET IntervalStyle (tracked by default) follows as well.
    a.simple("SET IntervalStyle = 'postgres_verbose'", STEP)
        .await;
    assert_eq!(show(&mut b).await.3, "sql_standard");
    assert_eq!(show(&mut a).await.3, "postgres_verbose");
    assert_eq!(show(&mut plain).await.3, "postgres");
}

/// psql sends PGTZ, PGDATESTYLE and PGAPPNAME as startup parameters; interleaved
/// with a raw client holding other values, over one server.
#[tokio::test]
async fn psql_environment_parameters_follow_the_client() {
    let db = fresh_db("txn_psqlenv");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut b = raw(
        &s,
        &db,
        &[
            ("TimeZone", "Asia/Tokyo"),
            ("DateStyle", "German, DMY"),
            ("application_name", "raw_b"),
        ],
    )
    .await;
    let psql = |tz: &str, ds: &str, app: &str| -> Vec<String> {
        let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, &db);
        cmd.env("PGTZ", tz)
            .env("PGDATESTYLE", ds)
            .env("PGAPPNAME", app)
            .args(["-c", SHOW]);
        let out = run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    for (tz, ds, app) in [
        ("America/New_York", "SQL, DMY", "psql_one"),
        ("Australia/Sydney", "Postgres, MDY", "psql_two"),
    ] {
        let (btz, bds, bapp, _, bpid) = show(&mut b).await;
        assert_eq!(
            (btz.as_str(), bds.as_str(), bapp.as_str()),
            ("Asia/Tokyo", "German, DMY", "raw_b")
        );
        let out = psql(tz, ds, app);
        assert_eq!(out[..3], [tz, ds, app], "psql saw {out:?}");
        assert_eq!(out[4], bpid, "not the same server");
        let (btz, bds, bapp, _, _) = show(&mut b).await;
        assert_eq!(
            (btz.as_str(), bds.as_str(), bapp.as_str()),
            ("Asia/Tokyo", "German, DMY", "raw_b")
        );
    }
}

/// Clients that log in with the same values share one parameter set, and a server
/// remembers the set it matched. A SET by one of them must not leave the other
/// believing the server still matches it.
#[tokio::test]
async fn clients_with_equal_parameters_stay_apart_after_a_set() {
    let db = fresh_db("txn_sharedparams");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let same = [("TimeZone", "Asia/Tokyo"), ("application_name", "twin")];
    let mut a = raw(&s, &db, &same).await;
    let mut b = raw(&s, &db, &same).await;
    for _ in 0..2 {
        assert_eq!(show(&mut a).await.0, "Asia/Tokyo");
        assert_eq!(show(&mut b).await.0, "Asia/Tokyo");
    }
    let r = a.simple("SET TimeZone = 'Europe/Paris'", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let (tz, _, app, _, pid_b) = show(&mut b).await;
    assert_eq!((tz.as_str(), app.as_str()), ("Asia/Tokyo", "twin"));
    let (tz, _, _, _, pid_a) = show(&mut a).await;
    assert_eq!(tz, "Europe/Paris");
    assert_eq!(pid_a, pid_b, "a pool of one");
    // A third client with the first values, after all that, still gets them.
    let mut c = raw(&s, &db, &same).await;
    assert_eq!(show(&mut c).await.0, "Asia/Tokyo");
    assert_eq!(show(&mut a).await.0, "Europe/Paris");
}

/// A client that waits in line for the pool's only server (held by another client's
/// transaction) gets it with its own parameters set, not the holder's: a server
/// handed over in line is synced as an idle one is.
#[tokio::test]
async fn a_client_served_from_the_line_gets_its_own_parameters() {
    let db = fresh_db("txn_params_line");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(
        &s,
        &db,
        &[
            ("TimeZone", "America/New_York"),
            ("application_name", "holder"),
        ],
    )
    .await;
    let mut b = raw(
        &s,
        &db,
        &[("TimeZone", "Asia/Tokyo"), ("application_name", "waiter")],
    )
    .await;
    // A holds the server in a transaction, with its values set on it.
    let r = a.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T', "{r:?}");
    // B's query must wait: nothing comes back while A holds the only server.
    b.query(SHOW).await.expect("send");
    assert!(
        b.try_recv(Duration::from_millis(300)).await.is_err(),
        "B was answered while the pool's only server was in A's transaction"
    );
    let r = a.simple("COMMIT", STEP).await;
    assert_eq!(status(&r), b'I', "{r:?}");
    let msgs = b.until_ready(STEP).await;
    assert!(first_error(&msgs).is_none(), "{msgs:?}");
    let v = col(&msgs);
    assert_eq!(v.len(), 5, "{msgs:?}");
    assert_eq!((v[0].as_str(), v[2].as_str()), ("Asia/Tokyo", "waiter"));
    // And A, served after B, gets its own back.
    let (tz, _, app, _, pid) = show(&mut a).await;
    assert_eq!((tz.as_str(), app.as_str()), ("America/New_York", "holder"));
    assert_eq!(pid, v[4], "a pool of one used two servers");
}

/// A client waiting in line leaves its request with its place, and the client that
/// releases the server writes it there at once (`pool::Request`), but only to a
/// server whose parameters are the waiter's: a waiter with other values gets its
/// SETs first, and sees its own values.
#[tokio::test]
async fn waiting_requests_are_sent_only_to_a_server_with_their_parameters() {
    const ASK: &str = "SHOW TimeZone; SELECT current_setting('application_name')";
    let db = fresh_db("txn_params_wait");
    // The single loop, where the request waits with the place.
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .env("SLUICE_WORKERS", "0")
        .start();
    let a_params = [
        ("TimeZone", "America/New_York"),
        ("application_name", "same"),
    ];
    let b_params = [("TimeZone", "Asia/Tokyo"), ("application_name", "other")];
    let mut holder = raw(&s, &db, &a_params).await;
    let mut same = raw(&s, &db, &a_params).await;
    let mut other = raw(&s, &db, &b_params).await;
    for round in 0..3 {
        // The holder keeps the one server in a transaction...
        let r = holder.simple("BEGIN; SELECT 1", STEP).await;
        assert_eq!(status(&r), b'T', "round {round}: {r:?}");
        // ... while a client with its values, then one with others, ask.
        same.query(ASK).await.expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        other.query(ASK).await.expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = holder.simple("COMMIT", STEP).await;
        assert_eq!(status(&r), b'I', "round {round}: {r:?}");
        let r = same.until_ready(STEP).await;
        assert!(first_error(&r).is_none(), "{r:?}");
        assert_eq!(col(&r), ["America/New_York", "same"], "round {round}");
        let r = other.until_ready(STEP).await;
        assert!(first_error(&r).is_none(), "{r:?}");
        assert_eq!(col(&r), ["Asia/Tokyo", "other"], "round {round}");
    }
}
