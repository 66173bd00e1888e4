//! End-to-end relay tests in session pool mode: the whole protocol passes through
//! Sluice between real clients (tokio-postgres, psql, a raw socket) and the real
//! PostgreSQL. Parameter handling lives in `relay/params.rs`, failure handling
//! (aborted transactions, dying clients, garbage) in `relay/failures.rs`.

mod failures;
mod framing;
mod params;

use std::sync::Arc;
use std::time::Duration;

use crate::support::probe::{connect_with_messages, within};
use crate::support::wire::{self, RawClient, TAG_PARAM};
use crate::support::{self, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};
use tokio_postgres::{AsyncMessage, SimpleQueryMessage};

const T: Duration = Duration::from_secs(30);

fn start_sluice() -> Sluice {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .start()
}

fn config(s: &Sluice) -> tokio_postgres::Config {
    s.config(MD5_USER, MD5_PASSWORD, TEST_DB)
}

async fn client(s: &Sluice) -> tokio_postgres::Client {
    within(T, "connect", support::connect(&config(s))).await
}

/// The text rows of a simple-query result.
fn rows(msgs: &[SimpleQueryMessage]) -> Vec<Vec<Option<String>>> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

fn completions(msgs: &[SimpleQueryMessage]) -> Vec<u64> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(*n),
            _ => None,
        })
        .collect()
}

/// psql through Sluice with `script` on stdin (`-f -`); returns (stdout, stderr).
fn psql_script(s: &Sluice, script: &str, extra: &[&str]) -> (String, String) {
    let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, TEST_DB);
    cmd.args(extra).args(["-f", "-"]);
    let out = support::run_bounded(&mut cmd, Some(script), Duration::from_secs(60))
        .expect("psql did not finish within 60 s");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "psql failed ({}):\n{stderr}\n{}",
        out.status,
        s.diagnostics()
    );
    (stdout, stderr)
}

#[tokio::test]
async fn simple_query_with_several_statements() {
    let s = start_sluice();
    let c = client(&s).await;
    let msgs = within(
        T,
        "multi-statement simple query",
        c.simple_query(
            "SELECT 1 AS a; SELECT 'x' AS b, NULL AS c; CREATE TEMP TABLE t(v int); \
             INSERT INTO t VALUES (1), (2), (3); SELECT sum(v) FROM t",
        ),
    )
    .await
    .expect("simple query");
    let some = |v: &str| Some(v.to_owned());
    assert_eq!(
        rows(&msgs),
        vec![vec![some("1")], vec![some("x"), None], vec![some("6")]]
    );
    assert_eq!(completions(&msgs), vec![1, 1, 0, 3, 1]);
    // An empty query string and a comment-only one.
    let empty = within(T, "empty query", c.simple_query("")).await.unwrap();
    assert!(rows(&empty).is_empty());
    within(T, "batch", c.batch_execute("-- nothing\n;;"))
        .await
        .unwrap();
}

#[tokio::test]
async fn extended_query_with_parameters() {
    let s = start_sluice();
    let c = client(&s).await;
    let stmt = within(
        T,
        "prepare",
        c.prepare("SELECT $1::int4 * 2, $2::text || '!'"),
    )
    .await
    .expect("prepare");
    for i in 0..20i32 {
        let text = format!("v{i}");
        let row = within(T, "query", c.query_one(&stmt, &[&i, &text]))
            .await
            .expect("execute prepared");
        assert_eq!(row.get::<_, i32>(0), i * 2);
        assert_eq!(row.get::<_, String>(1), format!("v{i}!"));
    }
    // Binary parameters and results, NULLs, many rows.
    let bytes: Vec<u8> = (0..=255u8).collect();
    let row = within(
        T,
        "bytea",
        c.query_one("SELECT $1::bytea, $2::int8", &[&bytes, &None::<i64>]),
    )
    .await
    .unwrap();
    assert_eq!(row.get::<_, Vec<u8>>(0), bytes);
    assert_eq!(row.get::<_, Option<i64>>(1), None);
    let many = within(
        T,
        "generate_series",
        c.query("SELECT g FROM generate_series(1, $1) g", &[&50_000i32]),
    )
    .await
    .unwrap();
    assert_eq!(many.len(), 50_000);
    assert_eq!(many[49_999].get::<_, i32>(0), 50_000);
}

