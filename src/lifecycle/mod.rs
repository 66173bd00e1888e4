//! The process: command line, config load, logging, listeners, signals, reload and the
//! shutdown modes.

mod accept;
pub(crate) use accept::AcceptFailures;
pub mod alloc;
pub mod cli;
pub mod logging;
pub mod os;
pub mod syslog;
pub mod systemd;
mod trim;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::app::{App, Shutdown};
use crate::config::{Config, Settings};
use crate::net::bind_listeners;
use cli::Args;
use logging::LogSink;

/// Runs Sluice as the command line says; returns the process exit code.
pub fn main_with(args: Args) -> i32 {
    os::share_malloc_arena();
    if args.version {
        println!("{}", cli::version_line());
        return 0;
    }
    let Some(path) = args.config.clone() else {
        eprintln!("sluice: a config file is required");
        return 1;
    };
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("FATAL {e}");
            return 1;
        }
    };
    let s = &config.settings;
    if args.daemon && (s.pidfile.is_none() || (s.logfile.is_none() && !s.syslog)) {
        eprintln!("FATAL daemon mode (-d) needs pidfile, and logfile or syslog, set in the config");
        return 1;
    }
    // Opened before forking so that an unwritable logfile is reported on the terminal.
    let sink = match LogSink::new(
        !args.quiet && !args.daemon,
        s.logfile.clone(),
        syslog::SyslogConfig::of(s),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("FATAL {e}");
            return 1;
        }
    };
    // Fork before the logger exists: it records the pid every line carries, and the
    // daemon's pid is only known after the fork.
    if args.daemon {
        if let Err(e) = os::daemonize() {
            eprintln!("FATAL cannot daemonize: {e}");
            return 1;
        }
    }
    logging::init(sink.clone(), args.verbose.max(s.verbose));
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    if args.reboot {
        // PgBouncer's takeover hands sockets over through SHOW FDS, which Sluice
        // does not serve; an old process's live UNIX socket still stops this one.
        tracing::warn!(
            "online restart (-R) is not supported, starting normally; use so_reuseport instead"
        );
    }
    tracing::debug!(
        "loaded config {}: {} databases, {} users in auth_file",
        path.display(),
        config.databases.len() + usize::from(config.fallback_database.is_some()),
        config.userlist.len()
    );
    let workers = worker_threads(
        std::env::var("SLUICE_WORKERS").ok().as_deref(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let mut builder = match workers {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    let runtime = match builder.enable_io().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start runtime: {e}");
            return 1;
        }
    };
    let user = args.user.clone().or_else(|| config.settings.user.clone());
    // Taken once, here: the descriptors become the listeners'.
    let passed = systemd::take_listen_fds();
    let code = runtime.block_on(run(path, config, sink, user, passed));
    // Dropping the runtime would wait without limit for blocking work (a DNS lookup of
    // a dead server, say); SIGQUIT promises an exit at once.
    runtime.shutdown_timeout(Duration::from_millis(500));
    code
}

/// How many worker threads to run: `SLUICE_WORKERS` if set (0: everything on the
/// main thread, like PgBouncer), else none on machines of up to 2 cores and one per
/// core above, at most [`MAX_DEFAULT_WORKERS`]. On 2 cores the pooler shares the CPUs
/// with the database and its clients, and a second worker costs more in cross-thread
/// wake-ups (a server handed from a client on one worker to a waiter on the other)
/// than it gains: measured there, one event loop used 1.0-1.2x PgBouncer's CPU per
/// transaction, two workers 1.3-1.7x (docs/performance.md).
fn worker_threads(env: Option<&str>, cores: usize) -> usize {
    match env.and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(n) => n,
        None if cores <= 2 => 0,
        None => cores.min(MAX_DEFAULT_WORKERS),
    }
}

/// The most worker threads chosen by default. The threads share one pool, which
/// keeps no more than about 3.5 cores busy: on 16 cores, three sessions measured 4
/// workers at the tps of 8 or 16 or above it, at 5-10% less CPU per transaction
/// (docs/performance.md, eighth, eleventh and seventeenth rounds).
const MAX_DEFAULT_WORKERS: usize = 4;

