//! The console's control commands (all need an admin): PAUSE, RESUME, SUSPEND,
//! DISABLE/ENABLE, RECONNECT, KILL, KILL_CLIENT, WAIT_CLOSE, RELOAD, SHUTDOWN; and
//! SIGUSR1/SIGUSR2, which pause and resume like PAUSE and RESUME.
//!
//! Pausing works through the gate in `App`: sessions check it before asking for a
//! server and wait while it blocks them, so clients stay connected and their next
//! transaction simply waits. PAUSE then waits for lent servers to come back and
//! closes the idle ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rows;
use super::{CmdError, Ctx};
use crate::app::{App, Shutdown};
use crate::config::ADMIN_DB;
use crate::pool::Pool;
use crate::protocol::sqlstate::QUERY_CANCELED;

const POLL: Duration = Duration::from_millis(50);

/// Whether `db` names a database (configured, or served by the `*` entry).
fn known_db(app: &App, db: &str) -> bool {
    app.config().fallback_database.is_some() || seen_db(app, db)
}

/// Whether `db` is a database PgBouncer would find without making it from `*`:
/// configured, in use, paused or disabled (PAUSE and DISABLE make it), or the
/// console's own (RESUME and ENABLE look names up so).
fn seen_db(app: &App, db: &str) -> bool {
    let g = app.gate();
    db == ADMIN_DB
        || g.paused_dbs.iter().chain(&g.disabled_dbs).any(|d| d == db)
        || app.config().databases.contains_key(db)
        || app.pools.all().iter().any(|p| p.key.database == db)
}

/// Checks a database argument: exists, and is not the console (`what` names the
/// refused action in PgBouncer's words).
fn check_db(app: &App, db: &str, what: &str) -> Result<(), CmdError> {
    if db == ADMIN_DB {
        return Err(format!("cannot {what} admin db: {db}").into());
    }
    if !known_db(app, db) {
        return Err(format!("no such database: {db}").into());
    }
    Ok(())
}

/// PAUSE, SUSPEND and KILL are refused while the pooler is paused or suspended (a
/// shutdown that stops lending counts, as PgBouncer's pause mode).
fn not_paused(g: &crate::app::Gate) -> Result<(), CmdError> {
    if g.pause_mode() || g.suspended {
        return Err("already suspended/paused".into());
    }
    Ok(())
}

/// The pools of `db`, or all pools.
fn pools_of(app: &App, db: Option<&str>) -> Vec<Arc<Pool>> {
    let mut v = app.pools.all();
    if let Some(db) = db {
        v.retain(|p| p.key.database == db);
    }
    v
}

/// Servers lent out or still logging in.
fn busy_servers(pools: &[Arc<Pool>]) -> u32 {
    pools
        .iter()
        .map(|p| {
            let c = p.counts();
            c.total.saturating_sub(c.idle)
        })
        .sum()
}

/// Waits until no server of `db` is in use (or the pause is lifted), then closes the
/// idle ones, as PgBouncer's PAUSE does.
async fn drain(app: &App, db: Option<&str>) {
    loop {
        let g = app.gate();
        let still_paused = match db {
            Some(d) => g.paused_dbs.iter().any(|x| x == d),
            None => g.paused,
        };
        if !still_paused {
            return;
        }
        let pools = pools_of(app, db);
        if busy_servers(&pools) == 0 {
            for p in pools {
                while let Some(conn) = p.evict_idle() {
                    drop(conn);
                }
            }
            return;
        }
        crate::timer::sleep(POLL).await;
    }
}

/// A PAUSE or SUSPEND whose wait ended because it was lifted (a cancel request, or
/// RESUME on another console) before it was complete.
fn lifted(command: &str) -> CmdError {
    CmdError {
        code: QUERY_CANCELED,
        message: format!("{command} canceled: the pooler was resumed before it was complete"),
        detail: None,
    }
}

/// `PAUSE [db]`.
pub async fn pause(ctx: &mut Ctx<'_>, db: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let app = ctx.app;
    let g = app.gate();
    not_paused(&g)?;
    if db.is_empty() {
        tracing::info!("PAUSE command issued");
        app.update_gate(|g| g.paused = true);
        drain(app, None).await;
        if !app.gate().paused {
            return Err(lifted("PAUSE"));
        }
    } else {
        tracing::info!("PAUSE '{db}' command issued");
        check_db(app, db, "pause")?;
        app.update_gate(|g| {
            if !g.paused_dbs.iter().any(|d| d == db) {
                g.paused_dbs.push(db.to_owned());
            }
        });
        drain(app, Some(db)).await;
    }
    rows::command_complete(&mut ctx.out, "PAUSE");
    Ok(())
}

/// A console client's cancel request (psql's ^C, most likely on a PAUSE or SUSPEND
/// that waits): lifts the pooler-wide pause or suspend, as PgBouncer does; paused
/// databases stay paused.
pub fn resume_on_cancel(app: &App) {
    let g = app.gate();
    if g.paused || g.suspended {
        tracing::info!("cancel request on the console: RESUME");
        app.update_gate(|g| {
            g.paused = false;
            g.suspended = false;
        });
    }
}

