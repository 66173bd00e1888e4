//! Pools and connections for the pool's unit tests and the fuzz targets.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::registry::PoolKey;
use super::server::conn_for_tests;
use super::slot::SlotToken;
use super::{LentMark, Pool, PoolConfig, PoolLimits, ServerConn};
use crate::net::Stream;

impl Pool {
    /// A pool of one connection to a server nobody listens on, for unit tests.
    pub(crate) fn one_slot_for_tests() -> Arc<Pool> {
        let ini = "[databases]\ndb = host=127.0.0.1 port=1\n[pgbouncer]\ndefault_pool_size = 1\n";
        let cfg = crate::config::Config::from_ini_str(ini, std::path::Path::new("test.ini"))
            .expect("config");
        let entry = cfg.database_entry("db").expect("db entry");
        Arc::new(Pool::for_tests(PoolConfig::new(&cfg, &entry, "db", "u")))
    }

    /// A connection over `stream`, lent from a pool of one of its own, for tests and
    /// the fuzz targets of what runs over a linked server.
    pub fn lent_for_tests(stream: Stream) -> ServerConn {
        lend(&Pool::one_slot_for_tests(), stream)
    }

    /// A pool of (`db`, `u`) counted against no shared limits, for unit tests.
    pub(crate) fn for_tests(cfg: PoolConfig) -> Pool {
        let key = PoolKey {
            database: "db".into(),
            user: "u".into(),
        };
        let limits = PoolLimits {
            db: Default::default(),
            user: Default::default(),
        };
        Pool::new(key, cfg, Arc::new(AtomicU64::new(1)), limits)
    }
}

/// `p`'s one connection, over `stream`, lent to a client (counted in `total` and
/// `active`).
fn lend(p: &Arc<Pool>, stream: Stream) -> ServerConn {
    let mut st = p.lock_state();
    st.total = 1;
    st.active = 1;
    drop(st);
    let mut conn = conn_for_tests(stream, SlotToken::counted(p.clone()), p.generation());
    conn.lent = LentMark::lent_by(p.clone());
    conn
}

/// [`lend`] over one end of a socket pair; the other end, to keep it open.
#[cfg(test)]
pub(super) fn lent(p: &Arc<Pool>) -> (ServerConn, std::os::unix::net::UnixStream) {
    use crate::net::StdStream;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    ours.set_nonblocking(true).expect("nonblocking");
    let stream = Stream::from_std(StdStream::Unix(ours)).expect("stream");
    (lend(p, stream), theirs)
}
