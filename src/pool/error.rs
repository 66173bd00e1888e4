//! Why a pool could not lend a server connection.

use crate::protocol::backend::ErrorFields;
use crate::protocol::sqlstate;

/// What the clients are told of a password whose type cannot answer the server's
/// method: PgBouncer's words, which its users (and some applications) know.
pub(crate) const WRONG_TYPE: &str = "wrong password type";

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
    /// Sluice cannot log in to the server with what it has (a password of the wrong
    /// type for the method the server asks, none at all, a mechanism it cannot do).
    /// `client` is what the clients are told, in PgBouncer's words ("server login
    /// failed: wrong password type"); `log` names the cause for the server's log line.
    #[error("server login failed: {client}")]
    Auth { log: String, client: &'static str },
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
    /// A server login Sluice cannot do: `log` for the log line, `client` after
    /// "server login failed: " for the clients.
    pub(crate) fn auth(log: impl Into<String>, client: &'static str) -> PoolError {
        PoolError::Auth {
            log: log.into(),
            client,
        }
    }

    /// The configured password cannot answer `method` (an MD5 hash for SCRAM, a SCRAM
    /// secret for MD5, a hash for a cleartext request).
    pub(crate) fn wrong_type(method: &str) -> PoolError {
        PoolError::auth(
            format!("cannot do {method} authentication: wrong password type"),
            WRONG_TYPE,
        )
    }

    /// The server asks for a password and neither `auth_file`, `auth_query` nor the
    /// database entry gave one for this user.
    pub(crate) fn no_password(method: &str) -> PoolError {
        PoolError::auth(
            format!("cannot do {method} authentication: no password configured for the user"),
            "no password configured",
        )
    }

    pub(crate) fn io(e: std::io::Error) -> PoolError {
        PoolError::Io(e.to_string())
    }

    /// SQLSTATE and message to show the client.
    pub fn client_error(&self) -> (String, String) {
        match self {
            PoolError::Server(f) => (f.code.clone(), f.message.clone()),
            // 08P01 below: PgBouncer's code for every error it ends a client with.
            PoolError::Timeout(m) => (sqlstate::PROTOCOL_VIOLATION.into(), (*m).into()),
            // As a killed client is told (KILL, a removed database); a server login
            // Sluice cannot do is the pooler's configuration, not the client's
            // credentials, so 08P01 as from PgBouncer, not a 28 code.
            PoolError::Auth { .. }
            | PoolError::PoolClosed
            | PoolError::LoginFailing(_)
            | PoolError::ShuttingDown => (sqlstate::PROTOCOL_VIOLATION.into(), self.to_string()),
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
