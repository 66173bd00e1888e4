//! Portals through transaction pooling with prepared-statement tracking.

use super::common::*;
use super::differential::{bind, execute, parse};
use crate::support::wire::frame;

/// A portal stays open while its transaction needs it, however many statements
/// come after it and evict its statement from the server (PostgreSQL keeps a
/// portal whose statement is closed, whatever its protocol documentation says).
#[tokio::test]
async fn a_portal_outlives_the_eviction_of_its_statement() {
    let db = fresh_db("txn_portal");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", "2")
        .start();
    let mut c = raw(&s, &db, &[]).await;
    let send = |batch: Vec<Vec<u8>>| batch.concat();
    let answer = c.simple("BEGIN", STEP).await;
    assert_eq!(status(&answer), b'T');
    let mut req = send(vec![
        parse("s0", 2),
        bind("p0", "s0", &["5".into()]),
        execute("p0", 1),
    ]);
    req.extend(frame(b'S', &[]));
    c.send(&req).await.expect("send");
    assert_eq!(col(&c.until_ready(STEP).await), ["1"]);
    // Three more statements, each used: the cache of two would evict s0's.
    for (k, sql) in [(1, 0), (2, 1), (3, 8)] {
        let name = format!("s{k}");
        let mut req = send(vec![
            parse(&name, sql),
            bind("", &name, &["7".into()]),
            execute("", 0),
        ]);
        req.extend(frame(b'S', &[]));
        c.send(&req).await.expect("send");
        let answer = c.until_ready(STEP).await;
        assert!(first_error(&answer).is_none(), "{answer:?}");
    }
    let mut req = execute("p0", 2);
    req.extend(frame(b'S', &[]));
    c.send(&req).await.expect("send");
    let answer = c.until_ready(STEP).await;
    assert!(
        first_error(&answer).is_none(),
        "the portal went: {answer:?}"
    );
    assert_eq!(col(&answer), ["2", "3"]);
    assert_eq!(status(&c.simple("ROLLBACK", STEP).await), b'I');
}
