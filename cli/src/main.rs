//! `tessera`: the one binary. Subcommands are added as the pieces behind them land.
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "GPU sharing for Kubernetes")]
enum Cmd {}

fn main() -> anyhow::Result<()> {
    let cmd = Cmd::parse();
    match cmd {}
}
