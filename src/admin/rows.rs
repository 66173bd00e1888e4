//! Result-set builders for the console: RowDescription with PgBouncer's column types,
//! DataRow, CommandComplete, and ERROR/NOTICE messages with optional detail.

use bytes::{BufMut, BytesMut};

use crate::protocol::backend::{begin, finish, put_cstr};

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

/// One cell of a DataRow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Text(String),
    Int(i64),
    UInt(u64),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_owned())
    }
}
impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}
impl From<&String> for Cell {
    fn from(s: &String) -> Cell {
        Cell::Text(s.clone())
    }
}
impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        Cell::UInt(v)
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Cell {
        Cell::UInt(u64::from(v))
    }
}
impl From<u16> for Cell {
    fn from(v: u16) -> Cell {
        Cell::UInt(u64::from(v))
    }
}
impl From<i64> for Cell {
    fn from(v: i64) -> Cell {
        Cell::Int(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Cell {
        Cell::UInt(u64::from(v))
    }
}
impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Cell {
        v.map_or(Cell::Null, Into::into)
    }
}

/// A result set being written: the header now, rows as they come, the tag at the end.
pub struct Table<'a> {
    out: &'a mut BytesMut,
    cols: usize,
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
        }
    }

    /// Writes one DataRow; missing trailing cells are sent as NULL. Each cell goes
    /// straight into the message, its text neither copied nor (a number) made a
    /// string first: SHOW CLIENTS writes ~20 cells for each of thousands of clients,
    /// on the event loop every client shares.
    pub fn row(&mut self, cells: Vec<Cell>) {
        let at = begin(self.out, b'D');
        self.out.put_u16(self.cols as u16);
        for i in 0..self.cols {
            match cells.get(i) {
                None | Some(Cell::Null) => self.out.put_i32(-1),
                Some(Cell::Text(t)) => {
                    self.out.put_i32(t.len() as i32);
                    self.out.extend_from_slice(t.as_bytes());
                }
                Some(Cell::Int(v)) => self.number(v),
                Some(Cell::UInt(v)) => self.number(v),
            }
        }
        finish(self.out, at);
    }

    /// A number's decimal text, with its length before it.
    fn number(&mut self, v: &dyn std::fmt::Display) {
        use std::fmt::Write;
        let len_at = self.out.len();
        self.out.put_i32(0);
        // Writing to a BytesMut cannot fail: it grows as needed.
        let _ = write!(self.out, "{v}");
        let len = (self.out.len() - len_at - 4) as i32;
        self.out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// Ends the result set with CommandComplete `SHOW`.
    pub fn finish(self) {
        command_complete(self.out, "SHOW");
    }
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
