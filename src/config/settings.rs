//! The `[pgbouncer]` section: PgBouncer 1.25 defaults and typed parsing of each key.
//!
//! Every setting PgBouncer knows is accepted so an existing `pgbouncer.ini` loads
//! unchanged; the ones Sluice does not implement only produce a warning, and only when
//! their value differs from PgBouncer's default (then the operator expects an effect
//! Sluice will not have). Unknown names are errors: a typo must not pass silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{warning_at, ConfigError};
use super::known::Kind::*;
use super::known::{DEFAULT_AUTH_QUERY, KNOWN, NOT_LISTED};
use super::types::{AuthType, PoolMode, Settings, SslMode};
use super::value::{
    opt_str, parse_bool, parse_int, parse_list, parse_octal_mode, parse_pool_mode, parse_seconds,
};

impl Default for Settings {
    /// PgBouncer 1.25's defaults; `raw` holds every listed setting's default text.
    fn default() -> Self {
        let raw = KNOWN
            .iter()
            .filter(|(n, _, _)| !NOT_LISTED.contains(n))
            .map(|(n, d, _)| (n.to_string(), d.to_string()))
            .collect();
        Settings {
            logfile: None,
            syslog: false,
            syslog_ident: "pgbouncer".to_string(),
            syslog_facility: 3,
            pidfile: None,
            listen_addr: Vec::new(),
            listen_port: 6432,
            unix_socket_dir: "/tmp".to_string(),
            unix_socket_mode: 0o777,
            unix_socket_group: None,
            user: None,
            auth_type: AuthType::Md5,
            auth_file: None,
            auth_hba_file: None,
            auth_ident_file: None,
            auth_ldap_options: None,
            auth_user: None,
            auth_query: DEFAULT_AUTH_QUERY.to_string(),
            auth_dbname: None,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            client_tls_sslmode: SslMode::Disable,
            client_tls_key_file: None,
            client_tls_cert_file: None,
            client_tls_ca_file: None,
            client_tls_protocols: "secure".to_string(),
            client_tls_ciphers: "default".to_string(),
            client_tls13_ciphers: String::new(),
            client_tls_ecdhcurve: "auto".to_string(),
            server_tls_ciphers: "default".to_string(),
            server_tls13_ciphers: String::new(),
            server_tls_sslmode: SslMode::Prefer,
            server_tls_key_file: None,
            server_tls_cert_file: None,
            server_tls_ca_file: None,
            server_tls_protocols: "secure".to_string(),
            pool_mode: PoolMode::Session,
            default_pool_size: 20,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: Duration::from_secs(5),
            max_client_conn: 100,
            max_db_connections: 0,
            max_user_connections: 0,
            max_db_client_connections: 0,
            max_user_client_connections: 0,
            server_reset_query: "DISCARD ALL".to_string(),
            server_reset_query_always: false,
            // PgBouncer's `<empty>`: check with an empty query.
            server_check_query: String::new(),
            server_check_disabled: false,
            server_check_delay: Duration::from_secs(30),
            server_fast_close: false,
            server_round_robin: false,
            server_lifetime: Duration::from_secs(3600),
            server_idle_timeout: Duration::from_secs(600),
            server_connect_timeout: Duration::from_secs(15),
            server_login_retry: Duration::from_secs(15),
            client_login_timeout: Duration::from_secs(60),
            query_timeout: Duration::ZERO,
            query_wait_timeout: Duration::from_secs(120),
            query_wait_notify: Duration::from_secs(5),
            dns_max_ttl: Duration::from_secs(15),
            dns_nxdomain_ttl: Duration::from_secs(15),
            client_idle_timeout: Duration::ZERO,
            idle_transaction_timeout: Duration::ZERO,
            transaction_timeout: Duration::ZERO,
            cancel_wait_timeout: Duration::from_secs(10),
            autodb_idle_timeout: Duration::from_secs(3600),
            pool_idle_timeout: Duration::ZERO,
            login_notify_message: None,
            suspend_timeout: Duration::from_secs(10),
            ignore_startup_parameters: Vec::new(),
            track_extra_parameters: vec!["IntervalStyle".to_string()],
            max_prepared_statements: 200,
            application_name_add_host: false,
            log_connections: true,
            log_disconnections: true,
            log_pooler_errors: true,
            log_stats: true,
            stats_period: Duration::from_secs(60),
            verbose: 0,
            max_packet_size: 2_147_483_647,
            disable_pqexec: false,
            pkt_buf: 4096,
            listen_backlog: 128,
            so_reuseport: false,
            // Off, unlike PgBouncer (on for Linux): see known.rs.
            tcp_defer_accept: false,
            peer_id: 0,
            tcp_keepalive: true,
            tcp_keepidle: 0,
            tcp_keepintvl: 0,
            tcp_keepcnt: 0,
            tcp_user_timeout: 0,
            tcp_socket_buffer: 0,
            scram_iterations: 4096,
            metrics_listen: None,
            raw,
        }
    }
}

