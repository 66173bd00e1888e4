//! `auth_user` / `auth_query` / `auth_dbname`: users missing from `auth_file` are
//! looked up in PostgreSQL at each login, and the server login then uses what the
//! lookup found (an md5 hash, or SCRAM pass-through with a stored verifier).

use std::time::Duration;

use crate::auth::{login_error, whoami, LOGIN_LIMIT};
use crate::support::raw::{self, RawConn};
use crate::support::{self, pg, wait_until, Sluice, SluiceBuilder};

/// A Sluice whose only auth_file user is the auth user `postgres` (trust over TCP in
/// the harness's pg_hba.conf).
fn with_auth_user(auth_type: &str) -> SluiceBuilder {
    SluiceBuilder::new()
        .setting("auth_type", auth_type)
        .setting("auth_user", "postgres")
        .userlist("postgres", "")
}

/// What a failed SCRAM login reads, whatever failed.
const SASL_FAILED: (&str, &str) = ("28P01", "SASL authentication failed");

async fn assert_refused(sluice: &Sluice, user: &str, password: &str, want: (&str, &str)) {
    let (code, msg) = login_error(&sluice.config(user, password, support::TEST_DB)).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        want,
        "{user}/{password}\n{}",
        sluice.diagnostics()
    );
}

#[tokio::test]
async fn auth_query_logs_in_users_missing_from_auth_file() {
    for auth_type in ["scram-sha-256", "md5"] {
        let sluice = with_auth_user(auth_type).start();
        // sluice_scram's verifier: SCRAM with the client, then pass-through to a
        // server that asks for SCRAM. Twice: the second login reuses the pool.
        for _ in 0..2 {
            let cfg = sluice.config(
                support::SCRAM_USER,
                support::SCRAM_PASSWORD,
                support::TEST_DB,
            );
            assert_eq!(whoami(&cfg).await, support::SCRAM_USER, "{auth_type}");
        }
        assert_refused(&sluice, support::SCRAM_USER, "wrong", SASL_FAILED).await;
        let unknown = match auth_type {
            "md5" => ("28P01", "password authentication failed"),
            _ => SASL_FAILED,
        };
        assert_refused(&sluice, "sluice_no_such_role", "x", unknown).await;
    }
    // sluice_md5's hash: md5 with the client, and md5 with the hash to the server.
    let sluice = with_auth_user("md5").start();
    let cfg = sluice.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    assert_eq!(whoami(&cfg).await, support::MD5_USER);
    assert_refused(
        &sluice,
        support::MD5_USER,
        "wrong",
        ("28P01", "password authentication failed"),
    )
    .await;
    // Without auth_user the same user is unknown.
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "md5")
        .userlist("postgres", "")
        .start();
    assert_refused(
        &sluice,
        support::MD5_USER,
        support::MD5_PASSWORD,
        ("28P01", "password authentication failed"),
    )
    .await;
}

#[tokio::test]
async fn auth_query_runs_at_each_login_and_honours_valid_until() {
    pg().psql("CREATE ROLE sluice_aq_change LOGIN PASSWORD 'one'");
    let sluice = with_auth_user("scram-sha-256").start();
    let login = |pw: &'static str| sluice.config("sluice_aq_change", pw, support::TEST_DB);
    assert_eq!(whoami(&login("one")).await, "sluice_aq_change");
    pg().psql("ALTER ROLE sluice_aq_change PASSWORD 'two'");
    assert_refused(&sluice, "sluice_aq_change", "one", SASL_FAILED).await;
    assert_eq!(whoami(&login("two")).await, "sluice_aq_change");
    // The default query gives NULL for an expired role: no password matches.
    pg().psql("ALTER ROLE sluice_aq_change VALID UNTIL '2000-01-01'");
    assert_refused(&sluice, "sluice_aq_change", "two", SASL_FAILED).await;
}

#[tokio::test]
async fn auth_dbname_and_per_database_auth_user_with_a_lookup_function() {
    // The setup PgBouncer's docs recommend: a dedicated role that may only call a
    // SECURITY DEFINER function, here in another database (auth_dbname).
    pg().psql(
        "CREATE ROLE sluice_aq_auth LOGIN;\n\
         CREATE FUNCTION public.sluice_aq_lookup(text) \
           RETURNS TABLE(name text, secret text) LANGUAGE sql SECURITY DEFINER \
           SET search_path = pg_catalog AS \
           $$ SELECT rolname::text, rolpassword FROM pg_authid \
              WHERE rolname = $1 AND rolcanlogin $$;\n\
         REVOKE ALL ON FUNCTION public.sluice_aq_lookup(text) FROM PUBLIC;\n\
         GRANT EXECUTE ON FUNCTION public.sluice_aq_lookup(text) TO sluice_aq_auth;\n",
    );
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "scram-sha-256")
        .setting(
            "auth_query",
            "SELECT name, secret FROM public.sluice_aq_lookup($1)",
        )
        .database(
            "app",
            "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test \
             auth_user=sluice_aq_auth auth_dbname=authdb",
        )
        .database("authdb", "host=127.0.0.1 port=@PG_PORT@ dbname=postgres")
        .start();
    let cfg = sluice.config(support::SCRAM_USER, support::SCRAM_PASSWORD, "app");
    assert_eq!(whoami(&cfg).await, support::SCRAM_USER);
    // The lookup ran as the auth user, in auth_dbname's database.
    let seen = pg().psql(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE usename = 'sluice_aq_auth' AND datname = 'postgres'",
    );
    assert_eq!(seen.trim(), "1", "{}", sluice.diagnostics());
    // sluice_test has no auth_user: the same user is unknown there.
    assert_refused(
        &sluice,
        support::SCRAM_USER,
        support::SCRAM_PASSWORD,
        SASL_FAILED,
    )
    .await;
}

