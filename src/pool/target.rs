//! Where a pool's server connections go and how they log in, derived from the config.

use std::time::Duration;

use crate::auth::Secret;
use crate::config::{Config, DatabaseEntry, LoadBalance, PoolMode};
use crate::net::TcpTuning;

/// How to reach the PostgreSQL server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddr {
    /// Host name or IP, and port.
    Tcp(String, u16),
    /// A socket directory and port (`<dir>/.s.PGSQL.<port>`); a "directory" starting
    /// with `@` is in the abstract namespace.
    Unix(String, u16),
}

impl ServerAddr {
    /// A `host=` value as libpq reads it: a directory (starting with `/`) holds the
    /// UNIX socket, one starting with `@` names it in the abstract namespace, anything
    /// else is a host name or address.
    pub fn for_host(host: &str, port: u16) -> ServerAddr {
        if host.starts_with('/') || host.starts_with('@') {
            ServerAddr::Unix(host.to_owned(), port)
        } else {
            ServerAddr::Tcp(host.to_owned(), port)
        }
    }
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddr::Tcp(h, p) => write!(f, "{h}:{p}"),
            ServerAddr::Unix(d, p) => write!(f, "unix:{d}/.s.PGSQL.{p}"),
        }
    }
}

/// Everything a pool needs to open and manage its server connections. One immutable
/// snapshot per pool, replaced on reload.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The first (often the only) host, for the log and for finding pools that reach
    /// the same server.
    pub addr: ServerAddr,
    /// Every host of the entry's `host` list, in its order (`hosts[0]` is `addr`).
    pub hosts: Vec<ServerAddr>,
    /// How new connections pick from `hosts`.
    pub load_balance: LoadBalance,
    /// Where host names are looked up (the configuration's cache).
    pub dns: std::sync::Arc<crate::net::dns::DnsCache>,
    /// Server-side database name.
    pub dbname: String,
    /// Server-side user name.
    pub user: String,
    /// The secret to log in with: the database entry's password, else the userlist's.
    pub secret: Option<Secret>,
    /// Whether `secret` came from `auth_query` (a reload, which knows only the
    /// files, keeps it then).
    pub secret_queried: bool,
    /// Extra startup parameters from the database entry (client_encoding, datestyle ...).
    pub startup: Vec<(String, String)>,
    pub connect_query: Option<String>,
    pub pool_mode: PoolMode,
    /// 0 = unlimited.
    pub pool_size: u32,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_connect_timeout: Duration,
    pub server_login_retry: Duration,
    pub query_wait_timeout: Duration,
    /// A client waiting in line this long is sent a notice (0: never).
    pub query_wait_notify: Duration,
    pub server_round_robin: bool,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub reserve_pool_timeout: Duration,
    /// 0 = unlimited.
    pub max_db_connections: u32,
    /// 0 = unlimited.
    pub max_user_connections: u32,
    /// Query run on a connection idle longer than `server_check_delay`; None: no check.
    pub server_check_query: Option<String>,
    pub server_check_delay: Duration,
    /// TCP options for its server connections (`net::tune`).
    pub tcp: TcpTuning,
    /// TLS for a server on TCP (`server_tls_*`); None: plaintext.
    pub tls: Option<std::sync::Arc<crate::tls::server::ServerTls>>,
    /// Log each server connection made (`log_connections`) and closed
    /// (`log_disconnections`), with PgBouncer's lines.
    pub log_connections: bool,
    pub log_disconnections: bool,
}

/// What lending and taking back a connection need of the settings: a copy kept in
/// the pool's state and read under the lock those paths take anyway, so that a
/// transaction's checkout and release load no settings (two `ArcSwap` loads, ~100
/// instructions, before).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reuse {
    pub lifetime: Duration,
    pub idle_timeout: Duration,
    pub check_delay: Duration,
    /// Whether a `server_check_query` is set.
    pub check: bool,
    pub round_robin: bool,
    /// 0 = unlimited.
    pub pool_size: u32,
    pub reserve_pool_size: u32,
    /// `server_login_retry`.
    pub login_retry: Duration,
    /// `server_idle_timeout` closes no connection that would leave fewer.
    pub min_pool_size: u32,
}

