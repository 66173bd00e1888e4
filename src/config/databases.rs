//! `[databases]` entries: `name = host=... port=... dbname=...` connection strings.
//!
//! Pairs are read libpq-style: whitespace separates them, spaces around `=` are
//! allowed, and a value may be single-quoted (`connect_query='SELECT 1'`). Inside
//! quotes `''` and `\'` stand for a quote and `\\` for a backslash; any other backslash
//! is kept as written, and unquoted values are taken literally, because PgBouncer does
//! not treat backslashes specially and existing files must mean the same thing here.
//!
//! `host` may be a comma-separated list; it is stored as written and Sluice connects to
//! the first host only (a warning says so).

use std::path::Path;

use super::error::ConfigError;
use super::types::{DatabaseEntry, LoadBalance};
use super::value::{opt_str, parse_int, parse_pool_mode, parse_seconds};

/// The default server port when a database entry names none.
pub const DEFAULT_PORT: u16 = 5432;

/// Splits a libpq-style connection string into `(key, value)` pairs, in order.
/// `Err` describes the syntax problem.
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if key.is_empty() {
            return Err("missing parameter name before \"=\"".to_string());
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next_if_eq(&'=').is_none() {
            return Err(format!("missing \"=\" after \"{key}\""));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("unterminated quoted value for \"{key}\"")),
                    Some('\'') if chars.next_if_eq(&'\'').is_some() => value.push('\''),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('\'' | '\\')) => value.push(c),
                        Some(c) => {
                            value.push('\\');
                            value.push(c);
                        }
                        None => return Err(format!("unterminated quoted value for \"{key}\"")),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
        }
        pairs.push((key, value));
    }
}