/// The janitor's part during a SUSPEND: with no console client left to RESUME it (the
/// one that suspended gone), the pooler resumes by itself, as PgBouncer does.
pub fn resume_if_no_console(app: &App) {
    if !app.gate().suspended {
        return;
    }
    let mut consoles = false;
    app.client_reg.for_each(|c| consoles |= c.meta.is_admin());
    if !consoles {
        tracing::info!("admin disappeared when suspended, doing RESUME");
        app.update_gate(|g| g.suspended = false);
    }
}

/// `RESUME [db]`.
pub fn resume(ctx: &mut Ctx<'_>, db: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let app = ctx.app;
    if db.is_empty() {
        tracing::info!("RESUME command issued");
        // PgBouncer's answer: a shutdown's pause is not for RESUME to lift.
        if app.shutdown_mode() != crate::app::Shutdown::No {
            return Err("pooler is shutting down".into());
        }
        let g = app.gate();
        if !g.paused && !g.suspended {
            return Err("pooler is not paused/suspended".into());
        }
        app.update_gate(|g| {
            g.paused = false;
            g.suspended = false;
        });
    } else {
        tracing::info!("RESUME '{db}' command issued");
        if !seen_db(app, db) {
            return Err(format!("no such database: {db}").into());
        }
        if !app.gate().paused_dbs.iter().any(|d| d == db) {
            return Err(format!("database {db} is not paused").into());
        }
        app.update_gate(|g| g.paused_dbs.retain(|d| d != db));
    }
    rows::command_complete(&mut ctx.out, "RESUME");
    Ok(())
}

/// SUSPEND: stops lending servers and waits (up to `suspend_timeout`) for the ones in
/// use to come back. Sluice has no online restart, so the listeners stay open.
/// (`query` as typed, for PgBouncer's syntax error, which quotes it.)
pub async fn suspend(ctx: &mut Ctx<'_>, arg: &str, query: &str) -> Result<(), CmdError> {
    if !arg.is_empty() {
        return Err(super::invalid(query));
    }
    ctx.need_admin()?;
    let app = ctx.app;
    let g = app.gate();
    not_paused(&g)?;
    if !g.paused_dbs.is_empty() {
        return Err("cannot suspend with paused databases".into());
    }
    tracing::info!("SUSPEND command issued");
    app.update_gate(|g| g.suspended = true);
    let limit = app.config().settings.suspend_timeout;
    let deadline = Instant::now() + limit;
    while busy_servers(&app.pools.all()) > 0 && (limit.is_zero() || Instant::now() < deadline) {
        if !app.gate().suspended {
            return Err(lifted("SUSPEND"));
        }
        crate::timer::sleep(POLL).await;
    }
    rows::command_complete(&mut ctx.out, "SUSPEND");
    Ok(())
}

/// DISABLE db (`disable` true) or ENABLE db: refuse or allow new logins.
pub fn disable(ctx: &mut Ctx<'_>, db: &str, disable: bool) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let (word, tag) = if disable {
        ("DISABLE", "DISABLE")
    } else {
        ("ENABLE", "ENABLE")
    };
    if db.is_empty() {
        return Err("a database is required".into());
    }
    tracing::info!("{word} '{db}' command issued");
    check_db(ctx.app, db, if disable { "disable" } else { "enable" })?;
    if !disable && !seen_db(ctx.app, db) {
        return Err(format!("no such database: {db}").into());
    }
    ctx.app.update_gate(|g| {
        g.disabled_dbs.retain(|d| d != db);
        if disable {
            g.disabled_dbs.push(db.to_owned());
        }
    });
    rows::command_complete(&mut ctx.out, tag);
    Ok(())
}

/// `RECONNECT [db]`: servers close when next released; new ones replace them.
pub fn reconnect(ctx: &mut Ctx<'_>, db: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let db = (!db.is_empty()).then_some(db);
    match db {
        None => tracing::info!("RECONNECT command issued"),
        Some(d) => {
            tracing::info!("RECONNECT '{d}' command issued");
            check_db(ctx.app, d, "reconnect")?;
        }
    }
    for p in pools_of(ctx.app, db) {
        p.reconnect_all();
    }
    ctx.app.close_retired_sessions();
    rows::command_complete(&mut ctx.out, "RECONNECT");
    Ok(())
}

/// `KILL [db]`: drops the clients and servers at once and leaves the database (or, with
/// no argument, the pooler) paused until RESUME.
pub fn kill(ctx: &mut Ctx<'_>, db: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let app = ctx.app;
    let g = app.gate();
    not_paused(&g)?;
    let db = (!db.is_empty()).then_some(db);
    match db {
        None => {
            tracing::info!("KILL command issued");
            app.update_gate(|g| g.paused = true);
        }
        Some(d) => {
            tracing::info!("KILL '{d}' command issued");
            check_db(app, d, "kill")?;
            app.update_gate(|g| {
                if !g.paused_dbs.iter().any(|x| x == d) {
                    g.paused_dbs.push(d.to_owned());
                }
            });
        }
    }
    for c in app.client_reg.all() {
        if !c.meta.is_admin() && db.is_none_or(|d| *c.meta.database == *d) {
            c.kill(crate::stats::conns::KillReason::DatabaseRemoved);
        }
    }
    app.keeper.kick();
    // Idle servers close now; lent ones close with their killed sessions.
    for p in pools_of(app, db) {
        p.reconnect_all();
    }
    rows::command_complete(&mut ctx.out, "KILL");
    Ok(())
}

