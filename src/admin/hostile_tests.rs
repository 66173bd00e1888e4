//! The console's command parser against bent and random text (`crate::hostile`).

use super::parse::parse;
use crate::hostile;

#[test]
fn console_commands() {
    let commands = [
        "SHOW POOLS;",
        "show stats_totals",
        "SET default_pool_size = 30",
        "set server_reset_query = 'DISCARD ALL'",
        "KILL_CLIENT 12",
        "PAUSE \"my db\"",
        "RECONNECT app",
        "WAIT_CLOSE",
        "SHUTDOWN WAIT_FOR_CLIENTS",
    ];
    for c in commands {
        assert!(parse(c).is_ok(), "{c}");
    }
    hostile::run_text(41, 20_000, &commands, |text| {
        crate::fuzzing::console(text.as_bytes())
    });
}
