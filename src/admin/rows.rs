//! Result-set builders for the console: RowDescription with PgBouncer's column types,
//! DataRow, CommandComplete, and ERROR/NOTICE messages with optional detail.

use std::fmt::Display;
use std::net::IpAddr;
use std::time::SystemTime;

use bytes::{BufMut, BytesMut};

use crate::protocol::backend::{begin, finish, put_cstr};
use crate::tls::TlsInfo;

/// Column types the console uses (PgBouncer sends the same OIDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Text,
    Int4,
    Int8,
    /// Statistics counters: `numeric`, so 64-bit values never overflow a client's int.
    Numeric,
}

impl Ty {
    fn oid_len(self) -> (u32, i16) {
        match self {
            Ty::Text => (25, -1),
            Ty::Int4 => (23, 4),
            Ty::Int8 => (20, 8),
            Ty::Numeric => (1700, -1),
        }
    }
}

/// One cell of a DataRow. Text is borrowed where the row's source holds it, and
/// addresses, handles and times are written into the message as they are read:
/// SHOW CLIENTS writes ~20 cells for each of thousands of clients, on the event loop
/// every client shares, so a row allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell<'a> {
    Null,
    Str(&'a str),
    Text(String),
    Int(i64),
    UInt(u64),
    /// An address's text (`127.0.0.1`, `::1`).
    Ip(IpAddr),
    /// A handle as PgBouncer prints a pointer: `0x` and lower-case hex digits.
    Hex(u64),
    /// A moment as PgBouncer prints one: `YYYY-MM-DD HH:MM:SS UTC`.
    Time(SystemTime),
    /// A connection's TLS as PgBouncer's `tls` column shows it (empty if none).
    Tls(TlsInfo),
}

impl<'a> From<&'a str> for Cell<'a> {
    fn from(s: &'a str) -> Cell<'a> {
        Cell::Str(s)
    }
}
impl From<String> for Cell<'_> {
    fn from(s: String) -> Self {
        Cell::Text(s)
    }
}
impl<'a> From<&'a String> for Cell<'a> {
    fn from(s: &'a String) -> Cell<'a> {
        Cell::Str(s)
    }
}
impl From<u64> for Cell<'_> {
    fn from(v: u64) -> Self {
        Cell::UInt(v)
    }
}
impl From<u32> for Cell<'_> {
    fn from(v: u32) -> Self {
        Cell::UInt(u64::from(v))
    }
}
impl From<u16> for Cell<'_> {
    fn from(v: u16) -> Self {
        Cell::UInt(u64::from(v))
    }
}
impl From<i64> for Cell<'_> {
    fn from(v: i64) -> Self {
        Cell::Int(v)
    }
}
impl From<bool> for Cell<'_> {
    fn from(v: bool) -> Self {
        Cell::UInt(u64::from(v))
    }
}
impl<'a, T: Into<Cell<'a>>> From<Option<T>> for Cell<'a> {
    fn from(v: Option<T>) -> Cell<'a> {
        v.map_or(Cell::Null, Into::into)
    }
}

/// A result set being written: the header now, rows as they come, the tag at the end.
pub struct Table<'a> {
    out: &'a mut BytesMut,
    cols: usize,
    /// What a row's missing trailing cells are sent as.
    pad: Cell<'static>,
}

impl<'a> Table<'a> {
    /// Writes the RowDescription for `cols`.
    pub fn new(out: &'a mut BytesMut, cols: &[(&str, Ty)]) -> Table<'a> {
        let at = begin(out, b'T');
        out.put_u16(cols.len() as u16);
        for (name, ty) in cols {
            let (oid, len) = ty.oid_len();
            put_cstr(out, name);
            out.put_u32(0); // table oid
            out.put_i16(0); // column number
            out.put_u32(oid);
            out.put_i16(len);
            out.put_i32(-1); // type modifier
            out.put_i16(0); // text format
        }
        finish(out, at);
        Table {
            out,
            cols: cols.len(),
            pad: Cell::Null,
        }
    }

    /// Missing trailing cells are sent as `pad` from now on (NULL until then).
    pub fn pad_with(mut self, pad: Cell<'static>) -> Table<'a> {
        self.pad = pad;
        self
    }

    /// Writes one DataRow; missing trailing cells are sent as the table's pad.
    pub fn row<'c>(&mut self, cells: impl AsRef<[Cell<'c>]>) {
        let cells = cells.as_ref();
        let at = begin(self.out, b'D');
        self.out.put_u16(self.cols as u16);
        for cell in cells.iter().take(self.cols) {
            put_cell(self.out, cell);
        }
        for _ in cells.len().min(self.cols)..self.cols {
            put_cell(self.out, &self.pad);
        }
        finish(self.out, at);
    }

