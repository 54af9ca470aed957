//! The flags of `tessera dra-plugin` and the [`Options`] they make; the
//! `tessera` binary only parses them and runs [`crate::run`].
// The doc comments below are also clap's --help text, where `<dir>` is
// meant literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use tessera_node::args::NodeArgs;

use crate::driver::DriverOptions;
use crate::plugin::{Error, Options};

/// The driver name, the DRA way: a DNS subdomain the vendor owns.
pub const DRIVER_NAME: &str = "vgpu.tessera.dev";

#[derive(clap::Args, Debug, Clone)]
pub struct DraPluginArgs {
    /// The DRA driver's name (in ResourceSlices, DeviceClasses, claims).
    #[arg(long, env = "TESSERA_DRA_DRIVER", default_value = DRIVER_NAME)]
    pub driver_name: String,
    /// The node: its name, config file, the manager's socket, the shim's host
    /// paths and the CDI spec dir (one spec per prepared claim; the flags the
    /// device plugin takes too).
    #[command(flatten)]
    pub node: NodeArgs,
    /// The kubelet's plugin registry dir, where the registration socket goes.
    #[arg(
        long,
        env = "TESSERA_DRA_REGISTRY_DIR",
        value_name = "DIR",
        default_value = tessera_proto::pluginregistration::v1::REGISTRY_DIR
    )]
    pub registry_dir: PathBuf,
    /// The plugin's dir: dra.sock and the checkpoint [default:
    /// /var/lib/kubelet/plugins/<driver-name>].
    #[arg(long, env = "TESSERA_DRA_PLUGIN_DIR", value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// A kubeconfig file [default: the in-cluster config].
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

impl DraPluginArgs {
    /// The options these flags give.
    pub fn options(&self) -> Result<Options, Error> {
        let node_name = self.node.node_name().map_err(Error::NodeName)?;
        let plugin_dir = self
            .plugin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&self.driver_name));
        Ok(Options {
            driver: DriverOptions {
                driver_name: self.driver_name.clone(),
                node_name,
                cdi_dir: self.node.cdi_spec_dir.clone(),
                host: self.node.host_paths(),
            },
            registry_dir: self.registry_dir.clone(),
            plugin_dir,
            manager_socket: self.node.manager_socket.clone(),
            config_path: self.node.config.clone(),
            kubeconfig: self.kubeconfig.clone(),
        })
    }
}
