//! `FLOOR_PIPELINE=n`: up to n requests of different clients in flight on one
//! server connection. A client first in line whose request is one simple Query of one
//! SELECT (which cannot open a transaction block, so the server is idle again after
//! it) has it sent behind the request the server is working on, if that one is such a
//! request too and, with `FLOOR_PIPE_US`, its client's last query was that quick. The
//! server's answers are split among the clients at each one's ReadyForQuery. The
//! backend then finds its next request waiting when it finishes one, instead of
//! sleeping until the pooler has read the answer and written the next request
//! (docs/performance/rounds-60-79.md, sixty-first round). An experiment: no cancel,
//! no timeouts, and a client that sends more while its request waits behind another
//! is closed.

use std::os::fd::RawFd;

use crate::framer::pipelinable;
use crate::Floor;

impl Floor {
    /// `FLOOR_PIPELINE`: sends the requests of the clients first in line behind the
    /// server's peer's, while they and it are single SELECTs.
    pub(crate) fn top_up(&mut self, server: RawFd) {
        while self.depth > 1 {
            let s = self.conn(server);
            if !s.pipe_ok || s.queue.len() + 1 >= self.depth {
                return;
            }
            let Some(&next) = self.line.front() else {
                return;
            };
            let c = self.conn(next);
            if c.req_syncs != 1 || !pipelinable(&c.req) {
                return;
            }
            self.line.pop_front();
            let c = self.conn(next);
            c.peer = Some(server);
            c.req_syncs = 0;
            let mut req = std::mem::take(&mut c.req);
            self.send(server, &req);
            req.clear();
            self.conn(next).req = req;
            self.conn(server).queue.push_back(next);
        }
    }

    /// `FLOOR_PIPELINE`: server bytes, split among the clients whose requests are in
    /// flight, at each one's ReadyForQuery.
    pub(crate) fn server_piped(&mut self, fd: RawFd, mut d: &[u8]) -> Result<(), ()> {
        while !d.is_empty() {
            let c = self.conn(fd);
            let want = c.pending;
            let (used, readies, status) = c.framer.scan_split(d, want)?;
            c.pending = c.pending.saturating_sub(readies);
            if let Some(s) = status {
                c.status = s;
            }
            let client = c.peer.ok_or(())?;
            let head = self.conn(client).ballast;
            self.ballast.touch(head);
            let part = &d[..used];
            d = &d[used..];
            self.answer(client, part);
            let c = self.conn(fd);
            if c.pending == 0 && c.status == b'I' && c.out.is_empty() {
                let clean = !self.conn(client).unsynced && self.conn(client).req.is_empty();
                if clean {
                    let pipe_us = self.pipe_us;
                    let cc = self.conn(client);
                    cc.peer = None;
                    if let Some(t) = cc.started.take() {
                        cc.fast = t.elapsed().as_micros() < pipe_us;
                    }
                    match self.conn(fd).queue.pop_front() {
                        Some(next) => {
                            let nc = self.conn(next);
                            let fast = pipe_us == 0 || nc.fast;
                            if pipe_us > 0 {
                                nc.started = Some(std::time::Instant::now());
                            }
                            let s = self.conn(fd);
                            s.peer = Some(next);
                            s.pending = 1;
                            s.pipe_ok = fast;
                            self.top_up(fd);
                        }
                        None => self.release(fd),
                    }
                    continue;
                }
            }
            if !d.is_empty() {
                return Err(());
            }
        }
        Ok(())
    }
}
