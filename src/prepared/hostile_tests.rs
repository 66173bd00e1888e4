//! The statement rewriter and its SQL recogniser against bent and random requests
//! (`crate::hostile`): no panic, and an unnamed-statement-only request is passed on
//! untouched.

use bytes::BytesMut;

use super::responses::ResponseTracker;
use super::rewrite::{plain_request, Ctx, Rewriter};
use super::{ClientStatements, Registry, ServerStatements};
use crate::hostile;

use crate::hostile::msg;

fn samples() -> Vec<Vec<u8>> {
    let named = [
        msg(b'P', b"S_1\0select $1\0\0\x01\0\0\0\x17"),
        msg(b'B', b"\0S_1\0\0\0\0\x01\0\0\0\x011\0\0"),
        msg(b'D', b"SS_1\0"),
        msg(b'E', b"\0\0\0\0\0"),
        msg(b'C', b"SS_1\0"),
        msg(b'S', b""),
    ]
    .concat();
    let unnamed = [
        msg(b'P', b"\0select 1\0\0\0"),
        msg(b'B', b"\0\0\0\0\0\0\0\0"),
        msg(b'E', b"\0\0\0\0\0"),
        msg(b'S', b""),
    ]
    .concat();
    let simple = msg(b'Q', b"PREPARE p AS SELECT 1; EXECUTE p; DEALLOCATE p\0");
    vec![named, unnamed, simple]
}

#[test]
fn requests() {
    let samples = samples();
    let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
    assert!(
        plain_request(&samples[1], 1 << 20, false),
        "the unnamed sample is plain"
    );
    let registry = Registry::default();
    hostile::run(31, 10_000, &refs, |input| {
        let plain = plain_request(input, 1 << 20, false);
        let (mut client, mut server) = (ClientStatements::default(), ServerStatements::default());
        let (mut tracker, mut parses) = (ResponseTracker::default(), 0);
        let mut ctx = Ctx {
            registry: &registry,
            client: &mut client,
            server: &mut server,
            tracker: &mut tracker,
            max_prepared: 2,
            server_parses: &mut parses,
            aborted: false,
            deferred: None,
        };
        let mut rest = BytesMut::from(input);
        let mut out = BytesMut::new();
        let r = Rewriter::default().process(&mut rest, &mut out, 1 << 20, &mut ctx, |_| {});
        if plain && r.is_ok() {
            // What needs no rewriting goes out as it came.
            assert_eq!(&out[..], input);
        }
    });
}

#[test]
fn sql_commands() {
    let texts = [
        "PREPARE p(int) AS SELECT $1",
        "EXECUTE p(1)",
        "DEALLOCATE ALL",
        "deallocate prepare \"P\"",
        "DISCARD ALL",
    ];
    hostile::run_text(32, 20_000, &texts, |text| {
        crate::fuzzing::sql(text.as_bytes())
    });
}
