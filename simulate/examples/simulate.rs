//! `tessera simulate` without building the whole `tessera` binary:
//! `cargo run --release -p tessera-simulate --example simulate -- --nodes ... --pods ...`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tessera_simulate::SimulateArgs,
}

fn main() -> std::process::ExitCode {
    match tessera_simulate::run(&Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
