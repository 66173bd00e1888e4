//! The authoritative list of settings PgBouncer 1.25 accepts in `[pgbouncer]`, with
//! PgBouncer's default for each (as its SHOW CONFIG prints it) and how Sluice treats it.
//!
//! Kept apart from the parsing code because it is data that must track PgBouncer
//! releases: adding a setting here is all it takes to accept it (with a warning).

/// How a known setting is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Parsed into a typed `Settings` field.
    Implemented,
    /// Accepted and ignored; the value is a free string.
    Str,
    /// Accepted and ignored; the value must be an integer.
    Int,
    /// Accepted and ignored; the value must be a number of seconds.
    Time,
}

use Kind::*;

/// PgBouncer's `auth_query` (1.24.1 on: an expired role gets NULL, so no login).
pub(crate) const DEFAULT_AUTH_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin";

/// PgBouncer 1.25's settings (alphabetical, as SHOW CONFIG lists them) with their
/// defaults as PgBouncer prints them, plus two unreleased ones (`pool_idle_timeout`,
/// `login_notify_message`). The alias `reserve_pool` is handled separately.
pub(super) const KNOWN: &[(&str, &str, Kind)] = &[
    ("admin_users", "", Implemented),
    ("application_name_add_host", "0", Implemented),
    ("auth_dbname", "", Implemented),
    ("auth_file", "", Implemented),
    ("auth_hba_file", "", Implemented),
    ("auth_ident_file", "", Implemented),
    ("auth_ldap_options", "", Implemented),
    ("auth_query", DEFAULT_AUTH_QUERY, Implemented),
    ("auth_type", "md5", Implemented),
    ("auth_user", "", Implemented),
    ("autodb_idle_timeout", "3600", Implemented),
    ("cancel_wait_timeout", "10", Implemented),
    ("client_idle_timeout", "0", Implemented),
    ("client_login_timeout", "60", Implemented),
    ("client_tls13_ciphers", "", Implemented),
    ("client_tls_ca_file", "", Implemented),
    ("client_tls_cert_file", "", Implemented),
    ("client_tls_ciphers", "default", Implemented),
    ("client_tls_dheparams", "auto", Str),
    ("client_tls_ecdhcurve", "auto", Implemented),
    ("client_tls_key_file", "", Implemented),
    ("client_tls_protocols", "secure", Implemented),
    ("client_tls_sslmode", "disable", Implemented),
    ("conffile", "", Str),
    ("default_pool_size", "20", Implemented),
    ("disable_pqexec", "0", Implemented),
    ("dns_max_ttl", "15", Implemented),
    ("dns_nxdomain_ttl", "15", Implemented),
    ("dns_zone_check_period", "0", Time),
    ("idle_transaction_timeout", "0", Implemented),
    ("ignore_startup_parameters", "", Implemented),
    ("job_name", "pgbouncer", Str),
    ("listen_addr", "", Implemented),
    ("listen_backlog", "128", Implemented),
    ("listen_port", "6432", Implemented),
    ("log_connections", "1", Implemented),
    ("log_disconnections", "1", Implemented),
    ("log_pooler_errors", "1", Implemented),
    ("log_stats", "1", Implemented),
    ("logfile", "", Implemented),
    ("max_client_conn", "100", Implemented),
    ("max_db_client_connections", "0", Implemented),
    ("max_db_connections", "0", Implemented),
    ("max_packet_size", "2147483647", Implemented),
    ("max_prepared_statements", "200", Implemented),
    ("max_user_client_connections", "0", Implemented),
    ("max_user_connections", "0", Implemented),
    ("min_pool_size", "0", Implemented),
    ("peer_id", "0", Implemented),
    ("pidfile", "", Implemented),
    ("pkt_buf", "4096", Implemented),
    ("pool_mode", "session", Implemented),
    ("query_timeout", "0", Implemented),
    ("query_wait_notify", "5", Implemented),
    ("query_wait_timeout", "120", Implemented),
    ("reserve_pool_size", "0", Implemented),
    ("reserve_pool_timeout", "5", Implemented),
    ("resolv_conf", "", Str),
    ("sbuf_loopcnt", "5", Int),
    ("scram_iterations", "4096", Implemented),
    ("server_check_delay", "30", Implemented),
    ("server_check_query", "<empty>", Implemented),
    ("server_connect_timeout", "15", Implemented),
    ("server_fast_close", "0", Implemented),
    ("server_idle_timeout", "600", Implemented),
    ("server_lifetime", "3600", Implemented),
    ("server_login_retry", "15", Implemented),
    ("server_reset_query", "DISCARD ALL", Implemented),
    ("server_reset_query_always", "0", Implemented),
    ("server_round_robin", "0", Implemented),
    ("server_tls13_ciphers", "", Implemented),
    ("server_tls_ca_file", "", Implemented),
    ("server_tls_cert_file", "", Implemented),
    ("server_tls_ciphers", "default", Implemented),
    ("server_tls_key_file", "", Implemented),
    ("server_tls_protocols", "secure", Implemented),
    ("server_tls_sslmode", "prefer", Implemented),
    ("service_name", "", Str),
    ("so_reuseport", "0", Implemented),
    ("stats_period", "60", Implemented),
    ("stats_users", "", Implemented),
    ("suspend_timeout", "10", Implemented),
    ("syslog", "0", Implemented),
    ("syslog_facility", "daemon", Implemented),
    ("syslog_ident", "pgbouncer", Implemented),
    // PgBouncer's default is 1 where TCP_DEFER_ACCEPT exists (Linux); Sluice's is 0,
    // which measured faster for connect-heavy clients (docs/configuration.md).
    ("tcp_defer_accept", "0", Implemented),
    ("tcp_keepalive", "1", Implemented),
    ("tcp_keepcnt", "0", Implemented),
    ("tcp_keepidle", "0", Implemented),
    ("tcp_keepintvl", "0", Implemented),
    ("tcp_socket_buffer", "0", Implemented),
    ("tcp_user_timeout", "0", Implemented),
    ("track_extra_parameters", "IntervalStyle", Implemented),
    ("transaction_timeout", "0", Implemented),
    ("unix_socket_dir", "/tmp", Implemented),
    ("unix_socket_group", "", Implemented),
    ("unix_socket_mode", "0777", Implemented),
    ("user", "", Implemented),
    ("verbose", "0", Implemented),
    // Not in a PgBouncer release yet; accepted so configs written for newer builds load.
    ("pool_idle_timeout", "0", Implemented),
    ("login_notify_message", "", Implemented),
];

