//! The config readers against bent and random text (`crate::hostile`): no panic, and
//! an error names the file and a line that exists.

use std::path::Path;

use super::ini::parse_str;
use super::{parse_pairs, parse_userlist};
use crate::hostile;

const FILE: &str = "/nonexistent/hostile.ini";

/// The config fuzz target on `text`, its first byte picking the reader (`which`):
/// no panic, and an error names a line that is there.
fn check(which: u8, text: &str) {
    let mut data = vec![which];
    data.extend_from_slice(text.as_bytes());
    crate::fuzzing::config(&data);
}

#[test]
fn ini_files() {
    let ini = "[databases]\n\
               app = host=127.0.0.1 port=5432 dbname=app pool_size=20\n\
               * = host=/run/postgresql\n\
               [users]\n\
               bob = pool_mode=session\n\
               [pgbouncer]\n\
               listen_addr = *\n\
               listen_port = 6432\n\
               auth_type = scram-sha-256 ; trailing comment\n\
               ignore_startup_parameters = extra_float_digits, search_path\n";
    assert!(parse_str(ini, Path::new(FILE)).is_ok());
    hostile::run_text(51, 10_000, &[ini], |text| check(0, text));
}

#[test]
fn connection_strings() {
    let s = "host=db.example port=5433 dbname='my app' user=u password='it''s' \
             connect_query='SELECT 1'";
    assert!(parse_pairs(s).is_ok());
    hostile::run_text(52, 20_000, &[s], |text| check(2, text));
}

#[test]
fn userlists() {
    let list = "\"alice\" \"md5b9e3b2b6f4c3d5a5b7c8d9e0f1a2b3c4\"\n\
                ;comment\n\
                \"bob\" \"SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVk:c2VydmVy\"\n\
                \"carol\" \"plain \"\"quoted\"\" pass\"\n";
    assert!(parse_userlist(list, Path::new(FILE)).is_ok());
    hostile::run_text(53, 20_000, &[list], |text| check(1, text));
}