/// Applies one `[pgbouncer]` line to `s`. Unknown names and malformed values are
/// errors at `file:line`; accepted-but-unimplemented settings push a warning.
pub(crate) fn apply_setting(
    s: &mut Settings,
    key: &str,
    value: &str,
    file: &Path,
    line: usize,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    if key == SLUICE_METRICS_LISTEN {
        s.metrics_listen = parse_listen_addr(value).map_err(|why| {
            ConfigError::at(
                file,
                line,
                format!("invalid value \"{value}\" for {key}: {why}"),
            )
        })?;
        s.raw.insert(key.to_string(), value.to_string());
        return Ok(());
    }
    let name = if key == "reserve_pool" {
        "reserve_pool_size"
    } else {
        key
    };
    let Some(&(name, default, kind)) = KNOWN.iter().find(|(n, _, _)| *n == name) else {
        return Err(ConfigError::at(
            file,
            line,
            format!("unknown setting \"{key}\""),
        ));
    };
    let bad = |expected: String| {
        ConfigError::at(
            file,
            line,
            format!("invalid value \"{value}\" for {key}: {expected}"),
        )
    };
    if kind == Implemented {
        if let Some(w) = set_implemented(s, name, value).map_err(bad)? {
            warnings.push(warning_at(file, line, w));
        }
    } else {
        let is_default = match kind {
            Int => Some(parse_int::<i64>(value).map_err(bad)?) == parse_int::<i64>(default).ok(),
            Time => Some(parse_seconds(value).map_err(bad)?) == parse_seconds(default).ok(),
            Str | Implemented => value.eq_ignore_ascii_case(default),
        };
        if !is_default {
            warnings.push(warning_at(
                file,
                line,
                format!("setting \"{name}\" is not implemented by Sluice yet; ignored"),
            ));
        }
    }
    s.raw.insert(name.to_string(), value.to_string());
    Ok(())
}

