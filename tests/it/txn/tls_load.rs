//! Many clients over a small pool whose servers are reached over TLS
//! (`server_tls_sslmode = require`): answers read for waiting clients come out of
//! the server's TLS session (pool/delegate.rs; plaintext already decrypted and
//! buffered there must wake the waiter as the socket would), whole and each client's
//! own, answers of every size.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::killed::{ask, Load, SIZES};
use crate::support::probe::within;
use crate::support::TEST_DB;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_share_servers_reached_over_tls() {
    let (pg, _certs) = tokio::task::spawn_blocking(|| {
        let certs = crate::tls::Certs::new();
        (crate::tls_server::tls_server(&certs), certs)
    })
    .await
    .expect("a TLS server");
    let s = Arc::new(
        private_txn_sluice(&pg)
            .setting("server_tls_sslmode", "require")
            .start(),
    );
    let load = Load::start(&s, TEST_DB);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    load.finish_undisturbed(&s, "servers over TLS").await;

    // The servers were TLS sessions, by PostgreSQL's own word.
    let c = client(&s, TEST_DB).await;
    let ssl = one(
        &c,
        "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .await;
    assert_eq!(ssl, "true");
    for step in 0..SIZES.len() as u64 {
        within(STEP, "a last answer", ask(&c, 99, step))
            .await
            .unwrap_or_else(|e| panic!("after the load: {e}"));
    }
}
