//! Startup-family packets (F): StartupMessage, SSLRequest, GSSENCRequest, CancelRequest.
//!
//! These have no tag byte: a 4-byte length (counting itself) and a 4-byte code.

use super::ProtocolError;

/// Largest startup packet accepted, as PostgreSQL's `MAX_STARTUP_PACKET_LENGTH`.
pub const MAX_STARTUP_LEN: usize = 10_000;

const CODE_CANCEL: u32 = 80877102;
const CODE_SSL: u32 = 80877103;
const CODE_GSSENC: u32 = 80877104;

/// One parsed startup-family packet.
#[derive(Debug, PartialEq, Eq)]
pub enum StartupPacket {
    /// A StartupMessage: protocol 3.minor and its name/value parameters in order.
    Startup { minor: u16, params: StartupParams },
    /// SSLRequest.
    Ssl,
    /// GSSENCRequest.
    GssEnc,
    /// CancelRequest with the backend key the client was given.
    Cancel { pid: u32, key: u32 },
}

/// Reads the total length from the first 4 bytes, checking the limits before any buffering.
pub fn packet_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if !(8..=MAX_STARTUP_LEN).contains(&len) {
        return Err(ProtocolError::BadLength(len));
    }
    Ok(Some(len))
}

/// A replication connection's kind. Such a client gets a server connection of its
/// own, opened with its `replication` value, for its whole session, as PgBouncer
/// 1.23 on gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `replication=true`: a walsender for physical replication.
    Physical,
    /// `replication=database`: a walsender for logical replication.
    Logical,
}

impl Replication {
    /// The startup parameter's value, as PostgreSQL reads it: None for a plain
    /// client, Err (PostgreSQL's words) for a value it refuses.
    pub fn parse(v: &str) -> Result<Option<Replication>, String> {
        match v.to_ascii_lowercase().as_str() {
            "true" | "on" | "yes" | "1" => Ok(Some(Replication::Physical)),
            "database" => Ok(Some(Replication::Logical)),
            "false" | "off" | "no" | "0" => Ok(None),
            _ => Err(format!(
                "invalid value for parameter \"replication\": \"{v}\""
            )),
        }
    }

    /// The value the server connection is opened with.
    pub fn param(self) -> &'static str {
        match self {
            Replication::Physical => "true",
            Replication::Logical => "database",
        }
    }

    /// Its name in SHOW CLIENTS and SERVERS.
    pub fn name(self) -> &'static str {
        match self {
            Replication::Physical => "physical",
            Replication::Logical => "logical",
        }
    }
}

/// Parses one whole packet (length prefix included).
pub fn parse(packet: &[u8]) -> Result<StartupPacket, ProtocolError> {
    if packet.len() < 8 {
        return Err(ProtocolError::BadLength(packet.len()));
    }
    let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    let body = &packet[8..];
    match code {
        CODE_SSL if body.is_empty() => Ok(StartupPacket::Ssl),
        CODE_GSSENC if body.is_empty() => Ok(StartupPacket::GssEnc),
        CODE_CANCEL if body.len() == 8 => Ok(StartupPacket::Cancel {
            pid: u32::from_be_bytes([body[0], body[1], body[2], body[3]]),
            key: u32::from_be_bytes([body[4], body[5], body[6], body[7]]),
        }),
        CODE_SSL | CODE_GSSENC | CODE_CANCEL => {
            Err(ProtocolError::Malformed("bad request packet length"))
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(ProtocolError::UnsupportedVersion(major, minor));
            }
            Ok(StartupPacket::Startup {
                minor,
                params: parse_params(body)?,
            })
        }
    }
}

/// A StartupMessage's name/value parameters, in the order sent, kept as they came
/// (each string NUL-terminated, checked UTF-8) in one allocation and read in place:
/// a login does not make two strings per parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupParams(Box<str>);

impl StartupParams {
    /// The (name, value) pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut rest = &*self.0;
        std::iter::from_fn(move || Some((next_cstr(&mut rest)?, next_cstr(&mut rest)?)))
    }

    /// The value of the first parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// Parameters as if sent (names must not be empty; no string may hold a NUL).
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> StartupParams {
        let text: String = pairs.iter().map(|(k, v)| format!("{k}\0{v}\0")).collect();
        StartupParams(text.into())
    }
}

/// The string up to the next NUL, and `rest` moved past it. A plain byte loop: the
/// strings are short, shorter than a `memchr` search takes to set up.
fn next_cstr<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let end = rest.bytes().position(|b| b == 0)?;
    let s = &rest[..end];
    *rest = &rest[end + 1..];
    Some(s)
}

