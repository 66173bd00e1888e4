//! The `options` startup parameter (libpq's `options`, `PGOPTIONS`), as PgBouncer
//! 1.20 on reads it: `-c name=value`, `-cname=value` or `--name=value` settings,
//! separated by spaces, a backslash escaping the next character (a space in a
//! value). A setting of a tracked parameter is taken as if sent on its own; any
//! other is refused unless `ignore_startup_parameters` names it (or `options`).

/// PgBouncer's words for an `options` value it cannot read.
pub const MALFORMED: &str =
    "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed";

/// The settings in `options`, as (name, value); Err with the client's error text.
pub fn parse(options: &str) -> Result<Vec<(String, String)>, String> {
    let words = split(options);
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        let setting = if let Some(rest) = word.strip_prefix("--") {
            // As PostgreSQL reads a long switch: dashes in the name are underscores.
            let (name, value) = rest.split_once('=').ok_or(MALFORMED)?;
            Some((name.replace('-', "_"), value.to_owned()))
        } else if word == "-c" {
            i += 1;
            let next = words.get(i).ok_or(MALFORMED)?;
            next.split_once('=')
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
        } else if let Some(rest) = word.strip_prefix("-c") {
            rest.split_once('=')
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
        } else {
            None
        };
        match setting {
            Some((name, value)) if !name.is_empty() => out.push((name, value)),
            _ => return Err(MALFORMED.into()),
        }
        i += 1;
    }
    Ok(out)
}

/// Splits at unescaped whitespace; a backslash keeps the next character as it is.
fn split(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = s.chars();
    let mut in_word = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
                in_word = true;
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_three_forms_and_escapes() {
        let want = vec![
            ("timezone".to_string(), "Portugal".to_string()),
            ("datestyle".to_string(), "German, YMD".to_string()),
        ];
        assert_eq!(
            pairs("-c timezone=Portugal  -c    datestyle=German,\\ YMD"),
            want
        );
        assert_eq!(pairs("-ctimezone=Portugal -cdatestyle=German,\\ YMD"), want);
        assert_eq!(
            pairs("--timezone=Portugal  --datestyle=German,\\ YMD"),
            want
        );
        // An escaped `=` is still the first `=` (as in PgBouncer).
        assert_eq!(
            pairs("-c t\\imezone=\\P\\o\\r\\t\\ugal -c dat\\estyle\\=\\Ge\\rman,\\ YMD"),
            want
        );
        assert_eq!(
            pairs("--search-path=app"),
            vec![("search_path".to_string(), "app".to_string())]
        );
        assert!(pairs("  ").is_empty());
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in ["-d", "-c timezone", "-c", "--x", "-c =1", "timezone=UTC"] {
            assert_eq!(parse(bad).expect_err(bad), MALFORMED, "{bad}");
        }
    }
}
