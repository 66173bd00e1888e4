//! What Sluice notes for a request before the server answers it, and how that is
//! undone when the request fails or the server skips it after an error.

use std::sync::Arc;

use super::responses::{Expect, Kind, ResponseTracker};
use super::{ClientStatements, Evicted, ServerStatements, Statement};

/// Bookkeeping to undo when a request is skipped after an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// The server never prepared this statement.
    ForgetOnServer(u64),
    /// The client's statement was never created either (its own Parse or PREPARE
    /// failed).
    ForgetClientAndServer(String, u64),
    /// A Bind or Describe of this statement: if it fails because DDL changed the
    /// statement's result type, the statement is replaced (see `process_chunk`).
    Stale(Arc<Statement>),
    /// The client's Parse (or SQL-level PREPARE) of a statement the server had: the
    /// name was never bound.
    ForgetClient(String),
    /// The client's Close of a statement: the name stays bound.
    Restore(String, Arc<Statement>),
    /// Sluice's Close of a statement evicted from the server: it is still there.
    Reinstate(Evicted),
}

impl Undo {
    /// Undoes it on the client's names and the server's cache.
    pub fn run(self, client: &mut ClientStatements, server: &mut ServerStatements) {
        match self {
            Undo::ForgetOnServer(id) => server.forget(id),
            Undo::ForgetClientAndServer(name, id) => {
                client.remove(&name);
                server.forget(id);
            }
            Undo::ForgetClient(name) => client.remove(&name),
            Undo::Restore(name, stmt) => {
                client.insert(name, stmt);
            }
            Undo::Reinstate(e) => server.reinstate(e),
            Undo::Stale(_) => {}
        }
    }
}

impl ResponseTracker {
    /// Runs undo actions for a skipped entry.
    pub(super) fn undo(
        u: Option<Undo>,
        client: &mut ClientStatements,
        server: &mut ServerStatements,
    ) {
        if let Some(u) = u {
            u.run(client, server);
        }
    }

    /// Undoes what was noted for a request the server skips, and counts a client's
    /// simple Query or FunctionCall among them: the relay counted a ReadyForQuery
    /// for it that will not come (`skipped_ready`).
    pub(super) fn undo_skipped(
        &mut self,
        e: Expect,
        client: &mut ClientStatements,
        server: &mut ServerStatements,
    ) {
        if matches!(
            e,
            Expect::Forward {
                kind: Kind::UntilReady,
                ..
            }
        ) {
            self.skipped_ready += 1;
        }
        match e {
            Expect::Forward { undo, .. }
            | Expect::Swallow { undo, .. }
            | Expect::Synthesize(_, undo)
            | Expect::Query { undo, .. }
            | Expect::SwallowQuery { undo, .. } => Self::undo(undo, client, server),
            Expect::Refuse { .. } => {}
        }
    }
}
