//! A `[databases]` entry with a host list: new server connections go round the list
//! (`load_balance_hosts = round-robin`) or stay on one host until it fails
//! (`disable`), and a host that is down is passed over for the next.

use super::{client, T};
use crate::support::probe::within;
use crate::support::{self, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

/// A Sluice whose `sluice_test` entry lists `hosts` (each reaching the test server
/// or not), with `extra` parameters.
fn sluice(hosts: &str, extra: &str) -> Sluice {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(
            TEST_DB,
            &format!("host={hosts} port=@PG_PORT@ dbname={TEST_DB} {extra}"),
        )
        .start()
}

/// Opens `n` clients that each hold a server (in an open transaction), and returns
/// how each server connection reached PostgreSQL: `tcp` or `unix`.
async fn held_links(s: &Sluice, n: usize) -> (Vec<tokio_postgres::Client>, Vec<String>) {
    let (mut clients, mut links) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let c = client(s).await;
        within(T, "BEGIN", c.batch_execute("BEGIN"))
            .await
            .expect("begin");
        let row = within(
            T,
            "inet_client_addr",
            c.query_one(
                "SELECT CASE WHEN inet_client_addr() IS NULL THEN 'unix' ELSE 'tcp' END",
                &[],
            ),
        )
        .await
        .expect("query");
        links.push(row.get::<_, String>(0));
        clients.push(c);
    }
    (clients, links)
}

/// How many failed connections to the socket directory `dir` the log shows.
fn failures(s: &Sluice, dir: &str) -> usize {
    let needle = format!("@unix:{dir}");
    s.log().lines().filter(|l| l.contains(&needle)).count()
}

#[tokio::test]
async fn round_robin_spreads_new_connections_over_the_hosts() {
    let s = sluice("127.0.0.1,@PG_SOCKET_DIR@", "");
    let (_held, links) = held_links(&s, 4).await;
    let tcp = links.iter().filter(|l| *l == "tcp").count();
    assert_eq!(tcp, 2, "{links:?}\n{}", s.diagnostics());
}

#[tokio::test]
async fn disable_stays_on_one_host_and_a_down_host_is_passed_over() {
    // The first host has no socket: every connection that tries it fails at once.
    let s = sluice(
        "/nonexistent-sluice-hosts,127.0.0.1,@PG_SOCKET_DIR@",
        "load_balance_hosts=disable",
    );
    let (_held, links) = held_links(&s, 3).await;
    // All on the first host that worked, which is then kept: the down one is tried
    // once, by the first connection.
    assert_eq!(links, ["tcp", "tcp", "tcp"], "{}", s.diagnostics());
    assert_eq!(failures(&s, "/nonexistent-sluice-hosts/"), 1, "{}", s.log());

    // Round-robin passes the down host over too: every client is served. Having
    // failed, it is tried after the other for `server_login_retry`: only once here.
    let s = sluice("/nonexistent-sluice-hosts,@PG_SOCKET_DIR@", "");
    let (_held, links) = held_links(&s, 3).await;
    assert_eq!(links, ["unix", "unix", "unix"], "{}", s.diagnostics());
    assert_eq!(failures(&s, "/nonexistent-sluice-hosts/"), 1, "{}", s.log());
}

#[tokio::test]
async fn every_host_down_fails_the_client() {
    let s = sluice("/nonexistent-sluice-a,/nonexistent-sluice-b", "");
    // The login needs a server (the pool's first, for the welcome): it fails with the
    // last host's error, after both were tried.
    let e = within(
        T,
        "login",
        support::try_connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await
    .expect_err("logged in with every host down");
    let text = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(
        text.starts_with("server connection failed: unix:/nonexistent-sluice-b/"),
        "{text} ({e:?})"
    );
    let log = s.log();
    for host in ["a", "b"] {
        assert!(
            log.contains(&format!("@unix:/nonexistent-sluice-{host}/")),
            "{log}"
        );
    }
}

/// A host name is looked up once and kept for `dns_max_ttl` (SHOW DNS_HOSTS lists
/// it); with 0 it is looked up at every connection and nothing is kept.
#[tokio::test]
async fn host_names_are_kept_for_dns_max_ttl() {
    for ttl in ["15", "0"] {
        let s = SluiceBuilder::new()
            .userlist(MD5_USER, MD5_PASSWORD)
            .setting("admin_users", MD5_USER)
            .setting("dns_max_ttl", ttl)
            .database(
                TEST_DB,
                &format!("host=localhost port=@PG_PORT@ dbname={TEST_DB}"),
            )
            .start();
        let (_held, links) = held_links(&s, 2).await;
        assert_eq!(links, ["tcp", "tcp"], "{}", s.diagnostics());
        let admin = crate::admin::console(&s, MD5_USER, MD5_PASSWORD).await;
        let rows: Vec<(String, String, String)> =
            within(T, "SHOW DNS_HOSTS", admin.simple_query("SHOW DNS_HOSTS"))
                .await
                .expect("SHOW DNS_HOSTS")
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => Some((
                        r.get(0).unwrap_or_default().to_owned(),
                        r.get(1).unwrap_or_default().to_owned(),
                        r.get(2).unwrap_or_default().to_owned(),
                    )),
                    _ => None,
                })
                .collect();
        // SHOW LISTS counts the names kept.
        let names = within(T, "SHOW LISTS", admin.simple_query("SHOW LISTS"))
            .await
            .expect("SHOW LISTS")
            .into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("dns_names") => {
                    r.get(1).map(str::to_owned)
                }
                _ => None,
            });
        let kept = if ttl == "0" { "0" } else { "1" };
        assert_eq!(names.as_deref(), Some(kept), "dns_names with ttl {ttl}");
        if ttl == "0" {
            assert!(rows.is_empty(), "{rows:?}");
            continue;
        }
        assert_eq!(rows.len(), 1, "{rows:?}");
        let (name, left, addrs) = &rows[0];
        assert_eq!(name, "localhost");
        let left: u64 = left.parse().expect("ttl");
        assert!((1..=15).contains(&left), "{rows:?}");
        assert!(addrs.split(',').any(|a| a == "127.0.0.1"), "{rows:?}");
        // The console's SET starts a cache with the new TTLs, as a reload does.
        within(T, "SET", admin.simple_query("SET dns_max_ttl = 0"))
            .await
            .expect("SET dns_max_ttl");
        let after = within(T, "SHOW DNS_HOSTS", admin.simple_query("SHOW DNS_HOSTS"))
            .await
            .expect("SHOW DNS_HOSTS");
        let left = after
            .iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
            .count();
        assert_eq!(left, 0, "kept after SET dns_max_ttl = 0");
    }
}
