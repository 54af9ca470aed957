//! The flags of `tessera dra-plugin` and the [`Options`] they make; the
//! `tessera` binary only parses them and runs [`crate::run`].
// The doc comments below are also clap's --help text, where `<dir>` is
// meant literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use tessera_node::cdi::HostPaths;

use crate::driver::DriverOptions;
use crate::plugin::{Error, Options};

/// The driver name, the DRA way: a DNS subdomain the vendor owns.
pub const DRIVER_NAME: &str = "vgpu.tessera.dev";

#[derive(clap::Args, Debug, Clone)]
pub struct DraPluginArgs {
    /// The DRA driver's name (in ResourceSlices, DeviceClasses, claims).
    #[arg(long, env = "TESSERA_DRA_DRIVER", default_value = DRIVER_NAME)]
    pub driver_name: String,
    /// This node's name [default: the kernel's hostname].
    #[arg(long, env = tessera_contract::node::NODE_NAME_ENV)]
    pub node_name: Option<String>,
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
    /// The container runtime's CDI spec dir: one spec per prepared claim.
    #[arg(
        long,
        env = "TESSERA_CDI_SPEC_DIR",
        value_name = "DIR",
        default_value = "/var/run/cdi"
    )]
    pub cdi_dir: PathBuf,
    /// A kubeconfig file [default: the in-cluster config].
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The manager's socket.
    #[arg(
        long,
        env = tessera_contract::env::SOCKET,
        value_name = "PATH",
        default_value = tessera_proto::manager::v1::DEFAULT_SOCKET
    )]
    pub socket: PathBuf,
    /// The node config file the device plugin reads (slices, device-list
    /// strategy, compute policy) [default: built-in defaults].
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The hook library on the host (mounted into containers by CDI).
    #[arg(
        long,
        env = "TESSERA_HOOK_LIBRARY",
        value_name = "PATH",
        default_value = tessera_contract::paths::HOST_HOOK_LIBRARY
    )]
    pub hook_library: PathBuf,
    /// The host file mounted as /etc/ld.so.preload when the node config sets
    /// ldSoPreload (the device plugin's file; either plugin writes it).
    #[arg(
        long,
        env = "TESSERA_PRELOAD_FILE",
        value_name = "PATH",
        default_value = tessera_contract::paths::HOST_PRELOAD_FILE
    )]
    pub preload_file: PathBuf,
}

impl DraPluginArgs {
    /// The options these flags give.
    pub fn options(&self) -> Result<Options, Error> {
        let node_name = match &self.node_name {
            Some(n) => n.clone(),
            None => tessera_contract::node::kernel_hostname().map_err(Error::NodeName)?,
        };
        let plugin_dir = self
            .plugin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&self.driver_name));
        Ok(Options {
            driver: DriverOptions {
                driver_name: self.driver_name.clone(),
                node_name,
                cdi_dir: self.cdi_dir.clone(),
                host: HostPaths {
                    hook_library: self.hook_library.clone(),
                    preload_file: self.preload_file.clone(),
                },
            },
            registry_dir: self.registry_dir.clone(),
            plugin_dir,
            manager_socket: self.socket.clone(),
            config_path: self.config.clone(),
            kubeconfig: self.kubeconfig.clone(),
        })
    }
}
