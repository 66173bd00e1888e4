//! Replication connections (the `replication` startup parameter), as PgBouncer 1.23
//! passes them on: each gets a server connection of its own, opened with its
//! `replication` value, held for its whole session in any pool mode and closed when
//! it leaves. Clients: psql, pg_basebackup (which streams WAL beside the copy) and a
//! raw client that holds a physical connection open while the console looks.

use std::time::Duration;

use crate::support::probe::within;
use crate::support::wire::{self, RawClient};
use crate::support::{
    self, pg, wait_until, Sluice, SluiceBuilder, TempDir, MD5_PASSWORD, MD5_USER, REPL_PASSWORD,
    REPL_USER, TEST_DB,
};

const T: Duration = Duration::from_secs(30);

/// Transaction pooling, two servers a pool; `replication` (the database physical
/// replication tools log in to) leads to the test database.
fn start() -> Sluice {
    SluiceBuilder::new()
        .userlist(REPL_USER, REPL_PASSWORD)
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist("admin", "adminpw")
        .setting("admin_users", "admin")
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .database(
            "replication",
            &format!("host=127.0.0.1 port=@PG_PORT@ dbname={TEST_DB}"),
        )
        .start()
}

/// Walsenders of the replication role with this application_name, as PostgreSQL
/// counts them (the tests here run side by side).
fn walsenders(app: &str) -> usize {
    let out = pg().psql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' \
         AND usename = '{REPL_USER}' AND application_name = '{app}'"
    ));
    out.trim().parse().unwrap_or(usize::MAX)
}

/// The raw replication client's application_name.
const HELD: &str = "sluice_held_replica";

/// psql as the replication role with `replication=<mode>` (in the connection
/// string: psql has no flag for it), running `sql`.
fn psql_replication(s: &Sluice, db: &str, mode: &str, sql: &str) -> (bool, String) {
    psql_replication_with(s, db, mode, "", sql)
}

/// [`psql_replication`] with `PGOPTIONS`.
fn psql_replication_with(
    s: &Sluice,
    db: &str,
    mode: &str,
    options: &str,
    sql: &str,
) -> (bool, String) {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={REPL_USER} dbname={db} replication={mode}",
        s.port()
    );
    let mut cmd = std::process::Command::new(pg().bin("psql"));
    cmd.env("PGPASSWORD", REPL_PASSWORD)
        .env("PGOPTIONS", options)
        .args(["-X", "-A", "-t", "-F", "|", "-d", &conninfo, "-c", sql]);
    let out = support::run_bounded(&mut cmd, None, T).expect("psql hung");
    support::outcome(&out)
}

