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

/// Bytes as lowercase hex, for [`ProtocolError::BadHeader`] and the startup phase's
/// own `bad packet header`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A malformed or unacceptable packet from a peer.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// A length field outside what the protocol or our limits allow.
    #[error("invalid packet length {0}")]
    BadLength(usize),
    /// A message header (tag and length) whose length is under the protocol's 4 or
    /// over the configured maximum (`max_packet_size`): PgBouncer's words, with the
    /// header's bytes in hex.
    #[error("bad packet header: '{}'", hex(.0))]
    BadHeader([u8; 5]),
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
