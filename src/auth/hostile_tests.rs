//! The SCRAM server against bent and random client messages (`crate::hostile`): no
//! panic, and a mock exchange (an unknown user's) never succeeds.

use super::scram_server::ScramServer;
use crate::hostile;

#[test]
fn scram_client_messages() {
    let first = b"n,,n=alice,r=rOprNGfwEbeRWgbNEkqO";
    hostile::run(61, 5_000, &[first], |input| {
        let mut rng = hostile::Rng::new(input.len() as u64 + 1);
        for bend in [false, true] {
            let mut server = ScramServer::mock("alice", 4096);
            let Ok(server_first) = server.handle_client_first(input) else {
                return;
            };
            // A client-final with the nonce this server chose, as sent or bent.
            let text = String::from_utf8_lossy(&server_first).into_owned();
            let nonce = text
                .split(',')
                .find_map(|f| f.strip_prefix("r="))
                .unwrap_or_default();
            let last = format!("c=biws,r={nonce},p=dGhpcyBpcyBub3QgdGhlIHByb29mIGF0IGFsbCEhISE=");
            let msg = if bend {
                hostile::mutate(&mut rng, last.as_bytes())
            } else {
                last.into_bytes()
            };
            assert!(server.handle_client_final(&msg).is_err());
            assert!(server.client_key().is_none());
        }
    });
}
