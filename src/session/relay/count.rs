//! What the server owes for each client message the relay passes on: one
//! ReadyForQuery per Query, FunctionCall and Sync (less the Syncs a COPY swallows,
//! copy.rs), and whether extended-protocol messages wait for a Sync.

use super::copy::CopyWatch;
use crate::protocol::header::*;

/// Counts one client message: what the server will owe for it and the parse/bind
/// statistics. Returns true for Terminate.
pub(in crate::session::relay) fn count_client_tag(
    tag: u8,
    pending: &mut u32,
    unsynced: &mut bool,
    (parses, binds): (&mut u64, &mut u64),
    copy: &mut CopyWatch,
) -> bool {
    match tag {
        TAG_QUERY | TAG_FUNCTION_CALL => {
            *pending += 1;
            copy.start(false);
        }
        TAG_SYNC => {
            *pending += 1;
            *unsynced = false;
            copy.sync();
        }
        TAG_PARSE => {
            *parses += 1;
            *unsynced = true;
        }
        TAG_BIND => {
            *binds += 1;
            *unsynced = true;
        }
        TAG_EXECUTE => {
            *unsynced = true;
            copy.start(true);
        }
        TAG_DESCRIBE | TAG_CLOSE | TAG_FLUSH => *unsynced = true,
        TAG_COPY_DATA | TAG_COPY_DONE | TAG_COPY_FAIL => copy.copy_message(tag),
        TAG_TERMINATE => return true,
        _ => {}
    }
    false
}