/// Sets one implemented field. `Err` is what was expected; `Ok(Some)` a warning.
fn set_implemented(s: &mut Settings, name: &str, v: &str) -> Result<Option<String>, String> {
    match name {
        "admin_users" => s.admin_users = parse_list(v),
        "application_name_add_host" => s.application_name_add_host = parse_bool(v)?,
        "auth_dbname" => s.auth_dbname = opt_str(v),
        "auth_file" => s.auth_file = opt_str(v).map(PathBuf::from),
        "auth_hba_file" => s.auth_hba_file = opt_str(v).map(PathBuf::from),
        "auth_ident_file" => s.auth_ident_file = opt_str(v).map(PathBuf::from),
        "auth_ldap_options" => {
            s.auth_ldap_options = match v.trim() {
                "" => None,
                text => Some(std::sync::Arc::new(crate::auth::LdapOptions::parse(text)?)),
            }
        }
        "auth_query" => s.auth_query = v.to_string(),
        "auth_type" => {
            s.auth_type = parse_auth_type(v)?;
            if s.auth_type == AuthType::Pam {
                crate::auth::pam::available().map_err(|e| format!("auth_type pam: {e}"))?;
            }
            if s.auth_type == AuthType::Ldap {
                crate::auth::ldap::available().map_err(|e| format!("auth_type ldap: {e}"))?;
            }
        }
        "auth_user" => s.auth_user = opt_str(v),
        "autodb_idle_timeout" => s.autodb_idle_timeout = parse_seconds(v)?,
        "pool_idle_timeout" => s.pool_idle_timeout = parse_seconds(v)?,
        "login_notify_message" => s.login_notify_message = opt_str(v).map(Into::into),
        "cancel_wait_timeout" => s.cancel_wait_timeout = parse_seconds(v)?,
        "client_idle_timeout" => s.client_idle_timeout = parse_seconds(v)?,
        "client_login_timeout" => s.client_login_timeout = parse_seconds(v)?,
        "client_tls_ca_file" => s.client_tls_ca_file = opt_str(v).map(PathBuf::from),
        "client_tls_cert_file" => s.client_tls_cert_file = opt_str(v).map(PathBuf::from),
        "client_tls_key_file" => s.client_tls_key_file = opt_str(v).map(PathBuf::from),
        "client_tls_protocols" | "server_tls_protocols" => {
            let (_, dropped) = crate::tls::protocols(v)?;
            if name == "client_tls_protocols" {
                s.client_tls_protocols = v.to_string();
            } else {
                s.server_tls_protocols = v.to_string();
            }
            if dropped {
                return Ok(Some(
                    "TLS 1.0 and 1.1 are not offered by Sluice; only TLS 1.2 and 1.3".into(),
                ));
            }
        }
        "client_tls_ciphers"
        | "client_tls13_ciphers"
        | "server_tls_ciphers"
        | "server_tls13_ciphers" => {
            crate::tls::ciphers::select(v, name.contains("tls13"))?;
            let field = match name {
                "client_tls_ciphers" => &mut s.client_tls_ciphers,
                "client_tls13_ciphers" => &mut s.client_tls13_ciphers,
                "server_tls_ciphers" => &mut s.server_tls_ciphers,
                _ => &mut s.server_tls13_ciphers,
            };
            *field = v.to_string();
        }
        "client_tls_ecdhcurve" => {
            crate::tls::ciphers::groups(v)?;
            s.client_tls_ecdhcurve = v.to_string();
        }
        "client_tls_sslmode" => s.client_tls_sslmode = parse_sslmode(v)?,
        "server_tls_ca_file" => s.server_tls_ca_file = opt_str(v).map(PathBuf::from),
        "server_tls_cert_file" => s.server_tls_cert_file = opt_str(v).map(PathBuf::from),
        "server_tls_key_file" => s.server_tls_key_file = opt_str(v).map(PathBuf::from),
        "server_tls_sslmode" => s.server_tls_sslmode = parse_sslmode(v)?,
        "default_pool_size" => s.default_pool_size = parse_int(v)?,
        "idle_transaction_timeout" => s.idle_transaction_timeout = parse_seconds(v)?,
        "ignore_startup_parameters" => s.ignore_startup_parameters = parse_list(v),
        "listen_addr" => s.listen_addr = parse_list(v),
        "listen_backlog" => s.listen_backlog = parse_int(v)?,
        "listen_port" => s.listen_port = parse_int(v)?,
        "log_connections" => s.log_connections = parse_bool(v)?,
        "log_disconnections" => s.log_disconnections = parse_bool(v)?,
        "log_pooler_errors" => s.log_pooler_errors = parse_bool(v)?,
        "log_stats" => s.log_stats = parse_bool(v)?,
        "logfile" => s.logfile = opt_str(v).map(PathBuf::from),
        "syslog" => s.syslog = parse_bool(v)?,
        "syslog_ident" => s.syslog_ident = v.to_string(),
        "syslog_facility" => s.syslog_facility = crate::lifecycle::syslog::facility(v)?,
        "max_client_conn" => s.max_client_conn = parse_int(v)?,
        "max_db_client_connections" => s.max_db_client_connections = parse_int(v)?,
        "max_db_connections" => s.max_db_connections = parse_int(v)?,
        "max_packet_size" => s.max_packet_size = parse_int(v)?,
        "disable_pqexec" => s.disable_pqexec = parse_bool(v)?,
        "max_prepared_statements" => s.max_prepared_statements = parse_int(v)?,
        "max_user_client_connections" => s.max_user_client_connections = parse_int(v)?,
        "max_user_connections" => s.max_user_connections = parse_int(v)?,
        "min_pool_size" => s.min_pool_size = parse_int(v)?,
        "peer_id" => {
            s.peer_id = match parse_int(v)? {
                n @ 0..=crate::config::MAX_PEER_ID => n,
                _ => return Err(format!("expected 0 to {}", crate::config::MAX_PEER_ID)),
            }
        }
        "pidfile" => s.pidfile = opt_str(v).map(PathBuf::from),
        "pkt_buf" => s.pkt_buf = parse_int(v)?,
        "pool_mode" => s.pool_mode = parse_pool_mode(v)?,
        "query_timeout" => s.query_timeout = parse_seconds(v)?,
        "query_wait_timeout" => s.query_wait_timeout = parse_seconds(v)?,
        "query_wait_notify" => s.query_wait_notify = parse_seconds(v)?,
        "dns_max_ttl" => s.dns_max_ttl = parse_seconds(v)?,
        "dns_nxdomain_ttl" => s.dns_nxdomain_ttl = parse_seconds(v)?,
        "reserve_pool_size" => s.reserve_pool_size = parse_int(v)?,
        "reserve_pool_timeout" => s.reserve_pool_timeout = parse_seconds(v)?,
        "scram_iterations" => s.scram_iterations = parse_int(v)?,
        "server_check_delay" => s.server_check_delay = parse_seconds(v)?,
        "server_check_query" => {
            // PgBouncer: "<empty>" sends an empty query, "" disables the check.
            s.server_check_disabled = v.is_empty();
            s.server_check_query = if v == "<empty>" { "" } else { v }.to_string();
        }
        "server_connect_timeout" => s.server_connect_timeout = parse_seconds(v)?,
        "server_fast_close" => s.server_fast_close = parse_bool(v)?,
        "server_idle_timeout" => s.server_idle_timeout = parse_seconds(v)?,
        "server_lifetime" => s.server_lifetime = parse_seconds(v)?,
        "server_login_retry" => s.server_login_retry = parse_seconds(v)?,
        "server_reset_query" => s.server_reset_query = v.to_string(),
        "server_reset_query_always" => s.server_reset_query_always = parse_bool(v)?,
        "server_round_robin" => s.server_round_robin = parse_bool(v)?,
        "so_reuseport" => s.so_reuseport = parse_bool(v)?,
        "stats_period" => s.stats_period = parse_seconds(v)?,
        "stats_users" => s.stats_users = parse_list(v),
        "suspend_timeout" => s.suspend_timeout = parse_seconds(v)?,
        "tcp_defer_accept" => s.tcp_defer_accept = parse_int::<u32>(v)? > 0,
        "tcp_keepalive" => s.tcp_keepalive = parse_bool(v)?,
        "tcp_keepcnt" => s.tcp_keepcnt = parse_int(v)?,
        "tcp_keepidle" => s.tcp_keepidle = parse_int(v)?,
        "tcp_keepintvl" => s.tcp_keepintvl = parse_int(v)?,
        "tcp_socket_buffer" => s.tcp_socket_buffer = parse_int(v)?,
        "tcp_user_timeout" => s.tcp_user_timeout = parse_int(v)?,
        "track_extra_parameters" => s.track_extra_parameters = parse_list(v),
        "transaction_timeout" => s.transaction_timeout = parse_seconds(v)?,
        "unix_socket_dir" => s.unix_socket_dir = v.to_string(),
        "unix_socket_group" => s.unix_socket_group = opt_str(v),
        "unix_socket_mode" => s.unix_socket_mode = parse_octal_mode(v)?,
        "user" => s.user = opt_str(v),
        "verbose" => s.verbose = parse_int(v)?,
        // Only reachable if KNOWN marks a name Implemented without a branch here.
        _ => return Err("setting is not handled (internal error)".to_string()),
    }
    Ok(None)
}

