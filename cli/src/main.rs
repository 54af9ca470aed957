//! `tessera`: the one binary. Subcommands are added as the pieces behind them land.
use clap::Parser;

mod device_plugin_cmd;
mod manager_cmd;
mod manifests_cmd;
mod run_cmd;
mod status_cmd;
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
    /// The node manager daemon: GPU inventory, allocations, metrics, the manager API.
    Manager(tessera_manager::ManagerArgs),
    /// This node's GPUs and allocations (usage, limits, shares), as a table or JSON.
    Status(tessera_client::status::StatusArgs),
    /// `tessera status`, live.
    Top(tessera_client::top::TopArgs),
    /// Run a command under the shim with its own GPU slice, without Kubernetes.
    Run(tessera_client::run::RunArgs),
    /// A simulated GPU node, the manager and workloads under the shim, live (no GPU needed).
    Demo(tessera_demo::DemoArgs),
    /// One demo workload (a CUDA client run under the shim by `tessera demo`).
    #[command(name = "__workload", hide = true)]
    Workload(tessera_demo::workload::WorkloadArgs),
}

fn main() -> anyhow::Result<()> {
    let cmd = Cmd::parse();
    match cmd {
        Cmd::Webhook(args) => webhook_cmd::main(args),
        Cmd::Manifests(args) => manifests_cmd::main(args),
        Cmd::DevicePlugin(args) => device_plugin_cmd::main(args),
        Cmd::Manager(args) => manager_cmd::main(args),
        Cmd::Status(args) => status_cmd::status_main(args),
        Cmd::Top(args) => status_cmd::top_main(args),
        Cmd::Run(args) => run_cmd::main(args),
        Cmd::Demo(args) => {
            let ok = tessera_demo::run(&args)?;
            std::process::exit(if ok { 0 } else { 1 });
        }
        Cmd::Workload(args) => {
            tessera_demo::workload::run(&args)?;
            Ok(())
        }
    }
}