#[tokio::test]
async fn pipelined_requests() {
    let s = start_sluice();
    let c = Arc::new(client(&s).await);
    // Several requests written before any answer is read; one of them fails and
    // must not disturb the others (each has its own Sync).
    let (a, b, bad, d) = within(T, "pipelined join", async {
        tokio::join!(
            c.query_one("SELECT 1::int4", &[]),
            c.query_one("SELECT pg_sleep(0.2)::text || 'b'", &[]),
            c.query_one("SELECT no_such_column", &[]),
            c.query_one("SELECT $1::text", &[&"d"]),
        )
    })
    .await;
    assert_eq!(a.unwrap().get::<_, i32>(0), 1);
    assert_eq!(b.unwrap().get::<_, String>(0), "b");
    assert_eq!(bad.unwrap_err().code().unwrap().code(), "42703");
    assert_eq!(d.unwrap().get::<_, String>(0), "d");

    // A deep pipeline: 300 requests in flight on one connection.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300i32 {
        let c = c.clone();
        set.spawn(async move {
            let row = c.query_one("SELECT $1::int4 + 1", &[&i]).await?;
            Ok::<_, tokio_postgres::Error>((i, row.get::<_, i32>(0)))
        });
    }
    let mut seen = 0;
    while let Some(r) = within(T, "deep pipeline", set.join_next()).await {
        let (i, v) = r.expect("task").expect("pipelined query");
        assert_eq!(v, i + 1);
        seen += 1;
    }
    assert_eq!(seen, 300);
}

#[test]
fn copy_from_stdin_and_to_stdout() {
    let s = start_sluice();
    let n = 20_000;
    let mut script = String::from("CREATE TEMP TABLE c(a int, b text);\nCOPY c FROM STDIN;\n");
    let mut expected = String::new();
    for i in 1..=n {
        let line = format!("{i}\trow number {i} {}\n", "z".repeat(i % 50));
        script.push_str(&line);
        expected.push_str(&line);
    }
    script.push_str("\\.\nSELECT count(*) || '|' || sum(a) FROM c;\n");
    script.push_str("COPY (SELECT a, b FROM c ORDER BY a) TO STDOUT;\n");
    let (out, err) = psql_script(&s, &script, &[]);
    let (first, rest) = out.split_once('\n').expect("output lines");
    assert_eq!(first, format!("{n}|{}", n * (n + 1) / 2), "stderr: {err}");
    assert_eq!(rest, expected);

    // A COPY that fails half-way: the session goes on.
    let script = "CREATE TEMP TABLE c(a int);\nCOPY c FROM STDIN;\n1\n2\nnot a number\n4\n\\.\n\
                  SELECT 'after:' || count(*) FROM c;\n";
    let (out, err) = psql_script(&s, script, &["-v", "ON_ERROR_STOP=0"]);
    assert!(err.contains("invalid input syntax"), "stderr: {err}");
    assert_eq!(out.trim(), "after:0", "stderr: {err}");
}

#[tokio::test]
async fn listen_notify_between_clients() {
    let s = start_sluice();
    let (listener, mut rx) = connect_with_messages(&config(&s)).await;
    within(T, "LISTEN", listener.batch_execute("LISTEN relay_chan"))
        .await
        .unwrap();
    let notifier = client(&s).await;
    let notifier_pid: i32 = within(T, "pid", notifier.query_one("SELECT pg_backend_pid()", &[]))
        .await
        .unwrap()
        .get(0);
    within(
        T,
        "NOTIFY",
        notifier.batch_execute("NOTIFY relay_chan, 'hi'; SELECT pg_notify('relay_chan', 'two')"),
    )
    .await
    .unwrap();
    // The listener is idle: the notifications must arrive without it asking.
    let mut got = Vec::new();
    while got.len() < 2 {
        match within(Duration::from_secs(10), "notification", rx.recv()).await {
            Some(AsyncMessage::Notification(n)) => {
                assert_eq!(n.channel(), "relay_chan");
                assert_eq!(n.process_id(), notifier_pid);
                got.push(n.payload().to_owned());
            }
            Some(_) => {}
            None => panic!("listener connection ended"),
        }
    }
    assert_eq!(got, ["hi", "two"]);
    // The listener still works afterwards.
    let row = within(T, "after", listener.query_one("SELECT 7::int4", &[]))
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 7);
}

#[tokio::test]
async fn notices_reach_the_client() {
    let s = start_sluice();
    let (c, mut rx) = connect_with_messages(&config(&s)).await;
    within(
        T,
        "DO with notices",
        c.batch_execute(
            "DO $$ BEGIN RAISE NOTICE 'hello'; \
             FOR i IN 1..500 LOOP RAISE NOTICE 'n%', i; END LOOP; END $$",
        ),
    )
    .await
    .unwrap();
    let mut notices = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        if let AsyncMessage::Notice(n) = m {
            notices.push(n.message().to_owned());
        }
        if notices.len() == 501 {
            break;
        }
    }
    assert_eq!(notices.len(), 501, "{notices:?}");
    assert_eq!(notices[0], "hello");
    assert_eq!(notices[500], "n500");
    drop(c);

    // psql prints notices on stderr.
    let (_, err) = tokio::task::spawn_blocking(move || {
        let r = psql_script(&s, "DO $$ BEGIN RAISE NOTICE 'hello'; END $$;\n", &[]);
        drop(s);
        r
    })
    .await
    .unwrap();
    assert!(err.contains("NOTICE:  hello"), "psql stderr: {err}");
}

