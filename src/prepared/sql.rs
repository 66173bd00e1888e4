//! SQL-level PREPARE / EXECUTE / DEALLOCATE in a simple Query: recognising them and
//! their statement name, so the rewriter can give them Sluice-owned names like
//! protocol-level statements. Only single-statement queries are recognised; anything
//! else passes through untouched.

/// A recognised SQL-level prepared-statement command.
#[derive(Debug, PartialEq, Eq)]
pub enum SqlCommand<'a> {
    /// `PREPARE name rest` (`rest` is `[(types)] AS statement`).
    Prepare { name: String, rest: &'a str },
    /// `EXECUTE name rest` (`rest` is `[(args)]`).
    Execute { name: String, rest: &'a str },
    /// `DEALLOCATE [PREPARE] name`.
    Deallocate { name: String },
}

/// Whether a Query body may hold one of the commands, by its first letter: every
/// simple query passes here, and most are rejected before any UTF-8 check.
pub fn may_match(body: &[u8]) -> bool {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    first.is_some_and(|b| matches!(b.to_ascii_uppercase(), b'P' | b'E' | b'D'))
}

/// Whether a Query body starts with a word the rewriter or the response tracker acts
/// on: PREPARE, EXECUTE and DEALLOCATE (all that [`parse`] recognises, read as it reads
/// them: the letters after leading ASCII whitespace), and DISCARD. Sharper than
/// [`may_match`], so that END, DELETE, EXPLAIN ... go the plain way.
pub fn names_statements(body: &[u8]) -> bool {
    // By the first letter first: every simple query comes here.
    may_match(body) && first_word_names_statements(body)
}

/// The rest of [`names_statements`], for a body starting with P, E or D (out of line:
/// inlined, it made the common case no cheaper).
#[inline(never)]
fn first_word_names_statements(body: &[u8]) -> bool {
    let Some(start) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
        return false;
    };
    let rest = &body[start..];
    let keyword: &[u8] = match rest[0].to_ascii_uppercase() {
        b'P' => b"PREPARE",
        b'E' => b"EXECUTE",
        b'D' => match rest.get(1).map(u8::to_ascii_uppercase) {
            Some(b'E') => b"DEALLOCATE",
            Some(b'I') => b"DISCARD",
            _ => return false,
        },
        _ => return false,
    };
    // The whole first word: the keyword, then no further letter.
    rest.get(..keyword.len())
        .is_some_and(|w| w.eq_ignore_ascii_case(keyword))
        && !rest.get(keyword.len()).is_some_and(u8::is_ascii_alphabetic)
}

/// Recognises `text` (a Query body without its NUL) as one of the commands.
pub fn parse(text: &str) -> Option<SqlCommand<'_>> {
    if !may_match(text.as_bytes()) {
        return None;
    }
    let t = text
        .trim()
        .trim_end_matches(|c: char| c == ';' || c.is_whitespace());
    if t.contains(';') {
        return None;
    }
    let (word, rest) = split_word(t)?;
    match word.to_ascii_uppercase().as_str() {
        "PREPARE" => {
            let (name, rest) = ident(rest)?;
            let rest = rest.trim_start();
            let starts_ok = rest.starts_with('(')
                || rest.get(..2).is_some_and(|w| w.eq_ignore_ascii_case("AS"));
            starts_ok.then_some(SqlCommand::Prepare { name, rest })
        }
        "EXECUTE" => {
            let (name, rest) = ident(rest)?;
            Some(SqlCommand::Execute {
                name,
                rest: rest.trim_start(),
            })
        }
        "DEALLOCATE" => {
            let rest = rest.trim_start();
            let rest = match split_word(rest) {
                Some((w, r)) if w.eq_ignore_ascii_case("PREPARE") => r,
                _ => rest,
            };
            let (name, tail) = ident(rest)?;
            if !tail.trim().is_empty()
                || name.eq_ignore_ascii_case("all") && !rest.trim_start().starts_with('"')
            {
                return None;
            }
            Some(SqlCommand::Deallocate { name })
        }
        _ => None,
    }
}

