//! `[users]` entries: per-user overrides such as `app = pool_mode=transaction pool_size=5`.
//!
//! The line uses the same `key=value` syntax as `[databases]` connection strings.

use std::path::Path;

use super::databases::parse_pairs;
use super::error::ConfigError;
use super::types::UserEntry;
use super::value::{parse_int, parse_pool_mode, parse_seconds};

/// Builds the entry for `name = params` (line `line` of `file`).
pub(crate) fn parse_user(
    name: &str,
    params: &str,
    file: &Path,
    line: usize,
) -> Result<UserEntry, ConfigError> {
    let pairs = parse_pairs(params).map_err(|m| {
        ConfigError::at(
            file,
            line,
            format!("syntax error in parameters for user \"{name}\": {m}"),
        )
    })?;
    let mut u = UserEntry {
        name: name.to_string(),
        ..UserEntry::default()
    };
    for (key, v) in pairs {
        let bad = |expected: String| {
            ConfigError::at(
                file,
                line,
                format!("invalid value \"{v}\" for {key} for user \"{name}\": {expected}"),
            )
        };
        let secs = || parse_seconds(&v).map(Some).map_err(bad);
        match key.as_str() {
            "pool_mode" => u.pool_mode = Some(parse_pool_mode(&v).map_err(bad)?),
            "pool_size" => u.pool_size = Some(parse_int(&v).map_err(bad)?),
            "reserve_pool_size" | "reserve_pool" => {
                u.reserve_pool_size = Some(parse_int(&v).map_err(bad)?)
            }
            "max_user_connections" => u.max_user_connections = Some(parse_int(&v).map_err(bad)?),
            "max_user_client_connections" => {
                u.max_user_client_connections = Some(parse_int(&v).map_err(bad)?)
            }
            "query_timeout" => u.query_timeout = secs()?,
            "idle_transaction_timeout" => u.idle_transaction_timeout = secs()?,
            "transaction_timeout" => u.transaction_timeout = secs()?,
            "client_idle_timeout" => u.client_idle_timeout = secs()?,
            // As for a database: -1 leaves the database's or the global value.
            "query_wait_timeout" => {
                u.query_wait_timeout = match v.trim() {
                    "-1" => None,
                    _ => secs()?,
                }
            }
            _ => {
                return Err(ConfigError::at(
                    file,
                    line,
                    format!("unrecognized user parameter \"{key}\" for user \"{name}\""),
                ))
            }
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolMode;
    use std::time::Duration;

    fn user(params: &str) -> Result<UserEntry, String> {
        parse_user("app", params, Path::new("/etc/x.ini"), 4).map_err(|e| e.to_string())
    }

    #[test]
    fn all_keys() {
        let u = user(
            "pool_mode=Statement pool_size = 5 reserve_pool=2 max_user_connections=10 \
             max_user_client_connections=11 query_timeout=1.5 idle_transaction_timeout=2 \
             transaction_timeout=3 client_idle_timeout='4' query_wait_timeout=9",
        )
        .unwrap();
        assert_eq!(u.name, "app");
        assert_eq!(u.pool_mode, Some(PoolMode::Statement));
        assert_eq!(u.pool_size, Some(5));
        assert_eq!(u.reserve_pool_size, Some(2));
        assert_eq!(u.max_user_connections, Some(10));
        assert_eq!(u.max_user_client_connections, Some(11));
        assert_eq!(u.query_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(u.idle_transaction_timeout, Some(Duration::from_secs(2)));
        assert_eq!(u.transaction_timeout, Some(Duration::from_secs(3)));
        assert_eq!(u.client_idle_timeout, Some(Duration::from_secs(4)));
        assert_eq!(u.query_wait_timeout, Some(Duration::from_secs(9)));
        assert_eq!(
            user("query_wait_timeout=-1").unwrap().query_wait_timeout,
            None
        );
        assert_eq!(
            user("reserve_pool_size=7").unwrap().reserve_pool_size,
            Some(7)
        );
    }

    #[test]
    fn empty_entry_overrides_nothing() {
        let u = user("").unwrap();
        assert_eq!(u.pool_mode, None);
        assert_eq!(u.pool_size, None);
        assert_eq!(u.query_timeout, None);
    }

    #[test]
    fn errors() {
        assert_eq!(
            user("pool_size=5 foo=1").unwrap_err(),
            "/etc/x.ini:4: unrecognized user parameter \"foo\" for user \"app\""
        );
        assert_eq!(
            user("pool_size=-1").unwrap_err(),
            "/etc/x.ini:4: invalid value \"-1\" for pool_size for user \"app\": \
             integer out of range"
        );
        assert_eq!(
            user("query_timeout=soon").unwrap_err(),
            "/etc/x.ini:4: invalid value \"soon\" for query_timeout for user \"app\": \
             expected a number of seconds"
        );
        assert_eq!(
            user("pool_mode").unwrap_err(),
            "/etc/x.ini:4: syntax error in parameters for user \"app\": \
             missing \"=\" after \"pool_mode\""
        );
    }
}