/// KILL_CLIENT id: ends one client session (and closes its server, if linked).
pub fn kill_client(ctx: &mut Ctx<'_>, arg: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let id: u64 = arg
        .parse()
        .map_err(|_| CmdError::from("invalid client pointer supplied"))?;
    let client = ctx
        .app
        .client_reg
        .get(id)
        .ok_or_else(|| CmdError::from("client not found"))?;
    tracing::info!("KILL_CLIENT '{id}' command issued");
    client.kill(crate::stats::conns::KillReason::AdminForced);
    ctx.app.keeper.kick();
    rows::command_complete(&mut ctx.out, "KILL_CLIENT");
    Ok(())
}

/// Servers of `db` (or all) that will close at release: made before a RECONNECT or a
/// reload that changed their target.
fn closing_servers(app: &App, db: Option<&str>) -> usize {
    let clients = app.client_reg.all();
    pools_of(app, db)
        .iter()
        .map(|p| {
            let generation = p.generation();
            let idle = p
                .idle_servers()
                .iter()
                .filter(|s| s.ident.generation != generation)
                .count();
            let linked = clients
                .iter()
                .filter(|c| *c.meta.database == *p.key.database && *c.meta.pool_user == *p.key.user)
                .filter_map(|c| c.linked())
                .filter(|s| s.generation != generation)
                .count();
            idle + linked
        })
        .sum()
}

/// `WAIT_CLOSE [db]`: waits until the servers marked for closing are gone.
pub async fn wait_close(ctx: &mut Ctx<'_>, db: &str) -> Result<(), CmdError> {
    ctx.need_admin()?;
    let db = (!db.is_empty()).then_some(db);
    match db {
        None => tracing::info!("WAIT_CLOSE command issued"),
        Some(d) => {
            tracing::info!("WAIT_CLOSE '{d}' command issued");
            if d == ADMIN_DB {
                return Err(format!("cannot wait in admin db: {d}").into());
            }
            check_db(ctx.app, d, "wait in")?;
        }
    }
    while closing_servers(ctx.app, db) > 0 {
        crate::timer::sleep(POLL).await;
    }
    rows::command_complete(&mut ctx.out, "WAIT_CLOSE");
    Ok(())
}

/// RELOAD: re-reads the config files; a failure is reported, the old config stays.
pub fn reload(ctx: &mut Ctx<'_>, arg: &str, query: &str) -> Result<(), CmdError> {
    if !arg.is_empty() {
        return Err(super::invalid(query));
    }
    ctx.need_admin()?;
    tracing::info!("RELOAD command issued");
    ctx.app.admin.reload(ctx.app).map_err(|detail| CmdError {
        code: "F0000",
        // PgBouncer's words; the DETAIL says what failed.
        message: "RELOAD failed, see logs for additional details".to_owned(),
        detail: Some(detail),
    })?;
    rows::command_complete(&mut ctx.out, "RELOAD");
    Ok(())
}

/// SHUTDOWN [WAIT_FOR_SERVERS | WAIT_FOR_CLIENTS]. Sluice answers before it goes, so
/// that a script can tell the command was taken.
pub fn shutdown(ctx: &mut Ctx<'_>, arg: &str, query: &str) -> Result<(), CmdError> {
    let mode = match arg.to_ascii_lowercase().as_str() {
        "" => Shutdown::Immediate,
        "wait_for_servers" => Shutdown::WaitForServers,
        "wait_for_clients" => Shutdown::WaitForClients,
        _ => return Err(super::invalid(query)),
    };
    ctx.need_admin()?;
    if arg.is_empty() {
        tracing::info!("SHUTDOWN command issued");
    } else {
        tracing::info!("SHUTDOWN {} command issued", arg.to_ascii_uppercase());
    }
    ctx.shutdown_after = Some(mode);
    rows::command_complete(&mut ctx.out, "SHUTDOWN");
    Ok(())
}

/// SIGUSR1: PAUSE, without anyone waiting for it to finish.
pub fn signal_pause(app: &Arc<App>) {
    let g = app.gate();
    if g.paused || g.suspended {
        tracing::info!("got SIGUSR1, but already paused/suspended");
        return;
    }
    tracing::info!("got SIGUSR1, pausing all activity");
    app.update_gate(|g| g.paused = true);
    let app = app.clone();
    tokio::spawn(async move { drain(&app, None).await });
}

/// SIGUSR2: RESUME; ignored while shutting down.
pub fn signal_resume(app: &App) {
    if app.shutdown_mode() != Shutdown::No {
        tracing::info!("got SIGUSR2 while shutting down, ignoring");
        return;
    }
    tracing::info!("got SIGUSR2, continuing");
    app.update_gate(|g| {
        g.paused = false;
        g.suspended = false;
    });
}
