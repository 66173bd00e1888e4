//! Idle clients that sleep: a client quiet since its login, or idle for a while, gives
//! up its task (session/keeper.rs) and wakes up when it sends something, is killed,
//! or its client_idle_timeout runs out. SHOW MEM's `asleep_client_cache` row counts
//! them.

use std::time::Duration;

use crate::admin::{builder, console, pooled, psql_ok, select1, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{wait_until, Sluice};

const T: Duration = Duration::from_secs(30);

fn asleep(s: &Sluice) -> u64 {
    psql_ok(s, "SHOW MEM")
        .cell("name", "asleep_client_cache", "used")
        .and_then(|v| v.parse().ok())
        .expect("SHOW MEM lists asleep_client_cache")
}

fn wait_asleep(s: &Sluice, n: u64) -> bool {
    wait_until(Duration::from_secs(10), || asleep(s) == n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_sleep_and_wake_with_their_state() {
    let s = builder().setting("pool_mode", "transaction").start();
    // Quiet after its login: it sleeps at once.
    let c = pooled(&s, Some("sleeper")).await;
    assert!(wait_asleep(&s, 1), "a quiet new client did not sleep");
    // Still listed, idle.
    let clients = psql_ok(&s, "SHOW CLIENTS");
    assert_eq!(
        clients.cell("application_name", "sleeper", "state"),
        Some("idle".into())
    );
    // A request wakes it; a prepared statement (tracked by the pooler in transaction
    // mode) and a session setting outlive the next sleep.
    select1(&c).await;
    within(T, "SET", c.simple_query("SET application_name = 'renamed'"))
        .await
        .expect("SET");
    let st = within(T, "prepare", c.prepare("SELECT $1::int + 1"))
        .await
        .expect("prepare");
    let row = within(T, "execute", c.query_one(&st, &[&41i32]))
        .await
        .expect("execute");
    assert_eq!(row.get::<_, i32>(0), 42);
    // Idle for a while: the janitor's sweep puts it to sleep again.
    assert!(wait_asleep(&s, 1), "an idle client did not sleep again");
    let row = within(T, "execute after sleep", c.query_one(&st, &[&1i32]))
        .await
        .expect("execute after sleep");
    assert_eq!(row.get::<_, i32>(0), 2);
    let rows = within(T, "SHOW", c.simple_query("SHOW application_name"))
        .await
        .expect("SHOW");
    let name = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(name.as_deref(), Some("renamed"));
    // A sleeping client that leaves is gone from the console and the keeper.
    assert!(wait_asleep(&s, 1));
    drop(c);
    assert!(wait_asleep(&s, 0), "a client that left still sleeps");
    assert!(wait_until(T, || psql_ok(&s, "SHOW CLIENTS")
        .column("user")
        .iter()
        .all(|u| u == "postgres")));
}

/// A client the sweep put to sleep that sends again soon after was only between
/// requests: the sweep lets it idle twice as long before it asks again (4 s, then 8 s),
/// so that a client sending every few seconds does not pay a sleep and a wake per
/// request (session/keeper.rs, `CAME_BACK`). It still sleeps once idle that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_comes_back_soon_sleeps_later() {
    let s = builder().setting("pool_mode", "transaction").start();
    let c = pooled(&s, Some("regular")).await;
    // Asleep on its own after its login; woken by a request, it is not a regular yet.
    assert!(wait_asleep(&s, 1), "a quiet new client did not sleep");
    select1(&c).await;
    // Idle 2 s: the sweep puts it to sleep, and it comes back at once.
    assert!(wait_asleep(&s, 1), "an idle client did not sleep");
    select1(&c).await;
    assert_eq!(asleep(&s), 0);
    // Now it may idle 4 s: at 2.5 s it is still awake (it slept by then before).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        asleep(&s),
        0,
        "a client that came back soon was put to sleep at 2 s"
    );
    assert!(
        wait_asleep(&s, 1),
        "a client that came back did not sleep at 4 s"
    );
    // It comes back again: 8 s from now on.
    select1(&c).await;
    std::thread::sleep(Duration::from_millis(5000));
    assert_eq!(
        asleep(&s),
        0,
        "a client that came back twice was put to sleep at 4 s"
    );
    select1(&c).await;
}

/// New clients that sleep quiet after their login and send their first query soon
/// after (an application that connects per request, then works a little) make the
/// clients after them wait longer before they sleep: 10 ms doubling to 320 ms
/// (session/keeper.rs, `FRESH_BACK`). A later client quiet for 100 ms is still awake;
/// it sleeps once quiet for longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_clients_slow_to_start_make_the_next_ones_wait_longer() {
    let s = builder().setting("pool_mode", "transaction").start();
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let asleep_now = || async {
        let rows = within(T, "SHOW MEM", admin.simple_query("SHOW MEM"))
            .await
            .expect("SHOW MEM");
        rows.iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r)
                    if r.get("name") == Some("asleep_client_cache") =>
                {
                    r.get("used").and_then(|v| v.parse::<u64>().ok())
                }
                _ => None,
            })
            .expect("SHOW MEM lists asleep_client_cache")
    };
    // Each quiet 200 ms after its login: it sleeps (at 10, 20, 40, 80, 160 ms) and
    // comes back soon.
    for _ in 0..5 {
        let c = pooled(&s, Some("late")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        select1(&c).await;
    }
    assert!(
        wait_until(T, || asleep(&s) == 0),
        "the late clients left, yet a client sleeps"
    );
    let quiet = pooled(&s, Some("quiet")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        asleep_now().await,
        0,
        "a new client slept at 10 ms after late ones came back soon"
    );
    assert!(wait_asleep(&s, 1), "a quiet new client never slept");
    select1(&quiet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_clients_are_killed_and_time_out() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("client_idle_timeout", "3")
        .start();
    let victim = pooled(&s, Some("victim")).await;
    let bystander = pooled(&s, Some("bystander")).await;
    assert!(wait_asleep(&s, 2));
    let id = psql_ok(&s, "SHOW CLIENTS")
        .cell("application_name", "victim", "id")
        .expect("victim listed");
    psql_ok(&s, &format!("KILL_CLIENT {id}"));
    assert!(
        wait_until(Duration::from_secs(5), || psql_ok(&s, "SHOW CLIENTS")
            .cell("application_name", "victim", "id")
            .is_none()),
        "a sleeping client outlived KILL_CLIENT"
    );
    assert!(s.log().contains("admin forced disconnect"), "{}", s.log());
    let err = within(T, "victim query", victim.simple_query("SELECT 1")).await;
    assert!(err.is_err(), "the killed client still works");
    // The bystander slept through it, then its client_idle_timeout ends it.
    assert_eq!(asleep(&s), 1);
    assert!(
        wait_until(T, || s.log().contains("client_idle_timeout")),
        "{}",
        s.log()
    );
    assert!(wait_asleep(&s, 0));
    let err = within(T, "bystander query", bystander.simple_query("SELECT 1")).await;
    assert!(
        err.is_err(),
        "a client past client_idle_timeout still works"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_mode_client_holding_its_server_stays_awake() {
    let s = builder().setting("pool_mode", "session").start();
    let c = pooled(&s, None).await;
    // No server yet: it may sleep.
    assert!(wait_asleep(&s, 1));
    select1(&c).await;
    // Now it holds its server until it leaves; a sweep (every half second, for clients
    // idle 2 s) must leave it awake.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(asleep(&s), 0, "a client holding a server slept");
    select1(&c).await;
}

/// A burst of logins, each client quiet after its welcome: every one sleeps. In a
/// burst the event loop can learn that a new socket is readable before the client's
/// task reads its first packet; that readiness, gone once the packet is read, must
/// not count as a request and keep the client awake.
#[test]
fn a_burst_of_quiet_logins_all_sleep() {
    const N: usize = 200;
    let s = builder()
        .setting("auth_type", "trust")
        .setting("max_client_conn", "1000")
        .userlist(crate::support::TRUST_USER, "")
        .start();
    let packet = crate::support::raw::startup_packet(
        crate::support::raw::PROTOCOL_3_0,
        &[
            ("user", crate::support::TRUST_USER),
            ("database", crate::support::TEST_DB),
        ],
    );
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        let mut c = crate::support::raw::RawConn::tcp(s.port());
        c.send(&packet).expect("send startup");
        conns.push(c);
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let msgs = c
            .read_until(b'Z', T)
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(msgs[0].auth_code(), Some(0), "client {i}: {msgs:?}");
    }
    assert!(
        wait_asleep(&s, N as u64),
        "{} of {N} quiet clients asleep",
        asleep(&s)
    );
}
