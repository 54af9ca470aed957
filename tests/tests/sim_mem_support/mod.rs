//! Shared by the memory-route tests (`sim_pools`, `sim_graph_memory`, `sim_ipc`): the
//! memory probe (`tests/probe/memprobe.c`) compiled against the simulated driver, and
//! ground-truth helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub use tessera_e2e::{Line, ProbeChild, SimNode};
use tessera_e2e::{sim_lib_dir, work_dir};

pub const MI: u64 = 1 << 20;
pub const T: Duration = Duration::from_secs(20);

/// `tests/probe/memprobe.c`, compiled once per test binary (linked with `-lcuda`).
pub fn memprobe() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("probe/memprobe.c");
        let lib = format!("-L{}", sim_lib_dir().dir.display());
        let out = work_dir().join(format!("memprobe.{}", std::process::id()));
        tessera_e2e::cc(&src, &out, &["-O1", &lib, "-lcuda"])
            .unwrap_or_else(|e| panic!("memprobe: {e}"));
        out
    })
}

/// A memory probe on `node`, taking commands on stdin.
pub fn spawn(node: &SimNode) -> Mem {
    Mem(ProbeChild::start(node.command(memprobe())))
}

/// A running memory probe.
pub struct Mem(pub ProbeChild);

impl Mem {
    /// Runs a command that must succeed.
    ///
    /// # Panics
    /// If it fails.
    pub fn ok(&mut self, cmd: &str) -> Line {
        let l = self.0.cmd(cmd, T);
        assert!(l.ok, "{cmd}: {}", l.raw);
        l
    }

    /// Runs a command that succeeds and makes an object; returns `$slot`.
    pub fn obj(&mut self, cmd: &str) -> String {
        format!("${}", self.ok(cmd).u64("h"))
    }

    /// Runs a command that must fail; returns the error name.
    ///
    /// # Panics
    /// If it succeeds.
    pub fn err(&mut self, cmd: &str) -> String {
        let l = self.0.cmd(cmd, T);
        assert!(!l.ok, "{cmd} should fail: {}", l.raw);
        l.error.clone().unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.0.pid()
    }
}

/// Bytes the process `pid` holds on `device` by ground truth (0 if it has no slot).
pub fn held(node: &SimNode, pid: u32, device: usize) -> u64 {
    node.node()
        .process(pid)
        .map_or(0, |p| p.memory.get(device).copied().unwrap_or(0))
}

/// Device memory in use by ground truth.
pub fn used(node: &SimNode, device: usize) -> u64 {
    node.node().memory_used(device)
}
