//! Sluice: a PgBouncer-compatible PostgreSQL connection pooler.
//!
//! Data flow: `net` accepts sockets, `session` logs the client in (with `auth` against
//! the `config` userlist) and relays its traffic through a server connection that
//! `pool` lends out; `lifecycle` owns the process (signals, reload, shutdown).

pub mod admin;
pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
pub(crate) mod hostile;
pub mod lifecycle;
pub mod net;
pub mod pool;
pub mod prepared;
pub mod protocol;
pub mod session;
pub mod stats;
pub mod timer;
pub mod tls;
