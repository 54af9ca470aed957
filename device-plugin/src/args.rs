//! The flags of `tessera device-plugin` and the [`Options`] they make; the
//! `tessera` binary only parses them and calls [`crate::run`].
// The doc comments below are also clap's --help text, where `<dir>` is
// meant literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::Options;

/// Flags that parse but cannot make [`Options`].
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("no --node-name and cannot read the hostname: {0}")]
    Hostname(#[source] std::io::Error),
    #[error("--node-label {0:?} is not KEY=VALUE")]
    NodeLabel(String),
}

/// Whether to use the Kubernetes API (node labels).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeMode {
    /// When running in a pod (KUBERNETES_SERVICE_HOST is set).
    Auto,
    On,
    Off,
}

/// Command-line flags of `tessera device-plugin`; most can also come from the
/// environment variable named beside them.
#[derive(clap::Args, Debug)]
pub struct DevicePluginArgs {
    /// The node: its name, config file, the manager's socket, the shim's host
    /// paths and the CDI spec dir (the flags the DRA plugin takes too).
    #[command(flatten)]
    pub node: tessera_node::args::NodeArgs,
    /// The kubelet's root dir.
    #[arg(
        long,
        env = "TESSERA_KUBELET_DIR",
        value_name = "DIR",
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_dir: PathBuf,
    /// Where kubelet.sock is and the plugin's socket goes [default:
    /// <kubelet-dir>/device-plugins].
    #[arg(long, env = "TESSERA_DEVICE_PLUGIN_DIR", value_name = "DIR")]
    pub device_plugin_dir: Option<PathBuf>,
    /// The kubelet's PodResources socket [default:
    /// <kubelet-dir>/pod-resources/kubelet.sock].
    #[arg(long, env = "TESSERA_POD_RESOURCES_SOCKET", value_name = "PATH")]
    pub pod_resources_socket: Option<PathBuf>,
    /// Do not track pods (no owners recorded, no orphaned allocations deleted).
    #[arg(long)]
    pub no_pod_resources: bool,
    /// Read node labels and publish GPU labels through the Kubernetes API.
    #[arg(long, env = "TESSERA_KUBE", value_enum, default_value = "auto")]
    pub kube: KubeMode,
    /// A node label to assume when the Kubernetes API is off (repeatable).
    #[arg(long = "node-label", value_name = "KEY=VALUE")]
    pub node_labels: Vec<String>,
    /// How often the config file is checked for changes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub config_poll: Duration,
    /// How often PodResources is read.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub pod_resources_interval: Duration,
    /// An allocation whose pod is gone for this long is deleted.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub orphan_grace: Duration,
    /// Without the manager for this long, every slice turns Unhealthy.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub manager_grace: Duration,
    /// Serve KAI-Scheduler's GPU choice (docs/dropin.md, "Who picks the GPU"):
    /// `nvidia.com/gpu`, one device per GPU, for KAI's reservation pods only, and the
    /// slices of a KAI pod on the GPU its group reserved. Nothing else on the node may
    /// ask for `nvidia.com/gpu` (NVIDIA's device plugin does not run beside Tessera's).
    #[arg(long, env = "TESSERA_KAI_RESERVATIONS")]
    pub kai_reservations: bool,
}

/// `500ms`, `2s`, `5m`, `1h`: the one duration syntax (tessera-contract).
fn parse_duration(s: &str) -> Result<Duration, String> {
    tessera_contract::units::duration_arg(s)
}

impl DevicePluginArgs {
    /// The plugin's [`Options`] for these flags: the node's name from the
    /// kernel when not given, paths under `--kubelet-dir` unless given one by
    /// one, the Kubernetes API on in `auto` mode when running in a pod.
    pub fn options(&self) -> Result<Options, ArgsError> {
        let node = self.node.node_name().map_err(ArgsError::Hostname)?;
        let mut labels = BTreeMap::new();
        for l in &self.node_labels {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| ArgsError::NodeLabel(l.clone()))?;
            labels.insert(k.to_owned(), v.to_owned());
        }
        let mut o = Options::new(node);
        o.config_path = self.node.config.clone();
        o.manager_socket = self.node.manager_socket.clone();
        o.device_plugin_dir = self
            .device_plugin_dir
            .clone()
            .unwrap_or_else(|| self.kubelet_dir.join("device-plugins"));
        o.pod_resources_socket = if self.no_pod_resources {
            None
        } else {
            Some(
                self.pod_resources_socket
                    .clone()
                    .unwrap_or_else(|| self.kubelet_dir.join("pod-resources/kubelet.sock")),
            )
        };
        o.host = self.node.host_paths();
        o.cdi_spec_dir = Some(self.node.cdi_spec_dir.clone());
        o.use_kube = match self.kube {
            KubeMode::On => true,
            KubeMode::Off => false,
            KubeMode::Auto => std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        };
        o.static_labels = labels;
        o.config_poll = self.config_poll;
        o.pod_resources_interval = self.pod_resources_interval;
        o.orphan_grace = self.orphan_grace;
        o.manager_grace = self.manager_grace;
        o.kai_reservations = self.kai_reservations;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevicePluginArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("s").is_err());
        // The contract's one syntax takes fractions.
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn socket_flag_and_its_old_name() {
        for flag in ["--socket", "--manager-socket"] {
            let cli =
                Cli::try_parse_from(["x", "--node-name", "n", flag, "/tmp/m.sock"]).expect("parse");
            let o = cli.args.options().expect("options");
            assert_eq!(o.manager_socket, PathBuf::from("/tmp/m.sock"), "{flag}");
        }
    }

    #[test]
    fn paths_derive_from_the_kubelet_dir() {
        let cli = Cli::try_parse_from([
            "x",
            "--node-name",
            "n1",
            "--kubelet-dir",
            "/k",
            "--node-label",
            "pool=big",
            "--kube",
            "off",
        ])
        .expect("parse");
        let o = cli.args.options().expect("options");
        assert_eq!(o.node_name, "n1");
        assert_eq!(o.device_plugin_dir, PathBuf::from("/k/device-plugins"));
        assert_eq!(
            o.pod_resources_socket,
            Some(PathBuf::from("/k/pod-resources/kubelet.sock"))
        );
        assert_eq!(o.static_labels.get("pool").map(String::as_str), Some("big"));
        assert!(!o.use_kube);
        let bad =
            Cli::try_parse_from(["x", "--node-name", "n", "--node-label", "nokey"]).expect("parse");
        assert!(bad.args.options().is_err());
    }
}