/// A physical replication client held open (application_name `app`), after its
/// IDENTIFY_SYSTEM: one walsender.
async fn held_replica(s: &Sluice, app: &str) -> RawClient {
    let mut raw = RawClient::login(
        s.port(),
        REPL_USER,
        REPL_PASSWORD,
        "replication",
        &[("replication", "true"), ("application_name", app)],
    )
    .await
    .expect("replication login");
    raw.query("IDENTIFY_SYSTEM").await.expect("send");
    let msgs = raw.until_ready(T).await;
    assert!(wire::first_error(&msgs).is_none(), "{msgs:?}");
    assert_eq!(wire::first_column(&msgs).len(), 1, "{msgs:?}");
    assert_eq!(walsenders(app), 1);
    // PgBouncer's login line names the kind.
    let line = format!("login attempt: db=replication user={REPL_USER} tls=no replication=yes");
    assert!(s.log().contains(&line), "{}", s.diagnostics());
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_clients_get_servers_of_their_own() {
    let s = start();
    // Physical: a walsender answers IDENTIFY_SYSTEM (system id, timeline, position,
    // no database).
    let (ok, text) = psql_replication(&s, "replication", "true", "IDENTIFY_SYSTEM");
    assert!(ok, "{text}\n{}", s.diagnostics());
    let fields: Vec<&str> = text.split('|').collect();
    assert_eq!(fields.len(), 4, "{text}");
    assert!(
        fields[0].parse::<u64>().is_ok() && fields[3].is_empty(),
        "{text}"
    );
    // Logical: the walsender is connected to the database.
    let (ok, text) = psql_replication(&s, TEST_DB, "database", "IDENTIFY_SYSTEM");
    assert!(ok, "{text}");
    assert!(text.ends_with(&format!("|{TEST_DB}")), "{text}");
    // Its `options` go to its own server as given, untracked settings included (a
    // logical subscriber sends extra_float_digits); a logical walsender runs SQL.
    let (ok, text) = psql_replication_with(
        &s,
        TEST_DB,
        "database",
        "-c extra_float_digits=3",
        "SHOW extra_float_digits",
    );
    assert_eq!((ok, text.as_str()), (true, "3"), "{}", s.diagnostics());

    // A physical client held open: the console shows it and its server as such.
    let raw = held_replica(&s, HELD).await;
    let admin = crate::admin::console(&s, "admin", "adminpw").await;
    for show in ["SHOW CLIENTS", "SHOW SERVERS"] {
        let rows = within(T, show, admin.simple_query(show)).await.expect(show);
        let kinds: Vec<String> = rows
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) if r.get(1) == Some(REPL_USER) => {
                    r.get(3).map(str::to_owned)
                }
                _ => None,
            })
            .collect();
        assert_eq!(kinds, ["physical"], "{show}");
    }
    // A plain client of another pool is served by a plain backend meanwhile.
    let c = within(
        T,
        "plain",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await;
    let kind: String = c
        .query_one(
            "SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("query")
        .get(0);
    assert_eq!(kind, "client backend");

    // Leaving closes its server: no walsender is left, none was pooled.
    drop(raw);
    assert!(
        wait_until(Duration::from_secs(10), || walsenders(HELD) == 0),
        "walsenders left: {}",
        walsenders(HELD)
    );

    // A bad value is refused with PostgreSQL's words.
    let e = RawClient::login(
        s.port(),
        REPL_USER,
        REPL_PASSWORD,
        "replication",
        &[("replication", "maybe")],
    )
    .await
    .err()
    .unwrap_or_default();
    assert!(
        e.contains("invalid value for parameter \"replication\""),
        "{e}"
    );
}

/// pg_basebackup through Sluice: the base backup's copy, and the WAL streamed beside
/// it on a second replication connection (CopyBoth), with the pool's two places.
#[test]
fn pg_basebackup_copies_the_cluster() {
    let s = start();
    let dir = TempDir::new("sluice-basebackup");
    let target = dir.join("copy");
    let mut cmd = std::process::Command::new(pg().bin("pg_basebackup"));
    cmd.env("PGPASSWORD", REPL_PASSWORD)
        .arg("-d")
        .arg(format!("host=127.0.0.1 port={} user={REPL_USER}", s.port()))
        .arg("-D")
        .arg(&target)
        .args(["-X", "stream", "-c", "fast", "--no-sync"]);
    let out =
        support::run_bounded(&mut cmd, None, Duration::from_secs(120)).expect("pg_basebackup hung");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
    assert!(target.join("PG_VERSION").exists());
    assert!(target
        .join("pg_wal")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some()));
    assert!(wait_until(Duration::from_secs(10), || walsenders(
        "pg_basebackup"
    ) == 0));
}

/// A replication stream is one long command: `query_timeout` does not cut it.
#[test]
fn query_timeout_spares_replication_clients() {
    let s = SluiceBuilder::new()
        .userlist(REPL_USER, REPL_PASSWORD)
        .setting("query_timeout", "1")
        .start();
    let (ok, text) = psql_replication(&s, TEST_DB, "database", "SELECT pg_sleep(2.5)");
    assert!(ok, "{text}\n{}", s.diagnostics());
    // A plain client of the same pool is held to it.
    let mut cmd = support::psql_cmd_pw(s.port(), "127.0.0.1", REPL_USER, TEST_DB, REPL_PASSWORD);
    cmd.args(["-c", "SELECT pg_sleep(2.5)"]);
    let (ok, text) = support::outcome(&support::run_bounded(&mut cmd, None, T).expect("psql"));
    assert!(!ok && text.contains("query_timeout"), "{text}");
}