/// Binds, serves, and returns the exit code once shut down.
async fn run(
    path: PathBuf,
    config: Config,
    sink: Arc<LogSink>,
    user: Option<String>,
    passed: Vec<std::os::fd::OwnedFd>,
) -> i32 {
    let listeners = match bind_listeners(&config.settings, passed) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen: {e}");
            return 1;
        }
    };
    // Bound with the other listeners, before any user switch.
    let metrics = match crate::admin::metrics::bind_setting(&config.settings).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("{e}");
            return 1;
        }
    };
    if let Some(user) = user {
        if let Err(e) = os::switch_user(&user) {
            tracing::error!("cannot switch to user {user}: {e}");
            return 1;
        }
    }
    let pidfile = config.settings.pidfile.clone();
    if let Some(p) = &pidfile {
        if let Err(e) = os::write_pidfile(p) {
            tracing::error!("{e}");
            return 1;
        }
    }
    let Some(sigs) = install_signals() else {
        tracing::error!("cannot install signal handlers");
        return 1;
    };
    for l in &listeners.tcp {
        if let Ok(a) = l.get_ref().local_addr() {
            tracing::info!("listening on {a}");
        }
    }
    if let Some(name) = listeners.unix_name() {
        tracing::info!("listening on {name}");
    }
    tracing::info!(
        "process up: {}, libc, tokio",
        crate::lifecycle::cli::version_line()
    );
    let notifier = systemd::Notifier::from_env();

    // Removed explicitly on the way out rather than left to the listener's drop, which
    // only happens whenever the runtime gets round to dropping the accept task.
    let socket_file = listeners.unix_path().cloned();
    let app = App::new(config);
    {
        let (path, sink) = (path.clone(), sink.clone());
        app.admin
            .set_reloader(move |app: &App| reload(app, &path, &sink));
    }
    // The stats ticker and the metrics endpoint; they stop when this is dropped.
    let _background = crate::admin::start_background(&app, metrics);
    let accept = tokio::spawn(accept::accept_loops(app.clone(), listeners));
    let janitor = tokio::spawn(janitor(app.clone()));
    let keeper = tokio::spawn(crate::session::keeper::run(app.clone()));
    if let Some(n) = &notifier {
        n.ready();
    }
    let code = signals(app.clone(), &path, &sink, sigs, notifier.as_ref()).await;
    accept.abort();
    janitor.abort();
    keeper.abort();
    if let Some(p) = &socket_file {
        let _ = std::fs::remove_file(p);
    }
    if let Some(p) = &pidfile {
        let _ = std::fs::remove_file(p);
    }
    code
}

/// Periodic upkeep, like PgBouncer's janitor.
async fn janitor(app: Arc<App>) {
    let mut tick = crate::timer::interval(Duration::from_millis(500));
    let mut trimmer = trim::Trimmer::new();
    loop {
        tick.tick().await;
        let gate = app.gate();
        app.pools.maintain(|db| gate.blocks(db));
        let cfg = app.config();
        let now = crate::clock::Tick::now();
        app.pools.reclaim_autodbs(
            &cfg,
            now,
            |db| app.db_clients(db),
            |db| gate.paused_dbs.iter().any(|d| d == db),
        );
        app.pools
            .reclaim_idle_pools(cfg.settings.pool_idle_timeout, now);
        drop(cfg);
        crate::session::keeper::sweep(&app);
        crate::admin::control::resume_if_no_console(&app);
        if let Some(t) = trimmer.tick() {
            tracing::debug!(
                "free heap memory given back: resident {} kB -> {} kB",
                t.rss_before >> 10,
                t.rss_after >> 10
            );
        }
    }
}

/// Handles signals until the process should exit; returns the exit code.
/// The signals Sluice acts on: SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2.
type Signals = [Signal; 6];

/// Installs the signal handlers; before the first log line, so that a signal sent as
/// soon as the log says the process is up (SIGHUP would otherwise end it) is acted on.
fn install_signals() -> Option<Signals> {
    let [hup, int, term, quit, usr1, usr2] = [
        SignalKind::hangup(),
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::quit(),
        SignalKind::user_defined1(),
        SignalKind::user_defined2(),
    ]
    .map(signal);
    Some([
        hup.ok()?,
        int.ok()?,
        term.ok()?,
        quit.ok()?,
        usr1.ok()?,
        usr2.ok()?,
    ])
}

async fn signals(
    app: Arc<App>,
    path: &Path,
    sink: &LogSink,
    sigs: Signals,
    notify: Option<&systemd::Notifier>,
) -> i32 {
    let [mut hup, mut int, mut term, mut quit, mut usr1, mut usr2] = sigs;
    // Shutdown progress is checked every 100 ms, only once a shutdown began (here, or
    // from the console, which the watch tells): an idle pooler does not wake for it.
    let mut check = crate::timer::interval(Duration::from_millis(100));
    let mut shutdown = app.shutdown_watch();
    loop {
        let stopping = app.shutdown_mode() != Shutdown::No;
        tokio::select! {
            r = shutdown.changed(), if !stopping => {
                // Closed only with the app, which this task holds: never.
                if r.is_err() {
                    return 0;
                }
            }
            _ = hup.recv() => {
                tracing::info!("got SIGHUP, re-reading config");
                if let Some(n) = notify {
                    n.reloading();
                }
                let _ = reload(&app, path, sink);
                if let Some(n) = notify {
                    n.ready();
                }
            }
            _ = int.recv() => {
                if app.shutdown_mode() != Shutdown::No {
                    tracing::info!("got SIGINT while shutting down, fast exit");
                    return 0;
                }
                tracing::info!("got SIGINT, shutting down, waiting for servers");
                if let Some(n) = notify {
                    n.stopping();
                }
                app.begin_shutdown(Shutdown::WaitForServers);
            }
            _ = term.recv() => {
                if app.shutdown_mode() != Shutdown::No {
                    tracing::info!("got SIGTERM while shutting down, fast exit");
                    return 0;
                }
                tracing::info!("got SIGTERM, shutting down, waiting for clients");
                if let Some(n) = notify {
                    n.stopping();
                }
                app.begin_shutdown(Shutdown::WaitForClients);
            }
            _ = quit.recv() => {
                tracing::info!("got SIGQUIT, fast exit");
                return 0;
            }
            _ = usr1.recv() => crate::admin::control::signal_pause(&app),
            _ = usr2.recv() => crate::admin::control::signal_resume(&app),
            _ = check.tick(), if stopping => {
                match app.shutdown_mode() {
                    Shutdown::No => {}
                    Shutdown::Immediate => return 0,
                    Shutdown::WaitForServers => {
                        if app.pools.active_servers() == 0 {
                            tracing::info!("server connections released, exiting");
                            return 0;
                        }
                    }
                    Shutdown::WaitForClients => {
                        if app.clients.load(std::sync::atomic::Ordering::Acquire) == 0 {
                            tracing::info!("all clients gone, exiting");
                            return 0;
                        }
                    }
                }
            }
        }
    }
}