/// Sluice's own setting for the Prometheus endpoint (not a PgBouncer name).
pub(crate) const SLUICE_METRICS_LISTEN: &str = "metrics_listen";

/// `HOST:PORT` (`[v6]:PORT` for IPv6); empty means off.
fn parse_listen_addr(v: &str) -> Result<Option<String>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let expected = || "expected HOST:PORT".to_string();
    let (host, port) = v.rsplit_once(':').ok_or_else(expected)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(expected());
    }
    Ok(Some(v.to_string()))
}

fn parse_sslmode(v: &str) -> Result<SslMode, String> {
    SslMode::parse(v).ok_or_else(|| format!("expected one of {}", SslMode::NAMES.join(", ")))
}

fn parse_auth_type(v: &str) -> Result<AuthType, String> {
    Ok(match v.to_ascii_lowercase().as_str() {
        "any" => AuthType::Any,
        "trust" => AuthType::Trust,
        "plain" => AuthType::Plain,
        "md5" => AuthType::Md5,
        "scram-sha-256" => AuthType::ScramSha256,
        "cert" => AuthType::Cert,
        "hba" => AuthType::Hba,
        "ldap" => AuthType::Ldap,
        "pam" => AuthType::Pam,
        _ => {
            return Err(
                "expected one of any, trust, plain, md5, scram-sha-256, cert, hba, ldap, pam"
                    .to_string(),
            )
        }
    })
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
