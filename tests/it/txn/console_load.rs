//! The console's control commands while many clients share a small pool in
//! transaction mode: RECONNECT and WAIT_CLOSE, PAUSE and RESUME, SUSPEND and RESUME,
//! SET of the pool size and RELOAD, each while answers are being relayed (most of them
//! by the server's delegate, pool/delegate.rs). None of them may cost a client an
//! error or an answer, or mix answers; the retired servers must all close.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::killed::{ask, Load, CLIENTS, MAX_STEPS, SIZES};
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::{within, Observer};
use crate::support::Sluice;
use tokio_postgres::SimpleQueryMessage;

/// A database of its own, and a Sluice with a console, a pool of 2 for it.
pub(super) fn console_sluice(prefix: &str) -> (String, Arc<Sluice>) {
    let db = fresh_db(prefix);
    let s = txn_sluice(&db)
        .userlist(ADMIN, ADMIN_PW)
        .setting("default_pool_size", "2")
        .start();
    (db, Arc::new(s))
}

/// Runs a console command; panics with its error.
pub(super) async fn admin_run(
    admin: &tokio_postgres::Client,
    sql: &str,
) -> Vec<SimpleQueryMessage> {
    within(STEP, sql, admin.simple_query(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", err_text(&e)))
}

/// Stops the load, each client allowed `max_errors`, and asks once more on the
/// connection each ended with (`when`, for the message).
async fn finish_and_ask_again(load: Load, s: &Sluice, max_errors: usize, when: &str) {
    let mut total = 0;
    for (id, (ok, errors, c)) in load.finish().await.into_iter().enumerate() {
        assert!(
            errors.len() <= max_errors,
            "client {id}: {errors:?}\n{}",
            s.diagnostics()
        );
        ask(&c, id as u64, MAX_STEPS + SIZES.len() as u64)
            .await
            .unwrap_or_else(|e| panic!("client {id} {when}: {e}"));
        total += ok;
    }
    assert!(total > CLIENTS, "hardly any answers: {total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_commands_under_load_cost_no_client_an_answer() {
    let (db, s) = console_sluice("txn_console_load");
    let obs = Observer::new().await;
    let load = Load::start(&s, &db);
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let run = |sql: String| {
        let admin = &admin;
        async move {
            admin_run(admin, &sql).await;
        }
    };
    let pause = || tokio::time::sleep(Duration::from_millis(150));

    pause().await;
    for target in [String::new(), format!(" {db}")] {
        let before = backend_pids(&obs, &db).await;
        assert!(!before.is_empty(), "no servers under load");
        run(format!("RECONNECT{target}")).await;
        run(format!("WAIT_CLOSE{target}")).await;
        // Every server of before the RECONNECT is gone (PostgreSQL lists a backend
        // for a moment after Sluice closed it).
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let now = backend_pids(&obs, &db).await;
            let left: Vec<_> = before.iter().filter(|p| now.contains(p)).collect();
            if left.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "servers {left:?} outlived RECONNECT{target} and WAIT_CLOSE"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        pause().await;
    }
    for (stop_cmd, go_cmd) in [("PAUSE", "RESUME"), ("SUSPEND", "RESUME")] {
        run(stop_cmd.to_owned()).await;
        pause().await;
        run(go_cmd.to_owned()).await;
        pause().await;
    }
    // A pool made smaller sheds servers as they come back, under load too.
    for size in [4, 1, 2] {
        run(format!("SET default_pool_size = {size}")).await;
        pause().await;
        wait_backends(&obs, &db, STEP, |n| n <= size).await;
    }
    run("RELOAD".to_owned()).await;
    pause().await;

    finish_and_ask_again(load, &s, 0, "afterwards").await;
    wait_backends(&obs, &db, STEP, |n| n <= 2).await;
}

/// Under pgbench's load every server goes from client to client without resting idle:
/// a pool made smaller must shed them as they come back all the same, and one made
/// larger again grow back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_smaller_pool_under_pgbench_sheds_servers_at_release() {
    let db = fresh_db("txn_shrunk_load");
    let s = txn_sluice(&db)
        .userlist(ADMIN, ADMIN_PW)
        .setting("default_pool_size", "4")
        .start();
    let obs = Observer::new().await;
    let (port, db2) = (s.port(), db.clone());
    let run = tokio::spawn(async move {
        let args = ["-n", "-c", "24", "-j", "2", "-T", "8"];
        crate::support::pgbench_script(port, &db2, "SELECT 1;\n", &args).await
    });
    wait_backends(&obs, &db, STEP, |n| n == 4).await;
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    admin_run(&admin, "SET default_pool_size = 1").await;
    // Well before pgbench ends.
    wait_backends(&obs, &db, Duration::from_secs(2), |n| n <= 1).await;
    // Made larger again, it grows back while pgbench still runs.
    admin_run(&admin, "SET default_pool_size = 4").await;
    wait_backends(&obs, &db, Duration::from_secs(3), |n| n >= 3).await;
    let run = within(Duration::from_secs(60), "pgbench", run)
        .await
        .unwrap();
    let report = format!("{}\n{}", run.stdout, run.stderr);
    assert!(run.success(), "pgbench: {report}\n{}", s.diagnostics());
    if let Some(line) = run
        .stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
    {
        assert!(line.contains(": 0 "), "{line}\n{report}");
    }
    assert!(
        s.log()
            .contains("closing because: too many servers in the pool"),
        "{}",
        s.diagnostics()
    );
}

/// KILL of a database under load: every client of it is dropped at once, whether it
/// runs a long query, waits in line, or sleeps until an answer relayed for it; every
/// server closes; no answer is mixed. After RESUME, every client is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_under_load_drops_every_client_at_once() {
    let (db, s) = console_sluice("txn_kill_load");
    let obs = Observer::new().await;
    let load = Load::start(&s, &db);
    let long = client(&s, &db).await;
    let long = tokio::spawn(async move {
        let t = std::time::Instant::now();
        let r = within(
            STEP,
            "pg_sleep(15)",
            long.simple_query("SELECT pg_sleep(15)"),
        )
        .await;
        (r.map(drop).map_err(|e| err_text(&e)), t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    admin_run(&admin, &format!("KILL {db}")).await;
    let (r, took) = within(STEP, "the long query", long).await.expect("join");
    assert!(r.is_err(), "pg_sleep(15) survived KILL");
    assert!(
        took < Duration::from_secs(5),
        "the long query's client was dropped only after {took:?}"
    );
    // Every server goes, though clients reconnect meanwhile (they wait: KILL pauses).
    // (PostgreSQL may keep the backend of pg_sleep until it ends: it notices the
    // closed socket only then, with PgBouncer too; Sluice's own list must be empty.)
    let listed = || async {
        let rows = admin_run(&admin, "SHOW SERVERS").await;
        rows.iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
            .count() as i64
    };
    settles(
        &s,
        Duration::from_secs(5),
        "servers listed after KILL",
        0,
        listed,
    )
    .await;
    wait_backends(&obs, &db, Duration::from_secs(5), |n| n <= 1).await;
    admin_run(&admin, &format!("RESUME {db}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One error at most: the KILL's (the connection it ended).
    finish_and_ask_again(load, &s, 1, "after RESUME").await;
}

/// SHOW POOLS and SHOW SERVERS under load, sampled again and again: every client is
/// either active or waiting, no more servers than the pool's size are counted, and
/// each active server is linked to a client (its answer relayed by a delegate or
/// not).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn show_pools_adds_up_under_load() {
    let (db, s) = console_sluice("txn_pools_load");
    let load = Load::start(&s, &db);
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut waiting_seen, mut active_seen) = (0, 0);
    for sample in 0..60 {
        let pools = admin_run(&admin, "SHOW POOLS").await;
        let row = pools
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) if r.get("database") == Some(db.as_str()) => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no pool of {db} in SHOW POOLS"));
        let n = |col: &str| -> u64 {
            row.get(col)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{col} in {:?}", row.columns()))
        };
        let clients = n("cl_active") + n("cl_waiting");
        assert_eq!(clients, CLIENTS, "sample {sample}: clients counted");
        let servers = n("sv_active") + n("sv_idle") + n("sv_used") + n("sv_tested") + n("sv_login");
        assert!(
            servers <= 2,
            "sample {sample}: {servers} servers in a pool of 2: {:?}",
            (0..row.len()).map(|i| row.get(i)).collect::<Vec<_>>()
        );
        assert!(
            n("sv_active") <= n("cl_active"),
            "sample {sample}: more active servers than active clients"
        );
        // SHOW SERVERS lists each server of the pool once, at most two.
        let servers = admin_run(&admin, "SHOW SERVERS").await;
        let ids: Vec<_> = servers
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) if r.get("database") == Some(db.as_str()) => {
                    r.get("ptr").map(str::to_owned)
                }
                _ => None,
            })
            .collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert!(
            unique.len() == ids.len() && ids.len() <= 2,
            "sample {sample}: SHOW SERVERS listed {ids:?}"
        );
        waiting_seen += n("cl_waiting");
        active_seen += n("sv_active");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waiting_seen > 0, "no client ever waited: no load?");
    assert!(active_seen > 0, "no server ever active: no load?");
    load.finish_undisturbed(&s, "SHOW POOLS").await;
}

