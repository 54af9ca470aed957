//! An isolated simulated node per test: its own state file in a temporary directory (so
//! tests run in parallel), and commands that run programs against it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use tessera_sim::config::parse_size;
use tessera_sim::{Node, NodeConfig};

use crate::paths::sim_lib_dir;
use crate::probe::{Mode, ProbeChild, ProbeOutput, probe_binary};

/// A simulated node: a state file, created with its configuration, and the environment
/// that points programs at it.
#[derive(Debug)]
pub struct SimNode {
    pub dir: tempfile::TempDir,
    /// The node state file (`TESSERA_SIM_STATE`).
    pub state: PathBuf,
    pub config: NodeConfig,
    node: Node,
}

/// Configuration of a [`SimNode`] before it exists.
#[derive(Debug, Clone)]
pub struct SimNodeBuilder {
    config: NodeConfig,
}

impl SimNodeBuilder {
    pub fn devices(mut self, n: u32) -> Self {
        self.config.devices = n;
        self
    }

    /// Memory per device, as `TESSERA_SIM_MEMORY` takes it (`1Gi`, `512Mi`, bytes).
    ///
    /// # Panics
    /// On a malformed size (a bug in the test).
    pub fn memory(mut self, size: &str) -> Self {
        self.config.memory_per_device =
            parse_size(size).unwrap_or_else(|e| panic!("memory {size:?}: {e}"));
        self
    }

    pub fn sms(mut self, n: u32) -> Self {
        self.config.sms = n;
        self
    }

    pub fn config(mut self, config: NodeConfig) -> Self {
        self.config = config;
        self
    }

    /// Creates the state file.
    ///
    /// # Panics
    /// If the temporary directory or the state file cannot be created.
    pub fn build(self) -> SimNode {
        let dir = tempfile::tempdir().expect("a temporary directory for the node");
        let state = dir.path().join("node");
        let node = Node::open(&state, &self.config).expect("creating the node state");
        SimNode {
            dir,
            state,
            config: self.config,
            node,
        }
    }
}

impl Default for SimNode {
    fn default() -> Self {
        Self::new()
    }
}

impl SimNode {
    /// Two 16 GiB devices with a fixed seed (stable UUIDs in tests).
    pub fn builder() -> SimNodeBuilder {
        SimNodeBuilder {
            config: NodeConfig {
                seed: 0x7e55e7a,
                ..NodeConfig::default()
            },
        }
    }

    pub fn new() -> SimNode {
        Self::builder().build()
    }

    /// The node the manager's end-to-end tests run on: `devices` GPUs of 16 GiB and
    /// 100 SMs, compute capability 8.6, named "E2E Simulated GPU". Each test file
    /// passes a `seed` of its own, so the UUIDs it sees are its own too.
    pub fn e2e(devices: u32, seed: u64) -> SimNode {
        Self::builder()
            .config(NodeConfig {
                devices,
                memory_per_device: 16 << 30,
                sms: 100,
                cc_major: 8,
                cc_minor: 6,
                name: "E2E Simulated GPU".into(),
                seed,
                gpus: Vec::new(),
            })
            .build()
    }

    /// The node state, read directly (the ground truth).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// `LD_LIBRARY_PATH` (the simulated driver first) and `TESSERA_SIM_STATE`.
    pub fn env(&self) -> Vec<(String, OsString)> {
        let mut ld = OsString::from(sim_lib_dir().dir.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        vec![
            ("LD_LIBRARY_PATH".to_string(), ld),
            (
                "TESSERA_SIM_STATE".to_string(),
                self.state.clone().into_os_string(),
            ),
        ]
    }

    /// `program` with this node's environment.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env());
        c
    }

    /// The probe in `mode` with this node's environment and `script` as its arguments
    /// (none: it reads commands from stdin).
    pub fn probe(&self, mode: Mode, script: &[&str]) -> Command {
        let mut c = self.command(probe_binary(mode));
        c.args(script);
        c
    }

    /// Runs the probe to completion.
    ///
    /// # Panics
    /// If it cannot be started.
    pub fn run(&self, mode: Mode, script: &[&str]) -> ProbeOutput {
        ProbeOutput::from_output(
            self.probe(mode, script)
                .output()
                .expect("running the probe"),
        )
    }

    /// Starts the probe; with an empty `script` it takes commands through
    /// [`ProbeChild::send`].
    pub fn spawn(&self, mode: Mode, script: &[&str]) -> ProbeChild {
        ProbeChild::start(self.probe(mode, script))
    }
}

/// Liveness as the manager's reaper judges it for a reclaim: dead by `/proc` *and* no
/// longer listed by the (simulated) driver, which goes on holding an exited process's
/// memory until it has torn it down (docs/security.md, "The exit window").
struct ReleasedByDriver<'a> {
    proc_fs: tessera_shm::LocalLiveness,
    node: &'a Node,
}

impl tessera_shm::Liveness for ReleasedByDriver<'_> {
    fn check(&self, id: &tessera_shm::ProcIdentity) -> Option<bool> {
        match self.proc_fs.check(id) {
            Some(false) if self.node.process(id.pid).is_some() => None,
            other => other,
        }
    }
}

/// One pass of the manager's reaper over an allocation's state, for tests that run no
/// manager (the shim never returns a dead process's quota itself): the driver notices
/// the dead (as NVML's queries make it), then the slots of dead processes it no longer
/// lists are reclaimed. Returns how many were. Either vendor's simulated processes.
pub fn reclaim_released(node: &Node, state: &tessera_shm::State) -> usize {
    node.reap_dead();
    let live = ReleasedByDriver {
        proc_fs: tessera_shm::LocalLiveness::thorough(),
        node,
    };
    state.reclaim_dead(&live, None).len()
}
