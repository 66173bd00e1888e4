//! Configuration: reads PgBouncer's `pgbouncer.ini` (with `%include`) and
//! `userlist.txt` unchanged into one immutable [`Config`].
//!
//! Loading is all-or-nothing: any error leaves the caller with the previous `Config`
//! (on reload) or stops startup, and names `file:line`. Things PgBouncer accepts but
//! Sluice does not implement load fine and are listed in [`Config::warnings`].

mod databases;
mod error;
/// An empty cache of server host names with the settings' TTLs.
fn dns_cache(s: &Settings) -> std::sync::Arc<crate::net::dns::DnsCache> {
    std::sync::Arc::new(crate::net::dns::DnsCache::new(
        s.dns_max_ttl,
        s.dns_nxdomain_ttl,
    ))
}

#[cfg(test)]
mod hostile_tests;
pub(crate) mod ini;
mod known;
mod peers;
mod settings;
#[cfg(test)]
pub(crate) mod testdir;
mod types;
mod userlist;
mod users;
mod value;

use std::borrow::Cow;
use std::path::Path;

use ini::Ini;

pub use databases::{parse_pairs, DEFAULT_PORT};
pub use error::ConfigError;
pub use known::is_known_setting;
pub use peers::{PeerEntry, MAX_PEER_ID};

/// PgBouncer's default for a setting as SHOW CONFIG prints it, if it is one.
pub fn setting_default(name: &str) -> Option<&'static str> {
    known::KNOWN
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, d, _)| *d)
}
pub use types::*;
pub use userlist::{load_userlist, parse_userlist};

/// The client TLS configuration; a file that cannot be read is named as such, any
/// other problem is put at `file:line`.
fn client_tls(
    s: &Settings,
    file: &Path,
    line: usize,
) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, ConfigError> {
    crate::tls::acceptor(s).map_err(|e| tls_error(e, file, line))
}

/// The server TLS configuration, with errors as [`client_tls`]'s.
fn server_tls(
    s: &Settings,
    file: &Path,
    line: usize,
) -> Result<Option<std::sync::Arc<crate::tls::server::ServerTls>>, ConfigError> {
    let tls = crate::tls::server::connector(s).map_err(|e| tls_error(e, file, line))?;
    Ok(tls.map(std::sync::Arc::new))
}

/// `auth_hba_file`'s rules when `auth_type = hba` (its problems at `file:line`, a
/// missing file at the `auth_type` line); None for other auth types. Also checks
/// that an `ldap` login has LDAP options.
fn hba(
    s: &Settings,
    file: &Path,
    line: usize,
) -> Result<Option<std::sync::Arc<crate::auth::hba::Hba>>, ConfigError> {
    if s.auth_type == AuthType::Ldap && s.auth_ldap_options.is_none() {
        let why = "auth_type ldap needs auth_ldap_options".to_string();
        return Err(ConfigError::at(file, line, why));
    }
    if s.auth_type != AuthType::Hba {
        return Ok(None);
    }
    let Some(hba_file) = &s.auth_hba_file else {
        let why = "auth_type hba needs auth_hba_file".to_string();
        return Err(ConfigError::at(file, line, why));
    };
    let rules = crate::auth::hba::Hba::load(hba_file, s.auth_ident_file.as_deref())?;
    if let (Some(at), None) = (rules.first_bare_ldap_rule(), &s.auth_ldap_options) {
        let why = "an ldap rule without options needs auth_ldap_options".to_string();
        return Err(ConfigError::at(hba_file, at, why));
    }
    Ok(Some(std::sync::Arc::new(rules)))
}

fn tls_error(e: crate::tls::TlsSetupError, file: &Path, line: usize) -> ConfigError {
    match e {
        crate::tls::TlsSetupError::Io { file, source } => ConfigError::io(&file, source),
        crate::tls::TlsSetupError::Invalid(m) => ConfigError::at(file, line, m),
    }
}