/// A subscription and the publication it reads, in two databases of the harness's
/// cluster, dropped when the test ends (passed or not), so that no apply worker goes
/// on knocking at a Sluice that is gone.
struct Subscribed {
    publisher: String,
    subscriber: String,
    slot: String,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        let _ = pg().try_psql(
            &self.subscriber,
            "ALTER SUBSCRIPTION sluice_sub DISABLE;\n\
             ALTER SUBSCRIPTION sluice_sub SET (slot_name = NONE);\n\
             DROP SUBSCRIPTION sluice_sub;",
        );
        // The walsender lets go of the slot once the disabled worker has left; the
        // count is of what is left after this turn's drop.
        let drop_slot = format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = '{0}' AND NOT active;\n\
             SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{0}';",
            self.slot
        );
        wait_until(Duration::from_secs(20), || {
            pg().try_psql("postgres", &drop_slot)
                .is_ok_and(|out| out.lines().last().map(str::trim) == Some("0"))
        });
        for db in [&self.subscriber, &self.publisher] {
            let _ = pg().try_psql(
                "postgres",
                &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            );
        }
    }
}

/// Logical replication through Sluice, as PgBouncer 1.23 allows it: a subscription
/// whose connection names Sluice gets the publication's rows, first by its table
/// copy and then streamed, both on `replication=database` connections (the apply
/// worker's and the table sync worker's), with the `options` PostgreSQL's
/// walreceiver sends.
#[test]
fn a_subscription_replicates_through_sluice() {
    let tag = std::process::id();
    let sub = Subscribed {
        publisher: format!("sluice_pub_{tag}"),
        subscriber: format!("sluice_sub_{tag}"),
        slot: format!("sluice_slot_{tag}"),
    };
    pg().psql(&format!("CREATE DATABASE {}", sub.publisher));
    pg().psql(&format!("CREATE DATABASE {}", sub.subscriber));
    pg().psql_db(
        &sub.publisher,
        &format!(
            "CREATE TABLE items (id int PRIMARY KEY, name text);\n\
             INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 100) g;\n\
             GRANT SELECT ON items TO {REPL_USER};\n\
             CREATE PUBLICATION sluice_pub FOR TABLE items;\n\
             SELECT pg_create_logical_replication_slot('{}', 'pgoutput');",
            sub.slot
        ),
    );
    pg().psql_db(
        &sub.subscriber,
        "CREATE TABLE items (id int PRIMARY KEY, name text);",
    );
    let s = SluiceBuilder::new()
        .userlist(REPL_USER, REPL_PASSWORD)
        .setting("pool_mode", "transaction")
        .database(
            "published",
            &format!("host=127.0.0.1 port=@PG_PORT@ dbname={}", sub.publisher),
        )
        .start();
    // The slot exists already: a subscription in the same cluster cannot make its
    // own (its creation would wait for the transaction that asks for it).
    pg().psql_db(
        &sub.subscriber,
        &format!(
            "CREATE SUBSCRIPTION sluice_sub CONNECTION 'host=127.0.0.1 port={} \
             user={REPL_USER} password={REPL_PASSWORD} dbname=published' \
             PUBLICATION sluice_pub WITH (create_slot = false, slot_name = '{}');",
            s.port(),
            sub.slot
        ),
    );
    let rows = |sql: &str| pg().try_psql(&sub.subscriber, sql).unwrap_or_default();
    let copied = wait_until(Duration::from_secs(60), || {
        rows("SELECT count(*) FROM items").trim() == "100"
    });
    assert!(
        copied,
        "the table copy did not arrive\n{}\n{}",
        s.diagnostics(),
        pg().log()
    );
    pg().psql_db(
        &sub.publisher,
        "INSERT INTO items VALUES (101, 'streamed');\n\
         UPDATE items SET name = 'changed' WHERE id = 1;",
    );
    let streamed = wait_until(Duration::from_secs(30), || {
        rows("SELECT name FROM items WHERE id IN (1, 101) ORDER BY id").trim()
            == "changed\nstreamed"
    });
    assert!(
        streamed,
        "the changes were not streamed\n{}",
        s.diagnostics()
    );
    // The apply worker's connection is a replication client of Sluice's.
    let out = pg().psql(&format!(
        "SELECT count(*) FROM pg_stat_replication WHERE usename = '{REPL_USER}' \
         AND application_name = 'sluice_sub'"
    ));
    assert_eq!(out.trim(), "1", "{}", s.diagnostics());
}

