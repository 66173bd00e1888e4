//! A server login that derives its SCRAM keys from a password runs PBKDF2 over as many
//! rounds as PostgreSQL's verifier says (up to a million). Sluice does that on a
//! blocking thread: on the event loop it would hold up every other client meanwhile
//! (over 100 ms a login at a million rounds, measured; docs/performance.md, thirtieth
//! round).

use std::time::{Duration, Instant};

use super::auth::{try_login, LOGIN_LIMIT};
use crate::support::{self, pg, SluiceBuilder};

const SLOW_USER: &str = "sluice_slow_scram";
const SLOW_PASSWORD: &str = "slowpass";
/// Enough rounds that deriving the keys is most of the slow login, in a debug build.
const ROUNDS: u32 = 200_000;

fn pg_db(extra: &str) -> String {
    format!("host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test {extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_scram_server_login_does_not_hold_up_other_clients() {
    let verifier =
        ::sluice::auth::scram_secret_from_password(SLOW_PASSWORD, b"a salt of sluice", ROUNDS);
    pg().psql(&format!("ALTER ROLE {SLOW_USER} PASSWORD '{verifier}'"));
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "any")
        .database(
            "slow",
            &pg_db(&format!("user={SLOW_USER} password={SLOW_PASSWORD}")),
        )
        .database("quick", &pg_db(&format!("user={}", support::TRUST_USER)))
        .start();
    let quick = try_login(&sluice.config("anyone", "", "quick"))
        .await
        .expect("login to quick");
    quick.simple_query("SELECT 1").await.expect("warm up quick");

    // The slow login opens the `slow` pool's first server connection.
    let slow_cfg = sluice.config("anyone", "", "slow");
    let started = Instant::now();
    let slow = tokio::spawn(async move {
        let c = try_login(&slow_cfg).await.expect("login to slow");
        let who = c
            .simple_query("SELECT current_user")
            .await
            .expect("query slow");
        (started.elapsed(), who.len())
    });
    // Meanwhile, the other client's queries, each timed.
    let mut longest = Duration::ZERO;
    let mut queries = 0;
    while !slow.is_finished() && started.elapsed() < LOGIN_LIMIT {
        let t = Instant::now();
        quick.simple_query("SELECT 1").await.expect("query quick");
        longest = longest.max(t.elapsed());
        queries += 1;
    }
    let (slow_took, rows) = slow.await.expect("slow login task");
    assert!(rows > 0, "no answer on the slow pool");
    // The slow login waited for its keys; the other client never waited for them.
    assert!(
        longest < slow_took / 3,
        "a query took {longest:?} while the slow login took {slow_took:?} ({queries} queries)"
    );
}
