//! A PostgreSQL server in miniature, for the conversation fuzz target: it answers the
//! frontend messages it is sent as PostgreSQL does in what a pooler follows (the
//! answers' kinds and order, ReadyForQuery and its transaction status, skipping to
//! the next Sync after an extended-protocol error, named statements), and nothing
//! else: no rows, no COPY, one statement per Query.

use std::collections::HashMap;

/// The model's state: the bytes it has not yet read whole, and the session's.
#[derive(Debug)]
pub struct Model {
    unread: Vec<u8>,
    /// ReadyForQuery's status byte: `I`, `T` or `E`.
    status: u8,
    /// After an error in an extended-protocol message, until the next Sync.
    skipping: bool,
    /// Prepared statements by name (the unnamed one is ""): their text.
    statements: HashMap<Vec<u8>, Vec<u8>>,
    /// The unnamed portal's statement text, once bound.
    portal: Option<Vec<u8>>,
    /// Messages since the last one answered by a ReadyForQuery.
    since_ready: u32,
    /// It has closed the connection (a Terminate, or a message it cannot read).
    pub closed: bool,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            unread: Vec::new(),
            status: b'I',
            skipping: false,
            statements: HashMap::new(),
            portal: None,
            since_ready: 0,
            closed: false,
        }
    }
}

/// The text of a message body's NUL-terminated string at `at`, and where it ends.
fn cstr(body: &[u8], at: usize) -> (&[u8], usize) {
    let rest = body.get(at..).unwrap_or(&[]);
    match rest.iter().position(|&b| b == 0) {
        Some(n) => (&rest[..n], at + n + 1),
        None => (rest, body.len()),
    }
}

fn message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

fn error(out: &mut Vec<u8>, code: &str, text: &str) {
    let body = format!("SERROR\0C{code}\0M{text}\0\0");
    message(out, b'E', body.as_bytes());
}

impl Model {
    /// Whether it is idle, every message it was sent answered by a ReadyForQuery `I`:
    /// a pooler in transaction mode must have let it go.
    pub fn idle(&self) -> bool {
        !self.closed && self.unread.is_empty() && self.since_ready == 0 && self.status == b'I'
    }

    /// Whether every message it read was answered up to a ReadyForQuery (whatever
    /// the transaction status). (The relay's tests ask; the fuzz targets do not.)
    #[cfg(test)]
    pub fn settled(&self) -> bool {
        self.unread.is_empty() && self.since_ready == 0
    }

    /// Reads `bytes` and appends its answers to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.unread.extend_from_slice(bytes);
        let mut at = 0;
        while !self.closed {
            let Some(head) = self.unread.get(at..at + 5) else {
                break;
            };
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if !(4..=1 << 20).contains(&len) {
                error(out, "08P01", "invalid message length");
                self.closed = true;
                break;
            }
            let Some(body) = self.unread.get(at + 5..at + 1 + len) else {
                break;
            };
            let (tag, body) = (head[0], body.to_vec());
            at += 1 + len;
            self.one(tag, &body, out);
        }
        self.unread.drain(..at.min(self.unread.len()));
    }

    fn one(&mut self, tag: u8, body: &[u8], out: &mut Vec<u8>) {
        self.since_ready += 1;
        if tag == b'S' {
            self.skipping = false;
        }
        if self.skipping {
            return;
        }
        match tag {
            b'Q' => {
                let text = cstr(body, 0).0.to_vec();
                if text.is_empty() {
                    message(out, b'I', b"");
                } else {
                    // An error in a Query does not start a skip to Sync.
                    let _ = self.run(&text, out);
                }
                self.ready(out);
            }
            b'P' => {
                let (name, at) = cstr(body, 0);
                let text = cstr(body, at).0;
                if self.aborted(text) {
                    self.fail(out, "25P02", "current transaction is aborted");
                } else if !name.is_empty() && self.statements.contains_key(name) {
                    self.fail(out, "42P05", "prepared statement already exists");
                } else if text.starts_with(b"ERR") {
                    self.fail(out, "42601", "syntax error");
                } else {
                    self.statements.insert(name.to_vec(), text.to_vec());
                    message(out, b'1', b"");
                }
            }
            b'B' => {
                let (_, at) = cstr(body, 0);
                let stmt = cstr(body, at).0;
                match self.statements.get(stmt) {
                    Some(text) if self.aborted(text) => {
                        self.fail(out, "25P02", "current transaction is aborted");
                    }
                    Some(text) => {
                        self.portal = Some(text.clone());
                        message(out, b'2', b"");
                    }
                    None => self.fail(out, "26000", "prepared statement does not exist"),
                }
            }
            b'D' => {
                let kind = body.first().copied();
                let name = cstr(body, 1).0;
                match kind {
                    Some(b'S') if self.statements.contains_key(name) => {
                        message(out, b't', &[0, 0]);
                        message(out, b'n', b"");
                    }
                    Some(b'P') if name.is_empty() && self.portal.is_some() => {
                        message(out, b'n', b"");
                    }
                    _ => self.fail(out, "34000", "no such statement or portal"),
                }
            }
            b'E' => match self.portal.clone() {
                Some(text) => {
                    if self.run(&text, out).is_err() {
                        self.skipping = true;
                    }
                }
                None => self.fail(out, "34000", "portal does not exist"),
            },
            b'C' => {
                if body.first() == Some(&b'S') {
                    self.statements.remove(cstr(body, 1).0);
                } else {
                    self.portal = None;
                }
                message(out, b'3', b"");
            }
            b'S' => {
                self.portal = None;
                self.ready(out);
            }
            b'F' => {
                message(out, b'V', &(-1i32).to_be_bytes());
                self.ready(out);
            }
            // Flush: the model answers at once anyway. CopyData, CopyDone, CopyFail
            // outside a COPY: PostgreSQL ignores them.
            b'H' | b'd' | b'c' | b'f' => {}
            b'X' => self.closed = true,
            _ => {
                error(out, "08P01", "invalid frontend message type");
                self.closed = true;
            }
        }
    }

    /// PostgreSQL refuses a Parse or Bind in a failed transaction, but of a
    /// statement that ends it.
    fn aborted(&self, text: &[u8]) -> bool {
        self.status == b'E' && !text.starts_with(b"COMMIT") && !text.starts_with(b"ROLLBACK")
    }

    /// An error in an extended-protocol message: skip to the next Sync.
    fn fail(&mut self, out: &mut Vec<u8>, code: &str, text: &str) {
        error(out, code, text);
        self.skipping = true;
        if self.status == b'T' {
            self.status = b'E';
        }
    }

    /// Runs one statement: its CommandComplete, or an error.
    fn run(&mut self, text: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
        let ends = text.starts_with(b"COMMIT") || text.starts_with(b"ROLLBACK");
        if text.starts_with(b"ERR") || (self.status == b'E' && !ends) {
            error(
                out,
                "25P02",
                "current transaction is aborted or a syntax error",
            );
            if self.status == b'T' {
                self.status = b'E';
            }
            return Err(());
        }
        let tag: &[u8] = if text.starts_with(b"BEGIN") {
            self.status = b'T';
            b"BEGIN\0"
        } else if ends {
            self.status = b'I';
            b"COMMIT\0"
        } else {
            b"SELECT 1\0"
        };
        message(out, b'C', tag);
        Ok(())
    }

    fn ready(&mut self, out: &mut Vec<u8>) {
        message(out, b'Z', &[self.status]);
        self.since_ready = 0;
    }
}
