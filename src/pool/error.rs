//! Why a pool could not lend a server connection.

use crate::protocol::backend::ErrorFields;
use crate::protocol::sqlstate;

/// A failure to get or use a server connection.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    /// The socket could not be opened.
    #[error("server connection failed: {0}")]
    Connect(String),
    /// An I/O error on an open server socket.
    #[error("server I/O error: {0}")]
    Io(String),
    /// The server closed the connection.
    #[error("server closed the connection unexpectedly")]
    Closed,
    /// The server answered with an ErrorResponse (login failure, failed reset ...).
    #[error("{}", .0.message)]
    Server(ErrorFields),
    /// Sluice cannot log in with what it has.
    #[error("{0}")]
    Auth(&'static str),
    /// The server broke the protocol.
    #[error("server protocol error: {0}")]
    Protocol(&'static str),
    /// The server answered a login whole, then sent more: almost always its FATAL
    /// error (a backend terminated as it logged in). The login was accepted, so it
    /// is no reason to fail other clients fast (acquire.rs), as in PgBouncer.
    #[error("server closed the connection right after its login")]
    DiedAfterLogin,
    /// A login failed less than `server_login_retry` ago, and no other is tried
    /// yet: what a new client is told, as PgBouncer tells it (applications match on
    /// "server login has been failing" to retry later).
    #[error("server login has been failing, cached error: {} (server_login_retry)", cached_text(.0))]
    LoginFailing(Box<PoolError>),
    /// A shutdown that waits for the servers (SIGINT, `SHUTDOWN WAIT_FOR_SERVERS`)
    /// lends no more: what a client that needs one is told, as PgBouncer tells it.
    #[error("server shutting down")]
    ShuttingDown,
    /// A wait ran out.
    #[error("{0}")]
    Timeout(&'static str),
    /// The pool is closed: its database was removed at a reload, or the pool freed
    /// (an unused auto-database, `pool_idle_timeout`). PgBouncer's words for the
    /// clients of a database it drops.
    #[error("database removed")]
    PoolClosed,
    /// Not a failure: a delegate relayed the answer already (pool/delegate.rs), at
    /// this time and of this many bytes; the waiter handles it before any error path.
    #[error("answer relayed by a delegate")]
    Served(crate::clock::Tick, u32),
}

impl PoolError {
    pub(crate) fn io(e: std::io::Error) -> PoolError {
        PoolError::Io(e.to_string())
    }

    /// SQLSTATE and message to show the client.
    pub fn client_error(&self) -> (String, String) {
        match self {
            PoolError::Server(f) => (f.code.clone(), f.message.clone()),
            // 08P01 below: PgBouncer's code for every error it ends a client with.
            PoolError::Timeout(m) => (sqlstate::PROTOCOL_VIOLATION.into(), (*m).into()),
            PoolError::Auth(m) => (sqlstate::INVALID_AUTHORIZATION.into(), (*m).into()),
            // As a killed client is told (KILL, a removed database).
            PoolError::PoolClosed | PoolError::LoginFailing(_) | PoolError::ShuttingDown => {
                (sqlstate::PROTOCOL_VIOLATION.into(), self.to_string())
            }
            other => (sqlstate::CONNECTION_FAILURE.into(), other.to_string()),
        }
    }
}

/// The cached error as PgBouncer quotes it: a server's own message alone.
fn cached_text(e: &PoolError) -> String {
    match e {
        PoolError::Server(f) => f.message.clone(),
        other => other.to_string(),
    }
}
