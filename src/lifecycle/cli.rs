//! The command line, shaped like PgBouncer's: `sluice [-d] [-q] [-R] [-v ...] [-u USER] CONFIG`.

use std::path::PathBuf;

use clap::{ArgAction, Parser};

/// Sluice, a PostgreSQL connection pooler that reads pgbouncer.ini.
#[derive(Debug, Parser)]
#[command(name = "sluice", disable_version_flag = true)]
pub struct Args {
    /// Run in the background (needs pidfile and logfile)
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Do not log to stderr
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Increase verbosity (repeatable)
    #[arg(short = 'v', long = "verbose", action = ArgAction::Count)]
    pub verbose: u8,
    /// PgBouncer's deprecated online restart: accepted, not done (Sluice starts
    /// normally; use so_reuseport to overlap an old and a new process)
    #[arg(short = 'R', long = "reboot")]
    pub reboot: bool,
    /// Switch to this OS user after binding the listeners
    #[arg(short = 'u', long = "user", value_name = "USER")]
    pub user: Option<String>,
    /// Print the version and exit
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    /// The configuration file (pgbouncer.ini format)
    #[arg(value_name = "CONFIG", required_unless_present = "version")]
    pub config: Option<PathBuf>,
}

/// The version line printed by `-V`.
pub fn version_line() -> String {
    format!("Sluice {}", env!("CARGO_PKG_VERSION"))
}
