//! How a relay stops, and when it should.

use std::io;

use crate::protocol::ProtocolError;

/// Why the relay stopped.
#[derive(Debug)]
pub enum Outcome {
    /// The client sent Terminate or closed its socket.
    ClientClosed,
    /// Transaction/statement mode: the server is idle and clean, and may go back.
    /// The end of the server's answer may still be owed to the client
    /// ([`Relay::owes_client`](super::Relay::owes_client)): the server goes back first (docs/architecture.md).
    ReleasePoint,
    /// The server closed or failed.
    ServerClosed(io::Error),
    /// The client failed at the socket level.
    ClientFailed(io::Error),
    /// The client sent bytes that break the protocol.
    ClientProtocol(ProtocolError),
    /// The server sent bytes that break the protocol.
    ServerProtocol(ProtocolError),
    /// A timeout ran out; the text is PgBouncer's reason.
    Timeout(&'static str),
    /// Statement mode: the server entered a transaction block.
    LongTransaction,
}

/// When the relay should hand the server back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAt {
    /// Never (session mode).
    SessionEnd,
    /// When the server is idle outside a transaction.
    TransactionEnd,
    /// After every statement; a transaction block is refused.
    StatementEnd,
    /// Session mode with `server_fast_close`: stop at the end of each transaction so
    /// the session can check whether its server must close.
    SessionCheckpoints,
}