/// Builds the entry for `name = connstr` (line `line` of `file`). `*` is accepted
/// here; the caller files it as the fallback.
pub(crate) fn parse_database(
    name: &str,
    connstr: &str,
    file: &Path,
    line: usize,
) -> Result<DatabaseEntry, ConfigError> {
    if name == "pgbouncer" {
        return Err(ConfigError::at(
            file,
            line,
            "database name \"pgbouncer\" is reserved for the admin console",
        ));
    }
    let pairs = parse_pairs(connstr).map_err(|m| {
        ConfigError::at(
            file,
            line,
            format!("syntax error in connection string for database \"{name}\": {m}"),
        )
    })?;
    let mut e = DatabaseEntry {
        name: name.to_string(),
        port: DEFAULT_PORT,
        connstr: connstr.to_string(),
        ..DatabaseEntry::default()
    };
    for (key, v) in pairs {
        let bad = |expected: String| {
            ConfigError::at(
                file,
                line,
                format!("invalid value \"{v}\" for {key} in database \"{name}\": {expected}"),
            )
        };
        match key.as_str() {
            "dbname" => e.dbname = opt_str(&v),
            "host" => {
                if v.contains(',') && v.split(',').any(|h| h.trim().is_empty()) {
                    return Err(bad("a host list with an empty entry".to_string()));
                }
                e.host = opt_str(&v);
            }
            "port" => e.port = parse_int(&v).map_err(bad)?,
            "user" => e.user = opt_str(&v),
            "password" => e.password = opt_str(&v),
            "pool_size" => e.pool_size = Some(parse_int(&v).map_err(bad)?),
            "min_pool_size" => e.min_pool_size = Some(parse_int(&v).map_err(bad)?),
            "reserve_pool_size" | "reserve_pool" => {
                e.reserve_pool_size = Some(parse_int(&v).map_err(bad)?)
            }
            "connect_query" => e.connect_query = opt_str(&v),
            "pool_mode" => e.pool_mode = Some(parse_pool_mode(&v).map_err(bad)?),
            "max_db_connections" => e.max_db_connections = Some(parse_int(&v).map_err(bad)?),
            "max_db_client_connections" => {
                e.max_db_client_connections = Some(parse_int(&v).map_err(bad)?)
            }
            "server_lifetime" => e.server_lifetime = Some(parse_seconds(&v).map_err(bad)?),
            "client_encoding" => e.client_encoding = opt_str(&v),
            "datestyle" => e.datestyle = opt_str(&v),
            "timezone" => e.timezone = opt_str(&v),
            "application_name" => e.application_name = opt_str(&v),
            "auth_user" => e.auth_user = opt_str(&v),
            "auth_query" => e.auth_query = opt_str(&v),
            "auth_dbname" => e.auth_dbname = opt_str(&v),
            "load_balance_hosts" => {
                e.load_balance_hosts = match v.to_ascii_lowercase().as_str() {
                    "round-robin" => LoadBalance::RoundRobin,
                    "disable" => LoadBalance::Disable,
                    _ => return Err(bad("expected disable or round-robin".to_string())),
                };
            }
            // PgBouncer's next release: -1 (its default) leaves the global value.
            "query_wait_timeout" => {
                e.query_wait_timeout = match v.trim() {
                    "-1" => None,
                    _ => Some(parse_seconds(&v).map_err(bad)?),
                };
            }
            _ => {
                return Err(ConfigError::at(
                    file,
                    line,
                    format!("unrecognized connection parameter \"{key}\" in database \"{name}\""),
                ))
            }
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolMode;
    use std::time::Duration;

    fn pairs(s: &str) -> Vec<(String, String)> {
        parse_pairs(s).unwrap()
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    fn db(connstr: &str) -> Result<DatabaseEntry, String> {
        parse_database("app", connstr, Path::new("/etc/x.ini"), 7).map_err(|e| e.to_string())
    }

    #[test]
    fn pairs_plain_spaced_and_quoted() {
        assert_eq!(pairs(""), vec![]);
        assert_eq!(pairs("  "), vec![]);
        assert_eq!(
            pairs("host=h port = 5433\tdbname= d user =u"),
            vec![
                p("host", "h"),
                p("port", "5433"),
                p("dbname", "d"),
                p("user", "u")
            ]
        );
        assert_eq!(
            pairs("connect_query='SELECT 1; SET x = ''y'''  password='it\\'s'"),
            vec![
                p("connect_query", "SELECT 1; SET x = 'y'"),
                p("password", "it's")
            ]
        );
        assert_eq!(
            pairs("a='x\\\\y' b='c:\\dir'"),
            vec![p("a", "x\\y"), p("b", "c:\\dir")]
        );
        // Unquoted backslashes and quotes inside a value are literal, as in PgBouncer.
        assert_eq!(pairs("password=ab\\cd'e"), vec![p("password", "ab\\cd'e")]);
        assert_eq!(pairs("a= b=c"), vec![p("a", "b=c")]);
        assert_eq!(pairs("a=''"), vec![p("a", "")]);
        assert_eq!(pairs("a="), vec![p("a", "")]);
    }

    #[test]
    fn pair_syntax_errors() {
        assert_eq!(
            parse_pairs("host"),
            Err("missing \"=\" after \"host\"".to_string())
        );
        assert_eq!(
            parse_pairs("host h"),
            Err("missing \"=\" after \"host\"".to_string())
        );
        assert_eq!(
            parse_pairs("=x"),
            Err("missing parameter name before \"=\"".to_string())
        );
        assert_eq!(
            parse_pairs("a='open"),
            Err("unterminated quoted value for \"a\"".to_string())
        );
        assert_eq!(
            parse_pairs("a='x\\"),
            Err("unterminated quoted value for \"a\"".to_string())
        );
    }

    #[test]
    fn full_entry() {
        let cs = "host=db1 port=5433 dbname=real user=u password='p w' pool_size=5 \
                  min_pool_size=1 reserve_pool=2 connect_query='SELECT 1' pool_mode=transaction \
                  max_db_connections=9 max_db_client_connections=10 server_lifetime=1.5 \
                  client_encoding=UTF8 datestyle=ISO timezone=UTC application_name=app \
                  auth_user=a auth_query='SELECT 2' auth_dbname=adb load_balance_hosts=round-robin";
        let e = db(cs).unwrap();
        assert_eq!(e.name, "app");
        assert_eq!(e.host.as_deref(), Some("db1"));
        assert_eq!(e.port, 5433);
        assert_eq!(e.dbname.as_deref(), Some("real"));
        assert_eq!(e.user.as_deref(), Some("u"));
        assert_eq!(e.password.as_deref(), Some("p w"));
        assert_eq!(e.pool_size, Some(5));
        assert_eq!(e.min_pool_size, Some(1));
        assert_eq!(e.reserve_pool_size, Some(2));
        assert_eq!(e.connect_query.as_deref(), Some("SELECT 1"));
        assert_eq!(e.pool_mode, Some(PoolMode::Transaction));
        assert_eq!(e.max_db_connections, Some(9));
        assert_eq!(e.max_db_client_connections, Some(10));
        assert_eq!(e.server_lifetime, Some(Duration::from_millis(1500)));
        assert_eq!(e.client_encoding.as_deref(), Some("UTF8"));
        assert_eq!(e.datestyle.as_deref(), Some("ISO"));
        assert_eq!(e.timezone.as_deref(), Some("UTC"));
        assert_eq!(e.application_name.as_deref(), Some("app"));
        assert_eq!(e.auth_user.as_deref(), Some("a"));
        assert_eq!(e.auth_query.as_deref(), Some("SELECT 2"));
        assert_eq!(e.auth_dbname.as_deref(), Some("adb"));
        assert_eq!(e.connstr, cs);
    }

    #[test]
    fn defaults_for_an_empty_entry() {
        let e = db("").unwrap();
        assert_eq!(e.port, 5432);
        assert_eq!(
            (e.host, e.dbname, e.user, e.pool_size),
            (None, None, None, None)
        );
        assert_eq!(db("host='' dbname=''").unwrap().host, None);
        // As in libpq and PgBouncer, spaces after "=" are skipped, so the next pair
        // becomes the value.
        assert_eq!(
            db("host= dbname=x").unwrap().host.as_deref(),
            Some("dbname=x")
        );
    }

    #[test]
    fn host_lists_load_balance_and_query_wait_timeout() {
        let e = db("host=a,/tmp/pg,b").unwrap();
        assert_eq!(e.host.as_deref(), Some("a,/tmp/pg,b"));
        assert_eq!(e.load_balance_hosts, LoadBalance::RoundRobin);
        assert_eq!(e.query_wait_timeout, None);
        assert!(db("host=a,,b").is_err_and(|e| e.contains("a host list with an empty entry")));
        let e = db("load_balance_hosts=Disable query_wait_timeout=3").unwrap();
        assert_eq!(e.load_balance_hosts, LoadBalance::Disable);
        assert_eq!(e.query_wait_timeout, Some(Duration::from_secs(3)));
        // -1, PgBouncer's default there: the global value.
        assert_eq!(
            db("query_wait_timeout=-1").unwrap().query_wait_timeout,
            None
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            db("host=h foo=1").unwrap_err(),
            "/etc/x.ini:7: unrecognized connection parameter \"foo\" in database \"app\""
        );
        assert_eq!(
            db("port=abc").unwrap_err(),
            "/etc/x.ini:7: invalid value \"abc\" for port in database \"app\": expected an integer"
        );
        assert_eq!(
            db("pool_mode=txn").unwrap_err(),
            "/etc/x.ini:7: invalid value \"txn\" for pool_mode in database \"app\": \
             expected session, transaction or statement"
        );
        assert!(db("server_lifetime=x").is_err());
        assert!(db("load_balance_hosts=random").is_err());
        assert!(db("query_wait_timeout=-2").is_err());
        assert_eq!(
            db("host='x").unwrap_err(),
            "/etc/x.ini:7: syntax error in connection string for database \"app\": \
             unterminated quoted value for \"host\""
        );
        let err = parse_database("pgbouncer", "", Path::new("a.ini"), 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a.ini:2: database name \"pgbouncer\" is reserved for the admin console"
        );
    }
}
