//! Frontend (F) messages the pooler writes to servers: startup, passwords, queries.

use bytes::{BufMut, BytesMut};

/// StartupMessage for protocol 3.0 with the given parameters.
pub fn startup_message(buf: &mut BytesMut, params: &[(&str, &str)]) {
    let at = buf.len();
    buf.put_u32(0);
    buf.put_u32(196608);
    for (k, v) in params {
        put_cstr(buf, k);
        put_cstr(buf, v);
    }
    buf.put_u8(0);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.extend(s.bytes().filter(|&b| b != 0));
    buf.put_u8(0);
}

fn tagged(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// PasswordMessage with a NUL-terminated string (cleartext or md5).
pub fn password_message(buf: &mut BytesMut, password: &str) {
    tagged(buf, b'p', |b| put_cstr(b, password));
}

/// SASLInitialResponse for a mechanism with its initial data.
pub fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    tagged(buf, b'p', |b| {
        put_cstr(b, mechanism);
        b.put_i32(data.len() as i32);
        b.extend_from_slice(data);
    });
}

/// SASLResponse.
pub fn sasl_response(buf: &mut BytesMut, data: &[u8]) {
    tagged(buf, b'p', |b| b.extend_from_slice(data));
}

/// Simple Query.
pub fn query(buf: &mut BytesMut, sql: &str) {
    tagged(buf, b'Q', |b| put_cstr(b, sql));
}

/// An unnamed statement run once with one text parameter: Parse, Bind, Execute
/// (all rows) and Sync, as PgBouncer sends `auth_query`. The parameter travels
/// apart from the SQL text, so no quoting is involved.
pub fn query_with_param(buf: &mut BytesMut, sql: &str, param: &str) {
    tagged(buf, b'P', |b| {
        put_cstr(b, "");
        put_cstr(b, sql);
        b.put_i16(0);
    });
    tagged(buf, b'B', |b| {
        put_cstr(b, "");
        put_cstr(b, "");
        b.put_i16(0);
        b.put_i16(1);
        b.put_i32(param.len() as i32);
        b.extend_from_slice(param.as_bytes());
        b.put_i16(0);
    });
    tagged(buf, b'E', |b| {
        put_cstr(b, "");
        b.put_i32(0);
    });
    tagged(buf, b'S', |_| {});
}

/// Terminate.
pub fn terminate(buf: &mut BytesMut) {
    tagged(buf, b'X', |_| {});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_with_param_bytes() {
        let mut b = BytesMut::new();
        query_with_param(&mut b, "SELECT $1", "al");
        let want: &[u8] = b"P\0\0\0\x11\0SELECT $1\0\0\0\
            B\0\0\0\x12\0\0\0\0\0\x01\0\0\0\x02al\0\0\
            E\0\0\0\x09\0\0\0\0\0\
            S\0\0\0\x04";
        assert_eq!(&b[..], want);
    }

    #[test]
    fn query_bytes() {
        let mut b = BytesMut::new();
        query(&mut b, "SELECT 1");
        assert_eq!(&b[..], b"Q\0\0\0\x0dSELECT 1\0");
    }

    #[test]
    fn startup_length_counts_itself() {
        let mut b = BytesMut::new();
        startup_message(&mut b, &[("user", "u")]);
        assert_eq!(
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize,
            b.len()
        );
        assert_eq!(b.last(), Some(&0));
    }
}