/// The client is told PgBouncer's words, `bouncer config error`; the log says what
/// failed.
#[tokio::test]
async fn a_failing_auth_query_is_a_config_error_to_the_client_and_logged() {
    let to_client = ("08P01", "bouncer config error");
    let cases = [
        (
            "SELECT rolname, rolpassword FROM sluice_no_such_table WHERE rolname = $1",
            "relation \"sluice_no_such_table\" does not exist",
        ),
        ("SELECT $1::text", "must return two columns"),
        (
            "SELECT rolname, rolpassword FROM pg_authid WHERE $1 <> ''",
            "more than one row",
        ),
    ];
    for (query, in_log) in cases {
        let sluice = with_auth_user("md5")
            .setting("auth_query", query)
            .userlist(support::PLAIN_USER, support::PLAIN_PASSWORD)
            .start();
        let md5 = (support::MD5_USER, support::MD5_PASSWORD);
        assert_refused(&sluice, md5.0, md5.1, to_client).await;
        assert!(
            wait_until(Duration::from_secs(5), || sluice.log().contains(in_log)),
            "log lacks {in_log:?}\n{}",
            sluice.diagnostics()
        );
        // A user in auth_file is not looked up, and logs in as before.
        let cfg = sluice.config(
            support::PLAIN_USER,
            support::PLAIN_PASSWORD,
            support::TEST_DB,
        );
        assert_eq!(whoami(&cfg).await, support::PLAIN_USER, "{query}");
    }
    let sluice = with_auth_user("md5")
        .setting("auth_dbname", "sluice_missing_db")
        .start();
    let missing = "auth_dbname \"sluice_missing_db\" is not a configured database";
    let md5 = (support::MD5_USER, support::MD5_PASSWORD);
    assert_refused(&sluice, md5.0, md5.1, to_client).await;
    assert!(sluice.log().contains(missing), "{}", sluice.log());
}

/// PgBouncer's CVE-2025-12819: a client's `search_path` startup parameter reached the
/// connection that ran `auth_query`, so an unqualified query could read the client's
/// own table. Sluice's lookup connection never takes a client's parameters.
#[test]
fn a_client_search_path_never_reaches_the_lookup() {
    let evil = postgres_protocol::password::md5(b"evil", support::MD5_USER);
    pg().psql_db(
        support::TEST_DB,
        &format!(
            "CREATE SCHEMA sluice_aq_evil;\n\
             CREATE TABLE sluice_aq_evil.pg_shadow (usename text, passwd text);\n\
             INSERT INTO sluice_aq_evil.pg_shadow VALUES ('{}', '{evil}');\n",
            support::MD5_USER
        ),
    );
    // The trap works where a client's search_path applies.
    let shadowed = pg().psql_db(
        support::TEST_DB,
        &format!(
            "SET search_path = sluice_aq_evil, pg_catalog; \
             SELECT passwd FROM pg_shadow WHERE usename = '{}'",
            support::MD5_USER
        ),
    );
    assert!(shadowed.contains(&evil), "{shadowed}");
    let sluice = with_auth_user("md5")
        .setting("track_extra_parameters", "search_path")
        .setting(
            "auth_query",
            "SELECT usename, passwd FROM pg_shadow WHERE usename = $1",
        )
        .start();
    let md5_login = |password: &str| {
        let mut c = RawConn::tcp(sluice.port());
        c.send(&raw::startup_packet(
            raw::PROTOCOL_3_0,
            &[
                ("user", support::MD5_USER),
                ("database", support::TEST_DB),
                ("search_path", "sluice_aq_evil, pg_catalog"),
            ],
        ))
        .expect("send startup");
        let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
        assert_eq!(
            m.auth_code(),
            Some(5),
            "not AuthenticationMD5Password: {m:?}"
        );
        let salt = [m.body[4], m.body[5], m.body[6], m.body[7]];
        let answer = postgres_protocol::authentication::md5_hash(
            support::MD5_USER.as_bytes(),
            password.as_bytes(),
            salt,
        );
        c.send(&raw::password_message(&answer)).expect("send md5");
        c.read_msg(LOGIN_LIMIT).expect("login answer")
    };
    let m = md5_login("evil");
    assert_eq!(
        m.error().map(|(_, msg)| msg).as_deref(),
        Some("password authentication failed"),
        "{m:?}"
    );
    assert_eq!(md5_login(support::MD5_PASSWORD).auth_code(), Some(0));
}