impl PoolConfig {
    /// The bound on a query Sluice runs itself on a server (the check, the reset,
    /// the SETs of a client's parameters): `server_connect_timeout`, or 15 s where
    /// that is 0 ("no limit" for a connect, but such a query must not hang forever).
    pub fn internal_timeout(&self) -> Duration {
        if self.server_connect_timeout.is_zero() {
            Duration::from_secs(15)
        } else {
            self.server_connect_timeout
        }
    }

    pub(crate) fn reuse(&self) -> Reuse {
        Reuse {
            lifetime: self.server_lifetime,
            idle_timeout: self.server_idle_timeout,
            check_delay: self.server_check_delay,
            check: self.server_check_query.is_some(),
            round_robin: self.server_round_robin,
            pool_size: self.pool_size,
            reserve_pool_size: self.reserve_pool_size,
            login_retry: self.server_login_retry,
            min_pool_size: self.min_pool_size,
        }
    }

    /// Builds the pool settings for `db` (already resolved, fallback included) and the
    /// client's `user`.
    pub fn new(cfg: &Config, db: &DatabaseEntry, client_db: &str, user: &str) -> PoolConfig {
        let s = &cfg.settings;
        let user_entry = cfg.users.get(user);
        // The pool `auth_query` runs in logs in as the auth user itself, even on a
        // database whose clients are all forced to another user.
        let auth_user = db.auth_user.as_deref().or(s.auth_user.as_deref());
        let forced = db
            .user
            .as_ref()
            .filter(|f| auth_user != Some(user) || f.as_str() == user);
        let server_user = forced.cloned().unwrap_or_else(|| user.to_owned());
        let secret = match (forced, &db.password) {
            (Some(_), Some(p)) => Some(Secret::parse(p)),
            _ => cfg.userlist.get(&server_user).map(|p| Secret::parse(p)),
        };
        let port = db.port;
        let mut hosts: Vec<ServerAddr> = db
            .host
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| ServerAddr::for_host(h, port))
            .collect();
        if hosts.is_empty() {
            hosts.push(ServerAddr::Unix(
                default_socket_dir(&s.unix_socket_dir),
                port,
            ));
        }
        let addr = hosts[0].clone();
        // For the TCP hosts of the list; a UNIX socket never uses TLS.
        let tls = hosts
            .iter()
            .any(|h| matches!(h, ServerAddr::Tcp(..)))
            .then(|| cfg.server_tls.clone())
            .flatten();
        let mut startup = Vec::new();
        for (k, v) in [
            ("client_encoding", &db.client_encoding),
            ("datestyle", &db.datestyle),
            ("timezone", &db.timezone),
            ("application_name", &db.application_name),
        ] {
            if let Some(v) = v {
                startup.push((k.to_owned(), v.clone()));
            }
        }
        PoolConfig {
            addr,
            hosts,
            load_balance: db.load_balance_hosts,
            dns: cfg.dns.clone(),
            dbname: db.dbname.clone().unwrap_or_else(|| client_db.to_owned()),
            user: server_user,
            secret,
            secret_queried: false,
            startup,
            connect_query: db.connect_query.clone(),
            pool_mode: user_entry
                .and_then(|u| u.pool_mode)
                .or(db.pool_mode)
                .unwrap_or(s.pool_mode),
            pool_size: user_entry
                .and_then(|u| u.pool_size)
                .or(db.pool_size)
                .unwrap_or(s.default_pool_size),
            server_reset_query: s.server_reset_query.clone(),
            server_reset_query_always: s.server_reset_query_always,
            server_lifetime: db.server_lifetime.unwrap_or(s.server_lifetime),
            server_idle_timeout: s.server_idle_timeout,
            server_connect_timeout: s.server_connect_timeout,
            server_login_retry: s.server_login_retry,
            query_wait_timeout: user_entry
                .and_then(|u| u.query_wait_timeout)
                .or(db.query_wait_timeout)
                .unwrap_or(s.query_wait_timeout),
            query_wait_notify: s.query_wait_notify,
            server_round_robin: s.server_round_robin,
            min_pool_size: db.min_pool_size.unwrap_or(s.min_pool_size),
            reserve_pool_size: user_entry
                .and_then(|u| u.reserve_pool_size)
                .or(db.reserve_pool_size)
                .unwrap_or(s.reserve_pool_size),
            reserve_pool_timeout: s.reserve_pool_timeout,
            max_db_connections: db.max_db_connections.unwrap_or(s.max_db_connections),
            max_user_connections: user_entry
                .and_then(|u| u.max_user_connections)
                .unwrap_or(s.max_user_connections),
            server_check_query: (!s.server_check_disabled).then(|| s.server_check_query.clone()),
            server_check_delay: s.server_check_delay,
            tcp: TcpTuning::from_settings(s),
            tls,
            log_connections: s.log_connections,
            log_disconnections: s.log_disconnections,
        }
    }

    /// Whether a change from `self` to `new` makes existing server connections unusable.
    pub fn needs_reconnect(&self, new: &PoolConfig) -> bool {
        self.hosts != new.hosts
            || self.dbname != new.dbname
            || self.user != new.user
            || self.secret != new.secret
            || self.startup != new.startup
            || self.connect_query != new.connect_query
            || self.tls != new.tls
    }
}