/// Every SHOW the console knows.
pub(super) const SHOWS: [&str; 21] = [
    "HELP",
    "VERSION",
    "CONFIG",
    "STATE",
    "DATABASES",
    "POOLS",
    "USERS",
    "LISTS",
    "MEM",
    "DNS_HOSTS",
    "DNS_ZONES",
    "PEERS",
    "PEER_POOLS",
    "CLIENTS",
    "SERVERS",
    "SOCKETS",
    "ACTIVE_SOCKETS",
    "STATS",
    "STATS_TOTALS",
    "STATS_AVERAGES",
    "TOTALS",
];

/// Every SHOW the console knows, from four consoles at once, again and again under
/// load: each answers, and the clients lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_show_answers_under_load() {
    let (db, s) = console_sluice("txn_shows_load");
    let load = Load::start(&s, &db);
    let mut consoles = Vec::new();
    for c in 0..4 {
        let admin = console(&s, ADMIN, ADMIN_PW).await;
        consoles.push(tokio::spawn(async move {
            for round in 0..8 {
                // Each console in its own order.
                for i in 0..SHOWS.len() {
                    let what = SHOWS[(i + c * 5 + round) % SHOWS.len()];
                    admin_run(&admin, &format!("SHOW {what}")).await;
                }
            }
        }));
    }
    for (c, h) in consoles.into_iter().enumerate() {
        within(Duration::from_secs(60), "a console", h)
            .await
            .unwrap_or_else(|e| panic!("console {c}: {e}\n{}", s.diagnostics()));
    }
    load.finish_undisturbed(&s, "the consoles").await;
}
