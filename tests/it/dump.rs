//! pg_dump and pg_restore through Sluice, as PgBouncer's users run them: a parallel
//! directory-format dump over a session pool (its workers share the leader's snapshot
//! through `pg_export_snapshot`, each on a connection of its own) restored by a
//! parallel pg_restore (COPY in both directions), and a plain dump restored by psql in one
//! transaction over a transaction pool. Each ends with the restored database compared
//! with the original directly on PostgreSQL, row by row.

use std::process::Command;
use std::time::Duration;

use crate::support::{self, pg, run_bounded, Sluice, SluiceBuilder, TempDir};
use crate::support::{MD5_PASSWORD, MD5_USER};
use crate::txn::common::{connstr, fresh_db};

const LIMIT: Duration = Duration::from_secs(120);

/// A database owned by the md5 user, with objects of its own: rows with awkward text
/// (tabs, newlines, backslashes, quotes, non-ASCII, NULLs), bytea, floats, json and
/// arrays; a sequence moved on; a foreign key, an index, a view and a function.
fn source_db() -> String {
    let db = fresh_db("dump_src");
    pg().psql_db(
        &db,
        &format!(
            "SET ROLE {MD5_USER};
             CREATE TABLE items (
                 id serial PRIMARY KEY,
                 label text,
                 blob bytea,
                 ratio float8,
                 at timestamptz,
                 doc jsonb,
                 tags int[]
             );
             INSERT INTO items (label, blob, ratio, at, doc, tags)
             SELECT CASE WHEN g % 97 = 0 THEN NULL
                         ELSE 'row ' || g || E'\\t tab\\n newline \\\\ back '
                              || chr(39) || ' quote é ✓' END,
                    decode(md5(g::text), 'hex'),
                    g / 7.0,
                    timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute',
                    jsonb_build_object('g', g, 'half', g / 2.0),
                    ARRAY[g, g * 2, g * 3]
             FROM generate_series(1, 20000) AS g;
             CREATE TABLE notes (
                 id bigint PRIMARY KEY,
                 item int REFERENCES items (id),
                 body text NOT NULL
             );
             INSERT INTO notes
             SELECT g, g * 3, repeat('x', g % 500) FROM generate_series(1, 5000) AS g;
             CREATE INDEX notes_item ON notes (item);
             CREATE SEQUENCE ticket START 100;
             SELECT setval('ticket', 4242);
             CREATE VIEW long_notes AS SELECT id, item FROM notes WHERE length(body) > 400;
             CREATE FUNCTION double_it(int) RETURNS int LANGUAGE sql AS 'SELECT $1 * 2';"
        ),
    );
    db
}

/// What must survive the trip, read directly from PostgreSQL: each table's rows in
/// order, hashed, with their count; the sequence; the view's and the function's
/// answers; the index.
fn fingerprint(db: &str) -> String {
    pg().psql_db(
        db,
        "SELECT count(*), md5(string_agg(i::text, '|' ORDER BY id)) FROM items i;
         SELECT count(*), md5(string_agg(n::text, '|' ORDER BY id)) FROM notes n;
         SELECT last_value FROM ticket;
         SELECT count(*) FROM long_notes;
         SELECT double_it(21);
         SELECT indexdef FROM pg_indexes WHERE indexname = 'notes_item';
         SELECT conname FROM pg_constraint WHERE contype = 'f' ORDER BY 1;",
    )
}

/// `tool` (a PostgreSQL client program) as the md5 user through Sluice.
fn through(s: &Sluice, tool: &str, db: &str) -> Command {
    let mut cmd = Command::new(pg().bin(tool));
    support::clear_pg_env(&mut cmd);
    cmd.env("PGPASSWORD", MD5_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &s.port().to_string(),
            "-U",
            MD5_USER,
        ])
        .args(["-d", db]);
    cmd
}

/// Runs `cmd` to its end; panics with its stderr and Sluice's log if it fails.
fn run_ok(s: &Sluice, what: &str, cmd: &mut Command) {
    let out = run_bounded(cmd, None, LIMIT).unwrap_or_else(|| panic!("{what} hung"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
}

fn sluice_for(mode: &str, pool_size: &str, dbs: &[&str]) -> Sluice {
    let mut b = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("pool_mode", mode)
        .setting("default_pool_size", pool_size);
    for db in dbs {
        b = b.database(db, &connstr(db, ""));
    }
    b.start()
}

#[test]
fn parallel_dump_and_parallel_restore_over_a_session_pool() {
    let src = source_db();
    let dst = fresh_db("dump_dst");
    let s = sluice_for("session", "4", &[&src, &dst]);
    let dir = TempDir::new("sluice-dump");
    let file = dir.path().join("src.dir");
    let file = file.to_string_lossy();
    run_ok(
        &s,
        "pg_dump",
        through(&s, "pg_dump", &src).args(["-Fd", "-j", "2", "-f", &file]),
    );
    // Three jobs: three more connections at once, each restoring its share with COPY.
    run_ok(
        &s,
        "pg_restore",
        through(&s, "pg_restore", &dst).args(["-j", "3", "--no-owner", "--exit-on-error", &file]),
    );
    let want = fingerprint(&src);
    assert!(want.contains("20000|"), "source: {want}");
    assert_eq!(fingerprint(&dst), want);
}

#[test]
fn plain_dump_restored_in_one_transaction_over_a_transaction_pool() {
    let src = source_db();
    let dst = fresh_db("dump_dst");
    let s = sluice_for("transaction", "2", &[&src, &dst]);
    let dir = TempDir::new("sluice-dump");
    let file = dir.path().join("src.sql");
    let file = file.to_string_lossy();
    run_ok(
        &s,
        "pg_dump",
        through(&s, "pg_dump", &src).args(["-Fp", "--no-owner", "-f", &file]),
    );
    // psql -1: the script's session settings and every statement in one transaction,
    // so on one server whatever the pool mode.
    run_ok(
        &s,
        "psql",
        through(&s, "psql", &dst).args(["-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "-f", &file]),
    );
    assert_eq!(fingerprint(&dst), fingerprint(&src));
}