/// A reload rebuilds each pool's settings from the files, which do not know a looked
/// up user: the secret the lookup found must survive it, or the pool's next server
/// login has no password to give.
#[tokio::test]
async fn a_reload_keeps_the_looked_up_secret_for_new_server_logins() {
    let mut sluice = with_auth_user("md5")
        .setting("pool_mode", "transaction")
        .start();
    let client = support::connect(&sluice.config(
        support::MD5_USER,
        support::MD5_PASSWORD,
        support::TEST_DB,
    ))
    .await;
    let before = backend_pid(&client).await.expect("first query");
    // A new startup parameter retires the pool's servers: the next query needs a new
    // server login, md5 with the hash the lookup found.
    let ini = std::fs::read_to_string(sluice.ini_path()).expect("read ini");
    let changed = ini.replacen(
        &format!("dbname={}", support::TEST_DB),
        &format!("dbname={} application_name=reloaded", support::TEST_DB),
        1,
    );
    assert_ne!(ini, changed, "database entry not found in {ini}");
    sluice.rewrite_ini(&changed);
    sluice.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || sluice
        .log()
        .contains("config reloaded")));
    let after = backend_pid(&client).await;
    assert!(
        matches!(after, Ok(pid) if pid != before),
        "{after:?} after {before}\n{}",
        sluice.diagnostics()
    );
}

async fn backend_pid(c: &tokio_postgres::Client) -> Result<i32, String> {
    let q = c.query_one("SELECT pg_backend_pid()", &[]);
    let row = tokio::time::timeout(LOGIN_LIMIT, q)
        .await
        .expect("query hung");
    row.map(|r| r.get::<_, i32>(0)).map_err(|e| e.to_string())
}

/// PAUSE lends no server to anyone: a login that needs a lookup waits for RESUME,
/// as a paused client's query does, rather than open a connection to a database
/// being worked on.
#[tokio::test]
async fn a_lookup_waits_while_the_database_is_paused() {
    let sluice = with_auth_user("md5")
        .userlist("postgres", "adminpw")
        .start();
    let cfg = sluice.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    // A first login before the PAUSE, so that the user's pool already knows its
    // welcome and only the lookup needs a server.
    assert_eq!(whoami(&cfg).await, support::MD5_USER);
    let admin = support::connect(&sluice.config("postgres", "adminpw", "pgbouncer")).await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    // The login alone: a query would wait for RESUME anyway.
    let login = tokio::spawn(async move { support::try_connect(&cfg).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!login.is_finished(), "logged in while paused");
    admin.simple_query("RESUME").await.expect("RESUME");
    let who = tokio::time::timeout(LOGIN_LIMIT, login).await;
    assert!(
        matches!(&who, Ok(Ok(Ok(())))),
        "{who:?}\n{}",
        sluice.diagnostics()
    );
}

/// Many logins at once through `auth_query` (good, wrong password, unknown user) on
/// a pool of 2 in transaction mode: the lookups wait their turn for the auth user's
/// connections, and each login ends as it would alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_lookups_ends_each_login_as_alone() {
    let sluice = std::sync::Arc::new(
        with_auth_user("scram-sha-256")
            .setting("pool_mode", "transaction")
            .setting("default_pool_size", "2")
            .start(),
    );
    let logins: Vec<_> = (0..60)
        .map(|i| {
            let s = sluice.clone();
            tokio::spawn(async move {
                let (user, password) = match i % 3 {
                    0 => (support::SCRAM_USER, support::SCRAM_PASSWORD),
                    1 => (support::SCRAM_USER, "wrong"),
                    _ => ("sluice_no_such_role", "x"),
                };
                let cfg = s.config(user, password, support::TEST_DB);
                match i % 3 {
                    0 => assert_eq!(whoami(&cfg).await, support::SCRAM_USER, "login {i}"),
                    _ => {
                        let (code, msg) = login_error(&cfg).await;
                        assert_eq!((code.as_str(), msg.as_str()), SASL_FAILED, "login {i}");
                    }
                }
            })
        })
        .collect();
    for (i, h) in logins.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .unwrap_or_else(|_| {
                panic!("login {i} still going after 60 s\n{}", sluice.diagnostics())
            })
            .unwrap_or_else(|e| panic!("login {i}: {e}\n{}", sluice.diagnostics()));
    }
}
