//! The console's counts with clients of several pools: SHOW POOLS, SERVERS, USERS and
//! DATABASES read every client in one pass and sort them out by pool, so each pool's
//! row and each server's link must come out as if each pool were alone.

use super::{builder, pooled, psql_ok, select1, PsqlOut, T};
use crate::support::probe::within;
use crate::support::{self, MD5_PASSWORD, MD5_USER, TEST_DB};

/// The value in `col` of every row, in order, whose `key_col` is `key`.
fn cells(o: &PsqlOut, key_col: &str, key: &str, col: &str) -> Vec<String> {
    let k = o
        .header
        .iter()
        .position(|h| h == key_col)
        .expect("key column");
    let c = o.header.iter().position(|h| h == col).expect("column");
    o.rows
        .iter()
        .filter(|r| r[k] == key)
        .map(|r| r[c].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_counts_its_own_clients_and_servers() {
    // Session mode: a client keeps the server its first query took.
    let s = builder()
        .database("other", "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test")
        .start();
    let a1 = pooled(&s, Some("pools_a1")).await;
    let a2 = pooled(&s, Some("pools_a2")).await;
    let b = within(
        T,
        "connect to other",
        support::connect(
            s.config(MD5_USER, MD5_PASSWORD, "other")
                .application_name("pools_b"),
        ),
    )
    .await;
    for c in [&a1, &a2, &b] {
        select1(c).await;
    }
    // One more client of `other` that never queried: counted, holding no server.
    let idle = within(
        T,
        "connect to other",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, "other")),
    )
    .await;

    let pools = psql_ok(&s, "SHOW POOLS");
    for (db, clients, servers) in [(TEST_DB, "2", "2"), ("other", "2", "1")] {
        assert_eq!(
            pools.cell("database", db, "cl_active").as_deref(),
            Some(clients),
            "{db}: {pools:?}"
        );
        assert_eq!(
            pools.cell("database", db, "sv_active").as_deref(),
            Some(servers),
            "{db}: {pools:?}"
        );
    }
    // The console's own pool: this psql alone.
    assert_eq!(
        pools.cell("database", "pgbouncer", "cl_active").as_deref(),
        Some("1")
    );

    // Each active server is linked to its own client, under its client's database,
    // the pools' servers together, each pool's in its clients' order.
    let clients = psql_ok(&s, "SHOW CLIENTS");
    let ptr = |app: &str| clients.cell("application_name", app, "ptr").expect(app);
    let servers = psql_ok(&s, "SHOW SERVERS");
    assert_eq!(
        cells(&servers, "state", "active", "link"),
        vec![ptr("pools_b"), ptr("pools_a1"), ptr("pools_a2")],
        "{servers:?}"
    );
    assert_eq!(
        cells(&servers, "state", "active", "database"),
        vec!["other", TEST_DB, TEST_DB],
        "{servers:?}"
    );
    for app in ["pools_a1", "pools_a2", "pools_b"] {
        let link = clients.cell("application_name", app, "link").expect(app);
        assert_eq!(
            servers.cell("link", &ptr(app), "ptr"),
            Some(link),
            "{app}: {servers:?}"
        );
    }

    // Four pooled clients of one user; the console's client named but not counted.
    let users = psql_ok(&s, "SHOW USERS");
    assert_eq!(
        users
            .cell("name", MD5_USER, "current_client_connections")
            .as_deref(),
        Some("4"),
        "{users:?}"
    );
    assert_eq!(
        users
            .cell("name", super::ADMIN, "current_client_connections")
            .as_deref(),
        Some("0"),
        "{users:?}"
    );
    let dbs = psql_ok(&s, "SHOW DATABASES");
    assert_eq!(
        dbs.cell("name", "pgbouncer", "current_client_connections")
            .as_deref(),
        Some("1"),
        "{dbs:?}"
    );

    // One client gone: only its pool's counts move.
    drop(a2);
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(10), || {
            let p = psql_ok(&s, "SHOW POOLS");
            p.cell("database", TEST_DB, "cl_active").as_deref() == Some("1")
                && p.cell("database", "other", "cl_active").as_deref() == Some("2")
        }),
        "{:?}",
        psql_ok(&s, "SHOW POOLS")
    );
    drop((a1, b, idle));
}
