//! Transaction and statement pooling, end to end with real clients (PgBouncer's
//! behaviour is the reference). Each test has its own Sluice and its own
//! PostgreSQL database (see `common::fresh_db`), so it counts only its own servers.

mod bad;
mod basic;
mod chaos;
pub(crate) mod common;
mod console_load;
mod copy;
mod delegated;
mod differential;
mod dirty;
mod frozen_load;
mod function_call;
mod held_begin;
mod idle_closed;
mod killed;
mod limits;
mod load;
mod login_failing;
mod logins_load;
mod midbatch;
mod mixed;
mod pairs;
mod params;
mod pipelined;
mod pipelined_cancel;
mod pipelined_drivers;
mod pipelined_end;
mod pipelined_prepared;
mod portals;
mod prepared_line;
mod prepared_load;
mod protocol;
mod reload_load;
mod reset;
mod restart_load;
mod shutdown_load;
mod statement;
mod timeouts;
mod timeouts_load;
mod tls_load;
mod vanishing;
