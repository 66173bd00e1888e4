//! A request that binds a prepared statement, rewritten while its client waited in
//! line (`prepared/deferred.rs`), in a pipeline: it may go behind another request, and
//! another behind it, when it runs one `SELECT` of a statement the server holds.

use super::super::line::Request;
use super::select_text;
use crate::protocol::header::{TAG_BIND, TAG_DESCRIBE, TAG_EXECUTE, TAG_FLUSH, TAG_SYNC};

/// Whether `r` runs one `SELECT` ([`select_text`]) of the one protocol-level statement
/// it needs: a Bind of it to the unnamed portal first (so nothing is recorded for a
/// replay, which a request behind would overtake), a Describe and an Execute of that
/// portal, Flushes, and one Sync, last. Its statement is its own on any server that
/// holds it (Sluice's server name), whatever the request before it did.
pub(in crate::pool) fn prepared_select(r: &Request) -> bool {
    let [stmt] = r.needs.as_slice() else {
        return false;
    };
    let text = stmt.body.split(|&b| b == 0).next().unwrap_or_default();
    if stmt.sql || !select_text(text) {
        return false;
    }
    let (req, mut at, mut execute) = (&r.bytes[..], 0, 0);
    while let Some(&[tag, a, b, c, d]) = req.get(at..).and_then(|r| r.first_chunk::<5>()) {
        let end = at + 1 + u32::from_be_bytes([a, b, c, d]) as usize;
        let Some(body) = req.get(at + 5..end) else {
            return false;
        };
        let ok = match tag {
            // Portal "", then the statement's server name.
            TAG_BIND => {
                at == 0
                    && body.first() == Some(&0)
                    && body[1..].starts_with(stmt.server_name.as_bytes())
                    && body.get(1 + stmt.server_name.len()) == Some(&0)
            }
            TAG_DESCRIBE => body == [b'P', 0],
            TAG_EXECUTE => {
                execute += 1;
                body.first() == Some(&0)
            }
            TAG_FLUSH => true,
            TAG_SYNC => return end == req.len() && execute == 1,
            _ => false,
        };
        if !ok || at == end {
            return false;
        }
        at = end;
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::{Bytes, BytesMut};

    use super::*;
    use crate::hostile::msg;

    fn request(bytes: Vec<u8>, text: &'static [u8]) -> Box<Request> {
        let registry = crate::prepared::Registry::default();
        let stmt = registry.intern(Bytes::from_static(text));
        let meta = crate::stats::conns::test_meta(1);
        let info = Arc::new(crate::stats::conns::ClientInfo::new(meta));
        let mut r = Request::new(BytesMut::from(&bytes[..]), Arc::default(), info);
        r.needs.push(stmt);
        r
    }

    /// Bind of the first statement of a fresh registry (`SLUICE_1`), as libpq's
    /// `PQexecPrepared` sends it, with `extra` before the Sync.
    fn run(extra: &[Vec<u8>]) -> Vec<u8> {
        let mut req = msg(b'B', b"\0SLUICE_1\0\0\0\0\0\0\0");
        req.extend(msg(b'D', b"P\0"));
        req.extend(msg(b'E', b"\0\0\0\0\0"));
        for e in extra {
            req.extend(e.iter());
        }
        req.extend(msg(b'S', b""));
        req
    }

    #[test]
    fn only_one_select_of_the_statement_it_binds_may_go_in_a_pipeline() {
        let select: &[u8] = b"SELECT abalance FROM pgbench_accounts WHERE aid = $1\0\0\0";
        assert!(prepared_select(&request(run(&[]), select)));
        // Not a SELECT, or two of them, or one that sets a parameter.
        assert!(!prepared_select(&request(
            run(&[]),
            b"UPDATE t SET v = 1\0\0\0"
        )));
        assert!(!prepared_select(&request(
            run(&[]),
            b"SELECT 1; SELECT 2\0\0\0"
        )));
        assert!(!prepared_select(&request(
            run(&[]),
            b"SELECT set_config('a', 'b', false)\0\0\0"
        )));
        // A second Execute, a Bind of another name or after a Describe, no Sync last.
        let twice = run(&[msg(b'E', b"\0\0\0\0\0")]);
        assert!(!prepared_select(&request(twice, select)));
        let other = run(&[])
            .iter()
            .map(|&b| if b == b'1' { b'2' } else { b })
            .collect();
        assert!(!prepared_select(&request(other, select)));
        let mut described = msg(b'D', b"SSLUICE_1\0");
        described.extend(run(&[]));
        assert!(!prepared_select(&request(described, select)));
        let r = run(&[]);
        assert!(!prepared_select(&request(
            r[..r.len() - 5].to_vec(),
            select
        )));
        // No statement needed: not this kind of request.
        let mut none = request(run(&[]), select);
        none.needs.clear();
        assert!(!prepared_select(&none));
    }
}
