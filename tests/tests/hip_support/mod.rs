//! Helpers for the `hip_*` tests: a simulated node whose GPU is AMD's, an
//! allocation's files on it, and `hipclient.c` under
//! `LD_PRELOAD=libtessera.so`, built linked (versioned references) and
//! dlopen'ed (lookups on its own handle).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use std::sync::OnceLock;

use tessera_e2e::{ProbeChild, ProbeOutput, SimNode, fingerprint, hook_library};
use tessera_shm::{ControlSpec, DeviceSpec, Policy, State, create_allocation_files};
use tessera_sim::{GpuSpec, NodeConfig};

pub const MI: u64 = 1 << 20;
/// The unit the simulated AMD device holds memory in (the shim's `HIP_PAGE`).
pub const PAGE: u64 = 4 << 10;
/// What each process's device context holds on these tests' nodes, and what
/// the allocation charges for it (small, so that sixteen fit).
pub const CONTEXT: u64 = 16 * MI;

pub fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE) * PAGE
}

pub const ALLOC_ID: &str = "hip-test";

const CLIENT: &str = include_str!("hipclient.c");

/// The simulated HIP runtime's directory: the built `libtessera_sim_hip.so`
/// linked as `libamdhip64.so.5` (and `libamdhip64.so`), the simulated ROCm
/// SMI as `librocm_smi64.so.5`, made once per test
/// process, each link renamed into place.
pub fn hip_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let built = tessera_sim::libs::find_built_library("libtessera_sim_hip.so")
            .expect("the simulated HIP runtime is built with the tests");
        let dir = tessera_e2e::work_dir().join("hiplib");
        std::fs::create_dir_all(&dir).expect("the HIP library directory");
        // ROCm SMI beside it, as a ROCm image has it: the shim asks it what
        // a context really holds.
        let smi = tessera_e2e::sim_rocm_smi_library();
        for (name, target) in [
            ("libamdhip64.so.5", &built),
            ("libamdhip64.so", &built),
            ("librocm_smi64.so.5", &smi),
        ] {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp).expect("linking the runtime");
            std::fs::rename(&tmp, dir.join(name)).expect("placing the link");
        }
        dir
    })
}

/// `LD_LIBRARY_PATH` with the simulated HIP runtime first.
pub fn hip_library_path() -> std::ffi::OsString {
    let mut p = hip_lib_dir().as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        p.push(":");
        p.push(old);
    }
    p
}

/// How the client reaches the HIP runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Linked against `libamdhip64.so.5`: its references carry the
    /// runtime's symbol versions (`hipMalloc@hip_4.2`).
    Link,
    /// `dlopen` + `dlsym` on its own handle, as hip-python does.
    Dlopen,
}

impl Client {
    pub const ALL: [Client; 2] = [Client::Link, Client::Dlopen];

    /// The client binary, compiled once per source and mode (once per test
    /// process: the tests of one binary run on threads of one process,
    /// whose temporary files would otherwise share a name).
    pub fn binary(self) -> PathBuf {
        static BUILT: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
        let slot = match self {
            Client::Link => &BUILT[0],
            Client::Dlopen => &BUILT[1],
        };
        slot.get_or_init(|| self.build()).clone()
    }

    fn build(self) -> PathBuf {
        let dir = tessera_e2e::work_dir();
        let lib = hip_lib_dir();
        let (tag, args): (&str, Vec<String>) = match self {
            Client::Link => (
                "link",
                vec![format!("-L{}", lib.display()), "-l:libamdhip64.so.5".into()],
            ),
            Client::Dlopen => ("dlopen", vec!["-DHIP_DLOPEN".into(), "-ldl".into()]),
        };
        let out = dir.join(format!("hipclient-{tag}-{}", fingerprint(CLIENT)));
        if !out.is_file() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tessera_e2e::cc_text(CLIENT, &out, &args).unwrap_or_else(|e| panic!("{e}"));
        }
        out
    }
}