/// Parses the NUL-terminated name/value list that ends with an empty name.
fn parse_params(body: &[u8]) -> Result<StartupParams, ProtocolError> {
    let mut rest = body;
    loop {
        let name = take_cstr(&mut rest)?;
        if name.is_empty() {
            if !rest.is_empty() {
                return Err(ProtocolError::Malformed(
                    "trailing bytes after startup parameters",
                ));
            }
            // Everything before the empty name's terminator.
            let list = &body[..body.len() - 1];
            let text = std::str::from_utf8(list)
                .map_err(|_| ProtocolError::Malformed("invalid UTF-8 in startup packet"))?;
            return Ok(StartupParams(text.into()));
        }
        take_cstr(&mut rest)?;
    }
}

fn take_cstr<'a>(body: &mut &'a [u8]) -> Result<&'a [u8], ProtocolError> {
    let end = body
        .iter()
        .position(|&b| b == 0)
        .ok_or(ProtocolError::Malformed(
            "unterminated string in startup packet",
        ))?;
    let s = &body[..end];
    *body = &body[end + 1..];
    Ok(s)
}

/// Builds a CancelRequest packet (F) for forwarding a cancel to a server.
pub fn cancel_request(pid: u32, key: u32) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..4].copy_from_slice(&16u32.to_be_bytes());
    p[4..8].copy_from_slice(&CODE_CANCEL.to_be_bytes());
    p[8..12].copy_from_slice(&pid.to_be_bytes());
    p[12..].copy_from_slice(&key.to_be_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(params: &[(&str, &str)], version: u32) -> Vec<u8> {
        let mut body = version.to_be_bytes().to_vec();
        for (k, v) in params {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut p = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        p.extend(body);
        p
    }

    #[test]
    fn parses_startup_message() {
        let p = startup(&[("user", "bob"), ("database", "db")], 196608);
        assert_eq!(packet_len(&p), Ok(Some(p.len())));
        let Ok(StartupPacket::Startup { minor: 0, params }) = parse(&p) else {
            panic!("not a startup message: {:?}", parse(&p));
        };
        let pairs: Vec<_> = params.iter().collect();
        assert_eq!(pairs, [("user", "bob"), ("database", "db")]);
        assert_eq!(params.get("database"), Some("db"));
        assert_eq!(params.get("options"), None);
        // Empty values, and no parameters at all.
        let p = startup(&[("user", "bob"), ("options", ""), ("x", "")], 196608);
        let Ok(StartupPacket::Startup { params, .. }) = parse(&p) else {
            panic!("not a startup message");
        };
        let pairs: Vec<_> = params.iter().collect();
        assert_eq!(pairs, [("user", "bob"), ("options", ""), ("x", "")]);
        let Ok(StartupPacket::Startup { params, .. }) = parse(&startup(&[], 196608)) else {
            panic!("not a startup message");
        };
        assert_eq!(params.iter().count(), 0);
        // Invalid UTF-8 is refused.
        let p = startup(&[("user", "b\u{e9}b")], 196608);
        let mut bad = p.clone();
        let at = bad.iter().position(|&b| b == 0xc3).unwrap_or(0);
        bad[at] = 0xff;
        assert!(parse(&bad).is_err());
    }

    #[test]
    fn parses_requests() {
        assert_eq!(parse(&[0, 0, 0, 8, 4, 210, 22, 47]), Ok(StartupPacket::Ssl));
        assert_eq!(
            parse(&[0, 0, 0, 8, 4, 210, 22, 48]),
            Ok(StartupPacket::GssEnc)
        );
        assert_eq!(
            parse(&cancel_request(7, 9)),
            Ok(StartupPacket::Cancel { pid: 7, key: 9 })
        );
    }

    #[test]
    fn rejects_bad_input_at_every_truncation() {
        let p = startup(&[("user", "bob")], 196608);
        for n in 0..p.len() {
            let _ = parse(&p[..n]); // must not panic
        }
        assert!(parse(&startup(&[("user", "bob")], 2 << 16)).is_err());
        assert_eq!(packet_len(&[0, 0, 0, 3]), Err(ProtocolError::BadLength(3)));
        assert_eq!(
            packet_len(&[0, 1, 0, 0]),
            Err(ProtocolError::BadLength(65536))
        );
        let mut unterminated = startup(&[("user", "bob")], 196608);
        unterminated.truncate(unterminated.len() - 2);
        assert!(parse(&unterminated).is_err());
    }

    #[test]
    fn reports_newer_minor_version() {
        let p = startup(&[("user", "u")], (3 << 16) | 2);
        assert!(matches!(
            parse(&p),
            Ok(StartupPacket::Startup { minor: 2, .. })
        ));
    }
}
