//! A request held at the gate: PAUSE (of all databases or of the client's), SUSPEND,
//! or a shutdown that lends no more servers.
//!
//! As in PgBouncer, a request that waits on a PAUSE is bounded by the pool's
//! `query_wait_timeout` (its janitor counts paused clients among the waiting ones);
//! one that waits on a SUSPEND is not, since PgBouncer's janitor does nothing while
//! suspended (an online restart must not see clients disappear).

use std::sync::atomic::AtomicBool;

use tokio::sync::watch;

use super::watch_client;
use crate::app::Gate;
use crate::clock::Tick;
use crate::net::Stream;
use crate::pool::{Pool, PoolError};
use crate::session::relay::Relay;

impl super::Session {
    /// Passes the gate: at once when it is open (true if the request waited there
    /// first, to try the common cases again), or the reason no server will be lent:
    /// a shutdown that stops lending, `query_wait_timeout`, or None, the client left.
    pub(super) async fn pass_gate(&mut self, stream: &Stream) -> Result<bool, Option<PoolError>> {
        let mut waited = false;
        let mut gate = self.app().gate_watch();
        let mut deadline = None;
        loop {
            let (stopping, blocks, suspended) = {
                let g = gate.borrow_and_update();
                (g.stopping, g.blocks(&self.pool.key.database), g.suspended)
            };
            if stopping {
                return Err(Some(PoolError::ShuttingDown));
            }
            if !blocks {
                return Ok(waited);
            }
            waited = true;
            // Boxed: rare, and its timer would otherwise add to every request's future.
            let (pool, relay) = (&self.pool, self.relay.get());
            let wait = wait(stream, relay, &mut gate, suspended, &mut deadline, pool);
            match Box::pin(wait).await {
                Opened::Changed => {}
                Opened::Closed => return Ok(waited),
                Opened::TimedOut(e) => return Err(Some(e)),
                Opened::Left => return Err(None),
            }
        }
    }
}

/// How a wait at the gate ended.
enum Opened {
    /// The gate changed: look again.
    Changed,
    /// The gate's sender is gone (the process is ending).
    Closed,
    /// `query_wait_timeout` ran out first.
    TimedOut(PoolError),
    /// The client left meanwhile: its place and count go at once, as a client's
    /// waiting in line do (PgBouncer stops reading a waiting client, and notices
    /// it gone only when its turn comes).
    Left,
}

/// Waits for the gate to change while watching the client, within the `deadline`
/// set at the first wait (from `pool`'s `query_wait_timeout`, none while suspended).
async fn wait(
    stream: &Stream,
    relay: &mut Relay,
    gate: &mut watch::Receiver<Gate>,
    suspended: bool,
    deadline: &mut Option<Tick>,
    pool: &Pool,
) -> Opened {
    let notice = AtomicBool::new(false);
    let changed = std::pin::pin!(changed(gate, suspended, deadline, pool));
    watch_client(stream, relay, || {}, &notice, None, changed)
        .await
        .unwrap_or(Opened::Left)
}

async fn changed(
    gate: &mut watch::Receiver<Gate>,
    suspended: bool,
    deadline: &mut Option<Tick>,
    pool: &Pool,
) -> Opened {
    if deadline.is_none() {
        let qwt = pool.config().query_wait_timeout;
        if !qwt.is_zero() {
            *deadline = Some(Tick::now() + qwt);
        }
    }
    let changed = async {
        match gate.changed().await {
            Ok(()) => Opened::Changed,
            Err(_) => Opened::Closed,
        }
    };
    match *deadline {
        Some(at) if !suspended => match crate::timer::timeout_at(at, changed).await {
            Ok(o) => o,
            Err(_) => Opened::TimedOut(PoolError::Timeout("query_wait_timeout")),
        },
        _ => changed.await,
    }
}
