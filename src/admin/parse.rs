//! The console's command grammar, as PgBouncer accepts it:
//!
//! * `WORD [WORD] [;]` — a command and an optional argument (`SHOW POOLS`, `PAUSE db`);
//! * `SET key (= | TO) value [;]` — value a word or a `'quoted string'`.
//!
//! A WORD is `[0-9A-Za-z_]+` or a `"double-quoted"` name (`""` inside for a quote).
//! Case is kept; commands are matched case-insensitively by the caller. One deliberate
//! leniency: an unquoted SET value may also hold `.`, `-`, `:` and `/` (`SET
//! query_timeout = 0.5`), which PgBouncer wants quoted.

/// A parsed console command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// `WORD [WORD]`; `arg` is empty when absent.
    Cmd { name: String, arg: String },
    /// `SET key = value`.
    Set { key: String, value: String },
}

/// Why a command did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Not a command at all: "invalid command".
    Syntax,
    /// A part too long: "bad arguments".
    BadArguments,
}

/// PgBouncer's buffer sizes for each part (the limit is one less).
const CMD_MAX: usize = 16;
const ARG_MAX: usize = 64;
const VAL_MAX: usize = 256;

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    /// Skips whitespace; returns how much was skipped.
    fn ws(&mut self) -> usize {
        let n = self
            .rest()
            .bytes()
            .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        self.pos += n;
        n
    }

    /// A WORD: a quoted name (unquoted here) or `[0-9A-Za-z_]+`.
    fn word(&mut self) -> Option<String> {
        if self.rest().starts_with('"') {
            return self.quoted(b'"');
        }
        let n = self
            .rest()
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        if n == 0 {
            return None;
        }
        let w = self.rest()[..n].to_owned();
        self.pos += n;
        Some(w)
    }

    /// A string quoted with `q`, the quote doubled inside; must not be empty for `"`.
    fn quoted(&mut self, q: u8) -> Option<String> {
        let bytes = self.rest().as_bytes();
        if bytes.first() != Some(&q) {
            return None;
        }
        let mut out = Vec::new();
        let mut i = 1;
        loop {
            match bytes.get(i) {
                None => return None,
                Some(&b) if b == q => {
                    if bytes.get(i + 1) == Some(&q) {
                        out.push(q);
                        i += 2;
                    } else {
                        i += 1;
                        break;
                    }
                }
                Some(&b) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        if q == b'"' && out.is_empty() {
            return None;
        }
        self.pos += i;
        String::from_utf8(out).ok()
    }

    /// An unquoted SET value (see the module doc for the extra characters).
    fn bare_value(&mut self) -> Option<String> {
        let n = self
            .rest()
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || b"_.-:/".contains(b))
            .count();
        if n == 0 {
            return None;
        }
        let v = self.rest()[..n].to_owned();
        self.pos += n;
        Some(v)
    }

    /// `WS0 (; WS0)? $`
    fn end(&mut self) -> bool {
        self.ws();
        if self.rest().starts_with(';') {
            self.pos += 1;
            self.ws();
        }
        self.rest().is_empty()
    }
}

/// Parses one console query.
pub fn parse(query: &str) -> Result<Parsed, ParseError> {
    if let Some(set) = parse_set(query) {
        return set;
    }
    let mut c = Cursor { s: query, pos: 0 };
    c.ws();
    let name = c.word().ok_or(ParseError::Syntax)?;
    let mut arg = String::new();
    let save = c.pos;
    if c.ws() > 0 {
        match c.word() {
            Some(a) => arg = a,
            None => c.pos = save,
        }
    }
    if !c.end() {
        return Err(ParseError::Syntax);
    }
    if name.len() >= CMD_MAX || arg.len() >= ARG_MAX {
        return Err(ParseError::BadArguments);
    }
    Ok(Parsed::Cmd { name, arg })
}

