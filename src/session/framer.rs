//! Follows message boundaries in a relayed byte stream that arrives in arbitrary chunks,
//! looking only at headers, without copying bodies (except the few it must read).
//!
//! The relay forwards each chunk as it came; the framer only reports where messages
//! start and, for messages it asked to capture, their bodies.

use crate::protocol::header::HEADER_LEN;
use crate::protocol::ProtocolError;

/// What to do with a message's body, decided when its header is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Let it stream past.
    Skip,
    /// Deliver the whole body in [`Event::Complete`] (small messages only).
    Capture,
}

/// Something the framer saw.
#[derive(Debug)]
pub enum Event<'a> {
    /// A message header. `at` is the header's offset in this chunk, or `None` when the
    /// header began in an earlier chunk.
    Start {
        tag: u8,
        len: usize,
        at: Option<usize>,
    },
    /// The body of a captured message.
    Complete { tag: u8, body: &'a [u8] },
}

/// Largest body the framer will capture; bigger captured messages are skipped.
const MAX_CAPTURE: usize = 64 * 1024;

/// Per-direction framing state. Cheap: a few words plus a capture buffer that is
/// allocated only when a captured message spans chunks.
#[derive(Debug, Default)]
// The rarely used capture buffer last (`repr(C)`): see `relay::Relay`.
#[repr(C)]
pub struct Framer {
    header_len: usize,
    /// Body bytes still to come for the current message.
    remaining: usize,
    header: [u8; HEADER_LEN],
    tag: u8,
    capturing: bool,
    capture: Vec<u8>,
}