/// PgBouncer uses its own `unix_socket_dir` for servers without a host; with that
/// disabled, fall back to libpq's usual directory.
fn default_socket_dir(dir: &str) -> String {
    if dir.is_empty() {
        "/var/run/postgresql".to_owned()
    } else {
        dir.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::pool::Pool;

    fn config(ini: &str) -> Config {
        Config::from_ini_str(ini, Path::new("test.ini")).expect("config")
    }

    #[test]
    fn the_auth_user_pool_logs_in_as_the_auth_user_despite_a_forced_user() {
        let cfg = config(
            "[databases]\ndb = host=h user=forced password=fpw auth_user=authu\n\
             [pgbouncer]\nauth_user = global\n",
        );
        let entry = cfg.database_entry("db").expect("db");
        let forced = PoolConfig::new(&cfg, &entry, "db", "forced");
        assert_eq!(forced.user, "forced");
        assert_eq!(forced.secret, Some(Secret::Plain("fpw".into())));
        let auth = PoolConfig::new(&cfg, &entry, "db", "authu");
        assert_eq!(auth.user, "authu");
        assert_eq!(auth.secret, None);
        // Only the database's own auth_user escapes the forced user.
        let other = PoolConfig::new(&cfg, &entry, "db", "global");
        assert_eq!(other.user, "forced");
    }

    #[test]
    fn a_looked_up_secret_survives_a_reconfigure_that_knows_none() {
        let cfg = config("[databases]\ndb = host=h\n");
        let entry = cfg.database_entry("db").expect("db");
        let pc = PoolConfig::new(&cfg, &entry, "db", "u");
        assert_eq!(pc.secret, None);
        let pool = Pool::for_tests(pc.clone());
        let md5 = Secret::parse("md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        pool.set_queried_secret(md5.clone());
        assert_eq!(pool.config().secret.as_ref(), Some(&md5));
        // A reload's fresh settings carry no secret for the user: the lookup's stays,
        // and the connections are not retired for it.
        let generation = pool.generation();
        pool.reconfigure(pc.clone());
        assert_eq!(pool.config().secret.as_ref(), Some(&md5));
        assert_eq!(pool.generation(), generation);
        // A secret the files do give wins.
        let mut listed = pc;
        listed.secret = Some(Secret::Plain("pw".into()));
        pool.reconfigure(listed);
        assert_eq!(pool.config().secret, Some(Secret::Plain("pw".into())));
        assert!(!pool.config().secret_queried);
    }
}
