//! Cancels around requests of two clients in flight on one server
//! (`pool/pipeline.rs`): a cancel aimed at the first client's query does not fail
//! the request written behind it, and a cancel the second client sends itself is its
//! own, not taken for one of those.

use std::time::Duration;

use super::common::*;
use super::pipelined::{answer, counter, line_up_bytes, one_loop, quick_client, Scene};
use super::prepared_line::{bind_run_of, prepare};
use crate::support::wire::{query_msg, send_cancel_tcp};

impl Scene {
    /// Requests written again after a cancel aimed at the one before canceled them.
    fn resent(&self) -> u64 {
        counter(self.mport, "sluice_pipelined_resent_total")
    }

    /// A quick client's 0.3 s query and then `b_sql` line up for the one server;
    /// 100 ms after it is let go, the first client cancels its query, and is told so.
    /// The second client, and whether its request went behind the first's.
    async fn first_canceled(&self, b_sql: &str, round: u32) -> (RawClient, bool) {
        let (mut a, b, before) = self.pair("SELECT pg_sleep(0.3), 'a'", b_sql).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = self.pipelined() > before;
        send_cancel_tcp(self.s.port(), a.pid, a.key).await;
        assert_eq!(answer(&mut a).await, "error 57014", "round {round}");
        (b, behind)
    }

    /// After the first client's cancel, the second client's answer is its own
    /// whether its request went `behind` the first's or waited in line. True if it
    /// went behind: then a late cancel landed on it instead, or is made to here.
    /// PostgreSQL signals a backend twice per cancel (its pid, then its process
    /// group), so the first client's may have done so already: the second request
    /// was then written again. If not, a late one is made by canceling the backend
    /// directly while it runs the second request. Either way its answer is not the
    /// second client's error to see: the request is written again, and answered.
    async fn second_answered(&self, b: &mut RawClient, behind: bool, pid: i32, round: u32) -> bool {
        if behind {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.resent() == 0 {
                direct(&self.db, &format!("SELECT pg_cancel_backend({pid})"));
            }
        }
        // (In line instead, it runs after; nothing more to see this round.)
        assert_eq!(answer(b).await, "b", "round {round}");
        if behind {
            assert_eq!(self.resent(), 1, "round {round}");
        }
        behind
    }
}

#[tokio::test]
async fn a_cancel_aimed_at_the_first_request_does_not_fail_the_one_behind() {
    let sc = Scene::new("txn_pipe_cancel").await;
    let server_pid = backend_pid(&sc.holder).await;
    for round in 0..10 {
        // The first client cancels its query: it is canceled, and the second one runs.
        let (mut b, behind) = sc.first_canceled("SELECT 'b', pg_sleep(1)", round).await;
        if sc.second_answered(&mut b, behind, server_pid, round).await || !one_loop() {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn the_second_clients_own_cancel_cancels_its_request_behind() {
    let sc = Scene::new("txn_pipe_own_cancel").await;
    for round in 0..10 {
        let (mut b, behind) = sc.first_canceled("SELECT 'b', pg_sleep(5)", round).await;
        // Its request runs now, exposed to the first client's cancel: the second
        // client cancels it itself, and its cancel is what it gets, not taken for
        // the first client's and answered by writing the request again.
        tokio::time::sleep(Duration::from_millis(100)).await;
        send_cancel_tcp(sc.s.port(), b.pid, b.key).await;
        assert_eq!(answer(&mut b).await, "error 57014", "round {round}");
        assert_eq!(one(&sc.holder, "SELECT 'next'").await, "next");
        if !one_loop() || behind {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

/// As [`a_cancel_aimed_at_the_first_request_does_not_fail_the_one_behind`], the
/// request behind binding a prepared statement (rewritten in line,
/// `pool/pipeline/prepared.rs`): its delegate sees the cancel was not its client's
/// and writes it again, rather than leaving the error to its relay.
#[tokio::test]
async fn a_cancel_aimed_at_the_first_request_does_not_fail_a_prepared_one_behind() {
    let sc = Scene::new("txn_pipe_cancel_prep").await;
    let server_pid = backend_pid(&sc.holder).await;
    let mut b = raw(&sc.s, &sc.db, &[]).await;
    prepare(&mut b, "S_b", "SELECT 'b', pg_sleep(1)").await;
    for round in 0..10 {
        let before = sc.pipelined();
        let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
        let a_req = query_msg("SELECT pg_sleep(0.3), 'a'");
        let b_req = bind_run_of("S_b", &[]);
        line_up_bytes(&sc.holder, &mut a, &a_req, &mut b, &b_req).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = sc.pipelined() > before;
        send_cancel_tcp(sc.s.port(), a.pid, a.key).await;
        assert_eq!(answer(&mut a).await, "error 57014", "round {round}");
        if sc.second_answered(&mut b, behind, server_pid, round).await || !one_loop() {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}
