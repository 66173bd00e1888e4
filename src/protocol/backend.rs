//! Backend (B) messages: builders for what the pooler sends to clients, and parsers for
//! the few server messages whose bodies the pooler must read.

use bytes::{BufMut, BytesMut};

use super::ProtocolError;

/// Starts a message with `tag` and a placeholder length; returns the length's offset.
pub(crate) fn begin(buf: &mut BytesMut, tag: u8) -> usize {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    at
}

/// Back-patches the length of a message begun with [`begin`].
pub(crate) fn finish(buf: &mut BytesMut, at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Appends `s` NUL-terminated.
pub(crate) fn put_cstr(buf: &mut BytesMut, s: &str) {
    // A NUL inside would corrupt framing; PostgreSQL strings cannot hold one.
    let s = s.as_bytes();
    if s.contains(&0) {
        buf.extend(s.iter().filter(|&&b| b != 0));
    } else {
        buf.extend_from_slice(s);
    }
    buf.put_u8(0);
}

/// ErrorResponse or NoticeResponse with severity, SQLSTATE and message.
pub fn error_response(buf: &mut BytesMut, severity: &str, code: &str, message: &str) {
    notice_like(buf, b'E', severity, code, message);
}

/// NoticeResponse.
pub fn notice_response(buf: &mut BytesMut, severity: &str, code: &str, message: &str) {
    notice_like(buf, b'N', severity, code, message);
}

fn notice_like(buf: &mut BytesMut, tag: u8, severity: &str, code: &str, message: &str) {
    let at = begin(buf, tag);
    buf.put_u8(b'S');
    put_cstr(buf, severity);
    buf.put_u8(b'V');
    put_cstr(buf, severity);
    buf.put_u8(b'C');
    put_cstr(buf, code);
    buf.put_u8(b'M');
    put_cstr(buf, message);
    buf.put_u8(0);
    finish(buf, at);
}

/// Authentication request of the given code with an optional payload.
pub fn authentication(buf: &mut BytesMut, code: u32, payload: &[u8]) {
    let at = begin(buf, b'R');
    buf.put_u32(code);
    buf.extend_from_slice(payload);
    finish(buf, at);
}

pub const AUTH_OK: u32 = 0;
pub const AUTH_CLEARTEXT: u32 = 3;
pub const AUTH_MD5: u32 = 5;
pub const AUTH_SASL: u32 = 10;
pub const AUTH_SASL_CONTINUE: u32 = 11;
pub const AUTH_SASL_FINAL: u32 = 12;

/// AuthenticationSASL offering SCRAM-SHA-256 only.
pub fn auth_sasl_scram(buf: &mut BytesMut) {
    authentication(buf, AUTH_SASL, b"SCRAM-SHA-256\0\0");
}

/// ParameterStatus.
pub fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    let at = begin(buf, b'S');
    put_cstr(buf, name);
    put_cstr(buf, value);
    finish(buf, at);
}

/// BackendKeyData.
pub fn backend_key_data(buf: &mut BytesMut, pid: u32, key: u32) {
    let at = begin(buf, b'K');
    buf.put_u32(pid);
    buf.put_u32(key);
    finish(buf, at);
}

/// ReadyForQuery with a transaction status byte (`I`, `T` or `E`).
pub fn ready_for_query(buf: &mut BytesMut, status: u8) {
    let at = begin(buf, b'Z');
    buf.put_u8(status);
    finish(buf, at);
}

/// NegotiateProtocolVersion: the newest minor we speak and the options we did not know.
pub fn negotiate_protocol_version(buf: &mut BytesMut, minor: u32, unknown: &[&str]) {
    let at = begin(buf, b'v');
    buf.put_u32(minor);
    buf.put_u32(unknown.len() as u32);
    for o in unknown {
        put_cstr(buf, o);
    }
    finish(buf, at);
}

/// The fields of an ErrorResponse or NoticeResponse that the pooler needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

/// Parses the body (after the header) of an ErrorResponse/NoticeResponse.
pub fn parse_error_fields(mut body: &[u8]) -> Result<ErrorFields, ProtocolError> {
    let mut f = ErrorFields::default();
    while let Some((&kind, rest)) = body.split_first() {
        if kind == 0 {
            return Ok(f);
        }
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ProtocolError::Malformed("unterminated error field"))?;
        let value = String::from_utf8_lossy(&rest[..end]).into_owned();
        match kind {
            b'S' if f.severity.is_empty() => f.severity = value,
            b'V' => f.severity = value,
            b'C' => f.code = value,
            b'M' => f.message = value,
            _ => {}
        }
        body = &rest[end + 1..];
    }
    Err(ProtocolError::Malformed("error fields not terminated"))
}

/// Parses a ParameterStatus body into name and value.
pub fn parse_parameter_status(body: &[u8]) -> Result<(&str, &str), ProtocolError> {
    let mut parts = body.split(|&b| b == 0);
    let name = parts
        .next()
        .ok_or(ProtocolError::Malformed("ParameterStatus"))?;
    let value = parts
        .next()
        .ok_or(ProtocolError::Malformed("ParameterStatus"))?;
    let as_str = |b| {
        std::str::from_utf8(b).map_err(|_| ProtocolError::Malformed("ParameterStatus not UTF-8"))
    };
    Ok((as_str(name)?, as_str(value)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_response_round_trips() {
        let mut b = BytesMut::new();
        error_response(&mut b, "FATAL", "08P01", "bad");
        assert_eq!(b[0], b'E');
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        assert_eq!(len + 1, b.len());
        let f = parse_error_fields(&b[5..]).unwrap();
        assert_eq!(
            (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
            ("FATAL", "08P01", "bad")
        );
    }

    #[test]
    fn error_fields_reject_truncation_without_panic() {
        let mut b = BytesMut::new();
        error_response(&mut b, "ERROR", "XX000", "m");
        for n in 5..b.len() - 1 {
            assert!(parse_error_fields(&b[5..n]).is_err());
        }
    }

    #[test]
    fn parameter_status_round_trips() {
        let mut b = BytesMut::new();
        parameter_status(&mut b, "TimeZone", "UTC");
        assert_eq!(
            parse_parameter_status(&b[5..]).unwrap(),
            ("TimeZone", "UTC")
        );
        assert!(parse_parameter_status(b"x").is_err());
    }

    #[test]
    fn ready_for_query_bytes() {
        let mut b = BytesMut::new();
        ready_for_query(&mut b, b'I');
        assert_eq!(&b[..], b"Z\0\0\0\x05I");
    }
}
