//! The protocol parsers against bent and random bytes (`crate::hostile`): no panic,
//! and what parses holds together.

use bytes::BytesMut;

use super::backend::{parse_error_fields, parse_parameter_status};
use super::frontend::startup_message;
use super::header;
use super::startup::{packet_len, parse, StartupPacket, MAX_STARTUP_LEN};
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
    hostile::run(11, 20_000, &samples, |input| {
        if let Ok(Some(len)) = packet_len(input) {
            assert!((8..=MAX_STARTUP_LEN).contains(&len));
        }
        if let Ok(StartupPacket::Startup { minor, params }) = parse(input) {
            // What parsed is a list of named parameters that reads the same when
            // written out and parsed again.
            let pairs: Vec<(&str, &str)> = params.iter().collect();
            assert!(pairs.iter().all(|(k, _)| !k.is_empty()));
            let mut again = startup(&pairs);
            again[6..8].copy_from_slice(&minor.to_be_bytes());
            match parse(&again) {
                Ok(StartupPacket::Startup { params: p2, .. }) => assert_eq!(p2, params),
                other => panic!("round trip: {other:?}"),
            }
        }
    });
}

#[test]
fn message_headers() {
    hostile::run(12, 20_000, &[b"Q\0\0\0\x0dSELECT 1;\0"], |input| {
        if let Some((_, len)) = header::parse(input) {
            if let Ok(n) = header::check_len(len, 1 << 20) {
                assert!((4..=1 << 20).contains(&n));
            }
        }
    });
}

#[test]
fn error_and_parameter_status_bodies() {
    let error = b"SERROR\0VERROR\0C28P01\0Mpassword authentication failed\0\0";
    let status = b"TimeZone\0Europe/Paris\0";
    hostile::run(13, 20_000, &[error, status], |input| {
        if let Ok(f) = parse_error_fields(input) {
            // (Lossy UTF-8: a bad byte becomes one replacement character.)
            let chars = |s: &str| s.chars().count();
            assert!(chars(&f.code) + chars(&f.message) + chars(&f.severity) < input.len());
        }
        if let Ok((name, value)) = parse_parameter_status(input) {
            assert!(name.len() + value.len() < input.len());
        }
    });
}
