//! Servers whose reset query runs at the end of a client's session, or whose
//! `server_check_query` runs before a client gets it (PgBouncer's `sv_tested`).
//! Such a server is lent still but linked to no client: SHOW SERVERS
//! lists it as `tested` and SHOW POOLS counts it in `sv_tested`, not in `sv_active`,
//! so that it is never missing from the console between its client and the pool.

use std::sync::Arc;

use super::server::ServerIdent;
use super::Pool;
use crate::clock::Tick;

/// A server's reset, listed in its pool while the mark lives.
pub struct Resetting<'a> {
    pool: &'a Pool,
    ident: Arc<ServerIdent>,
}

impl Pool {
    /// Lists `ident` as being reset until the mark is dropped.
    pub fn resetting(&self, ident: &Arc<ServerIdent>) -> Resetting<'_> {
        let since = Tick::now();
        self.lock_state().resetting.push((ident.clone(), since));
        Resetting {
            pool: self,
            ident: ident.clone(),
        }
    }

    /// The servers being reset, each with when its reset began, for SHOW SERVERS.
    pub fn resetting_servers(&self) -> Vec<(Arc<ServerIdent>, Tick)> {
        self.lock_state().resetting.clone()
    }
}

impl Drop for Resetting<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.lock_state();
        if let Some(i) = st
            .resetting
            .iter()
            .position(|(s, _)| Arc::ptr_eq(s, &self.ident))
        {
            st.resetting.swap_remove(i);
        }
    }
}
