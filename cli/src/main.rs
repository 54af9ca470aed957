//! `tessera`: the one binary. Subcommands are added as the pieces behind them land.
use clap::Parser;

mod manifests_cmd;
mod webhook_cmd;

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "GPU sharing for Kubernetes")]
enum Cmd {
    /// The mutating admission webhook (HTTPS): injects the shim into pods that request slices.
    Webhook(tessera_webhook::run::WebhookArgs),
    /// Print the deployment manifests (the Helm chart's objects) for `kubectl apply -f -`.
    Manifests(tessera_webhook::run::ManifestsArgs),
}

fn main() -> anyhow::Result<()> {
    let cmd = Cmd::parse();
    match cmd {
        Cmd::Webhook(args) => webhook_cmd::main(args),
        Cmd::Manifests(args) => manifests_cmd::main(args),
    }
}
