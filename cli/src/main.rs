//! `tessera`: the one binary; each subcommand is a thin call into its crate.
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

mod device_plugin_cmd;
mod dra_plugin_cmd;
mod extender_cmd;
mod manager_cmd;
mod resize_cmd;
mod run_cmd;
mod status_cmd;
mod webhook_cmd;

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "GPU sharing for Kubernetes")]
struct Cli {
    /// Log format of the daemons (manager, device-plugin, webhook): `text`, or
    /// `json` (one object a line, for log collectors). Text is coloured only
    /// when stderr is a terminal.
    #[arg(
        long,
        global = true,
        env = "TESSERA_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// The mutating admission webhook (HTTPS): injects the shim into pods that request slices.
    Webhook(tessera_webhook::run::WebhookArgs),
    /// The kubelet device plugin: advertises GPU slices as tessera.dev/vgpu.
    DevicePlugin(tessera_device_plugin::args::DevicePluginArgs),
    /// The kubelet DRA plugin (driver vgpu.tessera.dev): prepares ResourceClaims as allocations.
    DraPlugin(tessera_dra_plugin::DraPluginArgs),
    /// The node manager daemon: GPU inventory, allocations, metrics, the manager API.
    Manager(tessera_manager::ManagerArgs),
    /// This node's GPUs and allocations (usage, limits, shares), as a table or JSON.
    Status(tessera_client::status::StatusArgs),
    /// `tessera status`, live.
    Top(tessera_client::top::TopArgs),
    /// Run a command under the shim with its own GPU slice, without Kubernetes.
    Run(tessera_client::run::RunArgs),
    /// Change a running allocation's memory limits and compute shares.
    Resize(tessera_client::resize::ResizeArgs),
    /// Pause an allocation: no GPU time; its launches and memory requests wait.
    Pause(tessera_client::pause::PauseArgs),
    /// Resume a paused allocation.
    Resume(tessera_client::pause::PauseArgs),
    /// Install the shim on the node by copy and rename, never rewriting a mapped file.
    InstallHook(tessera_client::install_hook::InstallHookArgs),
    /// The kube-scheduler extender: filter, prioritize and bind pods with slices by the
    /// placement engine.
    #[command(alias = "extender")]
    SchedulerExtender(tessera_extender::SchedulerExtenderArgs),
    /// Replay a cluster trace (openb CSV) through the placement engine and compare policies.
    Simulate(tessera_simulate::SimulateArgs),
    /// A simulated GPU node, the manager and workloads under the shim, live (no GPU needed).
    #[cfg(feature = "demo")]
    Demo(tessera_demo::DemoArgs),
    /// One demo workload (a CUDA client run under the shim by `tessera demo`).
    #[cfg(feature = "demo")]
    #[command(name = "__workload", hide = true)]
    Workload(tessera_demo::workload::WorkloadArgs),
}

/// Logs to stderr for the daemons: plain text (ANSI colours only on a
/// terminal, so `kubectl logs` and files stay clean) or JSON lines.
/// `RUST_LOG` filters, `info` by default.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (a subcommand that sets up its own) is harmless: it fails.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// Completes on SIGTERM (what the kubelet sends) or Ctrl-C: the daemons'
/// (device plugin, DRA plugin, webhook) cue to stop serving.
async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if matches!(
        cli.cmd,
        Cmd::Webhook(_)
            | Cmd::DevicePlugin(_)
            | Cmd::DraPlugin(_)
            | Cmd::Manager(_)
            | Cmd::SchedulerExtender(_)
    ) {
        init_logs(cli.log_format);
    }
    match cli.cmd {
        Cmd::Webhook(args) => webhook_cmd::main(args)?,
        Cmd::DevicePlugin(args) => device_plugin_cmd::main(args)?,
        Cmd::DraPlugin(args) => dra_plugin_cmd::main(args)?,
        Cmd::Manager(args) => manager_cmd::main(args)?,
        Cmd::Status(args) => status_cmd::status_main(args)?,
        Cmd::Top(args) => status_cmd::top_main(args)?,
        Cmd::Run(args) => run_cmd::main(args)?,
        Cmd::Resize(args) => resize_cmd::main(args)?,
        Cmd::Pause(args) => resize_cmd::pause_main(args, true)?,
        Cmd::Resume(args) => resize_cmd::pause_main(args, false)?,
        Cmd::InstallHook(args) => tessera_client::install_hook::install_hook(&args)?,
        Cmd::SchedulerExtender(args) => extender_cmd::main(args)?,
        Cmd::Simulate(args) => tessera_simulate::run(&args)?,
        #[cfg(feature = "demo")]
        Cmd::Demo(args) => {
            let ok = tessera_demo::run(&args)?;
            return Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        #[cfg(feature = "demo")]
        Cmd::Workload(args) => tessera_demo::workload::run(&args)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line with the causes (`{:#}`), never anyhow's Debug form:
            // that one prints a backtrace whenever RUST_BACKTRACE is set, and
            // a bad flag or a missing file is not a bug. Panics keep theirs.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
