//! A console client's life: who may log in (PgBouncer's rules), the welcome, and the
//! loop that reads simple queries and answers them.
//!
//! Login rules: the user `pgbouncer` connecting over the UNIX socket from the process's
//! own OS user is an admin without a password; anyone else authenticates by
//! `auth_type` as for a pooled database, then must be in `admin_users` (everything) or
//! `stats_users` (SHOW only), except that `auth_type = any` lets everyone in.

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use super::{rows, Access, Ctx};
use crate::app::App;
use crate::config::{AuthType, DatabaseEntry, ADMIN_DB};
use crate::net::framed::{read_message, ReadError};
use crate::net::{PeerAddr, Stream};
use crate::protocol::backend;
use crate::protocol::header::*;
use crate::protocol::sqlstate::PROTOCOL_VIOLATION;
use crate::protocol::startup::StartupParams;
use crate::session::cancel::CancelKey;
use crate::session::ClientError;
use crate::stats::conns::ClientMeta;
use crate::stats::{StatsDelta, Totals};

/// Largest console message accepted; commands are short.
const MAX_MESSAGE: u32 = 64 * 1024;

/// A logged-in console user.
#[derive(Debug, Clone)]
pub struct AdminLogin {
    pub user: String,
    pub access: Access,
    pub application_name: String,
}

/// Whether a startup packet asks for the console.
pub fn is_console(params: &StartupParams) -> bool {
    let db = (params.get("database"))
        .filter(|d| !d.is_empty())
        .or_else(|| params.get("user"));
    db == Some(ADMIN_DB)
}

/// Whether the peer is this process's own OS user on the UNIX socket. `unix` comes
/// from accept (a TLS client is always a TCP one, with no peer uid).
fn same_os_user(stream: &Stream, unix: bool) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    unix && stream.peer_uid() == Some(me)
}

/// Authenticates a console client and decides what it may do. Writes
/// NegotiateProtocolVersion (if needed) and AuthenticationOk.
pub async fn login(
    app: &App,
    stream: &Stream,
    (unix, came): (bool, crate::session::identity::Came<'_>),
    buf: &mut BytesMut,
    minor: u16,
    params: &StartupParams,
) -> Result<AdminLogin, ClientError> {
    let cfg = app.config();
    let s = &cfg.settings;
    let user = (params.get("user").map(str::to_owned))
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ClientError::fatal(PROTOCOL_VIOLATION, "no username supplied".into()))?;
    let mut out = BytesMut::with_capacity(256);
    // The console ignores other startup parameters: drivers send all sorts, and none
    // of them means anything here.
    let options: Vec<&str> = params
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("_pq_."))
        .collect();
    if minor > 0 || !options.is_empty() {
        backend::negotiate_protocol_version(&mut out, 0, &options);
    }
    let access = if user == ADMIN_DB && same_os_user(stream, unix) {
        Access::Admin
    } else {
        let db = DatabaseEntry {
            name: ADMIN_DB.to_owned(),
            user: Some(ADMIN_DB.to_owned()),
            ..Default::default()
        };
        crate::session::authenticate::authenticate(
            &cfg,
            &db,
            stream,
            buf,
            &mut out,
            &user,
            cfg.userlist.get(&user).map(String::as_str),
            false,
            came,
        )
        .await
        .map_err(|e| e.naming("pgbouncer", &user))?;
        let listed = |l: &[String]| l.contains(&user);
        if listed(&s.admin_users) {
            Access::Admin
        } else if listed(&s.stats_users) || s.auth_type == AuthType::Any {
            Access::Stats
        } else {
            return Err(ClientError::fatal(PROTOCOL_VIOLATION, "not allowed".into()));
        }
    };
    backend::authentication(&mut out, backend::AUTH_OK, &[]);
    stream.write_all(&out).await.map_err(ClientError::Io)?;
    Ok(AdminLogin {
        user,
        access,
        application_name: params.get("application_name").unwrap_or("").into(),
    })
}

/// The parameters a console client sees, as PgBouncer sends them.
fn welcome(out: &mut BytesMut, notice: Option<&str>, key: CancelKey) {
    let server_version = format!("{}/bouncer", super::PGBOUNCER_VERSION);
    for (k, v) in [
        ("server_version", server_version.as_str()),
        ("client_encoding", "UTF8"),
        ("server_encoding", "UTF8"),
        ("DateStyle", "ISO"),
        ("TimeZone", "GMT"),
        ("standard_conforming_strings", "on"),
        ("is_superuser", "on"),
    ] {
        backend::parameter_status(out, k, v);
    }
    // Its cancel (psql's ^C) lifts a pause, as PgBouncer's does (control.rs).
    backend::backend_key_data(out, key.pid, key.key);
    if let Some(text) = notice {
        backend::notice_response(out, "NOTICE", "00000", text);
    }
    backend::ready_for_query(out, b'I');
}

