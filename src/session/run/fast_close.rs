//! `server_fast_close`: a session-mode client stops at each transaction's end
//! (`ReleaseAt::SessionCheckpoints`), and a server retired meanwhile (RECONNECT, a
//! reload that changed its database entry) ends the session there, or while the
//! client is idle between transactions (`App::close_retired_sessions`), as
//! PgBouncer's janitor ends it: its next query must not run on the old server.

use super::{Session, Step};
use crate::net::Stream;
use crate::protocol::sqlstate::PROTOCOL_VIOLATION;

/// What such a client is told (PgBouncer's words).
const CONFIG_CHANGED: &str = "database configuration changed";

impl Session {
    /// At a transaction's end in session mode: ends the session if its server was
    /// retired; otherwise waits, marked ready, for the client's next request.
    pub(super) async fn between_transactions(&mut self, stream: &Stream) -> Step {
        // Its answer goes first, whole: the client sends nothing before it has it.
        if self.relay.get().owes_client() {
            if let Err(e) = self.pay_client(stream, false).await {
                return Step::End(format!("client I/O error: {e}").into());
            }
        }
        if self.ready_and_retired() {
            self.info.unlink();
            let why = self.fail(stream, PROTOCOL_VIOLATION, CONFIG_CHANGED).await;
            return Step::Done(why.into());
        }
        // (A request already read goes on at once; the release point leaves at most
        // part of one, whose rest makes the socket readable.)
        let idle = if self.relay.get().has_request() {
            Ok(crate::session::relay::Idle::Request)
        } else {
            self.relay.wait_idle(stream, &self.info, None, false).await
        };
        self.info.set_ready(false);
        match idle {
            Ok(_) => Step::Next,
            Err(why) => Step::Done(self.fail(stream, PROTOCOL_VIOLATION, why).await.into()),
        }
    }

    /// Marks the client ready (between transactions, holding its server), then
    /// whether that server was retired. In that order, against a retirement
    /// meanwhile: the pool's lock orders this look and the generation's change, and
    /// `App::close_retired_sessions` looks at the mark after the change.
    fn ready_and_retired(&self) -> bool {
        self.info.set_ready(true);
        let generation = self.pool.generation();
        self.server
            .as_ref()
            .is_some_and(|srv| srv.ident.generation != generation)
    }
}
