//! The 5-byte message header (tag + length) shared by both directions after startup.

/// Bytes in a regular message header: one tag byte and a 4-byte length.
pub const HEADER_LEN: usize = 5;

// Backend (B) tags the relay looks at.
pub const TAG_READY_FOR_QUERY: u8 = b'Z';
pub const TAG_PARAMETER_STATUS: u8 = b'S';
pub const TAG_ERROR_RESPONSE: u8 = b'E';
pub const TAG_COMMAND_COMPLETE: u8 = b'C';
pub const TAG_AUTHENTICATION: u8 = b'R';
pub const TAG_BACKEND_KEY_DATA: u8 = b'K';
pub const TAG_NOTICE_RESPONSE: u8 = b'N';
pub const TAG_NOTIFICATION_RESPONSE: u8 = b'A';
pub const TAG_COPY_IN_RESPONSE: u8 = b'G';
pub const TAG_COPY_OUT_RESPONSE: u8 = b'H';
pub const TAG_COPY_BOTH_RESPONSE: u8 = b'W';
pub const TAG_NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
pub const TAG_DATA_ROW: u8 = b'D';
pub const TAG_PARSE_COMPLETE: u8 = b'1';
pub const TAG_BIND_COMPLETE: u8 = b'2';
pub const TAG_CLOSE_COMPLETE: u8 = b'3';
pub const TAG_EMPTY_QUERY_RESPONSE: u8 = b'I';
pub const TAG_PORTAL_SUSPENDED: u8 = b's';
pub const TAG_ROW_DESCRIPTION: u8 = b'T';
pub const TAG_NO_DATA: u8 = b'n';

// Frontend (F) tags the relay looks at.
pub const TAG_QUERY: u8 = b'Q';
pub const TAG_SYNC: u8 = b'S';
pub const TAG_TERMINATE: u8 = b'X';
pub const TAG_FUNCTION_CALL: u8 = b'F';
pub const TAG_PARSE: u8 = b'P';
pub const TAG_BIND: u8 = b'B';
pub const TAG_EXECUTE: u8 = b'E';
pub const TAG_DESCRIBE: u8 = b'D';
pub const TAG_CLOSE: u8 = b'C';
pub const TAG_FLUSH: u8 = b'H';
pub const TAG_COPY_DATA: u8 = b'd';
pub const TAG_COPY_DONE: u8 = b'c';
pub const TAG_COPY_FAIL: u8 = b'f';
pub const TAG_PASSWORD: u8 = b'p';

/// Reads a header from the first 5 bytes of `buf`.
///
/// Returns the tag and the length field (which counts itself but not the tag), or `None`
/// when fewer than 5 bytes are present. A length below 4 is returned as is; callers
/// reject it with [`check_len`].
#[inline]
pub fn parse(buf: &[u8]) -> Option<(u8, u32)> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    Some((buf[0], len))
}

/// Validates a header length against the protocol minimum and a configured maximum.
#[inline]
pub fn check_len(tag: u8, len: u32, max: u32) -> Result<usize, super::ProtocolError> {
    if len < 4 || len > max {
        return Err(bad_header(tag, len));
    }
    Ok(len as usize)
}

/// The error for a header [`check_len`] refuses.
#[cold]
pub fn bad_header(tag: u8, len: u32) -> super::ProtocolError {
    let [a, b, c, d] = len.to_be_bytes();
    super::ProtocolError::BadHeader([tag, a, b, c, d])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_and_rejects_short_input() {
        assert_eq!(parse(b"Z\0\0\0\x05I"), Some((b'Z', 5)));
        for n in 0..5 {
            assert_eq!(parse(&b"Z\0\0\0\x05"[..n]), None);
        }
    }

    #[test]
    fn length_limits() {
        assert!(check_len(b'Q', 3, 100).is_err());
        assert_eq!(
            check_len(b'Q', 101, 100).map_err(|e| e.to_string()),
            Err("bad packet header: '5100000065'".to_owned())
        );
        assert_eq!(check_len(b'Q', 4, 100), Ok(4));
    }
}
