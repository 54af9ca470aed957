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
pub mod kubelet;
pub mod paths;
pub mod probe;
pub mod sim;

pub use cc::{cc, cc_text, fingerprint};
pub use paths::{hook_library, sim_lib_dir, sim_nvml_library, sim_rocm_smi_library, work_dir};
pub use probe::{Line, Mode, ProbeChild, ProbeOutput, probe_binary, run_on_state};
pub use sim::{SimNode, SimNodeBuilder};

/// A log without its terminal colour codes (the daemons' `tracing` lines
/// colour their fields), so tests can match `pid=42` as written.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence ends at its first letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_codes_are_stripped_and_the_text_kept() {
        let coloured =
            "\u{1b}[2m2026\u{1b}[0m \u{1b}[33mWARN\u{1b}[0m pid\u{1b}[2m=\u{1b}[0m42 done";
        assert_eq!(super::strip_ansi(coloured), "2026 WARN pid=42 done");
        assert_eq!(super::strip_ansi("plain"), "plain");
    }
}
