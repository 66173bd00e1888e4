//! `auth_user` / `auth_query`: the stored secret of a user who is not in `auth_file`,
//! looked up in PostgreSQL at each login, as PgBouncer does.
//!
//! The query runs on a connection of the pool (`auth_dbname` or the client's
//! database, `auth_user`), taken with `Pool::acquire` like any other: it carries the
//! pool's own startup parameters, never the client's (PgBouncer's CVE-2025-12819 was
//! a client's `search_path` reaching the lookup), and the user name goes as a bound
//! parameter, never into the SQL text.

use super::ClientError;
use crate::app::App;
use crate::config::{Config, DatabaseEntry};
use crate::pool::lookup::{Clean, Lookup, LookupError};
use crate::pool::PoolConfig;
use crate::protocol::sqlstate::{CONNECTION_FAILURE, PROTOCOL_VIOLATION};

/// The stored password `auth_query` gives for `user` logging in to `db` (the entry
/// for the client's `database`): `None` when no `auth_user` applies or the query
/// found no such user, `Some("")` for a NULL password (which no password matches).
pub(super) async fn look_up(
    app: &App,
    cfg: &Config,
    db: &DatabaseEntry,
    database: &str,
    user: &str,
) -> Result<Option<String>, ClientError> {
    let s = &cfg.settings;
    let Some(auth_user) = db.auth_user.as_deref().or(s.auth_user.as_deref()) else {
        return Ok(None);
    };
    let query = db.auth_query.as_deref().unwrap_or(&s.auth_query);
    let (auth_db_name, auth_db) = match db.auth_dbname.as_deref().or(s.auth_dbname.as_deref()) {
        Some(name) => {
            let entry = cfg
                .databases
                .get(name)
                .or(cfg.fallback_database.as_ref())
                .ok_or_else(|| {
                    tracing::warn!("auth_dbname \"{name}\" is not a configured database");
                    config_error()
                })?;
            (name, entry)
        }
        None => (database, db),
    };
    let pool = app.pools.get_or_create(auth_db_name, auth_user, || {
        PoolConfig::new(cfg, auth_db, auth_db_name, auth_user)
    });
    let fail = |e: LookupError| {
        tracing::warn!(
            "auth_query for user \"{user}\" as \"{auth_user}\" on database \"{auth_db_name}\": {e}"
        );
        match e {
            LookupError::Pool(e) => {
                ClientError::fatal(CONNECTION_FAILURE, format!("could not run auth_query: {e}"))
            }
            // The client is told PgBouncer's words; the log above has what failed.
            LookupError::Query(_) | LookupError::Shape(_) => config_error(),
        }
    };
    // A paused (or suspended) database lends no server, to a lookup either: the login
    // waits, as the paused clients' queries do.
    let mut gate = app.gate_watch();
    while gate.borrow_and_update().blocks(auth_db_name) {
        if gate.changed().await.is_err() {
            break;
        }
    }
    let mut conn = pool.acquire().await.map_err(|e| fail(e.into()))?;
    let timeout = match s.server_connect_timeout {
        t if t.is_zero() => std::time::Duration::from_secs(3600),
        t => t,
    };
    let (found, Clean(clean)) = conn.look_up(query, user, timeout).await;
    pool.release(conn, clean);
    match found.map_err(fail)? {
        Lookup::NoSuchUser => Ok(None),
        Lookup::Found(secret) => Ok(Some(secret.unwrap_or_default())),
    }
}

/// What a client is told when `auth_query` cannot be run as configured, as PgBouncer
/// tells it.
fn config_error() -> ClientError {
    ClientError::fatal(PROTOCOL_VIOLATION, "bouncer config error".into())
}
