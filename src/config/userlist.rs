//! `auth_file` (`userlist.txt`): one `"user" "secret"` pair per line.
//!
//! Format, as PgBouncer reads it: each field is double-quoted with `""` standing for a
//! quote inside it; anything after the second field is ignored (PgBouncer's own tools
//! append extra fields); lines starting with `;` are comments; blank lines are skipped.
//! Secrets are kept verbatim: plaintext, `md5<32 hex>` or `SCRAM-SHA-256$...`.
//!
//! Difference from PgBouncer: on a malformed line PgBouncer logs "broken auth file" and
//! silently ignores the rest of the file, which locks out every user listed after it.
//! Sluice refuses the whole file instead, naming the line, so the mistake is found at
//! startup (or on reload, where the previous configuration is kept).

use std::path::Path;

use super::error::ConfigError;
use super::NameMap;

/// Reads and parses the auth file at `path` (relative paths resolve against the
/// process's working directory, as in PgBouncer).
pub fn load_userlist(path: &Path) -> Result<NameMap<String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, e))?;
    parse_userlist(&text, path)
}

/// Parses auth file contents; `file` is only used in error messages. A user listed
/// twice keeps the later secret.
pub fn parse_userlist(text: &str, file: &Path) -> Result<NameMap<String>, ConfigError> {
    let mut users = NameMap::default();
    for (idx, raw) in text.lines().enumerate() {
        let t = raw.trim_start();
        if t.trim_end().is_empty() || t.starts_with(';') {
            continue;
        }
        let broken =
            |why: &str| ConfigError::at(file, idx + 1, format!("broken auth file line: {why}"));
        let (user, rest) = quoted(t)
            .ok_or_else(|| broken("expected a double-quoted user name"))?
            .map_err(|()| broken("unterminated quoted user name"))?;
        let (secret, _ignored) = quoted(rest.trim_start())
            .ok_or_else(|| broken("expected a double-quoted secret after the user name"))?
            .map_err(|()| broken("unterminated quoted secret"))?;
        users.insert(user, secret);
    }
    Ok(users)
}

/// Reads one `"..."` field at the start of `s`: `None` if `s` does not start with a
/// quote, `Some(Err)` if the closing quote is missing, else the field and what follows.
fn quoted(s: &str) -> Option<Result<(String, &str), ()>> {
    let body = s.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            out.push(c);
        } else if body[i + 1..].starts_with('"') {
            out.push('"');
            chars.next();
        } else {
            return Some(Ok((out, &body[i + 1..])));
        }
    }
    Some(Err(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NameMap<String>, String> {
        parse_userlist(text, Path::new("userlist.txt")).map_err(|e| e.to_string())
    }

    #[test]
    fn pairs_comments_blanks_and_extra_fields() {
        let u = parse(
            "; comment\n\n  \"alice\" \"secret\"\n\"bob\"\t\"md5abcdef0123456789abcdef0123456789\" \
             extra \"fields\"\r\n\"carol\" \"SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2Vy\"\n\
             \"empty\" \"\"\n   \n",
        )
        .unwrap();
        assert_eq!(u.len(), 4);
        assert_eq!(u["alice"], "secret");
        assert_eq!(u["bob"], "md5abcdef0123456789abcdef0123456789");
        assert_eq!(u["carol"], "SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2Vy");
        assert_eq!(u["empty"], "");
    }

    #[test]
    fn doubled_quotes_escape_a_quote() {
        let u = parse("\"we\"\"ird\" \"pa\"\"ss word\"\"\"\n").unwrap();
        assert_eq!(u["we\"ird"], "pa\"ss word\"");
        // `"a""b"` is one field, a"b, so the secret is missing.
        assert!(parse("\"a\"\"b\"\n")
            .unwrap_err()
            .ends_with("after the user name"));
    }

    #[test]
    fn later_duplicate_wins() {
        let u = parse("\"a\" \"1\"\n\"a\" \"2\"\n").unwrap();
        assert_eq!(u["a"], "2");
    }

    #[test]
    fn broken_lines_are_errors_with_line_numbers() {
        assert_eq!(
            parse("\"a\" \"1\"\n\n# hash is not a comment\n").unwrap_err(),
            "userlist.txt:3: broken auth file line: expected a double-quoted user name"
        );
        assert_eq!(
            parse("alice secret\n").unwrap_err(),
            "userlist.txt:1: broken auth file line: expected a double-quoted user name"
        );
        assert_eq!(
            parse("\"a\" \"1\"\n\"alice\n").unwrap_err(),
            "userlist.txt:2: broken auth file line: unterminated quoted user name"
        );
        assert_eq!(
            parse("\"alice\"\n").unwrap_err(),
            "userlist.txt:1: broken auth file line: \
             expected a double-quoted secret after the user name"
        );
        assert_eq!(
            parse("\"alice\" secret\n").unwrap_err(),
            "userlist.txt:1: broken auth file line: \
             expected a double-quoted secret after the user name"
        );
        assert_eq!(
            parse("\n\n\n\"alice\" \"sec\n").unwrap_err(),
            "userlist.txt:4: broken auth file line: unterminated quoted secret"
        );
    }

    #[test]
    fn load_reads_file_or_reports_io_error() {
        let dir = std::env::temp_dir().join(format!("sluice-userlist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("userlist.txt");
        std::fs::write(&path, "\"u\" \"p\"\n").unwrap();
        let u = load_userlist(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(u["u"], "p");
        let err = load_userlist(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}: cannot read: ", path.display())),
            "{err}"
        );
    }
}