    /// Ends the result set with CommandComplete `SHOW`.
    pub fn finish(self) {
        command_complete(self.out, "SHOW");
    }
}

/// One cell, its length first. Each goes straight into the message, no text copied
/// first and no number, address or time made a string: numbers through `fmt` cost
/// several times their digits (callgrind, SHOW CLIENTS).
fn put_cell(out: &mut BytesMut, cell: &Cell<'_>) {
    match cell {
        Cell::Null => out.put_i32(-1),
        Cell::Str(t) => put_text(out, t.as_bytes()),
        Cell::Text(t) => put_text(out, t.as_bytes()),
        Cell::Int(v) => measured(out, |out| {
            if *v < 0 {
                out.put_u8(b'-');
            }
            put_digits::<10>(out, v.unsigned_abs());
        }),
        Cell::UInt(v) => measured(out, |out| put_digits::<10>(out, *v)),
        Cell::Hex(v) => measured(out, |out| {
            out.extend_from_slice(b"0x");
            put_digits::<16>(out, *v);
        }),
        Cell::Ip(IpAddr::V4(a)) => measured(out, |out| {
            for (i, octet) in a.octets().into_iter().enumerate() {
                if i > 0 {
                    out.put_u8(b'.');
                }
                put_digits::<10>(out, u64::from(octet));
            }
        }),
        Cell::Ip(a) => measured(out, |out| shown(out, a)),
        Cell::Tls(t) => measured(out, |out| shown(out, t)),
        Cell::Time(t) => {
            // The log's stamp less its milliseconds.
            let b = crate::lifecycle::logging::stamp(*t);
            out.put_i32(23);
            out.extend_from_slice(&b[..19]);
            out.extend_from_slice(b" UTC");
        }
    }
}

fn put_text(out: &mut BytesMut, t: &[u8]) {
    out.put_i32(t.len() as i32);
    out.extend_from_slice(t);
}

/// What `body` writes, with its length before it.
fn measured(out: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let len_at = out.len();
    out.put_i32(0);
    body(out);
    let len = (out.len() - len_at - 4) as i32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
}

/// `v`'s digits in `RADIX` (10 or 16, lower case), no padding. A constant radix
/// makes the divisions multiplications and shifts.
fn put_digits<const RADIX: u64>(out: &mut BytesMut, mut v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut b = [0u8; 20]; // u64::MAX has 20 decimal digits
    let mut i = b.len();
    loop {
        i -= 1;
        b[i] = DIGITS[(v % RADIX) as usize & 15];
        v /= RADIX;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&b[i..]);
}

/// A value's `Display` text (the rare cells: IPv6 addresses, TLS descriptions).
fn shown(out: &mut BytesMut, v: &dyn Display) {
    use std::fmt::Write;
    // Writing to a BytesMut cannot fail: it grows as needed.
    let _ = write!(out, "{v}");
}

/// CommandComplete with `tag`.
pub fn command_complete(out: &mut BytesMut, tag: &str) {
    let at = begin(out, b'C');
    put_cstr(out, tag);
    finish(out, at);
}

/// ReadyForQuery, idle.
pub fn ready(out: &mut BytesMut) {
    let at = begin(out, b'Z');
    out.put_u8(b'I');
    finish(out, at);
}