/// How the manager names simulated AMD device `i`: `GPU-` and ROCm SMI's
/// unique id, the first eight bytes of the device's UUID, in hex.
pub fn amd_uuid(node: &SimNode, i: u32) -> String {
    let bytes = node.node().device_info(i).expect("the device").uuid_bytes;
    let mut head = [0u8; 8];
    head.copy_from_slice(&bytes[..8]);
    format!("GPU-{:016x}", u64::from_be_bytes(head))
}

/// A node of simulated AMD GPUs with one allocation on one of them.
pub struct HipSim {
    pub node: SimNode,
    pub control: PathBuf,
    pub state_path: PathBuf,
    /// The node's GPU the allocation is on.
    pub gpu: u32,
}

impl HipSim {
    /// One AMD GPU of `memory` bytes, an allocation of `limit` on it.
    pub fn new(memory: u64, limit: u64) -> HipSim {
        HipSim::with_gpus(1, 0, memory, limit)
    }

    /// `gpus` AMD GPUs of `memory` bytes, an allocation of `limit` on GPU
    /// `gpu`.
    pub fn with_gpus(gpus: u32, gpu: u32, memory: u64, limit: u64) -> HipSim {
        let node = SimNode::builder()
            .config(NodeConfig {
                devices: gpus,
                memory_per_device: memory,
                gpus: (0..gpus).map(|_| GpuSpec::amd(None)).collect(),
                seed: 0x41d0_4149,
                ..NodeConfig::default()
            })
            .build();
        let dir = node.dir.path().join("alloc");
        let sim = HipSim {
            control: dir.join("control"),
            state_path: dir.join("state"),
            node,
            gpu,
        };
        sim.node.node().set_context_memory(CONTEXT);
        sim.allocate(limit, Policy::Burst, 1_000_000);
        sim
    }

    /// (Re)writes the allocation on the allocation's GPU.
    pub fn allocate(&self, limit: u64, policy: Policy, share_ppm: u32) {
        let uuid = amd_uuid(&self.node, self.gpu);
        let mut spec = ControlSpec::new(
            ALLOC_ID,
            vec![DeviceSpec {
                uuid,
                memory_limit_bytes: limit,
                compute_share_ppm: share_ppm,
                policy,
            }],
        );
        spec.context_overhead_bytes = CONTEXT;
        create_allocation_files(self.control.parent().expect("alloc dir"), &spec)
            .expect("allocation files");
    }

    pub fn state(&self) -> State {
        State::open(&self.state_path, ALLOC_ID).expect("state file")
    }

    /// The manager's reaper, stood in for: returns the quota of this node's processes
    /// that ended and that the driver let go (their contexts included). The shim never
    /// does; without it a process run after another would find its context still charged.
    pub fn reclaim_released(&self) -> usize {
        tessera_e2e::sim::reclaim_released(self.node.node(), &self.state())
    }

    /// After a governed process ended: waits (the simulated driver tears its context
    /// down after a while) until the stand-in reaper has returned its slot.
    pub fn reclaim_ended(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.reclaim_released() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the ended process's slot was never released"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Ground truth: bytes the simulated device holds.
    pub fn used(&self) -> u64 {
        self.node.node().memory_used(self.gpu as usize)
    }

    /// The client with `args`, the shim preloaded, governed when `governed`.
    pub fn command(&self, client: Client, governed: bool, args: &[&str]) -> Command {
        let mut c = self.node.command(client.binary());
        c.env("LD_LIBRARY_PATH", hip_library_path())
            .env(
                "LD_PRELOAD",
                hook_library().expect("libtessera.so is built"),
            )
            .env_remove("TESSERA_CONTROL")
            .env_remove("TESSERA_STATE")
            .env_remove("TESSERA_LOG")
            .args(args);
        if governed {
            c.env("TESSERA_CONTROL", &self.control);
        }
        c
    }

    pub fn run(&self, client: Client, governed: bool, args: &[&str]) -> ProbeOutput {
        ProbeOutput::from_output(
            self.command(client, governed, args)
                .output()
                .expect("running the client"),
        )
    }

    pub fn spawn(&self, client: Client, governed: bool, args: &[&str]) -> ProbeChild {
        ProbeChild::start(self.command(client, governed, args))
    }
}
