//! The single integration-test binary (`cargo test --test it`). Each feature's
//! tests live in `tests/it/<feature>.rs` and are declared as modules here; the
//! shared harness lives in `tests/support/`.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod auth;
mod auth_derived;
mod auth_ldap;
mod auth_pam;
mod auth_query;
mod auth_server;
mod auth_server_fake;
mod auth_server_slow;
mod cancel;
mod config_cli;
mod drivers;
mod dump;
mod fast_close;
mod harness_smoke;
mod hba;
mod listeners;
mod memory;
mod pooling;
mod prepared_sql;
mod relay;
mod replication;
mod signals;
mod sleep;
mod startup;
mod systemd;
mod tls;
mod tls_cert;
mod tls_direct;
mod tls_records;
mod tls_server;
mod tls_stream;
mod txn;
