//! The messages the differential test sends, and how it shows what comes back.

use crate::support::wire::{frame, RawMsg};

/// What a Parse may carry: query text, the parameters a Bind must give, the
/// parameter types the Parse declares.
pub(super) const SQL: &[(&str, usize, &[u32])] = &[
    ("SELECT $1::int4 + 1", 1, &[]),
    ("SELECT $1::text || 'x'", 1, &[]),
    ("SELECT g FROM generate_series(1, $1::int4) g", 1, &[]),
    // 22012 when bound to 0.
    ("SELECT 10 / $1::int4", 1, &[]),
    // 42601 at Parse.
    ("SELEC $1", 1, &[]),
    ("SELECT $1::int4, $2::text", 2, &[]),
    ("SELECT 1 AS one", 0, &[]),
    // EmptyQueryResponse, and NoData to a Describe.
    ("", 0, &[]),
    ("SELECT $1::int4 WHERE false", 1, &[]),
    ("SELECT $1 + 1", 1, &[23]),
    ("BEGIN", 0, &[]),
    ("COMMIT", 0, &[]),
];

pub(super) fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

pub(in crate::txn) fn parse(name: &str, sql: usize) -> Vec<u8> {
    let (text, _, types) = SQL[sql];
    let mut b = Vec::new();
    cstr(&mut b, name);
    cstr(&mut b, text);
    b.extend_from_slice(&(types.len() as u16).to_be_bytes());
    for t in types {
        b.extend_from_slice(&t.to_be_bytes());
    }
    frame(b'P', &b)
}

/// The table the conversation's COPYs fill.
pub(super) const COPY_TABLE: &str = "diff_copy";

/// A Parse of `text` (no declared parameter types).
pub(super) fn parse_text(name: &str, text: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, name);
    cstr(&mut b, text);
    b.extend_from_slice(&0u16.to_be_bytes());
    frame(b'P', &b)
}

pub(in crate::txn) fn bind(portal: &str, stmt: &str, params: &[String]) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    cstr(&mut b, stmt);
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        b.extend_from_slice(&(p.len() as i32).to_be_bytes());
        b.extend_from_slice(p.as_bytes());
    }
    b.extend_from_slice(&0u16.to_be_bytes());
    frame(b'B', &b)
}

pub(super) fn named(tag: u8, kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    cstr(&mut b, name);
    frame(tag, &b)
}

pub(in crate::txn) fn execute(portal: &str, max_rows: u32) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    b.extend_from_slice(&max_rows.to_be_bytes());
    frame(b'E', &b)
}

/// `int4pl` and `int4div`: built-in functions, whose OIDs are fixed in PostgreSQL's
/// catalog (the test checks them first).
pub(super) const INT4PL: u32 = 177;
pub(super) const INT4DIV: u32 = 154;

/// A FunctionCall (libpq's `PQfn`) with text arguments and a text result.
pub(in crate::txn) fn function_call(oid: u32, args: &[impl AsRef<str>]) -> Vec<u8> {
    let mut b = oid.to_be_bytes().to_vec();
    b.extend_from_slice(&1u16.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&(args.len() as u16).to_be_bytes());
    for a in args {
        let a = a.as_ref();
        b.extend_from_slice(&(a.len() as u32).to_be_bytes());
        b.extend_from_slice(a.as_bytes());
    }
    b.extend_from_slice(&0u16.to_be_bytes());
    frame(b'F', &b)
}

/// The message that ends the answer to one extended-protocol message.
pub(super) fn ends_answer(tag: u8) -> bool {
    matches!(tag, b'1' | b'2' | b'3' | b'T' | b'n' | b'C' | b'I' | b's')
}

/// A message as text: errors and notices by severity, code and message (the
/// source file and line fields are the server's business). A Bind's count of
/// parameters (or an EXECUTE's) names the statement as the server knows it, which
/// through Sluice is Sluice's own name (as through PgBouncer): that name is left out.
pub(super) fn show(m: &RawMsg) -> String {
    match m.tag {
        b'E' | b'N' => {
            let mut text = m.field(b'M').unwrap_or_default();
            for lead in [
                "but prepared statement \"",
                "parameters for prepared statement \"",
            ] {
                if let Some(at) = text.find(lead) {
                    let from = at + lead.len();
                    let name_end = text[from..].find('"').map_or(text.len(), |e| from + e);
                    text.replace_range(from - 1..=name_end.min(text.len() - 1), "<name>");
                }
            }
            format!(
                "{} {} {}: {}",
                m.tag as char,
                m.field(b'S').unwrap_or_default(),
                m.field(b'C').unwrap_or_default(),
                text
            )
        }
        _ => format!(
            "{} {}",
            m.tag as char,
            String::from_utf8_lossy(&m.body).escape_debug()
        ),
    }
}
