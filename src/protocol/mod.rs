//! The PostgreSQL wire format, sans I/O: message headers, the startup-family packets,
//! and builders for the few messages the pooler itself writes.
//!
//! Everything here works on byte slices and `BytesMut`; nothing awaits. Parsers return
//! `Err` on malformed input and never panic on peer bytes.

pub mod backend;
pub mod frontend;
pub mod header;
pub mod sqlstate;
pub mod startup;

#[cfg(test)]
mod hostile_tests;

use thiserror::Error;

/// A malformed or unacceptable packet from a peer.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// A length field outside what the protocol or our limits allow.
    #[error("invalid packet length {0}")]
    BadLength(usize),
    /// A packet whose body does not parse; the text names what is wrong.
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// A protocol version we cannot speak.
    #[error("unsupported protocol version {0}.{1}")]
    UnsupportedVersion(u16, u16),
    /// A message the configuration refuses (`disable_pqexec`); the text is
    /// PgBouncer's reason.
    #[error("{0}")]
    Refused(&'static str),
    /// A message type no client may send once logged in (PgBouncer's reason, as it
    /// tells the client; its log names the type).
    #[error("unknown pkt")]
    UnknownMessage(u8),
}