/// pg_receivewal through Sluice streams WAL until it passes a given position.
#[test]
fn pg_receivewal_streams_to_its_end_position() {
    let s = start();
    let dir = TempDir::new("sluice-receivewal");
    // A slot of its own fixes where pg_receivewal starts: at the slot's position, at
    // or before `end`, whatever other tests do to the WAL meanwhile (pg_basebackup
    // switches segments). It stops at the first WAL past `end`, written and flushed
    // (the segment switch) before it starts.
    let slot = format!("sluice_receivewal_{}", std::process::id());
    let end = pg().psql(&format!(
        "SELECT 1 FROM pg_create_physical_replication_slot('{slot}', true);\n\
         SELECT pg_current_wal_insert_lsn();\n\
         CREATE TABLE sluice_wal_mark (); DROP TABLE sluice_wal_mark;\n\
         SELECT 1 FROM pg_switch_wal();"
    ));
    let end = end.lines().nth(1).unwrap_or_default().trim().to_owned();
    let mut cmd = std::process::Command::new(pg().bin("pg_receivewal"));
    cmd.env("PGPASSWORD", REPL_PASSWORD)
        .arg("-d")
        .arg(format!("host=127.0.0.1 port={} user={REPL_USER}", s.port()))
        .arg("-D")
        .arg(dir.path())
        .args(["--no-loop", "--no-sync", "-S", &slot, "-E", &end]);
    let out = support::run_bounded(&mut cmd, None, T);
    // The walsender may hold the slot a moment after pg_receivewal has left.
    let drop = format!("SELECT pg_drop_replication_slot('{slot}')");
    wait_until(T, || pg().try_psql("postgres", &drop).is_ok());
    let out = out.expect("pg_receivewal hung");
    assert!(
        out.status.success(),
        "end {end}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
    let received = dir
        .path()
        .read_dir()
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    assert!(received > 0, "no WAL was received");
}

/// A replication client whose server RECONNECT retires is disconnected at once, as
/// PgBouncer disconnects it (its session may never end, so waiting for it is no
/// option), with `database configuration changed`; its walsender goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_drops_a_replication_client_at_once() {
    const APP: &str = "sluice_reconnected_replica";
    let s = start();
    let mut raw = held_replica(&s, APP).await;

    let admin = crate::admin::console(&s, "admin", "adminpw").await;
    within(T, "RECONNECT", admin.simple_query("RECONNECT"))
        .await
        .expect("RECONNECT");
    let m = raw.recv(T).await.expect("closed without a word");
    assert_eq!(m.tag, b'E', "{m:?}");
    let why = m.field(b'M');
    assert_eq!(why.as_deref(), Some("database configuration changed"));
    assert!(raw.recv(T).await.is_none(), "still open");
    assert!(
        wait_until(Duration::from_secs(10), || walsenders(APP) == 0),
        "walsenders left: {}",
        walsenders(APP)
    );
}
