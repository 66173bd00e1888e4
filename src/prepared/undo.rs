//! What Sluice notes for a request before the server answers it, and how that is
//! undone when the request fails or the server skips it after an error.

use std::sync::Arc;

use super::{ClientStatements, Evicted, ServerStatements, Statement};

/// Bookkeeping to undo when a request is skipped after an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// The server never prepared this statement.
    ForgetOnServer(u64),
    /// The client's statement was never created either (its own Parse failed).
    ForgetClientAndServer(String, u64),
    /// The same for an SQL-level PREPARE.
    ForgetSqlClientAndServer(String, u64),
    /// An SQL-level PREPARE of a statement the server keeps for other clients.
    ForgetSqlClient(String),
    /// A Bind or Describe of this statement: if it fails because DDL changed the
    /// statement's result type, the statement is replaced (see `process_chunk`).
    Stale(Arc<Statement>),
    /// The client's Parse of a statement the server had: the name was never bound.
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
            Undo::ForgetSqlClientAndServer(name, id) => {
                client.sql_remove(&name);
                server.forget(id);
            }
            Undo::ForgetClient(name) => client.remove(&name),
            Undo::ForgetSqlClient(name) => client.sql_remove(&name),
            Undo::Restore(name, stmt) => {
                client.insert(name, stmt);
            }
            Undo::Reinstate(e) => server.reinstate(e),
            Undo::Stale(_) => {}
        }
    }
}
