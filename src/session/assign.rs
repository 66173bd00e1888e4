//! Handing a pooled server to a client and taking it back: the links that cancels
//! and the console follow, session parameter sync, and the reset at session end.

use std::sync::Arc;

use super::params;
use super::relay::Relay;
use crate::config::PoolMode;
use crate::pool::{Pool, PoolError, ServerConn};
use crate::protocol::startup::Replication;
use crate::stats::conns::ClientInfo;

/// Records that the client now holds `s`: for cancels, the console and SHOW STATS.
pub(super) fn link_server(info: &ClientInfo, s: &ServerConn, relay: &mut Relay) {
    relay.stats.counts.server_assignments += 1;
    info.link(&s.ident, s.prepared.len() as u32);
}

/// Gets a server (unless `have` one already) and makes its session parameters match
/// the client's.
pub(super) async fn acquire_linked(
    pool: &Arc<Pool>,
    params: &mut params::ClientParams,
    have: Option<ServerConn>,
    on_notice: impl FnMut(),
    replication: Option<Replication>,
) -> Result<ServerConn, PoolError> {
    if let Some(kind) = replication {
        // A connection of its own, its parameters given at startup: a physical
        // replication connection takes no SET.
        let mut extra = params.values().to_vec();
        extra.push(("replication".to_owned(), kind.param().to_owned()));
        if let Some(options) = params.startup_options() {
            extra.push(("options".to_owned(), options.to_owned()));
        }
        return Box::pin(pool.acquire_dedicated(&extra)).await;
    }
    let mut server = match have {
        Some(s) => s,
        None => pool.acquire_noting(on_notice).await?,
    };
    if let Some(sql) = params.sync_sql(&mut server) {
        let timeout = pool.config().internal_timeout();
        if let Err(e) = Box::pin(server.run_internal(&sql, timeout)).await {
            // The server is fine but the client's value was refused; closing it keeps
            // the pool clean, and the client learns why.
            pool.close_lent(server, "invalid server parameter");
            return Err(e);
        }
        // Remembers the match (when the server reports every value it was given).
        params.differs(&mut server);
    }
    Ok(server)
}

/// Returns a server at the end of a client's session: reset and pooled when clean,
/// closed otherwise.
pub(super) async fn finish_server(
    pool: &Arc<Pool>,
    mut server: ServerConn,
    clean: bool,
    mode: PoolMode,
) {
    // The client left in a transaction or with a request under way: no reset can
    // make it clean. PgBouncer's words (since 1.16; "unclean server" before).
    if !clean {
        pool.close_lent(server, "client disconnect while server was not ready");
        return;
    }
    // Not pooled again (a replication client's): no reset; closed with its reason.
    if server.close_needed.is_some() {
        pool.release(server, true);
        return;
    }
    let cfg = pool.config();
    let reset = mode == PoolMode::Session || cfg.server_reset_query_always;
    if reset && !cfg.server_reset_query.trim().is_empty() {
        let timeout = cfg.internal_timeout();
        let reset = {
            // Listed as `tested` meanwhile (pool/resetting.rs), gone before release.
            let _listed = pool.resetting(&server.ident);
            server.run_internal(&cfg.server_reset_query, timeout).await
        };
        if reset.is_err() {
            pool.close_lent(server, "reset query failed");
            return;
        }
        // The reset (DISCARD ALL by default) may have dropped the server's prepared
        // statements; forget them so they are prepared again when needed.
        server.prepared.clear();
    }
    pool.release(server, true);
}
