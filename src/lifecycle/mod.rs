//! The process: command line, config load, logging, listeners, signals, reload and the
//! shutdown modes.

pub mod cli;
pub mod logging;
pub mod os;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::app::{App, Shutdown};
use crate::config::Config;
use crate::net::{bind_listeners, Listeners, Stream};
use cli::Args;
use logging::LogSink;

/// Runs Sluice as the command line says; returns the process exit code.
pub fn main_with(args: Args) -> i32 {
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
    if args.daemon && (s.pidfile.is_none() || s.logfile.is_none()) {
        eprintln!("FATAL daemon mode (-d) needs pidfile and logfile set in the config");
        return 1;
    }
    let sink = match LogSink::new(!args.quiet && !args.daemon, s.logfile.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("FATAL {e}");
            return 1;
        }
    };
    logging::init(sink.clone(), args.verbose.max(s.verbose));
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    if args.daemon {
        if let Err(e) = os::daemonize() {
            tracing::error!("cannot daemonize: {e}");
            return 1;
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start runtime: {e}");
            return 1;
        }
    };
    let user = args.user.clone().or_else(|| config.settings.user.clone());
    runtime.block_on(run(path, config, sink, user))
}

/// Binds, serves, and returns the exit code once shut down.
async fn run(path: PathBuf, config: Config, sink: Arc<LogSink>, user: Option<String>) -> i32 {
    let listeners = match bind_listeners(&config.settings) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen: {e}");
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
    for l in &listeners.tcp {
        if let Ok(a) = l.local_addr() {
            tracing::info!("listening on {a}");
        }
    }
    if let Some(p) = listeners.unix_path() {
        tracing::info!("listening on unix:{}", p.display());
    }
    tracing::info!(
        "process up: {}, libc, tokio",
        crate::lifecycle::cli::version_line()
    );

    let app = App::new(config);
    let accept = tokio::spawn(accept_loops(app.clone(), listeners));
    let janitor = tokio::spawn(janitor(app.clone()));
    let code = signals(app.clone(), &path, &sink).await;
    accept.abort();
    janitor.abort();
    if let Some(p) = &pidfile {
        let _ = std::fs::remove_file(p);
    }
    code
}

/// One accept task per listener; TCP listeners close when a shutdown begins, the UNIX
/// socket stays open until exit (PgBouncer keeps it for the admin console).
async fn accept_loops(app: Arc<App>, mut listeners: Listeners) {
    let mut tasks = Vec::new();
    for l in std::mem::take(&mut listeners.tcp) {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut shutdown = app.shutdown_watch();
            loop {
                tokio::select! {
                    r = l.accept() => match r {
                        Ok((s, _)) => {
                            let _ = s.set_nodelay(true);
                            tokio::spawn(crate::session::serve_client(app.clone(), Stream::Tcp(s)));
                        }
                        Err(e) => {
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    _ = shutdown.changed() => {
                        if *shutdown.borrow() != Shutdown::No {
                            return;
                        }
                    }
                }
            }
        }));
    }
    if let Some(l) = listeners.unix.take() {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok((s, _)) => {
                        tokio::spawn(crate::session::serve_client(app.clone(), Stream::Unix(s)));
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    // `listeners` (and the socket file) live as long as this task.
    for t in tasks {
        let _ = t.await;
    }
    drop(listeners);
}

/// Periodic upkeep, like PgBouncer's janitor.
async fn janitor(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        app.pools.maintain();
    }
}

/// Handles signals until the process should exit; returns the exit code.
async fn signals(app: Arc<App>, path: &Path, sink: &LogSink) -> i32 {
    let (Ok(mut hup), Ok(mut int), Ok(mut term), Ok(mut quit), Ok(mut usr1), Ok(mut usr2)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::quit()),
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return 1;
    };
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("got SIGHUP, re-reading config");
                reload(&app, path, sink);
            }
            _ = int.recv() => {
                if app.shutdown_mode() != Shutdown::No {
                    tracing::info!("got SIGINT while shutting down, fast exit");
                    return 0;
                }
                tracing::info!("got SIGINT, shutting down, waiting for servers");
                app.begin_shutdown(Shutdown::WaitForServers);
            }
            _ = term.recv() => {
                if app.shutdown_mode() != Shutdown::No {
                    tracing::info!("got SIGTERM while shutting down, fast exit");
                    return 0;
                }
                tracing::info!("got SIGTERM, shutting down, waiting for clients");
                app.begin_shutdown(Shutdown::WaitForClients);
            }
            _ = quit.recv() => {
                tracing::info!("got SIGQUIT, fast exit");
                return 0;
            }
            _ = usr1.recv() => tracing::warn!("got SIGUSR1: PAUSE is not implemented yet, ignoring"),
            _ = usr2.recv() => tracing::warn!("got SIGUSR2: RESUME is not implemented yet, ignoring"),
            _ = check.tick() => {
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

/// Re-reads the ini and the auth file; a bad file keeps the old config running.
pub fn reload(app: &App, path: &Path, sink: &LogSink) {
    match Config::load(path) {
        Ok(new) => {
            for w in &new.warnings {
                tracing::warn!("{w}");
            }
            if let Err(e) = sink.reopen(new.settings.logfile.clone()) {
                tracing::error!("{e}");
            }
            app.set_config(new);
            tracing::info!("config reloaded");
        }
        Err(e) => tracing::error!("config reload failed, keeping the old config: {e}"),
    }
}