/// ErrorResponse (`b'E'`) or NoticeResponse (`b'N'`) with an optional detail.
pub fn message(
    out: &mut BytesMut,
    tag: u8,
    severity: &str,
    code: &str,
    text: &str,
    detail: Option<&str>,
) {
    let at = begin(out, tag);
    for (k, v) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', text),
    ] {
        out.put_u8(k);
        put_cstr(out, v);
    }
    if let Some(d) = detail {
        out.put_u8(b'D');
        put_cstr(out, d);
    }
    out.put_u8(0);
    finish(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_bytes() {
        let mut out = BytesMut::new();
        let mut t = Table::new(&mut out, &[("a", Ty::Text), ("n", Ty::Numeric)]);
        t.row(vec!["x".into(), Cell::UInt(12)]);
        t.row(vec![Cell::Null]);
        t.finish();
        assert_eq!(out[0], b'T');
        // RowDescription: 4 len + 2 count + 2 * (name + 18 bytes).
        let t_len = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!(t_len, 4 + 2 + (2 + 18) * 2);
        let d1 = &out[1 + t_len..];
        assert_eq!(d1[0], b'D');
        assert_eq!(&d1[5..7], &[0, 2]);
        assert_eq!(&d1[7..11], &1i32.to_be_bytes());
        assert_eq!(d1[11], b'x');
        assert_eq!(&d1[12..16], &2i32.to_be_bytes());
        assert_eq!(&d1[16..18], b"12");
        let d2 = &d1[18..];
        assert_eq!(&d2[7..15], &[255, 255, 255, 255, 255, 255, 255, 255]);
        assert_eq!(d2[15], b'C');
    }

    /// Every kind of cell reads as `format!` would write it.
    #[test]
    fn cells_as_text() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_999);
        let tls = TlsInfo::default();
        let cases: Vec<(Cell, Option<String>)> = vec![
            (Cell::Null, None),
            (Cell::Str("ab"), Some("ab".into())),
            (Cell::Text(String::new()), Some(String::new())),
            (Cell::Int(0), Some("0".into())),
            (Cell::Int(-42), Some("-42".into())),
            (Cell::Int(i64::MIN), Some(i64::MIN.to_string())),
            (Cell::UInt(u64::MAX), Some(u64::MAX.to_string())),
            (Cell::UInt(7), Some("7".into())),
            (Cell::Hex(0), Some("0x0".into())),
            (
                Cell::Hex((1 << 40) | 0xbeef),
                Some(format!("{:#x}", (1u64 << 40) | 0xbeef)),
            ),
            (Cell::Hex(u64::MAX), Some(format!("{:#x}", u64::MAX))),
            (Cell::Ip([10, 0, 255, 1].into()), Some("10.0.255.1".into())),
            (Cell::Ip([0; 4].into()), Some("0.0.0.0".into())),
            (
                Cell::Ip(std::net::Ipv6Addr::LOCALHOST.into()),
                Some("::1".into()),
            ),
            (Cell::Tls(tls), Some(tls.to_string())),
            (Cell::Time(t), Some("2023-11-14 22:13:20 UTC".into())),
        ];
        for (cell, want) in cases {
            let mut out = BytesMut::new();
            put_cell(&mut out, &cell);
            let len = i32::from_be_bytes([out[0], out[1], out[2], out[3]]);
            let got = (len >= 0).then(|| String::from_utf8_lossy(&out[4..]).into_owned());
            assert_eq!(got, want, "{cell:?}");
            assert_eq!(out.len(), 4 + got.map_or(0, |g| g.len()), "{cell:?}");
        }
    }

    #[test]
    fn missing_cells_are_the_pad() {
        let mut out = BytesMut::new();
        let mut t = Table::new(
            &mut out,
            &[("a", Ty::Text), ("n", Ty::Int4), ("m", Ty::Int4)],
        )
        .pad_with(Cell::UInt(0));
        t.row([Cell::Str("x")]);
        let t_len = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        let d = &out[1 + t_len..];
        // 'D', length, 3 cells: "x", "0", "0".
        assert_eq!(&d[5..7], &[0, 3]);
        assert_eq!(&d[7..], b"\0\0\0\x01x\0\0\0\x010\0\0\0\x010");
    }

    #[test]
    fn error_with_detail() {
        let mut out = BytesMut::new();
        message(
            &mut out,
            b'E',
            "ERROR",
            "F0000",
            "RELOAD failed",
            Some("bad"),
        );
        let f = crate::protocol::backend::parse_error_fields(&out[5..]).unwrap();
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            ("F0000", "RELOAD failed")
        );
        assert!(out.windows(5).any(|w| w == b"Dbad\0"));
    }
}