/// Re-reads the ini and the auth file; a bad file keeps the old config running and
/// is returned as the error (the console's RELOAD reports it).
pub fn reload(app: &App, path: &Path, sink: &LogSink) -> Result<(), String> {
    match Config::load(path) {
        Ok(mut new) => {
            for w in &new.warnings {
                tracing::warn!("{w}");
            }
            for name in keep_restart_only(&app.config().settings, &mut new.settings) {
                tracing::warn!(
                    "setting \"{name}\" cannot be changed by a reload; restart Sluice to apply it"
                );
            }
            let syslog = syslog::SyslogConfig::of(&new.settings);
            if let Err(e) = sink.reopen(new.settings.logfile.clone(), syslog) {
                tracing::error!("{e}");
            }
            app.set_config(new);
            tracing::info!("config reloaded");
            Ok(())
        }
        Err(e) => {
            tracing::error!("config reload failed, keeping the old config: {e}");
            Err(e.to_string())
        }
    }
}

/// Settings bound to the listeners, the pidfile or the process identity only take
/// effect at startup (PgBouncer marks them no-reload). A reload keeps their running
/// values, so that what the config reports matches what the process does; returns the
/// names whose file value was ignored.
fn keep_restart_only(old: &Settings, new: &mut Settings) -> Vec<&'static str> {
    let mut ignored = Vec::new();
    macro_rules! keep {
        ($($field:ident),*) => {$(
            if old.$field != new.$field {
                let name = stringify!($field);
                ignored.push(name);
                new.$field = old.$field.clone();
                match old.raw.get(name) {
                    Some(v) => new.raw.insert(name.to_string(), v.clone()),
                    None => new.raw.remove(name),
                };
            }
        )*};
    }
    keep!(
        listen_addr,
        listen_port,
        listen_backlog,
        so_reuseport,
        peer_id,
        unix_socket_dir,
        unix_socket_mode,
        unix_socket_group,
        user,
        pidfile,
        metrics_listen,
        // PgBouncer's no-reload: a pooler that refused simple queries keeps on.
        disable_pqexec
    );
    ignored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reload_keeps_restart_only_settings() {
        let old = Settings::default();
        let mut new = Settings {
            listen_port: 7000,
            unix_socket_group: Some("staff".into()),
            default_pool_size: 3,
            disable_pqexec: true,
            ..Settings::default()
        };
        new.raw.insert("listen_port".into(), "7000".into());
        new.raw.insert("unix_socket_group".into(), "staff".into());
        new.raw.insert("disable_pqexec".into(), "1".into());
        let ignored = keep_restart_only(&old, &mut new);
        assert_eq!(
            ignored,
            vec!["listen_port", "unix_socket_group", "disable_pqexec"]
        );
        assert!(!new.disable_pqexec);
        assert_eq!(new.listen_port, 6432);
        assert_eq!(new.raw["listen_port"], "6432");
        assert_eq!(new.unix_socket_group, None);
        assert_eq!(new.raw["unix_socket_group"], "");
        // Reloadable settings pass through.
        assert_eq!(new.default_pool_size, 3);
        assert!(keep_restart_only(&old, &mut Settings::default()).is_empty());
    }

    #[test]
    fn worker_threads_by_cores_and_override() {
        assert_eq!(worker_threads(None, 1), 0);
        assert_eq!(worker_threads(None, 2), 0);
        assert_eq!(worker_threads(None, 3), 3);
        assert_eq!(worker_threads(None, 4), 4);
        assert_eq!(worker_threads(None, 16), 4);
        assert_eq!(worker_threads(Some("16"), 16), 16);
        assert_eq!(worker_threads(Some("4"), 2), 4);
        assert_eq!(worker_threads(Some("0"), 16), 0);
        // A value that is not a number is ignored, as before.
        assert_eq!(worker_threads(Some("many"), 16), 4);
    }
}
