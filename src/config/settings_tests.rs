//! Tests of `settings.rs`: parsing each kind of `[pgbouncer]` value.

use super::*;

const F: &str = "/etc/x.ini";

/// Applies `key = value` at line 3 of `F` to fresh defaults.
fn set(key: &str, value: &str) -> Result<(Settings, Vec<String>), String> {
    let mut s = Settings::default();
    let mut w = Vec::new();
    apply_setting(&mut s, key, value, Path::new(F), 3, &mut w).map_err(|e| e.to_string())?;
    Ok((s, w))
}

fn ok(key: &str, value: &str) -> Settings {
    let (s, w) = set(key, value).unwrap();
    assert!(w.is_empty(), "unexpected warnings {w:?}");
    s
}

#[test]
fn defaults_are_pgbouncer_1_25() {
    let s = Settings::default();
    assert_eq!(s.listen_port, 6432);
    assert!(s.listen_addr.is_empty());
    assert_eq!(s.unix_socket_dir, "/tmp");
    assert_eq!(s.unix_socket_mode, 0o777);
    assert_eq!(s.auth_type, AuthType::Md5);
    assert_eq!(s.pool_mode, PoolMode::Session);
    assert_eq!(s.default_pool_size, 20);
    assert_eq!(s.reserve_pool_timeout, Duration::from_secs(5));
    assert_eq!(s.max_client_conn, 100);
    assert_eq!(s.server_reset_query, "DISCARD ALL");
    assert_eq!(s.server_check_query, "");
    assert!(!s.server_check_disabled);
    assert_eq!(s.server_check_delay, Duration::from_secs(30));
    assert_eq!(s.server_lifetime, Duration::from_secs(3600));
    assert_eq!(s.server_idle_timeout, Duration::from_secs(600));
    assert_eq!(s.server_connect_timeout, Duration::from_secs(15));
    assert_eq!(s.server_login_retry, Duration::from_secs(15));
    assert_eq!(s.client_login_timeout, Duration::from_secs(60));
    assert_eq!(s.query_wait_timeout, Duration::from_secs(120));
    assert_eq!(s.cancel_wait_timeout, Duration::from_secs(10));
    assert_eq!(s.autodb_idle_timeout, Duration::from_secs(3600));
    assert_eq!(s.suspend_timeout, Duration::from_secs(10));
    assert_eq!(s.track_extra_parameters, vec!["IntervalStyle"]);
    assert_eq!(s.max_prepared_statements, 200);
    assert!(s.log_connections && s.log_disconnections && s.log_pooler_errors && s.log_stats);
    assert_eq!(s.stats_period, Duration::from_secs(60));
    assert_eq!(s.max_packet_size, 2_147_483_647);
    assert_eq!(s.pkt_buf, 4096);
    assert_eq!(s.listen_backlog, 128);
    assert!(s.tcp_keepalive);
    assert_eq!(s.scram_iterations, 4096);
    assert_eq!(s.query_timeout, Duration::ZERO);
    assert_eq!(s.auth_file, None);
}

#[test]
fn raw_is_prefilled_with_listed_defaults() {
    let raw = Settings::default().raw;
    // 99 PgBouncer 1.25 settings minus the Windows-only service_name.
    assert_eq!(raw.len(), 98);
    assert_eq!(raw["server_check_query"], "<empty>");
    assert_eq!(raw["server_tls_sslmode"], "prefer");
    assert_eq!(raw["listen_port"], "6432");
    assert!(!raw.contains_key("service_name"));
    assert!(!raw.contains_key("pool_idle_timeout"));
}

#[test]
fn applying_every_default_changes_nothing() {
    let mut s = Settings::default();
    let mut w = Vec::new();
    for (name, default, _) in KNOWN {
        apply_setting(&mut s, name, default, Path::new(F), 1, &mut w).unwrap();
    }
    assert!(w.is_empty(), "{w:?}");
    let mut expected = Settings::default();
    for name in NOT_LISTED {
        expected.raw.insert(name.to_string(), s.raw[*name].clone());
    }
    assert_eq!(format!("{s:?}"), format!("{expected:?}"));
}

