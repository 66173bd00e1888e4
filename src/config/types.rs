//! The typed configuration: one immutable value per load of `pgbouncer.ini`.
//!
//! Defaults follow PgBouncer 1.25. Durations of zero mean "disabled", as in PgBouncer.
//! A reload builds a whole new [`Config`]; nothing here is mutated after loading.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long a client keeps its server connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// For the whole client session.
    Session,
    /// Until the transaction ends (ReadyForQuery idle).
    Transaction,
    /// Until the statement ends.
    Statement,
}

impl PoolMode {
    /// The name PgBouncer uses in its config and console.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// How far TLS is asked for or required (`client_tls_sslmode`, `server_tls_sslmode`),
/// in libpq's order: each mode asks for at least what the one before it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub const NAMES: [&'static str; 6] = [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ];

    /// Parses a mode, any case.
    pub fn parse(v: &str) -> Option<SslMode> {
        let i = Self::NAMES.iter().position(|m| m.eq_ignore_ascii_case(v))?;
        Some(
            [
                SslMode::Disable,
                SslMode::Allow,
                SslMode::Prefer,
                SslMode::Require,
                SslMode::VerifyCa,
                SslMode::VerifyFull,
            ][i],
        )
    }
}

/// How clients prove who they are (`auth_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    /// No check at all; the user name is ignored in favour of the database's forced user.
    Any,
    /// No password, but the user must be in the auth file.
    Trust,
    /// Cleartext password.
    Plain,
    /// MD5, switching to SCRAM when the stored secret is SCRAM.
    Md5,
    /// SCRAM-SHA-256.
    ScramSha256,
    /// A TLS client certificate whose common name is the user name.
    Cert,
    /// The method named by the first matching rule of `auth_hba_file`.
    Hba,
    /// The OS user of a UNIX-socket client must be the user name; only as an
    /// `auth_hba_file` method (as in PgBouncer), never as `auth_type` itself.
    Peer,
    /// A cleartext password checked by PAM, service `pgbouncer` (`auth::pam`).
    Pam,
    /// A cleartext password checked by binding to an LDAP server (`auth::ldap`).
    Ldap,
}