/// The first word of `s` (letters only) and the rest.
fn split_word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], &s[end..]))
}

/// An SQL identifier at the start of `s`: unquoted (folded to lower case) or quoted.
fn ident(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start();
    if let Some(q) = s.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = q.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if q[i + 1..].starts_with('"') {
                    name.push('"');
                    chars.next();
                } else {
                    return (!name.is_empty()).then(|| (name, &q[i + 1..]));
                }
            } else {
                name.push(c);
            }
        }
        return None;
    }
    let mut end = 0;
    for (i, c) in s.char_indices() {
        let ok = if i == 0 {
            c.is_alphabetic() || c == '_'
        } else {
            c.is_alphanumeric() || c == '_' || c == '$'
        };
        if !ok {
            break;
        }
        end = i + c.len_utf8();
    }
    (end > 0).then(|| (s[..end].to_lowercase(), &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_statements_whenever_parse_recognises_one() {
        let mut recognised = 0;
        for text in [
            "PREPARE Foo (int) AS SELECT $1;",
            "  prepare \"x\" as select 1",
            "\texecute foo(1)",
            "DEALLOCATE PREPARE foo",
            "deallocate all",
            "EXECUTE\nfoo",
            "Prepare(x)",
            "END",
            "DELETE FROM t",
            "EXPLAIN EXECUTE foo",
            "PREPARED x",
            "  ",
        ] {
            if parse(text).is_some() {
                assert!(names_statements(text.as_bytes()), "{text:?}");
                recognised += 1;
            }
        }
        assert_eq!(recognised, 5);
        assert!(!names_statements(b"END"));
        assert!(!names_statements(b"EXPLAIN EXECUTE foo"));
        assert!(names_statements(b" discard all"));
        assert!(names_statements(b"PREPARE"));
        assert!(names_statements(b"execute\0"));
        for no in [
            &b"DEALLOCATEX"[..],
            b"P",
            b"di",
            b"Dx",
            b"",
            b"\n ",
            b"SELECT 1",
        ] {
            assert!(!names_statements(no), "{no:?}");
        }
    }

    #[test]
    fn recognises_the_three_commands() {
        assert_eq!(
            parse("PREPARE Foo (int) AS SELECT $1;"),
            Some(SqlCommand::Prepare {
                name: "foo".into(),
                rest: "(int) AS SELECT $1"
            })
        );
        assert_eq!(
            parse("prepare \"Q\"\"x\" as select 1"),
            Some(SqlCommand::Prepare {
                name: "Q\"x".into(),
                rest: "as select 1"
            })
        );
        assert_eq!(
            parse("  execute foo(1, 'a')  "),
            Some(SqlCommand::Execute {
                name: "foo".into(),
                rest: "(1, 'a')"
            })
        );
        assert_eq!(
            parse("EXECUTE foo"),
            Some(SqlCommand::Execute {
                name: "foo".into(),
                rest: ""
            })
        );
        assert_eq!(
            parse("DEALLOCATE foo"),
            Some(SqlCommand::Deallocate { name: "foo".into() })
        );
        assert_eq!(
            parse("deallocate prepare foo;"),
            Some(SqlCommand::Deallocate { name: "foo".into() })
        );
    }

    #[test]
    fn leaves_everything_else_alone() {
        assert_eq!(parse("DEALLOCATE ALL"), None);
        assert_eq!(parse("PREPARE foo AS SELECT 1; SELECT 2"), None);
        assert_eq!(parse("PREPARE TRANSACTION 'x'"), None);
        assert_eq!(parse("SELECT 1"), None);
        assert_eq!(parse("EXECUTE"), None);
        assert_eq!(parse("PREPARE \"unterminated AS SELECT 1"), None);
    }

    #[test]
    fn first_letter_filter() {
        assert!(may_match(b"  prepare x as select 1"));
        assert!(may_match(b"\n\tEXECUTE x"));
        assert!(may_match(b"deallocate x"));
        assert!(!may_match(b"SELECT 1"));
        assert!(!may_match(b"   "));
        assert!(!may_match(b""));
    }
}
