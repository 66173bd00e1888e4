//! The raw `pgbouncer.ini` reader: sections, `key = value` lines, comments and
//! `%include`, with the file and line of everything kept for error messages.
//!
//! The grammar follows PgBouncer's (libusual's) parser: a line is blank, a comment
//! (`;` or `#` first), a `[section]`, `%include path`, or `key = value` with the value
//! being the rest of the line, trimmed (no inline comments, no unquoting). A key may be
//! double-quoted (`"my db" = ...`, `""` for a quote) for database names with odd
//! characters. Names are case-sensitive. Meaning is given to sections elsewhere.

use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// How deep `%include` may nest (the main file is depth 0). Also stops include cycles.
pub const MAX_INCLUDE_DEPTH: usize = 10;

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniEntry {
    /// The section it appeared under (set by the last header, possibly in another file).
    pub section: String,
    /// The key, unquoted.
    pub key: String,
    /// The value, trimmed, verbatim otherwise.
    pub value: String,
    /// The file holding the line (an included file's path as resolved).
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
}

/// One `[section]` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniSection {
    /// The name between the brackets, trimmed.
    pub name: String,
    /// The file holding the header.
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
}

/// A parsed ini file with its includes flattened, in file order.
#[derive(Debug, Clone, Default)]
pub struct Ini {
    /// Every section header seen.
    pub sections: Vec<IniSection>,
    /// Every `key = value` line.
    pub entries: Vec<IniEntry>,
}

/// Reads and parses `path` and everything it includes.
pub fn parse_file(path: &Path) -> Result<Ini, ConfigError> {
    let text = read(path)?;
    parse_str(&text, path)
}

/// Parses `text` as if read from `file`; `%include`s are read from disk, relative to
/// `file`'s directory.
pub fn parse_str(text: &str, file: &Path) -> Result<Ini, ConfigError> {
    let mut parser = Parser::default();
    parser.parse(text, file, 0)?;
    Ok(parser.ini)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, e))
}

/// State that carries across included files: PgBouncer keeps the current section
/// when entering and leaving an include.
#[derive(Default)]
struct Parser {
    ini: Ini,
    section: Option<String>,
}

impl Parser {
    fn parse(&mut self, text: &str, file: &Path, depth: usize) -> Result<(), ConfigError> {
        // A UTF-8 byte order mark would otherwise be read as part of the first key.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let t = raw.trim();
            if t.is_empty() || t.starts_with(';') || t.starts_with('#') {
                continue;
            }
            if let Some(rest) = t.strip_prefix("%include") {
                if rest.is_empty() || rest.starts_with(char::is_whitespace) {
                    self.include(rest.trim(), file, line, depth)?;
                    continue;
                }
            }
            if let Some(rest) = t.strip_prefix('[') {
                self.section_header(rest, file, line)?;
                continue;
            }
            let (key, value) = split_key_value(t).map_err(|m| ConfigError::at(file, line, m))?;
            let Some(section) = &self.section else {
                return Err(ConfigError::at(
                    file,
                    line,
                    format!("\"{key}\" appears before any [section]"),
                ));
            };
            self.ini.entries.push(IniEntry {
                section: section.clone(),
                key,
                value,
                file: file.to_path_buf(),
                line,
            });
        }
        Ok(())
    }

    fn section_header(&mut self, rest: &str, file: &Path, line: usize) -> Result<(), ConfigError> {
        let Some((name, after)) = rest.split_once(']') else {
            return Err(ConfigError::at(
                file,
                line,
                "missing \"]\" in section header",
            ));
        };
        let after = after.trim_start();
        // Like PgBouncer, a comment may follow the header; anything else is a mistake.
        if !(after.is_empty() || after.starts_with(';') || after.starts_with('#')) {
            return Err(ConfigError::at(
                file,
                line,
                format!("unexpected text after section header: \"{after}\""),
            ));
        }
        let name = name.trim().to_string();
        self.section = Some(name.clone());
        self.ini.sections.push(IniSection {
            name,
            file: file.to_path_buf(),
            line,
        });
        Ok(())
    }

    fn include(
        &mut self,
        target: &str,
        file: &Path,
        line: usize,
        depth: usize,
    ) -> Result<(), ConfigError> {
        if target.is_empty() {
            return Err(ConfigError::at(file, line, "%include needs a file name"));
        }
        if depth >= MAX_INCLUDE_DEPTH {
            return Err(ConfigError::at(
                file,
                line,
                format!("%include nested too deeply (more than {MAX_INCLUDE_DEPTH} levels)"),
            ));
        }
        let target = Path::new(target);
        // Relative to the including file, so a config directory can be moved as a whole.
        let path = match file.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target.to_path_buf(),
        };
        // Named at the %include line: the operator must learn which line asked for the
        // file, not only that some file is missing.
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::at(
                file,
                line,
                format!("%include {}: cannot read: {e}", path.display()),
            )
        })?;
        self.parse(&text, &path, depth + 1)
    }
}