/// Global settings: the `[pgbouncer]` section.
#[derive(Debug, Clone)]
pub struct Settings {
    pub logfile: Option<PathBuf>,
    /// Log to the syslog daemon too, as `syslog_ident`, at `syslog_facility` (its
    /// code: daemon is 3).
    pub syslog: bool,
    pub syslog_ident: String,
    pub syslog_facility: u8,
    pub pidfile: Option<PathBuf>,
    /// Addresses to listen on; `*` means all. Empty: UNIX socket only.
    pub listen_addr: Vec<String>,
    pub listen_port: u16,
    /// Directory for `.s.PGSQL.<port>`; empty disables the UNIX socket.
    pub unix_socket_dir: String,
    pub unix_socket_mode: u32,
    pub unix_socket_group: Option<String>,
    pub user: Option<String>,
    pub auth_type: AuthType,
    pub auth_file: Option<PathBuf>,
    /// The rules `auth_type = hba` follows.
    pub auth_hba_file: Option<PathBuf>,
    /// The user-name maps `map=` in `auth_hba_file` names (cert and peer rules).
    pub auth_ident_file: Option<PathBuf>,
    /// The LDAP server and how to find a user in it, for `auth_type = ldap` and for
    /// `ldap` rules of `auth_hba_file` that give no options of their own.
    pub auth_ldap_options: Option<std::sync::Arc<crate::auth::LdapOptions>>,
    /// Role that runs `auth_query` for users not in `auth_file`; None: no lookups.
    pub auth_user: Option<String>,
    /// Query returning (name, secret or NULL) for `$1`, the user logging in.
    pub auth_query: String,
    /// `[databases]` entry the lookup runs against; None: the client's database.
    pub auth_dbname: Option<String>,
    pub admin_users: Vec<String>,
    pub stats_users: Vec<String>,
    /// TLS towards clients on TCP (UNIX-socket clients never use it, as in PgBouncer).
    pub client_tls_sslmode: SslMode,
    pub client_tls_key_file: Option<PathBuf>,
    pub client_tls_cert_file: Option<PathBuf>,
    /// Roots that client certificates are checked against.
    pub client_tls_ca_file: Option<PathBuf>,
    /// The TLS versions offered, as PgBouncer writes them (`secure`, `tlsv1.3`, ...).
    pub client_tls_protocols: String,
    /// The TLS 1.2 and 1.3 cipher suites offered (`tls::ciphers`).
    pub client_tls_ciphers: String,
    pub client_tls13_ciphers: String,
    /// The key exchange groups offered (`tls::ciphers::groups`).
    pub client_tls_ecdhcurve: String,
    /// TLS towards servers on TCP (never on a UNIX socket, as in PgBouncer).
    pub server_tls_sslmode: SslMode,
    /// A client certificate and its key, for servers that ask for one.
    pub server_tls_key_file: Option<PathBuf>,
    pub server_tls_cert_file: Option<PathBuf>,
    /// Roots that server certificates are checked against (`verify-ca`, `verify-full`).
    pub server_tls_ca_file: Option<PathBuf>,
    pub server_tls_protocols: String,
    pub server_tls_ciphers: String,
    pub server_tls13_ciphers: String,
    pub pool_mode: PoolMode,
    /// 0 means unlimited (PgBouncer 1.24+).
    pub default_pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub reserve_pool_timeout: Duration,
    pub max_client_conn: u32,
    pub max_db_connections: u32,
    pub max_user_connections: u32,
    pub max_db_client_connections: u32,
    pub max_user_client_connections: u32,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// Query sent to check an idle server before reuse. PgBouncer's default is the
    /// special value `<empty>`, meaning "send an empty query"; Sluice stores that as `""`.
    /// (An explicitly empty value in the ini means "no check": see `server_check_disabled`.)
    pub server_check_query: String,
    /// True when the ini sets `server_check_query` to an empty string, which PgBouncer
    /// treats as "never check servers" (distinct from the default `<empty>`).
    pub server_check_disabled: bool,
    pub server_check_delay: Duration,
    pub server_fast_close: bool,
    pub server_round_robin: bool,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_connect_timeout: Duration,
    pub server_login_retry: Duration,
    pub client_login_timeout: Duration,
    pub query_timeout: Duration,
    pub query_wait_timeout: Duration,
    /// A client queued this long is told so with a notice (PgBouncer 1.25); 0: never.
    pub query_wait_notify: Duration,
    /// How long a server host name's addresses, or its failed lookup, are kept.
    pub dns_max_ttl: Duration,
    pub dns_nxdomain_ttl: Duration,
    pub client_idle_timeout: Duration,
    pub idle_transaction_timeout: Duration,
    pub transaction_timeout: Duration,
    pub cancel_wait_timeout: Duration,
    pub autodb_idle_timeout: Duration,
    /// A pool with no client, no server and no waiter this long is freed (PgBouncer
    /// after 1.25.2); 0: never.
    pub pool_idle_timeout: Duration,
    /// Sent to every client as a NOTICE as it logs in (PgBouncer after 1.25.2).
    pub login_notify_message: Option<std::sync::Arc<str>>,
    pub suspend_timeout: Duration,
    pub ignore_startup_parameters: Vec<String>,
    pub track_extra_parameters: Vec<String>,
    pub max_prepared_statements: u32,
    pub application_name_add_host: bool,
    pub log_connections: bool,
    pub log_disconnections: bool,
    pub log_pooler_errors: bool,
    pub log_stats: bool,
    pub stats_period: Duration,
    pub verbose: u8,
    pub max_packet_size: u32,
    /// Refuse the simple query protocol (`Query` messages): the client is closed.
    pub disable_pqexec: bool,
    pub pkt_buf: usize,
    pub listen_backlog: u32,
    /// SO_REUSEPORT on the TCP listeners: several processes may share a port.
    pub so_reuseport: bool,
    /// TCP_DEFER_ACCEPT on the TCP listeners (Linux): a connection is accepted when
    /// its first bytes arrive. PgBouncer's `tcp_defer_accept`, a number taken as on
    /// or off; off by default (PgBouncer's default is on for Linux).
    pub tcp_defer_accept: bool,
    /// This process's id among its peers (`[peers]`); 0: no peering.
    pub peer_id: u16,
    pub tcp_keepalive: bool,
    /// `TCP_KEEPIDLE`, `TCP_KEEPINTVL` (seconds) and `TCP_KEEPCNT` with keepalive on;
    /// 0: the system's. On client and server TCP sockets (`net::tune`).
    pub tcp_keepidle: u32,
    pub tcp_keepintvl: u32,
    pub tcp_keepcnt: u32,
    /// `TCP_USER_TIMEOUT` in milliseconds; 0: the system's.
    pub tcp_user_timeout: u32,
    /// `SO_SNDBUF` and `SO_RCVBUF` in bytes; 0: the system's.
    pub tcp_socket_buffer: u32,
    pub scram_iterations: u32,
    /// Sluice-specific: `HOST:PORT` for the Prometheus endpoint; None: off.
    pub metrics_listen: Option<String>,
    /// Every key as written in the file (after defaults), for SHOW CONFIG.
    pub raw: BTreeMap<String, String>,
}

