//! The protocol parsers against bent and random bytes (`crate::hostile`): no panic,
//! and what parses holds together.

use bytes::BytesMut;

use super::frontend::startup_message;
use super::header;
use crate::hostile;

fn startup(params: &[(&str, &str)]) -> Vec<u8> {
    let mut b = BytesMut::new();
    startup_message(&mut b, params);
    b.to_vec()
}

#[test]
fn startup_packets() {
    let plain = startup(&[("user", "alice"), ("database", "app")]);
    let options = startup(&[
        ("user", "u"),
        ("options", "-c search_path=x"),
        ("_pq_.x", ""),
    ]);
    let cancel = super::startup::cancel_request(1234, 5678);
    let ssl = [0, 0, 0, 8, 4, 210, 22, 47];
    let samples: [&[u8]; 4] = [&plain, &options, &cancel, &ssl];
    // The checks are the fuzz target's (a parse reads the same written out again).
    hostile::run(11, 20_000, &samples, crate::fuzzing::startup);
}

#[test]
fn message_headers() {
    hostile::run(12, 20_000, &[b"Q\0\0\0\x0dSELECT 1;\0"], |input| {
        if let Some((tag, len)) = header::parse(input) {
            if let Ok(n) = header::check_len(tag, len, 1 << 20) {
                assert!((4..=1 << 20).contains(&n));
            }
        }
    });
}

#[test]
fn error_and_parameter_status_bodies() {
    let error = b"SERROR\0VERROR\0C28P01\0Mpassword authentication failed\0\0";
    let status = b"TimeZone\0Europe/Paris\0";
    hostile::run(13, 20_000, &[error, status], crate::fuzzing::server_bodies);
}