/// Serves a logged-in console client until it leaves or is killed.
pub async fn serve(
    app: &Arc<App>,
    stream: &Stream,
    mut buf: BytesMut,
    who: AdminLogin,
    id: u64,
    (peer, local, tls): (PeerAddr, Option<std::net::SocketAddr>, crate::tls::TlsInfo),
) {
    let started = Instant::now();
    let tag = format!("C-{id}: {ADMIN_DB}/{}@{peer}", who.user);
    let info = app.client_reg.register(ClientMeta {
        id,
        user: who.user.as_str().into(),
        database: ADMIN_DB.into(),
        pool_user: ADMIN_DB.into(),
        peer,
        local_addr: local.map(Into::into),
        application_name: who.application_name.as_str().into(),
        kind: crate::stats::conns::ClientKind::Console,
        tls,
    });
    app.admin.console_stats.flush(&mut StatsDelta {
        counts: Totals {
            logins: 1,
            ..Default::default()
        },
    });
    // Only an admin's cancel may lift a pause: a stats user's key is registered
    // nowhere, so its cancel finds no one.
    let key = match who.access {
        Access::Admin => Some(app.cancels.register(&info.info)),
        Access::Stats => None,
    };
    let mut out = BytesMut::with_capacity(256);
    welcome(
        &mut out,
        app.config().settings.login_notify_message.as_deref(),
        key.unwrap_or(CancelKey {
            pid: rand::random::<u32>() & 0x7fff_ffff,
            key: rand::random(),
        }),
    );
    let reason = match stream.write_all(&out).await {
        Err(e) => format!("client I/O error: {e}"),
        Ok(()) => {
            tokio::select! {
                r = run(app, stream, &mut buf, &who, &tag, &info) => r,
                why = info.killed() => {
                    let mut out = BytesMut::new();
                    rows::message(&mut out, b'E', "FATAL", PROTOCOL_VIOLATION, why, None);
                    send_last(stream, &out).await;
                    why.to_owned()
                }
            }
        }
    };
    if let Some(key) = key {
        app.cancels.remove(key.pid, key.key);
    }
    if app.config().settings.log_disconnections {
        tracing::info!(
            "{tag} closing because: {reason} (age={}s)",
            started.elapsed().as_secs()
        );
    }
}

/// Reads and answers queries; returns why the session ended.
async fn run(
    app: &Arc<App>,
    stream: &Stream,
    buf: &mut BytesMut,
    who: &AdminLogin,
    tag: &str,
    info: &crate::stats::conns::ClientInfo,
) -> String {
    loop {
        let (msg_tag, body) = match read_message(stream, buf, MAX_MESSAGE).await {
            Ok(m) => m,
            Err(ReadError::Eof) => return "client unexpected eof".into(),
            Err(ReadError::Io(e)) => return format!("client I/O error: {e}"),
            Err(ReadError::Protocol(e @ crate::protocol::ProtocolError::BadHeader(_))) => {
                return fail(stream, tag, &e.to_string()).await
            }
            Err(ReadError::Protocol(e)) => {
                return fail(stream, tag, &format!("client protocol error: {e}")).await
            }
        };
        match msg_tag {
            TAG_QUERY => {
                let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
                let query = String::from_utf8_lossy(&body[..end]).into_owned();
                tracing::debug!("{tag} got admin query: {query}");
                info.set_active();
                let mut ctx = Ctx {
                    app,
                    access: who.access,
                    out: BytesMut::with_capacity(1024),
                    shutdown_after: None,
                };
                if let Err(e) = super::execute(&mut ctx, &query).await {
                    tracing::warn!("{tag} pooler error: {}", e.message);
                    ctx.out.clear();
                    let detail = e.detail.as_deref();
                    rows::message(&mut ctx.out, b'E', "ERROR", e.code, &e.message, detail);
                }
                info.unlink();
                rows::ready(&mut ctx.out);
                app.admin.console_stats.flush(&mut StatsDelta {
                    counts: Totals {
                        queries: 1,
                        xacts: 1,
                        ..Default::default()
                    },
                });
                if let Err(e) = stream.write_all(&ctx.out).await {
                    return format!("client I/O error: {e}");
                }
                if let Some(mode) = ctx.shutdown_after {
                    app.begin_shutdown(mode);
                }
            }
            TAG_TERMINATE => return "client close request".into(),
            TAG_PARSE | TAG_BIND | TAG_EXECUTE => {
                return bad_packet(
                    stream,
                    tag,
                    "extended query protocol not supported by admin console",
                )
                .await
            }
            other => {
                // The type as a number, as PgBouncer prints it.
                let what = format!("unsupported packet type for admin console: {other}");
                return bad_packet(stream, tag, &what).await;
            }
        }
    }
}

/// Sends an error and ends the session (PgBouncer closes after these).
async fn fail(stream: &Stream, tag: &str, message: &str) -> String {
    tracing::warn!("{tag} pooler error: {message}");
    let mut out = BytesMut::new();
    rows::message(&mut out, b'E', "ERROR", PROTOCOL_VIOLATION, message, None);
    send_last(stream, &out).await;
    message.to_owned()
}

/// Refuses a message the console does not take as PgBouncer does: the error and
/// ReadyForQuery, then FATAL `bad packet` and the close ("closing because: bad
/// packet" in the log).
async fn bad_packet(stream: &Stream, tag: &str, message: &str) -> String {
    tracing::warn!("{tag} pooler error: {message}");
    let mut out = BytesMut::new();
    rows::message(&mut out, b'E', "ERROR", PROTOCOL_VIOLATION, message, None);
    rows::ready(&mut out);
    rows::message(
        &mut out,
        b'E',
        "FATAL",
        PROTOCOL_VIOLATION,
        "bad packet",
        None,
    );
    send_last(stream, &out).await;
    "bad packet".into()
}

/// Writes what a closing session owes, waiting at most a second for a client that
/// does not read.
async fn send_last(stream: &Stream, out: &[u8]) {
    let _ = crate::timer::timeout(std::time::Duration::from_secs(1), stream.write_all(out)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kv: &[(&str, &str)]) -> StartupParams {
        StartupParams::from_pairs(kv)
    }

    #[test]
    fn console_by_database_or_user_name() {
        assert!(is_console(&p(&[("user", "a"), ("database", "pgbouncer")])));
        assert!(is_console(&p(&[("user", "pgbouncer")])));
        assert!(is_console(&p(&[("user", "pgbouncer"), ("database", "")])));
        assert!(!is_console(&p(&[
            ("user", "pgbouncer"),
            ("database", "app")
        ])));
        assert!(!is_console(&p(&[("user", "a")])));
    }
}