#[test]
fn typed_values() {
    assert_eq!(ok("listen_port", "7000").listen_port, 7000);
    assert_eq!(ok("reserve_pool", "3").reserve_pool_size, 3);
    assert_eq!(ok("reserve_pool", "3").raw["reserve_pool_size"], "3");
    assert!(!ok("log_connections", "off").log_connections);
    assert!(ok("server_round_robin", "Yes").server_round_robin);
    assert_eq!(
        ok("query_timeout", "0.5").query_timeout,
        Duration::from_millis(500)
    );
    assert_eq!(
        ok("stats_period", "10").stats_period,
        Duration::from_secs(10)
    );
    assert_eq!(ok("unix_socket_mode", "0750").unix_socket_mode, 0o750);
    assert_eq!(
        ok("pool_mode", "Transaction").pool_mode,
        PoolMode::Transaction
    );
    assert_eq!(
        ok("auth_type", "SCRAM-SHA-256").auth_type,
        AuthType::ScramSha256
    );
    assert_eq!(ok("auth_type", "trust").auth_type, AuthType::Trust);
    assert_eq!(ok("auth_type", "any").auth_type, AuthType::Any);
    assert_eq!(ok("auth_type", "plain").auth_type, AuthType::Plain);
    assert_eq!(
        ok("admin_users", "a, b ,c").admin_users,
        vec!["a", "b", "c"]
    );
    assert_eq!(ok("listen_addr", "*").listen_addr, vec!["*"]);
    assert_eq!(
        ok(
            "ignore_startup_parameters",
            "extra_float_digits, search_path"
        )
        .ignore_startup_parameters,
        vec!["extra_float_digits", "search_path"]
    );
    assert_eq!(
        ok("auth_file", "/etc/userlist.txt").auth_file,
        Some(PathBuf::from("/etc/userlist.txt"))
    );
    assert_eq!(ok("logfile", "").logfile, None);
    assert_eq!(ok("user", "postgres").user.as_deref(), Some("postgres"));
    assert_eq!(ok("verbose", "2").verbose, 2);
    assert_eq!(ok("pkt_buf", "8192").pkt_buf, 8192);
    let s = ok("server_reset_query", "RESET ALL");
    assert_eq!(s.server_reset_query, "RESET ALL");
    assert_eq!(s.raw["server_reset_query"], "RESET ALL");
}

#[test]
fn server_check_query_sentinels() {
    let s = ok("server_check_query", "<empty>");
    assert_eq!(
        (s.server_check_query.as_str(), s.server_check_disabled),
        ("", false)
    );
    let s = ok("server_check_query", "");
    assert_eq!(
        (s.server_check_query.as_str(), s.server_check_disabled),
        ("", true)
    );
    let s = ok("server_check_query", "SELECT 1");
    assert_eq!(s.server_check_query, "SELECT 1");
    assert!(!s.server_check_disabled);
}

#[test]
fn errors_name_file_line_key_and_value() {
    let bool_err = "expected a boolean (0/1, yes/no, on/off, true/false)";
    let ssl_err = "expected one of disable, allow, prefer, require, verify-ca, verify-full";
    for (k, v, why) in [
        ("listen_port", "abc", "expected an integer"),
        ("listen_port", "70000", "integer out of range"),
        ("tcp_keepalive", "maybe", bool_err),
        ("server_lifetime", "1h", "expected a number of seconds"),
        (
            "pool_mode",
            "txn",
            "expected session, transaction or statement",
        ),
        (
            "unix_socket_mode",
            "rw",
            "expected an octal file mode such as 0777",
        ),
        // Unimplemented settings are still validated.
        ("syslog", "perhaps", bool_err),
        (
            "syslog_facility",
            "kernel",
            "expected one of auth, authpriv, daemon, user, local0, local1, local2, local3, local4, local5, local6, local7",
        ),
        ("dns_max_ttl", "x", "expected a number of seconds"),
        ("sbuf_loopcnt", "x", "expected an integer"),
        ("peer_id", "x", "expected an integer"),
        ("peer_id", "16384", "expected 0 to 16383"),
        ("server_tls_sslmode", "sometimes", ssl_err),
    ] {
        let want = format!("/etc/x.ini:3: invalid value \"{v}\" for {k}: {why}");
        assert_eq!(set(k, v).unwrap_err(), want);
    }
    assert_eq!(
        set("lsten_port", "1").unwrap_err(),
        "/etc/x.ini:3: unknown setting \"lsten_port\""
    );
    assert!(set("auth_type", "password").unwrap_err().starts_with(
        "/etc/x.ini:3: invalid value \"password\" for auth_type: expected one of any,"
    ));
}

