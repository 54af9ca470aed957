//! `tessera`: the one binary. Subcommands are added as the pieces behind them land.
use clap::Parser;

mod device_plugin_cmd;
mod manifests_cmd;
mod webhook_cmd;

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "GPU sharing for Kubernetes")]
enum Cmd {
    /// The mutating admission webhook (HTTPS): injects the shim into pods that request slices.
    Webhook(tessera_webhook::run::WebhookArgs),
    /// Print the deployment manifests (the Helm chart's objects) for `kubectl apply -f -`.
    Manifests(tessera_webhook::run::ManifestsArgs),
    /// The kubelet device plugin: advertises GPU slices as tessera.dev/vgpu.
    DevicePlugin(device_plugin_cmd::DevicePluginArgs),
}

fn main() -> anyhow::Result<()> {
    let cmd = Cmd::parse();
    match cmd {
        Cmd::Webhook(args) => webhook_cmd::main(args),
        Cmd::Manifests(args) => manifests_cmd::main(args),
        Cmd::DevicePlugin(args) => device_plugin_cmd::main(args),
    }
}
