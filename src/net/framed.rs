//! Whole-message reads for the slow paths (login, reset, the console): the relay's hot
//! path never uses these.

use std::io;

use bytes::BytesMut;

use super::Stream;
use crate::protocol::header::{self, HEADER_LEN};
use crate::protocol::ProtocolError;

/// Why a whole-message read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("connection closed")]
    Eof,
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
}

/// Reads one tagged message, buffering in `buf` (which may hold bytes of later
/// messages afterwards). Returns the tag and the body without the header.
///
/// # Cancel safety
/// Partial input stays in `buf`, so a cancelled call loses nothing.
pub async fn read_message(
    stream: &Stream,
    buf: &mut BytesMut,
    max_len: u32,
) -> Result<(u8, BytesMut), ReadError> {
    loop {
        if let Some((tag, len)) = header::parse(buf) {
            let len = header::check_len(tag, len, max_len)?;
            if buf.len() > len {
                let mut msg = buf.split_to(len + 1);
                let body = msg.split_off(HEADER_LEN);
                return Ok((tag, body));
            }
            buf.reserve(len + 1 - buf.len());
        } else {
            buf.reserve(1024);
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadError::Eof);
        }
    }
}
