//! The flags both kubelet plugins take for the node they serve (its name, its config
//! file, the manager's socket, the shim's host paths, the CDI spec directory): one
//! declaration, flattened into `tessera device-plugin`'s and `tessera dra-plugin`'s own,
//! so that the two cannot drift apart in name, variable or default.

use std::path::PathBuf;

use crate::cdi::HostPaths;

/// The node flags of a kubelet plugin; each can also come from the environment
/// variable named beside it.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name [default: the kernel's hostname].
    #[arg(long, env = tessera_contract::node::NODE_NAME_ENV)]
    pub node_name: Option<String>,
    /// The node config file (slices, device-list strategy, compute policy; a
    /// ConfigMap in a cluster), reloaded when it changes [default: built-in
    /// defaults, 4 slices per GPU].
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The manager's socket.
    // `--socket` as for every other subcommand; the device plugin's old
    // `--manager-socket` stays accepted as a hidden alias.
    #[arg(
        long = "socket",
        alias = "manager-socket",
        env = tessera_contract::env::SOCKET,
        value_name = "PATH",
        default_value = tessera_proto::manager::v1::DEFAULT_SOCKET
    )]
    pub manager_socket: PathBuf,
    /// The hook library on the host (mounted into containers).
    #[arg(
        long,
        env = "TESSERA_HOOK_LIBRARY",
        value_name = "PATH",
        default_value = tessera_contract::paths::HOST_HOOK_LIBRARY
    )]
    pub hook_library: PathBuf,
    /// The host file mounted as /etc/ld.so.preload when the node config sets
    /// ldSoPreload (one file for both plugins).
    #[arg(
        long,
        env = "TESSERA_PRELOAD_FILE",
        value_name = "PATH",
        default_value = tessera_contract::paths::HOST_PRELOAD_FILE
    )]
    pub preload_file: PathBuf,
    /// The container runtime's CDI spec dir, where the plugin writes its specs.
    // The DRA plugin's old `--cdi-dir` stays accepted as a hidden alias.
    #[arg(
        long,
        alias = "cdi-dir",
        env = "TESSERA_CDI_SPEC_DIR",
        value_name = "DIR",
        default_value = "/var/run/cdi"
    )]
    pub cdi_spec_dir: PathBuf,
}

impl NodeArgs {
    /// The node's name: `--node-name` when given, else the kernel's hostname.
    pub fn node_name(&self) -> std::io::Result<String> {
        match &self.node_name {
            Some(n) => Ok(n.clone()),
            None => tessera_contract::node::kernel_hostname(),
        }
    }

    /// The shim's files on the host, as the CDI edits and mounts name them.
    pub fn host_paths(&self) -> HostPaths {
        HostPaths {
            hook_library: self.hook_library.clone(),
            preload_file: self.preload_file.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    #[test]
    fn old_flag_names_still_parse() {
        for (flag, cdi) in [
            ("--socket", "--cdi-spec-dir"),
            ("--manager-socket", "--cdi-dir"),
        ] {
            let cli = Cli::try_parse_from(["x", flag, "/tmp/m.sock", cdi, "/c"]).expect("parse");
            assert_eq!(
                cli.node.manager_socket,
                PathBuf::from("/tmp/m.sock"),
                "{flag}"
            );
            assert_eq!(cli.node.cdi_spec_dir, PathBuf::from("/c"), "{cdi}");
        }
    }

    #[test]
    fn a_given_name_and_host_paths_are_used() {
        let cli = Cli::try_parse_from([
            "x",
            "--node-name",
            "n1",
            "--hook-library",
            "/h/libtessera.so",
            "--preload-file",
            "/h/preload",
        ])
        .expect("parse");
        assert_eq!(cli.node.node_name().expect("name"), "n1");
        let host = cli.node.host_paths();
        assert_eq!(host.hook_library, PathBuf::from("/h/libtessera.so"));
        assert_eq!(host.preload_file, PathBuf::from("/h/preload"));
    }
}
