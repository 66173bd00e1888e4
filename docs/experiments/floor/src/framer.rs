//! Message headers, followed without reading bodies; the startup packet's user.

/// Follows message boundaries in one direction, headers only.
#[derive(Default)]
pub(crate) struct Framer {
    /// Body bytes of the current message not yet seen.
    skip: u32,
    /// Header bytes gathered so far (a header may straddle reads).
    hdr: [u8; 5],
    have: u8,
    /// The next body byte is ReadyForQuery's status.
    want_status: bool,
}

/// What one scan of client or server bytes found.
#[derive(Default)]
pub(crate) struct Seen {
    /// Client: Query, Sync and FunctionCall, each owed a ReadyForQuery.
    pub(crate) syncs: u32,
    /// Client: a message other than those since the last of them.
    pub(crate) unsynced: Option<bool>,
    pub(crate) terminate: bool,
    /// Server: ReadyForQuery messages, and the last one's status.
    pub(crate) readies: u32,
    pub(crate) status: Option<u8>,
}

impl Framer {
    pub(crate) fn scan(&mut self, mut d: &[u8], server: bool, seen: &mut Seen) -> Result<(), ()> {
        while !d.is_empty() {
            if self.skip > 0 {
                if self.want_status {
                    seen.status = Some(d[0]);
                    self.want_status = false;
                }
                let n = (self.skip as usize).min(d.len());
                self.skip -= n as u32;
                d = &d[n..];
                continue;
            }
            let have = self.have as usize;
            let n = (5 - have).min(d.len());
            self.hdr[have..have + n].copy_from_slice(&d[..n]);
            self.have += n as u8;
            d = &d[n..];
            if self.have < 5 {
                break;
            }
            self.have = 0;
            let len = u32::from_be_bytes([self.hdr[1], self.hdr[2], self.hdr[3], self.hdr[4]]);
            if len < 4 {
                return Err(());
            }
            self.skip = len - 4;
            match (server, self.hdr[0]) {
                (true, b'Z') => {
                    seen.readies += 1;
                    self.want_status = true;
                }
                (false, b'Q' | b'S' | b'F') => {
                    seen.syncs += 1;
                    seen.unsynced = Some(false);
                }
                (false, b'X') => seen.terminate = true,
                (false, _) => seen.unsynced = Some(true),
                _ => {}
            }
        }
        Ok(())
    }
}

impl Framer {
    /// Server bytes: follows `d` until `want` ReadyForQuery messages have ended (their
    /// status byte included), and says how many bytes that took, how many ended, and
    /// the last one's status. `want` 0: the whole of `d`.
    pub(crate) fn scan_split(
        &mut self,
        d: &[u8],
        want: u32,
    ) -> Result<(usize, u32, Option<u8>), ()> {
        let mut at = 0;
        let mut readies = 0;
        let mut status = None;
        while at < d.len() {
            if self.skip > 0 {
                if self.want_status {
                    status = Some(d[at]);
                    self.want_status = false;
                    self.skip -= 1;
                    at += 1;
                    readies += 1;
                    if want > 0 && readies == want && self.skip == 0 {
                        return Ok((at, readies, status));
                    }
                    continue;
                }
                let n = (self.skip as usize).min(d.len() - at);
                self.skip -= n as u32;
                at += n;
                continue;
            }
            let have = self.have as usize;
            let n = (5 - have).min(d.len() - at);
            self.hdr[have..have + n].copy_from_slice(&d[at..at + n]);
            self.have += n as u8;
            at += n;
            if self.have < 5 {
                break;
            }
            self.have = 0;
            let len = u32::from_be_bytes([self.hdr[1], self.hdr[2], self.hdr[3], self.hdr[4]]);
            if len < 4 {
                return Err(());
            }
            self.skip = len - 4;
            if self.hdr[0] == b'Z' {
                if self.skip == 0 {
                    return Err(());
                }
                self.want_status = true;
            }
        }
        Ok((at, readies, status))
    }
}

/// Whether a buffered request may go to a server behind another client's: one whole
/// simple Query, one statement, starting with SELECT (so it cannot open a transaction
/// block, and ends with ReadyForQuery `I`).
pub(crate) fn pipelinable(req: &[u8]) -> bool {
    let Some(&[b'Q', a, b, c, d]) = req.first_chunk::<5>() else {
        return false;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len + 1 != req.len() || len < 5 {
        return false;
    }
    let body = &req[5..req.len() - 1];
    let t = body.trim_ascii_start();
    if t.len() < 6 || !t[..6].eq_ignore_ascii_case(b"select") {
        return false;
    }
    match t.iter().position(|&b| b == b';') {
        None => true,
        Some(i) => t[i + 1..].iter().all(|b| b.is_ascii_whitespace()),
    }
}

/// The `user` parameter of a startup packet's body (after the protocol version).
pub(crate) fn startup_user(mut body: &[u8]) -> Option<String> {
    let mut next = || {
        let end = body.iter().position(|&b| b == 0)?;
        let s = String::from_utf8_lossy(&body[..end]).into_owned();
        body = &body[end + 1..];
        Some(s)
    };
    loop {
        let key = next()?;
        let value = next()?;
        if key == "user" {
            return Some(value);
        }
    }
}
