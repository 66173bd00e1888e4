//! What the session does when the relay stops: at a release point the server goes
//! back and the client is paid what it is owed; otherwise the session ends, with the
//! error PgBouncer gives for the reason.

use bytes::BytesMut;

use super::{Session, Step};
use crate::config::PoolMode;
use crate::net::Stream;
use crate::protocol::backend;
use crate::protocol::sqlstate::*;
use crate::session::assign::finish_server;
use crate::session::relay::Outcome;
use crate::session::{protocol_failure, ClientTag};

impl Session {
    /// Acts on how the relay stopped.
    pub(super) async fn after(&mut self, stream: &Stream, outcome: Outcome) -> Step {
        match outcome {
            Outcome::ReleasePoint if self.mode == PoolMode::Session => {
                Box::pin(self.between_transactions(stream)).await
            }
            Outcome::ReleasePoint => {
                let relay = self.relay.get();
                if let Some(n) = relay.changed_prepared_count() {
                    self.info.set_prepared(n);
                }
                let last_activity = relay.last_activity();
                // Before the server goes back: a cancel request that found it linked
                // is then counted in time to hold it (pool/canceled.rs).
                self.info.unlink();
                if self.reset_always {
                    // The reset is a round trip: the client's answer goes first.
                    if let Err(e) = self.pay_client(stream, false).await {
                        self.drop_server("client disconnect while server was not ready");
                        return Step::End(format!("client I/O error: {e}").into());
                    }
                    if let Some(s) = self.server.take() {
                        // Resets and returns it (or closes it if the reset fails).
                        Box::pin(finish_server(&self.pool, s, true, PoolMode::Session)).await;
                    }
                }
                let handed_on = match self.server.take() {
                    Some(s) => self.pool.release_at(s, true, last_activity),
                    None => false,
                };
                if self.relay.get().owes_client() {
                    if let Err(e) = self.pay_client(stream, handed_on).await {
                        return Step::End(format!("client I/O error: {e}").into());
                    }
                }
                // The client may now stay idle for long: its counts go in now.
                self.pool.stats.flush(&mut self.relay.get().stats);
                // Kept for the client's next request, until it goes to sleep.
                self.relay.rest();
                Step::Next
            }
            Outcome::ClientClosed => Step::End(
                if self.relay.get().terminated() {
                    "client close request"
                } else {
                    "client unexpected eof"
                }
                .into(),
            ),
            Outcome::ClientFailed(e) => Step::End(format!("client I/O error: {e}").into()),
            Outcome::ClientProtocol(e) => {
                self.drop_server("client disconnect while server was not ready");
                Step::Done(
                    Box::pin(protocol_failure(
                        stream,
                        self.relay.get(),
                        ClientTag::new(&self.info, self.log_pooler_errors),
                        &e,
                    ))
                    .await
                    .into(),
                )
            }
            // 08P01, as every error PgBouncer itself ends a client with.
            Outcome::Timeout(why) => {
                Step::Done(self.fail(stream, PROTOCOL_VIOLATION, why).await.into())
            }
            Outcome::LongTransaction => {
                // PgBouncer's words since 1.16 ("Long transactions not allowed" before).
                let why = "transaction blocks not allowed in statement pooling mode";
                Step::Done(self.fail(stream, PROTOCOL_VIOLATION, why).await.into())
            }
            Outcome::ServerClosed(_) | Outcome::ServerProtocol(_) => {
                let msg = "server conn crashed?";
                self.drop_server(msg);
                let mut out = BytesMut::new();
                backend::error_response(&mut out, "FATAL", PROTOCOL_VIOLATION, msg);
                let _ = Box::pin(self.relay.get().send_to_client(stream, &out)).await;
                Step::End(msg.into())
            }
        }
    }
}
