//! `auth_query` on a server connection: the one query Sluice itself runs for a
//! client, to find the stored secret of a user who is not in `auth_file`.

use std::time::Duration;

use bytes::{Buf, BytesMut};

use super::error::PoolError;
use super::server::ServerState;
use crate::protocol::frontend;

/// Largest message accepted in the answer (a row holds a name and a verifier).
const LOOKUP_MAX_LEN: u32 = 1 << 16;

/// What `auth_query` said of a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// No row: no such user (or one that may not log in).
    NoSuchUser,
    /// A row; its secret column, `None` when NULL (the default query's answer for an
    /// expired role).
    Found(Option<String>),
}

/// Why a lookup failed, beyond the connection's own errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// The query itself failed on the server (bad SQL, no privilege ...).
    #[error("auth_query failed: {0}")]
    Query(String),
    /// The answer was not one row of at least two columns.
    #[error("auth_query {0}")]
    Shape(&'static str),
}

/// Whether a connection can go back to its pool after a lookup: it ended outside a
/// transaction with nothing unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clean(pub bool);

impl ServerState {
    /// Runs `query` with `$1` set to `user` (extended protocol, so the name is never
    /// spliced into SQL) and reads the first row's second column as the secret.
    pub async fn look_up(
        &mut self,
        query: &str,
        user: &str,
        timeout: Duration,
    ) -> (Result<Lookup, LookupError>, Clean) {
        let fut = async {
            let mut out = BytesMut::with_capacity(query.len() + user.len() + 48);
            frontend::query_with_param(&mut out, query, user);
            let mut rows: Vec<Option<String>> = Vec::new();
            let mut short_row = false;
            let answer = self
                .exchange(&out, LOOKUP_MAX_LEN, |row| match second_column(row) {
                    Some(secret) => rows.push(secret),
                    None => short_row = true,
                })
                .await?;
            let clean = Clean(!answer.trailing && answer.status == Some(b'I'));
            let result = if let Some(e) = answer.error {
                Err(LookupError::Query(e.message))
            } else if short_row {
                Err(LookupError::Shape(
                    "must return two columns: name and password",
                ))
            } else if rows.len() > 1 {
                Err(LookupError::Shape("returned more than one row"))
            } else {
                Ok(rows.pop().map_or(Lookup::NoSuchUser, Lookup::Found))
            };
            Ok::<_, LookupError>((result, clean))
        };
        match crate::timer::timeout(timeout, fut).await {
            Ok(Ok((r, clean))) => (r, clean),
            Ok(Err(e)) => (Err(e), Clean(false)),
            Err(_) => (
                Err(PoolError::Timeout("auth_query timed out").into()),
                Clean(false),
            ),
        }
    }
}

/// The second column of a DataRow (`None` inside for NULL); `None` if the row has
/// fewer than two columns or does not parse.
fn second_column(mut body: &[u8]) -> Option<Option<String>> {
    if body.len() < 2 || body.get_i16() < 2 {
        return None;
    }
    let mut value = None;
    for _ in 0..2 {
        if body.len() < 4 {
            return None;
        }
        let len = body.get_i32();
        value = if len < 0 {
            Some(None)
        } else {
            let len = len as usize;
            if body.len() < len {
                return None;
            }
            let v = String::from_utf8_lossy(&body[..len]).into_owned();
            body.advance(len);
            Some(Some(v))
        };
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn row(cols: &[Option<&str>]) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i16(cols.len() as i16);
        for c in cols {
            match c {
                Some(s) => {
                    b.put_i32(s.len() as i32);
                    b.extend_from_slice(s.as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
        b.to_vec()
    }

    #[test]
    fn second_column_reads_value_null_and_refuses_short_rows() {
        assert_eq!(
            second_column(&row(&[Some("al"), Some("md5abc")])),
            Some(Some("md5abc".into()))
        );
        assert_eq!(second_column(&row(&[Some("al"), None])), Some(None));
        assert_eq!(
            second_column(&row(&[None, Some("x"), Some("extra")])),
            Some(Some("x".into()))
        );
        assert_eq!(second_column(&row(&[Some("al")])), None);
        // Lengths past the end of the message, negative counts, nothing at all.
        let mut bad = row(&[Some("al"), Some("secret")]);
        bad.truncate(bad.len() - 2);
        assert_eq!(second_column(&bad), None);
        assert_eq!(second_column(&[0xff, 0xff]), None);
        assert_eq!(second_column(&[]), None);
    }
}
