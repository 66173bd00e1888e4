//! The one error type of the `config` module.
//!
//! Every problem that comes from a specific line says where it is, as
//! `file:line: what is wrong`, so an operator can jump straight to it; problems
//! reading a whole file say `file: cannot read: <io error>`.

use std::path::{Path, PathBuf};

/// Why a configuration (ini, include or auth file) could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read (missing, permissions, not UTF-8, ...).
    #[error("{}: cannot read: {source}", .file.display())]
    Io {
        /// The file as it was named (not canonicalized), so the message matches the config.
        file: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is malformed or holds a value that is not allowed.
    #[error("{}:{line}: {message}", .file.display())]
    Line {
        /// The file holding the offending line.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong, without the location prefix.
        message: String,
    },
}

impl ConfigError {
    /// A line-level error at `file:line`.
    pub fn at(file: &Path, line: usize, message: impl Into<String>) -> Self {
        ConfigError::Line {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    /// An I/O error while reading `file`.
    pub fn io(file: &Path, source: std::io::Error) -> Self {
        ConfigError::Io {
            file: file.to_path_buf(),
            source,
        }
    }
}

/// Formats a warning the same way as a line-level error, for `Config::warnings`.
pub(crate) fn warning_at(file: &Path, line: usize, message: impl std::fmt::Display) -> String {
    format!("{}:{line}: {message}", file.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_error_display() {
        let e = ConfigError::at(
            Path::new("/etc/sluice.ini"),
            12,
            "unknown setting \"lsten_port\"",
        );
        assert_eq!(
            e.to_string(),
            "/etc/sluice.ini:12: unknown setting \"lsten_port\""
        );
    }

    #[test]
    fn io_error_display() {
        let e = ConfigError::io(
            Path::new("/nope.ini"),
            std::io::Error::new(std::io::ErrorKind::NotFound, "gone"),
        );
        assert_eq!(e.to_string(), "/nope.ini: cannot read: gone");
    }

    #[test]
    fn warning_format_matches_errors() {
        assert_eq!(warning_at(Path::new("a.ini"), 3, "hmm"), "a.ini:3: hmm");
    }
}