/// Splits `key = value`; the key may be double-quoted with `""` for a quote.
fn split_key_value(t: &str) -> Result<(String, String), String> {
    let syntax = || {
        format!(
            "syntax error: expected \"key = value\", a [section], a comment or %include, \
             found \"{t}\""
        )
    };
    let (key, rest) = if let Some(quoted) = t.strip_prefix('"') {
        let mut key = String::new();
        let mut chars = quoted.char_indices();
        let rest = loop {
            match chars.next() {
                None => return Err("unterminated quoted name".to_string()),
                Some((i, '"')) => {
                    if quoted[i + 1..].starts_with('"') {
                        key.push('"');
                        chars.next();
                    } else {
                        break &quoted[i + 1..];
                    }
                }
                Some((_, c)) => key.push(c),
            }
        };
        (key, rest)
    } else {
        let end = t
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(t.len());
        (t[..end].to_string(), &t[end..])
    };
    let Some(value) = rest.trim_start().strip_prefix('=') else {
        return Err(syntax());
    };
    if key.is_empty() {
        return Err(syntax());
    }
    Ok((key, value.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::testdir::TempDir;

    fn parse(text: &str) -> Result<Ini, String> {
        parse_str(text, Path::new("/etc/x.ini")).map_err(|e| e.to_string())
    }

    fn kv(ini: &Ini) -> Vec<(String, String, String, usize)> {
        ini.entries
            .iter()
            .map(|e| (e.section.clone(), e.key.clone(), e.value.clone(), e.line))
            .collect()
    }

    #[test]
    fn sections_keys_comments_blank_lines() {
        let ini = parse(
            "; comment\n# other comment\n\n[pgbouncer]\n  listen_port   =  6432  \n\
             Key=Value with = and ; kept\r\n[databases] ; trailing comment\n\
             \"my \"\"db\"\"\" = host=x\nempty =\n* = \n",
        )
        .unwrap();
        let s = |a: &str, b: &str, c: &str, l| (a.to_string(), b.to_string(), c.to_string(), l);
        assert_eq!(
            kv(&ini),
            vec![
                s("pgbouncer", "listen_port", "6432", 5),
                s("pgbouncer", "Key", "Value with = and ; kept", 6),
                s("databases", "my \"db\"", "host=x", 8),
                s("databases", "empty", "", 9),
                s("databases", "*", "", 10),
            ]
        );
        let names: Vec<_> = ini
            .sections
            .iter()
            .map(|s| (s.name.as_str(), s.line))
            .collect();
        assert_eq!(names, vec![("pgbouncer", 4), ("databases", 7)]);
        assert_eq!(ini.entries[0].file, PathBuf::from("/etc/x.ini"));
    }

    #[test]
    fn bom_is_ignored_and_sections_are_case_sensitive() {
        let ini = parse("\u{feff}[PgBouncer]\na = 1\n").unwrap();
        assert_eq!(ini.sections[0].name, "PgBouncer");
        assert_eq!(ini.entries[0].key, "a");
    }

    #[test]
    fn syntax_errors_have_file_and_line() {
        assert_eq!(
            parse("[pgbouncer]\nlisten_port 6432\n").unwrap_err(),
            "/etc/x.ini:2: syntax error: expected \"key = value\", a [section], a comment \
             or %include, found \"listen_port 6432\""
        );
        assert_eq!(
            parse("listen_port = 1\n").unwrap_err(),
            "/etc/x.ini:1: \"listen_port\" appears before any [section]"
        );
        assert_eq!(
            parse("\n[pgbouncer\n").unwrap_err(),
            "/etc/x.ini:2: missing \"]\" in section header"
        );
        assert_eq!(
            parse("[a] b\n").unwrap_err(),
            "/etc/x.ini:1: unexpected text after section header: \"b\""
        );
        assert_eq!(
            parse("[a]\n\"open = 1\n").unwrap_err(),
            "/etc/x.ini:2: unterminated quoted name"
        );
        assert!(parse("[a]\n= 1\n")
            .unwrap_err()
            .starts_with("/etc/x.ini:2: syntax error"));
        assert!(parse("[a]\n%includes x\n")
            .unwrap_err()
            .starts_with("/etc/x.ini:2: syntax"));
        assert_eq!(
            parse("[a]\n%include\n").unwrap_err(),
            "/etc/x.ini:2: %include needs a file name"
        );
    }

    #[test]
    fn include_is_relative_to_including_file_and_keeps_section() {
        let dir = TempDir::new("ini", "rel");
        std::fs::create_dir_all(dir.0.join("conf.d")).unwrap();
        dir.write(
            "conf.d/dbs.ini",
            "a = host=1\n%include more.ini\n[users]\nu = pool_size=1\n",
        );
        dir.write("conf.d/more.ini", "b = host=2\n");
        let main = dir.write("main.ini", "[databases]\n%include conf.d/dbs.ini\nc = 3\n");
        let ini = parse_file(&main).unwrap();
        let got: Vec<_> = ini
            .entries
            .iter()
            .map(|e| (e.section.as_str(), e.key.as_str(), e.file.clone(), e.line))
            .collect();
        assert_eq!(
            got,
            vec![
                ("databases", "a", dir.0.join("conf.d/dbs.ini"), 1),
                ("databases", "b", dir.0.join("conf.d/more.ini"), 1),
                ("users", "u", dir.0.join("conf.d/dbs.ini"), 4),
                // The section set inside the include persists after it, as in PgBouncer.
                ("users", "c", main.clone(), 3),
            ]
        );
    }

    #[test]
    fn include_errors() {
        let dir = TempDir::new("ini", "err");
        let main = dir.write("main.ini", "[pgbouncer]\n%include missing.ini\n");
        let err = parse_file(&main).unwrap_err().to_string();
        let expected = format!(
            "{}:2: %include {}: cannot read: ",
            main.display(),
            dir.0.join("missing.ini").display()
        );
        assert!(err.starts_with(&expected), "{err}");

        let bad = dir.write("bad.ini", "[pgbouncer]\nnot a line\n");
        let main = dir.write("main2.ini", "%include bad.ini\n");
        let err = parse_file(&main).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}:2: syntax error", bad.display())),
            "{err}"
        );
    }

    #[test]
    fn include_depth_limit_and_cycles() {
        let dir = TempDir::new("ini", "depth");
        // f0 includes f1 ... f10 includes f11: 11 levels, one too many.
        for i in 0..=11 {
            dir.write(&format!("f{i}.ini"), &format!("%include f{}.ini\n", i + 1));
        }
        dir.write("f10.ini", "[pgbouncer]\nx = 1\n");
        let ini = parse_file(&dir.0.join("f0.ini")).unwrap();
        assert_eq!(ini.entries.len(), 1);
        dir.write("f10.ini", "%include f11.ini\n");
        dir.write("f11.ini", "[pgbouncer]\n");
        let err = parse_file(&dir.0.join("f0.ini")).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}:1: %include nested too deeply (more than 10 levels)",
                dir.0.join("f10.ini").display()
            )
        );
        let cyc = dir.write("cycle.ini", "%include cycle.ini\n");
        let err = parse_file(&cyc).unwrap_err().to_string();
        assert!(
            err.ends_with("%include nested too deeply (more than 10 levels)"),
            "{err}"
        );
    }

    #[test]
    fn missing_main_file_is_io_error() {
        let err = parse_file(Path::new("/nonexistent/sluice.ini")).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(err
            .to_string()
            .starts_with("/nonexistent/sluice.ini: cannot read: "));
    }
}
