//! Session pooling under load: many short sessions over a pool of 2, each leaving its
//! server dirty in every way a session can (settings, prepared statements, LISTEN,
//! temporary tables, session advisory locks, an open transaction, a query still
//! running) and leaving politely, abruptly, or mid-transaction. The next session on
//! that server must find none of it: no session state leaks between clients.

use std::time::Duration;

use crate::support::probe::{marked_sluice, unique_marker, within};
use crate::support::wire::{first_column, first_error, frame, RawClient};
use crate::support::{MD5_PASSWORD, MD5_USER, TEST_DB};

const WORKERS: u64 = 6;
const SESSIONS: u64 = 12;
const T: Duration = Duration::from_secs(30);

/// What a fresh session must see: the defaults, and nothing of an earlier session.
const CHECK: &str = "SELECT concat_ws(',', \
    coalesce(current_setting('leak.owner', true), ''), \
    current_setting('work_mem'), \
    (SELECT count(*) FROM pg_prepared_statements), \
    (SELECT count(*) FROM pg_listening_channels()), \
    (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()), \
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
        AND pid = pg_backend_pid()), \
    current_setting('transaction_isolation'))";

async fn simple(c: &mut RawClient, sql: &str) -> Vec<Option<String>> {
    let msgs = within(T, sql, c.simple(sql, T)).await;
    if let Some(e) = first_error(&msgs) {
        panic!("{sql}: {:?}", e.field(b'M'));
    }
    first_column(&msgs)
}

/// One session: checks it starts clean, dirties its server and leaves (`how`).
async fn session(port: u16, owner: u64, how: u64) {
    let mut c = within(
        T,
        "login",
        RawClient::login(port, MD5_USER, MD5_PASSWORD, TEST_DB, &[]),
    )
    .await
    .unwrap_or_else(|e| panic!("login refused: {e}"));
    let state = simple(&mut c, CHECK).await;
    assert_eq!(
        state,
        [Some(",4MB,0,0,0,0,read committed".to_owned())],
        "session of {owner} found an earlier session's state"
    );
    simple(
        &mut c,
        &format!(
            "SET leak.owner = '{owner}'; SET work_mem = '7MB'; \
             SET default_transaction_isolation = 'serializable'; \
             PREPARE leak_{owner} AS SELECT {owner}; LISTEN leak_{owner}; \
             CREATE TEMP TABLE leak_{owner} (v int); SELECT pg_advisory_lock({owner})"
        ),
    )
    .await;
    match how % 4 {
        // Politely: Terminate.
        0 => {
            c.send(&frame(b'X', &[])).await.ok();
        }
        // Gone, idle.
        1 => {}
        // Gone inside a transaction that wrote to its temp table.
        2 => {
            simple(
                &mut c,
                &format!("BEGIN; INSERT INTO leak_{owner} VALUES (1)"),
            )
            .await;
        }
        // Gone while a query runs.
        _ => {
            c.query("SELECT pg_sleep(0.05)").await.ok();
        }
    }
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_session_state_leaks_to_the_next_client_under_load() {
    let marker = unique_marker("leaks");
    let s = marked_sluice(&marker)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "2")
        .start();
    let port = s.port();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            tokio::spawn(async move {
                for i in 0..SESSIONS {
                    session(port, w * 1000 + i, w + i).await;
                }
            })
        })
        .collect();
    for (w, h) in workers.into_iter().enumerate() {
        within(Duration::from_secs(120), "a worker", h)
            .await
            .unwrap_or_else(|e| panic!("worker {w}: {e}\n{}", s.diagnostics()));
    }
}