/// `SET key (=|TO) value`; None when the query is not shaped like a SET at all.
fn parse_set(query: &str) -> Option<Result<Parsed, ParseError>> {
    let mut c = Cursor { s: query, pos: 0 };
    c.ws();
    let head = c.rest().get(..3)?;
    if !head.eq_ignore_ascii_case("set") {
        return None;
    }
    c.pos += 3;
    if c.ws() == 0 {
        return None;
    }
    let key = c.word()?;
    c.ws();
    if c.rest().starts_with('=') {
        c.pos += 1;
    } else if c
        .rest()
        .get(..2)
        .is_some_and(|t| t.eq_ignore_ascii_case("to"))
    {
        c.pos += 2;
    } else {
        return None;
    }
    c.ws();
    let value = if c.rest().starts_with('\'') {
        c.quoted(b'\'')?
    } else if c.rest().starts_with('"') {
        c.quoted(b'"')?
    } else {
        c.bare_value()?
    };
    if !c.end() {
        return None;
    }
    if key.is_empty() || key.len() >= ARG_MAX || value.len() >= VAL_MAX {
        return Some(Err(ParseError::BadArguments));
    }
    Some(Ok(Parsed::Set { key, value }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(name: &str, arg: &str) -> Result<Parsed, ParseError> {
        Ok(Parsed::Cmd {
            name: name.into(),
            arg: arg.into(),
        })
    }

    fn set(key: &str, value: &str) -> Result<Parsed, ParseError> {
        Ok(Parsed::Set {
            key: key.into(),
            value: value.into(),
        })
    }

    #[test]
    fn commands() {
        assert_eq!(parse("SHOW POOLS"), cmd("SHOW", "POOLS"));
        assert_eq!(
            parse("  show   stats_totals ;  "),
            cmd("show", "stats_totals")
        );
        assert_eq!(parse("PAUSE;"), cmd("PAUSE", ""));
        assert_eq!(parse("\tRELOAD\n"), cmd("RELOAD", ""));
        assert_eq!(parse("PAUSE \"my-db\""), cmd("PAUSE", "my-db"));
        assert_eq!(parse("KILL \"a\"\"b\""), cmd("KILL", "a\"b"));
        assert_eq!(parse("KILL_CLIENT 12"), cmd("KILL_CLIENT", "12"));
    }

    #[test]
    fn rejects() {
        for q in [
            "",
            ";",
            "show pools; show version",
            "SHOW a b",
            "PAUSE my-db",
            "select 1 + 1",
            "PAUSE \"\"",
            "PAUSE \"open",
        ] {
            assert_eq!(parse(q), Err(ParseError::Syntax), "{q:?}");
        }
        assert_eq!(parse("abcdefghijklmnopq"), Err(ParseError::BadArguments));
        assert_eq!(
            parse(&format!("PAUSE {}", "d".repeat(64))),
            Err(ParseError::BadArguments)
        );
    }

    #[test]
    fn sets() {
        assert_eq!(
            parse("SET default_pool_size = 5"),
            set("default_pool_size", "5")
        );
        assert_eq!(
            parse("set pool_mode to transaction;"),
            set("pool_mode", "transaction")
        );
        assert_eq!(
            parse("SET server_reset_query = 'DISCARD ALL; SELECT ''x'''"),
            set("server_reset_query", "DISCARD ALL; SELECT 'x'")
        );
        assert_eq!(parse("SET query_timeout=0.5"), set("query_timeout", "0.5"));
        assert_eq!(parse("SET admin_users = ''"), set("admin_users", ""));
        // Not a SET shape: falls back to the command grammar.
        assert_eq!(parse("SET foo"), cmd("SET", "foo"));
        assert_eq!(parse("SET x = 'open"), Err(ParseError::Syntax));
        assert_eq!(
            parse(&format!("SET x = '{}'", "v".repeat(300))),
            Err(ParseError::BadArguments)
        );
    }
}
