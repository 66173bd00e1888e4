//! Entry points for coverage-guided fuzzing (`fuzz/`, run with cargo fuzz): each
//! takes the fuzzer's bytes, drives one reader of what a peer or a file controls, and
//! panics only where an invariant breaks. The hostile tests call the same entry
//! points on randomly bent samples in every `cargo test`, so the checks live here
//! once. Built only with the `fuzzing` feature and for tests, so the readers stay
//! private to the crate otherwise.

use std::path::Path;

use bytes::BytesMut;

use crate::protocol::backend::{parse_error_fields, parse_parameter_status};
use crate::protocol::startup::{self, StartupPacket, MAX_STARTUP_LEN};

pub(crate) mod conversation;
pub(crate) mod model;
mod prepared;
mod relay;
pub use conversation::conversation;
pub use prepared::prepared;
pub use relay::{relay, relay_steps};

/// Which peer a step of a two-sided input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// The steps of a two-sided input (`prepared`, `relay`, `relay_steps`): each is a
/// byte, whose low bit picks the side (0: the client) and whose other bits, times 4,
/// are how many of the following bytes it carries (fewer at the end), then the bytes.
fn steps(mut data: &[u8]) -> impl Iterator<Item = (Side, &[u8])> {
    std::iter::from_fn(move || {
        let (&step, rest) = data.split_first()?;
        let n = (usize::from(step >> 1) * 4).min(rest.len());
        let (bytes, rest) = rest.split_at(n);
        data = rest;
        let side = if step & 1 == 0 {
            Side::Client
        } else {
            Side::Server
        };
        Some((side, bytes))
    })
}

/// A client's first packet: length check, then parse; what parses reads the same
/// when written out and parsed again.
pub fn startup(data: &[u8]) {
    if let Ok(Some(len)) = startup::packet_len(data) {
        assert!((8..=MAX_STARTUP_LEN).contains(&len));
    }
    if let Ok(StartupPacket::Startup { minor, params }) = startup::parse(data) {
        let pairs: Vec<(&str, &str)> = params.iter().collect();
        assert!(pairs.iter().all(|(k, _)| !k.is_empty()));
        let mut again = BytesMut::new();
        crate::protocol::frontend::startup_message(&mut again, &pairs);
        again[6..8].copy_from_slice(&minor.to_be_bytes());
        match startup::parse(&again) {
            Ok(StartupPacket::Startup { params: p2, .. }) => assert_eq!(p2, params),
            other => panic!("round trip: {other:?}"),
        }
    }
}

/// Bodies of a server's ErrorResponse / NoticeResponse and ParameterStatus.
pub fn server_bodies(data: &[u8]) {
    if let Ok(f) = parse_error_fields(data) {
        let chars = |s: &str| s.chars().count();
        assert!(chars(&f.code) + chars(&f.message) + chars(&f.severity) < data.len());
    }
    if let Ok((name, value)) = parse_parameter_status(data) {
        assert!(name.len() + value.len() < data.len());
    }
}

/// A SCRAM exchange as the server side, for an unknown user (the mock exchange):
/// the bytes up to the first NUL are the client-first-message, the rest the
/// client-final-message. It must never succeed.
pub fn scram_server(data: &[u8]) {
    let (first, last) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    // Few iterations: the fuzzer is after the parsing, not PBKDF2.
    let mut server = crate::auth::ScramServer::mock("alice", 2);
    if server.handle_client_first(first).is_ok() {
        assert!(server.handle_client_final(last).is_err());
        assert!(server.client_key().is_none());
    }
}

/// The console's command parser.
pub fn console(data: &[u8]) {
    let _ = crate::admin::parse::parse(&String::from_utf8_lossy(data));
}

/// The config readers; the first byte picks one. An error that names a line of the
/// file names one that is there.
pub fn config(data: &[u8]) {
    const FILE: &str = "/nonexistent/fuzz.conf";
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let err = match which % 5 {
        0 => crate::config::ini::parse_str(&text, Path::new(FILE))
            .err()
            .map(|e| e.to_string()),
        1 => crate::config::parse_userlist(&text, Path::new(FILE))
            .err()
            .map(|e| e.to_string()),
        2 => {
            if let Ok(pairs) = crate::config::parse_pairs(&text) {
                assert!(pairs.iter().all(|(k, _)| !k.is_empty()), "{pairs:?}");
            }
            None
        }
        3 => crate::auth::hba::Hba::parse(&text, Path::new(FILE), None)
            .err()
            .map(|e| e.to_string()),
        _ => crate::auth::ident::IdentMap::parse(&text, Path::new(FILE))
            .err()
            .map(|e| e.to_string()),
    };
    if let Some(e) = err {
        let line = e
            .strip_prefix(FILE)
            .and_then(|r| r.strip_prefix(':'))
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(line) = line {
            assert!(
                (1..=text.lines().count().max(1)).contains(&line),
                "{e} (of {} lines)",
                text.lines().count()
            );
        }
    }
}

/// The SQL-level PREPARE / EXECUTE / DEALLOCATE recogniser.
pub fn sql(data: &[u8]) {
    let _ = crate::prepared::sql::may_match(data);
    let _ = crate::prepared::sql::names_statements(data);
    let _ = crate::prepared::sql::parse(&String::from_utf8_lossy(data));
}

#[cfg(test)]
mod tests {
    /// Every target against its committed seeds (`fuzz/seeds/<target>/`, where the
    /// inputs of fixed crashes are kept too): none panics.
    #[test]
    fn the_seeds_pass_every_target() {
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 10] = [
            ("startup", super::startup),
            ("server_bodies", super::server_bodies),
            ("scram_server", super::scram_server),
            ("console", super::console),
            ("config", super::config),
            ("sql", super::sql),
            ("prepared", super::prepared),
            ("relay", super::relay),
            ("relay_steps", super::relay_steps),
            ("conversation", super::conversation),
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        for (name, target) in targets {
            let dir = root.join(name);
            let mut seen = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let path = entry.expect("a directory entry").path();
                let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                let ok = std::panic::catch_unwind(|| target(&data));
                assert!(ok.is_ok(), "{name} panicked on {path:?}");
                seen += 1;
            }
            assert!(seen > 0, "no seeds for {name} in {dir:?}");
        }
    }

    /// The seeds reach past the first checks: a startup packet and each config file
    /// parse, so the fuzzer starts from inputs that go deep.
    #[test]
    fn the_seeds_are_valid_inputs() {
        use crate::protocol::startup::{parse, StartupPacket};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        let read = |p: &str| std::fs::read(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(matches!(
            parse(&read("startup/plain")),
            Ok(StartupPacket::Startup { .. })
        ));
        let path = std::path::Path::new("/nonexistent/x");
        let text = |p: &str| String::from_utf8(read(p)[1..].to_vec()).expect("UTF-8");
        assert!(crate::config::ini::parse_str(&text("config/ini"), path).is_ok());
        assert!(crate::config::parse_userlist(&text("config/userlist"), path).is_ok());
        assert!(crate::config::parse_pairs(&text("config/pairs")).is_ok());
        assert!(crate::auth::ident::IdentMap::parse(&text("config/ident"), path).is_ok());
        for c in ["show", "set", "kill", "pause", "shutdown"] {
            let t = String::from_utf8(read(&format!("console/{c}"))).expect("UTF-8");
            assert!(crate::admin::parse::parse(&t).is_ok(), "{t}");
        }
    }
}
