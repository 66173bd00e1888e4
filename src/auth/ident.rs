//! `auth_ident_file`: user-name maps for the `cert` and `peer` rules of
//! `auth_hba_file` (`map=NAME`), in pg_ident.conf's format as PgBouncer reads it:
//! `MAPNAME SYSTEM-USERNAME DATABASE-USERNAME` per line, `#` comments, double quotes
//! for names with spaces. A line lets the system user (the certificate's common
//! name, or the OS user) log in as the database user under that map; with a map
//! nothing else does, not even the same name unless a line says so.
//!
//! Not supported (as in PgBouncer; an error at load, naming file and line):
//! regular expressions (`/...`), `all`, `+group` and `@file` as names, `include`.

use std::path::Path;

use super::hba::{tokens, Field};
use crate::config::ConfigError;

/// The loaded maps.
#[derive(Debug, Clone, Default)]
pub struct IdentMap {
    /// (map, system user, database user), in file order.
    lines: Vec<(String, String, String)>,
}

impl IdentMap {
    /// Reads and parses `file`.
    pub fn load(file: &Path) -> Result<IdentMap, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError::io(file, e))?;
        IdentMap::parse(&text, file)
    }

    /// Parses the maps in `text`, read from `file`.
    pub fn parse(text: &str, file: &Path) -> Result<IdentMap, ConfigError> {
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let at = |m: String| ConfigError::at(file, i + 1, m);
            let fields = tokens(line).map_err(at)?;
            if fields.is_empty() {
                continue;
            }
            lines.push(entry(&fields).map_err(at)?);
        }
        Ok(IdentMap { lines })
    }

    /// Whether map `map` lets `system` log in as `user`.
    pub fn allows(&self, map: &str, system: &str, user: &str) -> bool {
        self.lines
            .iter()
            .any(|(m, s, u)| m == map && s == system && u == user)
    }
}

fn entry(fields: &[Field]) -> Result<(String, String, String), String> {
    let [map, system, user] = fields else {
        if fields.len() < 3 {
            return Err("missing entry at end of line".into());
        }
        return Err("extra fields at end of line".into());
    };
    Ok((name(map, false)?, name(system, true)?, name(user, false)?))
}

/// One name; `system` for the SYSTEM-USERNAME field, where `/` starts a regular
/// expression.
fn name(field: &Field, system: bool) -> Result<String, String> {
    let [(item, quoted)] = field.as_slice() else {
        return Err("a name list is not supported here".into());
    };
    if !quoted {
        if system && item.starts_with('/') {
            return Err(format!(
                "regular expressions (\"{item}\") are not supported"
            ));
        }
        if item == "all" || item.starts_with('+') || item.starts_with('@') || item == "include" {
            return Err(format!("\"{item}\" is not supported here"));
        }
    }
    if item.is_empty() {
        return Err("empty name".into());
    }
    Ok(item.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<IdentMap, String> {
        IdentMap::parse(text, Path::new("/etc/ident.conf")).map_err(|e| e.to_string())
    }

    #[test]
    fn lines_map_system_users_to_database_users() {
        let m = parse(
            "# comment\n\
             certs  alice.example.com  alice\n\
             certs  ops  alice   # many to one\n\
             certs  ops  bob\n\
             local  \"John Smith\"  john\n",
        )
        .unwrap_or_default();
        assert!(m.allows("certs", "alice.example.com", "alice"));
        assert!(m.allows("certs", "ops", "alice"));
        assert!(m.allows("certs", "ops", "bob"));
        assert!(m.allows("local", "John Smith", "john"));
        // Only what a line says: not the same name, not another map's line.
        assert!(!m.allows("certs", "alice", "alice"));
        assert!(!m.allows("local", "ops", "bob"));
        assert!(!m.allows("certs", "bob", "ops"));
    }

    #[test]
    fn unsupported_forms_are_errors_at_their_line() {
        let e = |t: &str| parse(t).err().unwrap_or_default();
        assert_eq!(
            e("m a b\nm /^(.*)$ \\1\n"),
            "/etc/ident.conf:2: regular expressions (\"/^(.*)$\") are not supported"
        );
        assert!(e("m a\n").ends_with(":1: missing entry at end of line"));
        assert!(e("m a b c\n").ends_with(":1: extra fields at end of line"));
        assert!(e("m a all\n").contains("\"all\" is not supported"));
        assert!(e("m a +admins\n").contains("\"+admins\" is not supported"));
        assert!(e("m a b,c\n").contains("a name list is not supported"));
        assert!(e("m \"unterminated b\n").contains("unterminated quoted string"));
        // Quoted, a keyword is just a name.
        assert!(parse("m a \"all\"\n").is_ok_and(|m| m.allows("m", "a", "all")));
    }
}
