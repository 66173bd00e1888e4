//! Typed value parsers shared by the `[pgbouncer]`, `[databases]` and `[users]` sections.
//!
//! Each returns `Err(what was expected)`; the caller adds `file:line`, the key and the
//! value, so every message reads `invalid value "x" for key: expected ...`.

use std::time::Duration;

use super::types::PoolMode;

/// `None` for an empty string: PgBouncer treats an empty value as "not set".
pub(super) fn opt_str(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_string())
}

/// A decimal integer that must fit `T` (sign allowed only if `T` is signed).
pub(super) fn parse_int<T: TryFrom<i128>>(v: &str) -> Result<T, String> {
    let n: i128 = v.parse().map_err(|_| "expected an integer".to_string())?;
    T::try_from(n).map_err(|_| "integer out of range".to_string())
}

/// PgBouncer-style boolean: 0/1, yes/no, on/off, true/false, any case.
pub(super) fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Ok(true),
        "0" | "no" | "off" | "false" => Ok(false),
        _ => Err("expected a boolean (0/1, yes/no, on/off, true/false)".to_string()),
    }
}

/// A non-negative number of seconds, possibly fractional (`0.5`), as PgBouncer's
/// time settings take.
pub(super) fn parse_seconds(v: &str) -> Result<Duration, String> {
    let expected = || "expected a number of seconds".to_string();
    let secs: f64 = v.parse().map_err(|_| expected())?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(expected());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| expected())
}

/// `session`, `transaction` or `statement`, any case.
pub(super) fn parse_pool_mode(v: &str) -> Result<PoolMode, String> {
    match v.to_ascii_lowercase().as_str() {
        "session" => Ok(PoolMode::Session),
        "transaction" => Ok(PoolMode::Transaction),
        "statement" => Ok(PoolMode::Statement),
        _ => Err("expected session, transaction or statement".to_string()),
    }
}

/// A file mode, always read as octal (`0777`, `777`, `0o777`): operators write modes
/// in octal even without the leading zero, so decimal would only ever surprise.
pub(super) fn parse_octal_mode(v: &str) -> Result<u32, String> {
    let digits = v.strip_prefix("0o").unwrap_or(v);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 && !digits.starts_with('+') => Ok(m),
        _ => Err("expected an octal file mode such as 0777".to_string()),
    }
}

/// A comma-separated list; items are trimmed and empty items dropped.
pub(super) fn parse_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_int::<u16>("6432"), Ok(6432));
        assert_eq!(parse_int::<i64>("-3"), Ok(-3));
        assert_eq!(
            parse_int::<u32>("abc"),
            Err("expected an integer".to_string())
        );
        assert_eq!(
            parse_int::<u32>("1.5"),
            Err("expected an integer".to_string())
        );
        assert_eq!(parse_int::<u32>(""), Err("expected an integer".to_string()));
        assert_eq!(
            parse_int::<u16>("70000"),
            Err("integer out of range".to_string())
        );
        assert_eq!(
            parse_int::<u32>("-1"),
            Err("integer out of range".to_string())
        );
    }

    #[test]
    fn booleans() {
        for t in ["1", "yes", "YES", "on", "On", "true", "TRUE"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "no", "No", "off", "OFF", "false", "False"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        assert!(parse_bool("2").is_err());
        assert!(parse_bool("").is_err());
        assert!(parse_bool("y").is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_seconds("0"), Ok(Duration::ZERO));
        for bad in ["-1", "abc", "", "inf", "NaN", "1e400", "5s"] {
            assert_eq!(
                parse_seconds(bad),
                Err("expected a number of seconds".to_string()),
                "{bad}"
            );
        }
    }

    #[test]
    fn pool_modes() {
        assert_eq!(parse_pool_mode("session"), Ok(PoolMode::Session));
        assert_eq!(parse_pool_mode("Transaction"), Ok(PoolMode::Transaction));
        assert_eq!(parse_pool_mode("STATEMENT"), Ok(PoolMode::Statement));
        assert!(parse_pool_mode("txn").is_err());
    }

    #[test]
    fn octal_modes() {
        assert_eq!(parse_octal_mode("0777"), Ok(0o777));
        assert_eq!(parse_octal_mode("777"), Ok(0o777));
        assert_eq!(parse_octal_mode("0o600"), Ok(0o600));
        assert_eq!(parse_octal_mode("0"), Ok(0));
        for bad in ["0888", "abc", "", "+777", "77777", "0o"] {
            assert!(parse_octal_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lists_and_optional_strings() {
        assert_eq!(parse_list(" a , b,,c "), vec!["a", "b", "c"]);
        assert!(parse_list("").is_empty());
        assert!(parse_list(" , ").is_empty());
        assert_eq!(opt_str(""), None);
        assert_eq!(opt_str("x"), Some("x".to_string()));
    }
}