#[test]
fn unimplemented_settings_warn_unless_default() {
    let (s, w) = set("dns_zone_check_period", "30").unwrap();
    assert_eq!(
        w,
        vec![
            "/etc/x.ini:3: setting \"dns_zone_check_period\" is not implemented by Sluice yet; ignored"
        ]
    );
    assert_eq!(s.raw["dns_zone_check_period"], "30");
    for (k, v) in [
        ("client_tls_sslmode", "disable"),
        ("client_tls_sslmode", "DISABLE"),
        ("syslog", "no"),
        ("syslog", "1"),
        ("dns_zone_check_period", "0.0"),
        ("syslog_facility", "local0"),
        ("syslog_ident", "pgbouncer"),
    ] {
        assert!(set(k, v).unwrap().1.is_empty(), "{k} = {v}");
    }
    let s = ok("syslog_facility", "LOCAL3");
    assert_eq!(s.syslog_facility, 19);
    for (k, v) in [("sbuf_loopcnt", "10"), ("resolv_conf", "/etc/r")] {
        assert_eq!(set(k, v).unwrap().1.len(), 1, "{k} = {v}");
    }
    // Unreleased in PgBouncer, implemented here: no warning.
    let (s, w) = set("pool_idle_timeout", "30").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.pool_idle_timeout, Duration::from_secs(30));
    let (s, w) = set("login_notify_message", "through Sluice").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.login_notify_message.as_deref(), Some("through Sluice"));
    assert_eq!(ok("login_notify_message", "").login_notify_message, None);
}

#[test]
fn auth_query_settings() {
    let d = Settings::default();
    assert_eq!((d.auth_user, d.auth_dbname), (None, None));
    assert_eq!(d.auth_query, d.raw["auth_query"]);
    assert!(d.auth_query.contains("rolvaliduntil"));
    assert_eq!(ok("auth_user", "pgb").auth_user.as_deref(), Some("pgb"));
    assert_eq!(ok("auth_user", "").auth_user, None);
    assert_eq!(
        ok("auth_dbname", "authdb").auth_dbname.as_deref(),
        Some("authdb")
    );
    assert_eq!(ok("auth_query", "SELECT f($1)").auth_query, "SELECT f($1)");
    for k in ["auth_user", "auth_query", "auth_dbname"] {
        assert!(set(k, "x").unwrap().1.is_empty(), "{k} warns");
    }
}

#[test]
fn tcp_socket_options() {
    for k in [
        "tcp_keepcnt",
        "tcp_keepidle",
        "tcp_keepintvl",
        "tcp_socket_buffer",
        "tcp_user_timeout",
    ] {
        let (s, w) = set(k, "60").unwrap();
        assert!(w.is_empty(), "{k}: {w:?}");
        assert_eq!(s.raw[k], "60");
        assert!(set(k, "-1").is_err(), "{k}");
    }
    let s = ok("tcp_keepidle", "60");
    assert_eq!((s.tcp_keepidle, s.tcp_keepintvl), (60, 0));
    assert_eq!(ok("tcp_user_timeout", "2500").tcp_user_timeout, 2500);
}

