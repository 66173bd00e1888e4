//! A session's start: made from a login, then its welcome (the parameters, the cancel
//! key and ReadyForQuery after the login's greeting, in one write).

use std::sync::Arc;

use bytes::BytesMut;

use super::Session;
use crate::config::PoolMode;
use crate::net::Stream;
use crate::protocol::backend;
use crate::session::assign::acquire_linked;
use crate::session::login::LoggedIn;
use crate::session::relay::{Parked, RelaySlot, ReleaseAt};
use crate::session::{fail_client, protocol_failure, timeouts, ClientSlot, ClientTag};
use crate::stats::conns::ClientInfo;

/// What a new session sends first: the login's greeting, then the welcome; and any
/// request bytes that came with the login.
pub(in crate::session) struct Welcome {
    pub greeting: BytesMut,
    pub leftover: BytesMut,
    /// `login_notify_message`, if set.
    pub notice: Option<Arc<str>>,
}

/// The registrations a session starts from (its count against the database and user
/// limits is undone when the session drops).
pub(in crate::session) struct Registrations {
    /// Registered with the console by the caller; the session unregisters it.
    pub info: Arc<ClientInfo>,
    pub slot: ClientSlot,
    pub log_pooler_errors: bool,
}

impl Session {
    /// A logged-in client's session, before its welcome.
    pub(in crate::session) fn new(r: Registrations, who: LoggedIn) -> (Box<Session>, BytesMut) {
        let LoggedIn {
            pool,
            params,
            user,
            greeting,
            replication,
            ..
        } = who;
        let app = &r.slot.0;
        let cfg = app.config();
        // A replication client holds its own server for its whole session, whatever
        // the pool's mode (and server_fast_close does not cut it short).
        let mode = match replication {
            Some(_) => PoolMode::Session,
            None => pool.config().pool_mode,
        };
        // server_fast_close: a session-mode server retired by RECONNECT or a reload
        // closes at the end of the current transaction, and the client with it.
        let fast_close =
            mode == PoolMode::Session && cfg.settings.server_fast_close && replication.is_none();
        let release_at = match mode {
            PoolMode::Session if fast_close => ReleaseAt::SessionCheckpoints,
            PoolMode::Session => ReleaseAt::SessionEnd,
            PoolMode::Transaction => ReleaseAt::TransactionEnd,
            PoolMode::Statement => ReleaseAt::StatementEnd,
        };
        // An idle client keeps only the parked part of its relay.
        let mut limits = timeouts(&cfg, &user);
        if replication.is_some() {
            // A stream runs for as long as the replica follows: no query or
            // transaction limit applies to it (PostgreSQL's statement_timeout does
            // not either). client_idle_timeout still does, between commands.
            limits = limits.streaming();
        }
        let mut kept = Parked::new(cfg.settings.max_packet_size, limits);
        if cfg.settings.disable_pqexec {
            kept.refuse_simple_query();
        }
        let max_prepared = cfg.settings.max_prepared_statements;
        if mode != PoolMode::Session && max_prepared > 0 {
            kept.enable_prepared(app.statements.clone(), max_prepared);
        }
        let s = Session {
            cancel_key: app.cancels.register(&r.info),
            reset_always: pool.config().server_reset_query_always,
            log_disconnections: cfg.settings.log_disconnections,
            log_pooler_errors: r.log_pooler_errors,
            info: r.info,
            pool,
            params,
            relay: RelaySlot::new(kept),
            server: None,
            mode,
            replication,
            release_at,
            fresh: true,
            begun: None,
            slot: r.slot,
        };
        (Box::new(s), greeting)
    }

    /// The welcome (parameters, cancel key, ReadyForQuery), after the login's greeting.
    pub(super) async fn welcome(&mut self, stream: &Stream, w: Welcome) -> Result<(), String> {
        let Welcome {
            greeting,
            leftover,
            notice,
        } = w;
        let pool = &self.pool;
        // The welcome needs the server's parameters; the first client of a pool waits
        // for a server login to learn them.
        let welcome = match pool
            .welcome()
            .or_else(|| self.app().pools.sibling_welcome(pool))
        {
            Some(w) => w,
            // A replication client's own server, opened now (PgBouncer links one at
            // once): its parameters are this client's welcome, and no plain
            // connection is opened just to learn them.
            None if self.replication.is_some() => {
                let pool = pool.clone();
                let own = self.replication;
                let acquired = acquire_linked(&pool, &mut self.params, None, || {}, own);
                match Box::pin(acquired).await {
                    Ok(server) => {
                        let w = Arc::new(server.params.values.clone());
                        self.info.link(&server.ident, 0);
                        self.server = Some(server);
                        w
                    }
                    Err(e) => return Err(Box::pin(fail_client(stream, self.tag(), &e)).await),
                }
            }
            None => match Box::pin(pool.acquire()).await {
                Ok(server) => {
                    pool.release(server, true);
                    match pool.welcome() {
                        Some(w) => w,
                        None => Arc::new(Vec::new()),
                    }
                }
                Err(e) => return Err(Box::pin(fail_client(stream, self.tag(), &e)).await),
            },
        };
        // The greeting, AuthenticationOk and the welcome go out in one write.
        let mut out = greeting;
        // AuthenticationOk, the ParameterStatus messages, key data and ReadyForQuery:
        // ~400 bytes. One allocation under 1 KB, which glibc serves from its
        // per-thread cache (a larger one takes its slow path both ways).
        out.reserve(768);
        backend::authentication(&mut out, backend::AUTH_OK, &[]);
        self.params.settle(&welcome, &pool.shared_params, &mut out);
        drop(welcome);
        backend::backend_key_data(&mut out, self.cancel_key.pid, self.cancel_key.key);
        if let Some(text) = notice {
            backend::notice_response(&mut out, "NOTICE", "00000", &text);
        }
        backend::ready_for_query(&mut out, b'I');
        // Nearly always taken whole by the socket at once; the wait is boxed only if not.
        let sent = match stream.try_write(&out) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(format!("client I/O error: {e}")),
        };
        if sent < out.len() {
            if let Err(e) = Box::pin(stream.write_all(&out[sent..])).await {
                return Err(format!("client I/O error: {e}"));
            }
        }
        drop(out);
        self.pool.stats.count_login();
        if leftover.is_empty() {
            // The usual case: no relay is made (nor the prepared-statement state it
            // would take) until the client sends something.
            return Ok(());
        }
        let first = self.relay.get();
        if let Err(e) = first.preload(&leftover) {
            return Err(Box::pin(protocol_failure(
                stream,
                first,
                ClientTag::new(&self.info, self.log_pooler_errors),
                &e,
            ))
            .await);
        }
        drop(leftover);
        self.pool.stats.flush(&mut first.stats);
        // Parked unless the client already sent a request with its login.
        self.relay.park();
        Ok(())
    }
}
