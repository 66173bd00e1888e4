//! The admin console: the virtual database `pgbouncer`, reached on the same listeners
//! as pooled databases, speaking PgBouncer's console language (SHOW, PAUSE, RELOAD,
//! SET ...) over the simple query protocol; plus what feeds it and the metrics
//! endpoint: averages over `stats_period`, the `stats:` log line, `/metrics`.
//!
//! `console.rs` logs a client in and runs its session; this file dispatches one
//! command to the `show_*` and `control` handlers.

pub mod averages;
mod console;
pub mod control;
#[cfg(test)]
mod hostile_tests;
pub mod metrics;
mod metrics_text;
pub(crate) mod parse;
mod rows;
mod show_config;
mod show_misc;
mod show_pools;
mod show_sockets;
mod show_stats;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::BytesMut;

use crate::app::{App, Shutdown};
use crate::protocol::sqlstate::PROTOCOL_VIOLATION;
use crate::stats::PoolStats;
pub use console::{is_console, login, serve, AdminLogin};
pub use control::resume_on_cancel;
use parse::{ParseError, Parsed};

/// The version PgBouncer-aware tools see: SHOW VERSION starts with the PgBouncer
/// release whose console Sluice implements (tools pick column sets by it), then names
/// Sluice; the `server_version` parameter is PgBouncer's own.
pub const PGBOUNCER_VERSION: &str = "1.25.2";

/// SHOW VERSION's text.
pub fn version_string() -> String {
    format!(
        "PgBouncer {PGBOUNCER_VERSION} (Sluice {})",
        env!("CARGO_PKG_VERSION")
    )
}

type Reloader = Box<dyn Fn(&App) -> Result<(), String> + Send + Sync>;

/// The console's state inside [`App`].
pub struct AdminState {
    /// Re-reads the config files (installed by the lifecycle, which knows the path).
    reloader: OnceLock<Reloader>,
    /// Snapshots for the averages.
    pub history: averages::History,
    /// The console's own traffic: database `pgbouncer` in SHOW STATS.
    pub console_stats: PoolStats,
    pub started: SystemTime,
}

impl Default for AdminState {
    fn default() -> Self {
        AdminState {
            reloader: OnceLock::new(),
            history: averages::History::default(),
            console_stats: PoolStats::default(),
            started: SystemTime::now(),
        }
    }
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("reloader", &self.reloader.get().is_some())
            .field("history", &self.history)
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// Installs the reload function (once, at startup).
    pub fn set_reloader(&self, f: impl Fn(&App) -> Result<(), String> + Send + Sync + 'static) {
        let _ = self.reloader.set(Box::new(f));
    }

    /// Runs the reload function; without one (an embedded instance) there is no file.
    pub fn reload(&self, app: &App) -> Result<(), String> {
        match self.reloader.get() {
            Some(f) => f(app),
            None => Err("no configuration file to reload".to_owned()),
        }
    }
}

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `admin_users` (and `pgbouncer` over the UNIX socket as the same OS user).
    Admin,
    /// `stats_users`: read-only SHOW commands.
    Stats,
}

/// A failed command: SQLSTATE, message and optional detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdError {
    pub code: &'static str,
    pub message: String,
    pub detail: Option<String>,
}

impl From<String> for CmdError {
    fn from(message: String) -> CmdError {
        CmdError {
            code: PROTOCOL_VIOLATION,
            message,
            detail: None,
        }
    }
}

impl From<&str> for CmdError {
    fn from(message: &str) -> CmdError {
        message.to_owned().into()
    }
}

/// Everything a command handler needs.
pub struct Ctx<'a> {
    pub app: &'a Arc<App>,
    pub access: Access,
    /// Replies are written here, flushed after the command.
    pub out: BytesMut,
    /// A shutdown to begin once the reply is sent (SHUTDOWN answers first).
    pub shutdown_after: Option<Shutdown>,
}