#[test]
fn metrics_listen_is_sluice_specific() {
    assert_eq!(Settings::default().metrics_listen, None);
    assert!(!Settings::default().raw.contains_key("metrics_listen"));
    let s = ok("metrics_listen", "127.0.0.1:9127");
    assert_eq!(s.metrics_listen.as_deref(), Some("127.0.0.1:9127"));
    assert_eq!(s.raw["metrics_listen"], "127.0.0.1:9127");
    assert_eq!(ok("metrics_listen", "").metrics_listen, None);
    assert_eq!(
        set("metrics_listen", "9127").unwrap_err(),
        "/etc/x.ini:3: invalid value \"9127\" for metrics_listen: expected HOST:PORT"
    );
}

#[test]
fn every_auth_type_of_pgbouncer_is_taken() {
    assert_eq!(ok("auth_type", "cert").auth_type, AuthType::Cert);
    assert_eq!(ok("auth_type", "HBA").auth_type, AuthType::Hba);
    // libpam and libldap are opened at load: this machine has them.
    assert_eq!(ok("auth_type", "PAM").auth_type, AuthType::Pam);
    assert_eq!(ok("auth_type", "LDAP").auth_type, AuthType::Ldap);
    let o = ok("auth_ldap_options", "ldapserver=h ldapprefix=cn=");
    assert_eq!(
        o.auth_ldap_options
            .as_ref()
            .and_then(|o| o.prefix.as_deref()),
        Some("cn=")
    );
    assert!(set("auth_ldap_options", "ldapserver=h").is_err());
}

#[test]
fn client_tls_settings() {
    let d = Settings::default();
    assert_eq!(d.client_tls_sslmode, SslMode::Disable);
    assert_eq!(d.client_tls_protocols, "secure");
    assert_eq!(
        ok("client_tls_sslmode", "Verify-Full").client_tls_sslmode,
        SslMode::VerifyFull
    );
    assert!(set("client_tls_sslmode", "always")
        .unwrap_err()
        .ends_with("expected one of disable, allow, prefer, require, verify-ca, verify-full"));
    let s = ok("client_tls_ca_file", "/etc/ca.pem");
    assert_eq!(
        s.client_tls_ca_file.as_deref(),
        Some(Path::new("/etc/ca.pem"))
    );
    // Older versions asked for are named in a warning; none of 1.2 and 1.3 is an error.
    let (s, w) = set("client_tls_protocols", "all").unwrap();
    assert_eq!(s.client_tls_protocols, "all");
    assert!(w[0].contains("TLS 1.0 and 1.1 are not offered"), "{w:?}");
    assert!(set("client_tls_protocols", "tlsv1.1")
        .unwrap_err()
        .contains("no TLS version"));
    assert!(set("client_tls_sslmode", "require").unwrap().1.is_empty());
}

#[test]
fn cipher_settings_are_checked_at_their_line() {
    assert_eq!(
        ok("client_tls_ciphers", "HIGH:!aNULL").client_tls_ciphers,
        "HIGH:!aNULL"
    );
    let s = ok("server_tls13_ciphers", "TLS_AES_128_GCM_SHA256");
    assert_eq!(s.server_tls13_ciphers, "TLS_AES_128_GCM_SHA256");
    let e = set("client_tls_ciphers", "DES-CBC3-SHA")
        .err()
        .unwrap_or_default();
    let want = format!("{F}:3: invalid value \"DES-CBC3-SHA\" for client_tls_ciphers: none of");
    assert!(e.starts_with(&want), "{e}");
    assert!(set("client_tls13_ciphers", "TLS_AES_128_CCM_SHA256").is_err());
    assert_eq!(
        ok("client_tls_ecdhcurve", "secp384r1").client_tls_ecdhcurve,
        "secp384r1"
    );
    let e = set("client_tls_ecdhcurve", "brainpoolP256r1")
        .err()
        .unwrap_or_default();
    let want =
        format!("{F}:3: invalid value \"brainpoolP256r1\" for client_tls_ecdhcurve: none of");
    assert!(e.starts_with(&want), "{e}");
}