/// Known names that PgBouncer's Linux SHOW CONFIG does not list, so they are not
/// pre-filled into `Settings::raw` (only recorded when the file sets them).
pub(super) const NOT_LISTED: &[&str] =
    &["service_name", "pool_idle_timeout", "login_notify_message"];

/// Whether `name` is a setting PgBouncer accepts in `[pgbouncer]` (including the
/// `reserve_pool` alias).
pub fn is_known_setting(name: &str) -> bool {
    name == "reserve_pool" || KNOWN.iter().any(|(n, _, _)| *n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_all_pgbouncer_1_25_settings_once_in_order() {
        let released: Vec<&str> = KNOWN.iter().map(|(n, _, _)| *n).take(99).collect();
        assert_eq!(released.first(), Some(&"admin_users"));
        assert_eq!(released.last(), Some(&"verbose"));
        // Alphabetical and strictly increasing: no duplicates, SHOW CONFIG order.
        assert!(released.windows(2).all(|w| w[0] < w[1]), "{released:?}");
        assert_eq!(KNOWN.len(), 101);
        assert_eq!(KNOWN[99].0, "pool_idle_timeout");
        assert_eq!(KNOWN[100].0, "login_notify_message");
    }

    #[test]
    fn known_names_and_alias() {
        for n in [
            "reserve_pool",
            "reserve_pool_size",
            "so_reuseport",
            "verbose",
            "user",
        ] {
            assert!(is_known_setting(n), "{n}");
        }
        for n in ["lsten_port", "Listen_Port", "", "reserve"] {
            assert!(!is_known_setting(n), "{n}");
        }
        assert!(NOT_LISTED.iter().all(|n| is_known_setting(n)));
    }
}
