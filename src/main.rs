//! The `sluice` binary: parse the command line and hand over to the lifecycle.

use clap::Parser;

fn main() {
    let args = sluice::lifecycle::cli::Args::parse();
    std::process::exit(sluice::lifecycle::main_with(args));
}