impl Framer {
    /// Whether the stream is at a message boundary.
    pub fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.remaining == 0
    }

    /// Whether the stream is inside the body of a `tag` message (its `Start` reported).
    pub fn in_body_of(&self, tag: u8) -> bool {
        self.header_len == 0 && self.remaining > 0 && self.tag == tag
    }

    /// Header bytes seen of a message whose header is not complete yet.
    pub fn partial_header_len(&self) -> usize {
        self.header_len
    }

    /// Where the first `want` message to end in `data` ends (the offset after it),
    /// `data` following on from what this framer has seen; the framer is unchanged.
    pub fn end_of_first(&self, data: &[u8], want: u8) -> Option<usize> {
        let (mut header, mut have) = (self.header, self.header_len);
        let (mut remaining, mut tag, mut pos) = (self.remaining, self.tag, 0);
        loop {
            if remaining > 0 {
                let take = remaining.min(data.len() - pos);
                remaining -= take;
                pos += take;
                if remaining > 0 {
                    return None;
                }
                if tag == want {
                    return Some(pos);
                }
            }
            let take = (HEADER_LEN - have).min(data.len() - pos);
            header[have..have + take].copy_from_slice(&data[pos..pos + take]);
            have += take;
            pos += take;
            if have < HEADER_LEN {
                return None;
            }
            have = 0;
            tag = header[0];
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            remaining = len.checked_sub(4)?;
            if remaining == 0 && tag == want {
                return Some(pos);
            }
        }
    }

    /// Feeds one chunk. `on` is called for each event and returns the body treatment
    /// for `Start` events (ignored for others). `max_len` bounds the length field.
    pub fn feed<F>(&mut self, data: &[u8], max_len: u32, mut on: F) -> Result<(), ProtocolError>
    where
        F: FnMut(Event<'_>) -> Body,
    {
        let mut pos = 0;
        while pos < data.len() {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len() - pos);
                if self.capturing {
                    self.capture.extend_from_slice(&data[pos..pos + take]);
                }
                self.remaining -= take;
                pos += take;
                if self.remaining == 0 && self.capturing {
                    self.capturing = false;
                    let body = std::mem::take(&mut self.capture);
                    on(Event::Complete {
                        tag: self.tag,
                        body: &body,
                    });
                    self.capture = body;
                    self.capture.clear();
                }
                continue;
            }
            // At a header: fast path when the whole header is in this chunk.
            let start = pos;
            let (tag, len, at) = if self.header_len == 0 && data.len() - pos >= HEADER_LEN {
                let h = &data[pos..pos + HEADER_LEN];
                pos += HEADER_LEN;
                (
                    h[0],
                    u32::from_be_bytes([h[1], h[2], h[3], h[4]]),
                    Some(start),
                )
            } else {
                let take = (HEADER_LEN - self.header_len).min(data.len() - pos);
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&data[pos..pos + take]);
                let began_here = self.header_len == 0;
                self.header_len += take;
                pos += take;
                if self.header_len < HEADER_LEN {
                    continue;
                }
                self.header_len = 0;
                let h = self.header;
                (
                    h[0],
                    u32::from_be_bytes([h[1], h[2], h[3], h[4]]),
                    began_here.then_some(start),
                )
            };
            if len < 4 || len > max_len {
                return Err(crate::protocol::header::bad_header(tag, len));
            }
            let body_len = len as usize - 4;
            self.tag = tag;
            let want = on(Event::Start {
                tag,
                len: body_len,
                at,
            });
            if want == Body::Capture && body_len <= MAX_CAPTURE {
                if data.len() - pos >= body_len {
                    on(Event::Complete {
                        tag,
                        body: &data[pos..pos + body_len],
                    });
                    pos += body_len;
                    continue;
                }
                self.capturing = true;
                self.capture.clear();
                self.capture.reserve(body_len);
            }
            self.remaining = body_len;
            if body_len == 0 && self.capturing {
                self.capturing = false;
                on(Event::Complete { tag, body: &[] });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::hostile::msg;

    #[test]
    fn finds_where_the_first_ready_for_query_ends_wherever_the_stream_was_cut() {
        let mut stream = msg(b'D', b"\0\x01\0\0\0\x01Z");
        stream.extend(msg(b'Z', b"I"));
        let end = stream.len();
        stream.extend(msg(b'T', b"\0\0"));
        stream.extend(msg(b'Z', b"T"));
        for cut in 0..stream.len() {
            let mut f = Framer::default();
            f.feed(&stream[..cut], 1 << 20, |_| Body::Skip).unwrap();
            let found = f.end_of_first(&stream[cut..], b'Z');
            // (Past the first, the second is the first to end in what is left.)
            let want = Some(if cut < end {
                end - cut
            } else {
                stream.len() - cut
            });
            assert_eq!(found, want, "cut at {cut}");
            // Nothing changed: the same answer again.
            assert_eq!(f.end_of_first(&stream[cut..], b'Z'), want);
        }
        assert_eq!(
            Framer::default().end_of_first(&stream[..end - 1], b'Z'),
            None
        );
    }

    #[test]
    fn knows_when_it_is_inside_a_body_whose_header_it_reported() {
        let z = msg(b'Z', b"I");
        for cut in 0..z.len() {
            let mut f = Framer::default();
            f.feed(&z[..cut], 1 << 20, |_| Body::Skip).unwrap();
            // Only once the header is through (the Start reported) and before the end.
            assert_eq!(f.in_body_of(b'Z'), cut == HEADER_LEN, "cut {cut}");
            assert!(!f.in_body_of(b'C'));
        }
    }

    #[test]
    fn same_events_at_every_split_point() {
        let mut s = msg(b'D', b"row data here");
        s.extend(msg(b'S', b"TimeZone\0UTC\0"));
        s.extend(msg(b'C', b"SELECT 1\0"));
        s.extend(msg(b'Z', b"I"));
        s.extend(msg(b'I', b""));
        let zs = |tag: u8| tag == b'Z' || tag == b'S';
        let whole = events(&s, &[], zs);
        assert!(!whole.1);
        assert_eq!(whole.0.len(), 5);
        assert_eq!(whole.0[1].2.as_deref(), Some(&b"TimeZone\0UTC\0"[..]));
        assert_eq!(whole.0[3].2.as_deref(), Some(&b"I"[..]));
        for a in 0..s.len() {
            assert_eq!(events(&s, &[a], zs), whole, "split at {a}");
            for b in a..s.len() {
                assert_eq!(events(&s, &[a, b], zs), whole, "split at {a},{b}");
            }
        }
    }

    #[test]
    fn reports_header_offsets() {
        let mut s = msg(b'Q', b"x\0");
        s.extend(msg(b'X', b""));
        let mut f = Framer::default();
        let mut ats = Vec::new();
        f.feed(&s, 100, |e| {
            if let Event::Start { at, .. } = e {
                ats.push(at);
            }
            Body::Skip
        })
        .unwrap();
        assert_eq!(ats, vec![Some(0), Some(7)]);
    }

    /// A message seen: tag, length field, captured body.
    type Seen = (u8, usize, Option<Vec<u8>>);

    /// Events and whether it failed, fed in pieces ending at `cuts`, capturing the
    /// bodies of the tags `capture` picks; stops at an error.
    fn events(stream: &[u8], cuts: &[usize], capture: impl Fn(u8) -> bool) -> (Vec<Seen>, bool) {
        let mut f = Framer::default();
        let mut seen = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
            let r = f.feed(&stream[last..c], 256, |e| match e {
                Event::Start { tag, len, .. } => {
                    seen.push((tag, len, None));
                    if capture(tag) {
                        Body::Capture
                    } else {
                        Body::Skip
                    }
                }
                Event::Complete { body, .. } => {
                    if let Some(last) = seen.last_mut() {
                        last.2 = Some(body.to_vec());
                    }
                    Body::Skip
                }
            });
            if r.is_err() {
                return (seen, true);
            }
            last = c;
        }
        (seen, false)
    }

    #[test]
    fn hostile_streams_frame_alike_however_they_are_cut() {
        // Streams of messages with random tags and bodies, then bent (lengths set to
        // extremes, bytes cut or repeated): fed whole or in random pieces, the framer
        // reports the same messages and fails at the same point, or at none.
        let mut rng = crate::hostile::Rng::new(21);
        for case in 0..3_000 {
            let mut stream = Vec::new();
            for _ in 0..rng.below(6) {
                let body = rng.bytes(40);
                stream.extend(msg(b'A' + rng.below(26) as u8, &body));
            }
            if rng.below(2) == 0 {
                stream = crate::hostile::mutate(&mut rng, &stream);
            }
            // Capture some, skip others, the same way every time.
            let even = |tag: u8| tag % 2 == 0;
            let whole = events(&stream, &[], even);
            let mut cuts: Vec<usize> = (0..rng.below(6))
                .map(|_| rng.below(stream.len() + 1))
                .collect();
            cuts.sort_unstable();
            assert_eq!(
                events(&stream, &cuts, even),
                whole,
                "case {case}: {stream:?} cut at {cuts:?}"
            );
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut f = Framer::default();
        assert!(f.feed(b"Q\0\0\0\x02", 100, |_| Body::Skip).is_err());
        let mut f = Framer::default();
        assert!(f.feed(b"Q\0\0\x10\0", 100, |_| Body::Skip).is_err());
    }
}
