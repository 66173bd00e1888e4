//! Session parameters through Sluice: the welcome's ParameterStatus messages, and
//! startup parameters (application_name, client_encoding, DateStyle) applied on
//! the server — and not leaking to the next client of the same server.

use std::time::Duration;

use super::{client, config, T};
use crate::support::probe::{marked_sluice, unique_marker, within, Observer};
use crate::support::wire::{self, RawClient};
use crate::support::{self, pg, MD5_PASSWORD, MD5_USER, TEST_DB};

async fn raw_login(port: u16, extra: &[(&str, &str)]) -> RawClient {
    within(
        T,
        "raw login",
        RawClient::login(port, MD5_USER, MD5_PASSWORD, TEST_DB, extra),
    )
    .await
    .unwrap_or_else(|e| panic!("raw login with {extra:?}: {e}"))
}

async fn show(raw: &mut RawClient, name: &str) -> String {
    let msgs = raw.simple(&format!("SHOW {name}"), T).await;
    wire::first_column(&msgs)[0].clone().unwrap()
}

#[tokio::test]
async fn welcome_carries_the_servers_parameters() {
    let s = super::start_sluice();
    let via = raw_login(s.port(), &[]).await;
    let direct = raw_login(pg().port(), &[]).await;
    for name in [
        "server_version",
        "server_encoding",
        "client_encoding",
        "integer_datetimes",
        "standard_conforming_strings",
        "DateStyle",
        "TimeZone",
        "IntervalStyle",
        "is_superuser",
        "session_authorization",
    ] {
        assert_eq!(
            via.param(name),
            direct.param(name),
            "ParameterStatus {name}: via Sluice {:?}, direct {:?}",
            via.params,
            direct.params
        );
    }
    assert!(via.param("server_version").is_some(), "{:?}", via.params);
    assert!(via.pid != 0 || via.key != 0, "no BackendKeyData");

    // psql's SHOW agrees with the welcome.
    let expected = direct.param("server_version").unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, TEST_DB);
        cmd.args(["-c", "SHOW server_version"]);
        let out = support::run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    })
    .await
    .unwrap();
    assert_eq!(out, expected);
}

#[tokio::test]
async fn startup_application_name_is_applied_on_the_server() {
    let s = super::start_sluice();
    let app = unique_marker("relay_app");
    let mut cfg = config(&s);
    cfg.application_name(&app);
    let c = within(T, "connect", support::connect(&cfg)).await;
    let row = within(
        T,
        "pg_stat_activity",
        c.query_one(
            "SELECT application_name, current_setting('application_name') \
             FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(row.get::<_, String>(0), app);
    assert_eq!(row.get::<_, String>(1), app);

    let raw = raw_login(s.port(), &[("application_name", "relay_raw_app")]).await;
    assert_eq!(raw.param("application_name"), Some("relay_raw_app"));
}

#[tokio::test]
async fn each_client_gets_its_own_values_in_the_welcome() {
    // The welcome's ParameterStatus messages are written once per set of values and
    // copied for the next client with the same ones: clients taking turns with
    // different values must each see theirs, and the server's for the rest.
    let s = super::start_sluice();
    let direct = raw_login(pg().port(), &[]).await;
    for (app, tz) in [
        ("welcome_a", None),
        ("welcome_a", None),
        ("welcome_b", Some("Asia/Tokyo")),
        ("welcome_a", None),
        ("welcome_b", Some("Asia/Tokyo")),
        ("welcome_b", Some("Asia/Tokyo")),
    ] {
        let mut extra = vec![("application_name", app)];
        extra.extend(tz.map(|tz| ("TimeZone", tz)));
        let mut raw = raw_login(s.port(), &extra).await;
        assert_eq!(raw.param("application_name"), Some(app), "{raw:?}");
        let want_tz = tz.or(direct.param("TimeZone")).map(str::to_owned);
        assert_eq!(raw.param("TimeZone").map(str::to_owned), want_tz, "{raw:?}");
        assert_eq!(raw.param("server_version"), direct.param("server_version"));
        assert_eq!(show(&mut raw, "application_name").await, app);
    }
}

#[tokio::test]
async fn client_encoding_and_datestyle_from_startup() {
    let marker = unique_marker("relay_enc");
    // One server, so each client below gets the previous one's connection.
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .start();
    let obs = Observer::new().await;

    let mut latin = raw_login(
        s.port(),
        &[("client_encoding", "LATIN1"), ("DateStyle", "German")],
    )
    .await;
    assert_eq!(latin.param("client_encoding"), Some("LATIN1"), "{latin:?}");
    assert_eq!(show(&mut latin, "client_encoding").await, "LATIN1");
    assert_eq!(show(&mut latin, "DateStyle").await, "German, DMY");
    drop(latin);
    obs.wait_pooled(&marker, 1).await;

    // The next client of the same server sees its own (default) settings.
    let c = client(&s).await;
    let row = within(
        T,
        "settings",
        c.query_one(
            "SELECT current_setting('client_encoding'), current_setting('DateStyle')",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(row.get::<_, String>(0), "UTF8");
    assert_eq!(row.get::<_, String>(1), "ISO, MDY");
    drop(c);
    obs.wait_pooled(&marker, 1).await;

    // LATIN1 again: a non-ASCII character is converted both ways.
    let mut latin = raw_login(s.port(), &[("client_encoding", "LATIN1")]).await;
    let mut body = b"SELECT length('\xe9t\xe9'), '\xe9'::text".to_vec();
    body.push(0);
    latin.send(&wire::frame(b'Q', &body)).await.unwrap();
    let msgs = latin.until_ready(T).await;
    let row = msgs
        .iter()
        .find(|m| m.tag == wire::TAG_DATA_ROW)
        .expect("a row");
    // The raw bytes of the second column must be the LATIN1 byte 0xE9.
    assert_eq!(row.columns()[0].as_deref(), Some("3"));
    assert!(row.body.ends_with(&[0, 0, 0, 1, 0xe9]), "{row:?}");
}
