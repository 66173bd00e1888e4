//! Statement names read out of client messages.

use bytes::{Buf, Bytes};

use crate::protocol::header::*;
use crate::protocol::ProtocolError;

/// The statement name in a whole Parse, Bind or Describe-statement (non-empty).
pub(super) fn statement_name(tag: u8, msg: &[u8]) -> Option<&str> {
    std::str::from_utf8(statement_name_bytes(tag, msg)?)
        .ok()
        .filter(|n| !n.is_empty())
}

/// The statement a whole Parse, Bind, or Describe or Close of a statement names, as
/// sent (empty: the unnamed one); `None` for a portal's Describe or Close, or a
/// message cut short.
pub(super) fn statement_name_bytes(tag: u8, msg: &[u8]) -> Option<&[u8]> {
    let body = msg.get(HEADER_LEN..)?;
    let rest = match tag {
        TAG_BIND => {
            let portal_end = body.iter().position(|&b| b == 0)?;
            &body[portal_end + 1..]
        }
        TAG_DESCRIBE | TAG_CLOSE => body.strip_prefix(b"S")?,
        _ => body,
    };
    let end = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..end])
}

/// Reads a NUL-terminated string from the front of `b`.
pub(super) fn take_cstr(b: &mut Bytes) -> Result<Bytes, ProtocolError> {
    let end = b
        .iter()
        .position(|&c| c == 0)
        .ok_or(ProtocolError::Malformed("unterminated string"))?;
    let s = b.split_to(end);
    b.advance(1);
    Ok(s)
}

/// Splits a NUL-terminated string off the front of `b`: the string, and the rest.
pub(super) fn split_cstr(b: &[u8]) -> Result<(&[u8], &[u8]), ProtocolError> {
    let end = b
        .iter()
        .position(|&c| c == 0)
        .ok_or(ProtocolError::Malformed("unterminated string"))?;
    Ok((&b[..end], &b[end + 1..]))
}

pub(super) fn name_of(b: &[u8]) -> Result<&str, ProtocolError> {
    std::str::from_utf8(b).map_err(|_| NOT_UTF8)
}

pub(super) const NOT_UTF8: ProtocolError = ProtocolError::Malformed("statement name is not UTF-8");
