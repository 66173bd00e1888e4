//! The single integration-test binary (`cargo test --test it`). Each feature's
//! tests live in `tests/it/<feature>.rs` and are declared as modules here; the
//! shared harness lives in `tests/support/`.

#[path = "../support/mod.rs"]
mod support;

mod harness_smoke;