impl Ctx<'_> {
    /// Fails unless the user is an admin.
    pub fn need_admin(&self) -> Result<(), CmdError> {
        match self.access {
            Access::Admin => Ok(()),
            Access::Stats => Err("admin access needed".into()),
        }
    }
}

fn invalid(query: &str) -> CmdError {
    format!("invalid command '{query}', use SHOW HELP;").into()
}

/// Runs one console query, writing its reply (not ReadyForQuery) into `ctx.out`.
pub(crate) async fn execute(ctx: &mut Ctx<'_>, query: &str) -> Result<(), CmdError> {
    let (name, arg) = match parse::parse(query) {
        Ok(Parsed::Set { key, value }) => return show_config::set(ctx, &key, &value),
        Ok(Parsed::Cmd { name, arg }) => (name.to_ascii_lowercase(), arg),
        Err(ParseError::Syntax) => return Err(invalid(query)),
        Err(ParseError::BadArguments) => return Err("bad arguments".into()),
    };
    match name.as_str() {
        // PgBouncer maps SELECT onto SHOW too.
        "show" | "select" => show(ctx, &arg, query),
        "pause" => control::pause(ctx, &arg).await,
        "resume" => control::resume(ctx, &arg),
        "suspend" => control::suspend(ctx, &arg, query).await,
        "disable" => control::disable(ctx, &arg, true),
        "enable" => control::disable(ctx, &arg, false),
        "reconnect" => control::reconnect(ctx, &arg),
        "kill" => control::kill(ctx, &arg),
        "kill_client" => control::kill_client(ctx, &arg),
        "wait_close" => control::wait_close(ctx, &arg).await,
        "reload" => control::reload(ctx, &arg, query),
        "shutdown" => control::shutdown(ctx, &arg, query),
        _ => Err(invalid(query)),
    }
}

fn show(ctx: &mut Ctx<'_>, what: &str, query: &str) -> Result<(), CmdError> {
    if show_config::fake_show(ctx, what) {
        return Ok(());
    }
    let app = ctx.app;
    let out = &mut ctx.out;
    match what.to_ascii_lowercase().as_str() {
        "help" => show_config::help(out),
        "version" => show_config::version(out),
        "config" => show_config::config(app, out),
        "state" => show_misc::state(app, out),
        "databases" => show_pools::databases(app, out),
        "pools" => show_pools::pools(app, out),
        "users" => show_pools::users(app, out),
        "lists" => show_misc::lists(app, out),
        "mem" => show_misc::mem(app, out),
        "dns_hosts" => show_misc::dns_hosts(app, out),
        "dns_zones" => show_misc::dns_zones(out),
        "peers" => show_misc::peers(app, out),
        "peer_pools" => show_misc::peer_pools(app, out),
        "clients" => show_sockets::clients(app, out),
        "servers" => show_sockets::servers(app, out),
        "sockets" => show_sockets::sockets(app, out, false),
        "active_sockets" => show_sockets::sockets(app, out, true),
        "stats" => show_stats::stats(app, out),
        "stats_totals" => show_stats::stats_totals(app, out),
        "stats_averages" => show_stats::stats_averages(app, out),
        "totals" => show_stats::totals(app, out),
        "fds" => {
            ctx.need_admin()?;
            return Err("SHOW FDS is not supported by Sluice (there is no online restart)".into());
        }
        _ => return Err(invalid(query)),
    }
    Ok(())
}

/// Tasks that run beside the listeners: the statistics ticker and, when
/// `metrics_listen` is set, the metrics endpoint. Dropping this stops them.
#[derive(Debug)]
pub struct Background {
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Background {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the background tasks; `metrics` is the endpoint's listener, if configured
/// (bound earlier with the other listeners, see [`metrics::bind_setting`]).
pub fn start_background(app: &Arc<App>, metrics: Option<tokio::net::TcpListener>) -> Background {
    let mut tasks = vec![tokio::spawn(averages::run(app.clone())).abort_handle()];
    if let Some(listener) = metrics {
        tasks.push(tokio::spawn(metrics::serve(app.clone(), listener)).abort_handle());
    }
    Background { tasks }
}