/// `load_balance_hosts`: how a database entry's host list is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalance {
    /// Each new server connection goes to the next host of the list.
    #[default]
    RoundRobin,
    /// New connections go to the same host until one fails, then to the next.
    Disable,
}

impl LoadBalance {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadBalance::RoundRobin => "round-robin",
            LoadBalance::Disable => "disable",
        }
    }
}

/// One `[databases]` entry.
#[derive(Debug, Clone, Default)]
pub struct DatabaseEntry {
    /// The name clients connect to (`*` for the fallback entry).
    pub name: String,
    /// Host name, IP, or a socket directory (starts with `/`), or a comma-separated
    /// list of them. None: UNIX socket in `unix_socket_dir`.
    pub host: Option<String>,
    /// How a host list is used.
    pub load_balance_hosts: LoadBalance,
    pub port: u16,
    /// The server-side database; None: same as the client's.
    pub dbname: Option<String>,
    /// Forced server user.
    pub user: Option<String>,
    pub password: Option<String>,
    pub pool_size: Option<u32>,
    pub min_pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub pool_mode: Option<PoolMode>,
    pub connect_query: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub application_name: Option<String>,
    pub max_db_connections: Option<u32>,
    pub max_db_client_connections: Option<u32>,
    pub server_lifetime: Option<Duration>,
    /// This database's `query_wait_timeout`; None: the global one.
    pub query_wait_timeout: Option<Duration>,
    pub auth_user: Option<String>,
    pub auth_query: Option<String>,
    pub auth_dbname: Option<String>,
    /// The connection string as written, for SHOW DATABASES and change detection on reload.
    pub connstr: String,
}

/// One `[users]` entry.
#[derive(Debug, Clone, Default)]
pub struct UserEntry {
    pub name: String,
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub max_user_connections: Option<u32>,
    pub max_user_client_connections: Option<u32>,
    pub query_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
    /// This user's `query_wait_timeout` (PgBouncer's next release); before the
    /// database's and the global one.
    pub query_wait_timeout: Option<Duration>,
}

/// A table of the configuration's names (databases, users, the auth file's entries).
/// Its entries come from the operator's files, and clients only look names up, so the
/// fast unkeyed hash is safe here (a login makes three lookups; SipHash cost ~190
/// instructions each).
pub type NameMap<V> = rustc_hash::FxHashMap<String, V>;

/// The whole configuration as loaded from the ini, its includes and the auth file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The main ini file, as given on the command line.
    pub path: PathBuf,
    pub settings: Settings,
    /// Named `[databases]` entries (not `*`).
    pub databases: NameMap<DatabaseEntry>,
    /// The `*` fallback entry, if any.
    pub fallback_database: Option<DatabaseEntry>,
    pub users: NameMap<UserEntry>,
    /// `[peers]`, by peer id.
    pub peers: std::collections::BTreeMap<u16, super::PeerEntry>,
    /// `auth_file` contents: user name to secret (plaintext, `md5...` or `SCRAM-SHA-256$...`).
    pub userlist: NameMap<String>,
    /// SCRAM secrets derived from `userlist`'s plaintext passwords; a copy of the
    /// configuration starts with an empty one (auth/derived.rs).
    pub derived_secrets: crate::auth::DerivedSecrets,
    /// Accepted-but-unimplemented settings and similar: logged as warnings at load.
    pub warnings: Vec<String>,
    /// The TLS acceptor's configuration, built from `client_tls_*` and the files they
    /// name at each load; None when `client_tls_sslmode` is `disable`.
    pub client_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// The TLS connector for server connections, from `server_tls_*`; None when
    /// `server_tls_sslmode` is `disable`.
    pub server_tls: Option<std::sync::Arc<crate::tls::server::ServerTls>>,
    /// Lookups of the server host names (net/dns.rs); a copy shares them.
    pub dns: std::sync::Arc<crate::net::dns::DnsCache>,
    /// `auth_hba_file`'s rules, read at each load when `auth_type = hba`.
    pub hba: Option<std::sync::Arc<crate::auth::hba::Hba>>,
}
