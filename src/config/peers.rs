//! The `[peers]` section: the other processes of a group sharing a port
//! (`so_reuseport`), to which a cancel request carrying one of their keys is passed on.
//!
//! `<peer_id> = host=... port=... pool_size=...`, as PgBouncer reads it.

use std::path::Path;

use super::databases::parse_pairs;
use super::error::ConfigError;
use super::value::parse_int;

/// The largest `peer_id` (it must fit the 14 bits a cancel key has for it).
pub const MAX_PEER_ID: u16 = 16383;

/// The default port of a peer, as of a listener.
const DEFAULT_PEER_PORT: u16 = 6432;

/// One `[peers]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    pub id: u16,
    /// A host name or address, or a directory holding the peer's UNIX socket.
    pub host: String,
    pub port: u16,
    /// Accepted for PgBouncer's configs: each forwarded cancel uses a connection of
    /// its own, so it limits nothing here.
    pub pool_size: Option<u32>,
}

/// Parses `id = connstr` (line `line` of `file`).
pub(crate) fn parse_peer(
    id: &str,
    connstr: &str,
    file: &Path,
    line: usize,
) -> Result<PeerEntry, ConfigError> {
    let at = |m: String| ConfigError::at(file, line, m);
    let id = match parse_int::<u16>(id) {
        Ok(n) if (1..=MAX_PEER_ID).contains(&n) => n,
        _ => {
            return Err(at(format!(
                "invalid peer id \"{id}\": expected an integer from 1 to {MAX_PEER_ID}"
            )))
        }
    };
    let pairs = parse_pairs(connstr).map_err(|m| {
        at(format!(
            "syntax error in connection string for peer {id}: {m}"
        ))
    })?;
    let mut host = None;
    let mut e = PeerEntry {
        id,
        host: String::new(),
        port: DEFAULT_PEER_PORT,
        pool_size: None,
    };
    for (key, v) in pairs {
        let bad = |why: String| {
            at(format!(
                "invalid value \"{v}\" for {key} in peer {id}: {why}"
            ))
        };
        match key.as_str() {
            "host" => host = Some(v.clone()).filter(|h| !h.is_empty()),
            "port" => e.port = parse_int(&v).map_err(bad)?,
            "pool_size" => e.pool_size = Some(parse_int(&v).map_err(bad)?),
            _ => {
                return Err(at(format!(
                    "unrecognized connection parameter \"{key}\" in peer {id}"
                )))
            }
        }
    }
    e.host = host.ok_or_else(|| at(format!("peer {id} needs a host")))?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, s: &str) -> Result<PeerEntry, String> {
        parse_peer(id, s, Path::new("/etc/x.ini"), 9).map_err(|e| e.to_string())
    }

    #[test]
    fn host_port_and_pool_size() {
        assert_eq!(
            peer("2", "host=/tmp/b port=6433 pool_size=3"),
            Ok(PeerEntry {
                id: 2,
                host: "/tmp/b".into(),
                port: 6433,
                pool_size: Some(3)
            })
        );
        let p = peer("16383", "host=10.0.0.2").unwrap();
        assert_eq!((p.id, p.port, p.pool_size), (16383, 6432, None));
    }

    #[test]
    fn bad_entries_name_the_file_line_and_problem() {
        for (id, s, want) in [
            (
                "0",
                "host=a",
                "invalid peer id \"0\": expected an integer from 1 to 16383",
            ),
            (
                "16384",
                "host=a",
                "invalid peer id \"16384\": expected an integer from 1 to 16383",
            ),
            ("x", "host=a", "invalid peer id \"x\""),
            ("1", "port=6432", "peer 1 needs a host"),
            (
                "1",
                "host=a port=x",
                "invalid value \"x\" for port in peer 1",
            ),
            (
                "1",
                "host=a dbname=b",
                "unrecognized connection parameter \"dbname\" in peer 1",
            ),
            (
                "1",
                "host='a",
                "syntax error in connection string for peer 1",
            ),
        ] {
            let err = peer(id, s).unwrap_err();
            assert!(err.starts_with("/etc/x.ini:9: "), "{err}");
            assert!(err.contains(want), "{id} = {s}: {err}");
        }
    }
}
