//! The `sluice` binary: parse the command line and hand over to the lifecycle.

use clap::Parser;

/// glibc's allocator, with freed over-aligned blocks (tokio's tasks and socket
/// registrations) kept for reuse: see `sluice::lifecycle::alloc`.
#[global_allocator]
static ALLOC: sluice::lifecycle::alloc::CachingAlloc =
    sluice::lifecycle::alloc::CachingAlloc::new();

fn main() {
    let args = sluice::lifecycle::cli::Args::parse();
    std::process::exit(sluice::lifecycle::main_with(args));
}
