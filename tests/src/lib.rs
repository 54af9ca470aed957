//! Helpers shared by the end-to-end tests: paths of the built libraries, the probe client
//! (compiled once per test binary), isolated simulated nodes, child processes and their
//! output.
//!
//! A typical test:
//!
//! ```no_run
//! use tessera_e2e::{Mode, SimNode};
//! let node = SimNode::builder().memory("1Gi").build();
//! let out = node.run(Mode::Link, &["init", "ctx", "alloc 1024", "meminfo"]);
//! out.expect_ok();
//! assert_eq!(out.get("alloc").u64("bytes"), 1024);
//! ```

pub mod bench;
pub mod cc;
pub mod paths;
pub mod probe;
pub mod sim;

pub use cc::{cc, cc_text, fingerprint};
pub use paths::{hook_library, sim_lib_dir, sim_nvml_library, work_dir};
pub use probe::{Line, Mode, ProbeChild, ProbeOutput, probe_binary, run_on_state};
pub use sim::{SimNode, SimNodeBuilder};