#[tokio::test]
async fn parameter_status_follows_set() {
    let s = start_sluice();
    let mut raw = within(
        T,
        "raw login",
        RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[]),
    )
    .await
    .expect("raw login");
    let params_of = |msgs: &[wire::RawMsg]| -> Vec<(String, String)> {
        msgs.iter()
            .filter(|m| m.tag == TAG_PARAM)
            .map(|m| m.param())
            .collect()
    };
    let msgs = raw.simple("SET application_name = 'relay_x'", T).await;
    assert!(
        params_of(&msgs).contains(&("application_name".into(), "relay_x".into())),
        "{msgs:?}"
    );
    let msgs = raw.simple("SET DateStyle = 'German'", T).await;
    assert!(
        params_of(&msgs).contains(&("DateStyle".into(), "German, DMY".into())),
        "{msgs:?}"
    );
    let msgs = raw.simple("SHOW application_name", T).await;
    assert_eq!(wire::first_column(&msgs), [Some("relay_x".to_owned())]);

    // The same through tokio-postgres and psql.
    let c = client(&s).await;
    within(
        T,
        "SET",
        c.batch_execute("SET application_name = 'relay_y'"),
    )
    .await
    .unwrap();
    let v: String = within(T, "SHOW", c.query_one("SHOW application_name", &[]))
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, "relay_y");
    let out = tokio::task::spawn_blocking(move || {
        let r = psql_script(
            &s,
            "SET DateStyle = 'SQL, DMY';\nSELECT '2024-01-31'::date;\nSHOW DateStyle;\n",
            &[],
        );
        drop(s);
        r.0
    })
    .await
    .unwrap();
    assert_eq!(out.lines().collect::<Vec<_>>(), ["31/01/2024", "SQL, DMY"]);
}

#[tokio::test]
async fn rows_of_twenty_megabytes_both_ways() {
    let s = start_sluice();
    let c = client(&s).await;
    let big = 21 * 1024 * 1024;
    let limit = Duration::from_secs(60);

    let row = within(
        limit,
        "big result",
        c.query_one("SELECT repeat('x', $1)", &[&big]),
    )
    .await
    .unwrap();
    let v: String = row.get(0);
    assert_eq!(v.len(), big as usize);
    assert!(v.bytes().all(|b| b == b'x'));

    let param: String = "ab".repeat(big as usize / 2);
    let row = within(
        limit,
        "big parameter",
        c.query_one(
            "SELECT length($1::text), $1::text = repeat('ab', $2)",
            &[&param, &(big / 2)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(row.get::<_, i32>(0), big);
    assert!(row.get::<_, bool>(1));

    within(
        limit,
        "insert big",
        c.execute("CREATE TEMP TABLE big(v text)", &[]),
    )
    .await
    .unwrap();
    within(
        limit,
        "insert big",
        c.execute("INSERT INTO big VALUES ($1)", &[&param]),
    )
    .await
    .unwrap();
    let back: String = within(limit, "select big", c.query_one("SELECT v FROM big", &[]))
        .await
        .unwrap()
        .get(0);
    assert!(back == param, "20 MB value changed on the round trip");

    // A 20 MB simple Query message.
    let sql = format!("SELECT length('{}')", "q".repeat(big as usize));
    let msgs = within(limit, "big simple query", c.simple_query(&sql))
        .await
        .unwrap();
    assert_eq!(rows(&msgs), vec![vec![Some(big.to_string())]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_requests_and_replies_do_not_deadlock() {
    let s = start_sluice();
    let c = Arc::new(client(&s).await);
    // 40 requests of 1 MB each in flight while the server answers each with 1 MB:
    // both directions are full at once.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..40u8 {
        let c = c.clone();
        set.spawn(async move {
            let payload = String::from_utf8(vec![b'a' + i % 26; 1 << 20]).unwrap();
            let row = c.query_one("SELECT $1::text", &[&payload]).await?;
            Ok::<_, tokio_postgres::Error>(row.get::<_, String>(0) == payload)
        });
    }
    let mut n = 0;
    while let Some(r) = within(Duration::from_secs(60), "big pipeline", set.join_next()).await {
        assert!(r.expect("task").expect("echo query"), "payload changed");
        n += 1;
    }
    assert_eq!(n, 40);
}