/// Where a problem of a TLS configuration as a whole is reported: the line setting
/// `mode_key`, else the ini itself.
fn mode_line<'a>(ini: &'a Ini, mode_key: &str, path: &'a Path) -> (&'a Path, usize) {
    (ini.entries.iter())
        .rfind(|e| e.section == "pgbouncer" && e.key == mode_key)
        .map_or((path, 0), |e| (e.file.as_path(), e.line))
}

/// The database name clients use for the admin console; never a pooled database.
pub const ADMIN_DB: &str = "pgbouncer";

impl Config {
    /// Loads the ini at `path`, its includes, and the `auth_file` it names (a relative
    /// `auth_file` resolves against the process's working directory, like PgBouncer).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::build(ini::parse_file(path)?, path)
    }

    /// Like [`Config::load`], but with the ini text given; `path` is used for error
    /// messages and to resolve `%include`. Handy for tests elsewhere in the crate.
    pub fn from_ini_str(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Self::build(ini::parse_str(text, path)?, path)
    }

    fn build(ini: Ini, path: &Path) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        for s in &ini.sections {
            let note = match s.name.as_str() {
                "pgbouncer" | "databases" | "users" | "peers" => continue,
                other => format!("unknown section [{other}]; ignored"),
            };
            warnings.push(error::warning_at(&s.file, s.line, note));
        }

        let mut settings = Settings::default();
        // SHOW CONFIG reports the file actually loaded, as PgBouncer does.
        settings
            .raw
            .insert("conffile".to_string(), path.display().to_string());
        let mut databases = NameMap::default();
        let mut fallback_database = None;
        let mut users = NameMap::default();
        let mut peers = std::collections::BTreeMap::new();
        for e in &ini.entries {
            match e.section.as_str() {
                "pgbouncer" => settings::apply_setting(
                    &mut settings,
                    &e.key,
                    &e.value,
                    &e.file,
                    e.line,
                    &mut warnings,
                )?,
                "databases" => {
                    let db = databases::parse_database(&e.key, &e.value, &e.file, e.line)?;
                    // A later definition replaces an earlier one, as in PgBouncer.
                    if e.key == "*" {
                        fallback_database = Some(db);
                    } else {
                        databases.insert(e.key.clone(), db);
                    }
                }
                "users" => {
                    let u = users::parse_user(&e.key, &e.value, &e.file, e.line)?;
                    users.insert(e.key.clone(), u);
                }
                "peers" => {
                    let p = peers::parse_peer(&e.key, &e.value, &e.file, e.line)?;
                    peers.insert(p.id, p);
                }
                // Unknown sections were warned about above.
                _ => {}
            }
        }

        let userlist = match &settings.auth_file {
            Some(f) => load_userlist(f)?,
            None => NameMap::default(),
        };
        // A problem that is no one file's is reported at the line setting the mode.
        let (file, line) = mode_line(&ini, "client_tls_sslmode", path);
        let client_tls = client_tls(&settings, file, line)?;
        let (file, line) = mode_line(&ini, "server_tls_sslmode", path);
        let server_tls = server_tls(&settings, file, line)?;
        let (file, line) = mode_line(&ini, "auth_type", path);
        let hba = hba(&settings, file, line)?;
        let dns = dns_cache(&settings);
        Ok(Config {
            path: path.to_path_buf(),
            settings,
            databases,
            fallback_database,
            users,
            peers,
            userlist,
            derived_secrets: Default::default(),
            warnings,
            client_tls,
            server_tls,
            hba,
            dns,
        })
    }

    /// A copy with one `[pgbouncer]` setting changed, as the console's SET does;
    /// changing `auth_file` re-reads the auth file.
    pub fn with_setting(&self, key: &str, value: &str) -> Result<Config, ConfigError> {
        let mut new = self.clone();
        let mut warnings = Vec::new();
        settings::apply_setting(&mut new.settings, key, value, &self.path, 0, &mut warnings)?;
        if key == "auth_file" {
            new.userlist = match &new.settings.auth_file {
                Some(f) => load_userlist(f)?,
                None => NameMap::default(),
            };
        }
        if key.starts_with("client_tls") {
            new.client_tls = client_tls(&new.settings, &self.path, 0)?;
        }
        if key.starts_with("server_tls") {
            new.server_tls = server_tls(&new.settings, &self.path, 0)?;
        }
        if key == "auth_type"
            || key == "auth_hba_file"
            || key == "auth_ident_file"
            || key == "auth_ldap_options"
        {
            new.hba = hba(&new.settings, &self.path, 0)?;
        }
        if key.starts_with("dns_") {
            // New TTLs: a new, empty cache (as a reload makes).
            new.dns = dns_cache(&new.settings);
        }
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(new)
    }

    /// The `[users]` entry for `name`, if any.
    pub fn user_entry(&self, name: &str) -> Option<&UserEntry> {
        self.users.get(name)
    }

    /// The entry a client asking for database `name` gets: the named entry (borrowed),
    /// else a copy of the `*` fallback with `name` set to the requested name (owned;
    /// its `dbname` stays as written, so `None` means "the same name on the server").
    /// `None` if neither exists, and always for the admin console name `pgbouncer`,
    /// which must never be routed to a server.
    pub fn database_entry(&self, name: &str) -> Option<Cow<'_, DatabaseEntry>> {
        if name == ADMIN_DB {
            return None;
        }
        if let Some(db) = self.databases.get(name) {
            return Some(Cow::Borrowed(db));
        }
        self.fallback_database.as_ref().map(|fb| {
            Cow::Owned(DatabaseEntry {
                name: name.to_string(),
                ..fb.clone()
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::config::testdir::TempDir;

    #[test]
    fn loads_a_typical_pgbouncer_ini() {
        let dir = TempDir::new("config", "typical");
        let users = dir.write(
            "userlist.txt",
            "\"app\" \"md5d41d8cd98f00b204e9800998ecf8427e\"\n",
        );
        dir.write(
            "dbs.ini",
            "[databases]\nreporting = host=10.0.0.2 dbname=reports pool_size=2\n",
        );
        let ini = dir.write(
            "pgbouncer.ini",
            &format!(
                "[databases]\nappdb = host=127.0.0.1 port=5432 dbname=app\n\
                 * = host=fallback\n%include dbs.ini\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = 6543\n\
                 auth_type = scram-sha-256\nauth_file = {}\npool_mode = transaction\n\
                 admin_users = admin, ops\nclient_tls_sslmode = disable\n\
                 [users]\napp = pool_mode=session max_user_connections=3\n",
                users.display()
            ),
        );
        let c = Config::load(&ini).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.path, ini);
        assert_eq!(c.settings.listen_addr, vec!["127.0.0.1"]);
        assert_eq!(c.settings.listen_port, 6543);
        assert_eq!(c.settings.auth_type, AuthType::ScramSha256);
        assert_eq!(c.settings.pool_mode, PoolMode::Transaction);
        assert_eq!(c.settings.admin_users, vec!["admin", "ops"]);
        assert_eq!(c.settings.raw["listen_port"], "6543");
        assert_eq!(c.settings.raw["conffile"], ini.display().to_string());
        assert_eq!(c.settings.server_idle_timeout, Duration::from_secs(600));
        assert_eq!(c.databases.len(), 2);
        assert_eq!(c.databases["reporting"].pool_size, Some(2));
        assert_eq!(c.userlist["app"], "md5d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(c.user_entry("app").unwrap().max_user_connections, Some(3));
        assert!(c.user_entry("other").is_none());

        let named = c.database_entry("appdb").unwrap();
        assert!(matches!(named, Cow::Borrowed(_)));
        assert_eq!(named.dbname.as_deref(), Some("app"));
        let fb = c.database_entry("anything").unwrap();
        assert!(matches!(fb, Cow::Owned(_)));
        assert_eq!(fb.name, "anything");
        assert_eq!(fb.host.as_deref(), Some("fallback"));
        assert_eq!(fb.dbname, None);
        assert!(c.database_entry("pgbouncer").is_none());
        assert_eq!(c.fallback_database.as_ref().unwrap().name, "*");
    }

    #[test]
    fn no_fallback_means_unknown_databases_are_none() {
        let c = Config::from_ini_str("[databases]\na = host=x\n", Path::new("x.ini")).unwrap();
        assert!(c.database_entry("a").is_some());
        assert!(c.database_entry("b").is_none());
        assert!(c.userlist.is_empty());
    }

    #[test]
    fn warnings_for_sections_and_unimplemented_settings() {
        let c = Config::from_ini_str(
            "[pgbouncer]\nsbuf_loopcnt = 1\n[peers]\n1 = host=a\n[extra]\nk = v\n",
            Path::new("/etc/x.ini"),
        )
        .unwrap();
        assert_eq!(
            c.warnings,
            vec![
                "/etc/x.ini:5: unknown section [extra]; ignored",
                "/etc/x.ini:2: setting \"sbuf_loopcnt\" is not implemented by Sluice yet; ignored",
            ]
        );
    }

    #[test]
    fn peers_and_peer_id() {
        let c = Config::from_ini_str(
            "[pgbouncer]\npeer_id = 2\n[peers]\n1 = host=/tmp/a port=7000\n3 = host=b\n",
            Path::new("/etc/x.ini"),
        )
        .unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.settings.peer_id, 2);
        let ids: Vec<u16> = c.peers.keys().copied().collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(
            (c.peers[&1].host.as_str(), c.peers[&1].port),
            ("/tmp/a", 7000)
        );
        let err = Config::from_ini_str("[peers]\n1 = port=1\n", Path::new("/etc/x.ini"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "/etc/x.ini:2: peer 1 needs a host");
    }

    #[test]
    fn errors_carry_file_and_line() {
        let err = |t: &str| {
            Config::from_ini_str(t, Path::new("/etc/sluice.ini"))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("[pgbouncer]\n\nlsten_port = 1\n"),
            "/etc/sluice.ini:3: unknown setting \"lsten_port\""
        );
        assert_eq!(
            err("[databases]\npgbouncer = host=x\n"),
            "/etc/sluice.ini:2: database name \"pgbouncer\" is reserved for the admin console"
        );
        assert_eq!(
            err("[databases]\nbar = foo=1\n"),
            "/etc/sluice.ini:2: unrecognized connection parameter \"foo\" in database \"bar\""
        );
        assert_eq!(
            err("[users]\nu = bogus=1\n"),
            "/etc/sluice.ini:2: unrecognized user parameter \"bogus\" for user \"u\""
        );
    }

    #[test]
    fn auth_file_errors() {
        let dir = TempDir::new("config", "auth");
        let missing = dir.0.join("nope.txt");
        let text = format!("[pgbouncer]\nauth_file = {}\n", missing.display());
        let e = Config::from_ini_str(&text, &dir.0.join("p.ini")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}: cannot read: ", missing.display())),
            "{e}"
        );
        let broken = dir.write("users.txt", "\"a\" \"b\"\nbad\n");
        let text = format!("[pgbouncer]\nauth_file = {}\n", broken.display());
        let e = Config::from_ini_str(&text, &dir.0.join("p.ini")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}:2: broken auth file line: expected a double-quoted user name",
                broken.display()
            )
        );
    }

    #[test]
    fn later_definitions_win() {
        let c = Config::from_ini_str(
            "[pgbouncer]\nlisten_port = 1\nlisten_port = 2\n\
             [databases]\nd = port=1\nd = port=2\n* = port=3\n* = port=4\n",
            Path::new("x.ini"),
        )
        .unwrap();
        assert_eq!(c.settings.listen_port, 2);
        assert_eq!(c.databases["d"].port, 2);
        assert_eq!(c.fallback_database.unwrap().port, 4);
    }
}
