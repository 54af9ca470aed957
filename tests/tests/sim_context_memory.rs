//! The memory a CUDA context holds for itself on the simulated node: charged to the
//! device when a context is created (primary or not), returned when it is destroyed,
//! visible in ground truth, `cuMemGetInfo` and NVML's per-process memory, and configured
//! per node (`TESSERA_SIM_CONTEXT_MEMORY`, 300 MiB by default for nodes made from the
//! environment).

mod sim_mem_support;

use sim_mem_support::*;
use tessera_e2e::{Mode, ProbeOutput, run_on_state};

#[test]
fn every_context_holds_the_nodes_context_memory_until_destroyed() {
    let node = SimNode::builder().devices(2).memory("2Gi").build();
    node.node().set_context_memory(300 * MI);
    let mut p = spawn(&node);
    p.ok("init");
    assert_eq!(used(&node, 0), 0, "cuInit alone makes no context");
    p.ok("ctx 0");
    assert_eq!(held(&node, p.pid(), 0), 300 * MI);
    let free = p.ok("meminfo").u64("free");
    assert_eq!(free, 2048 * MI - 300 * MI);
    let c = p.obj("ctx-create 0");
    assert_eq!(used(&node, 0), 600 * MI);
    assert_eq!(used(&node, 1), 0, "only the context's device");
    p.ok(&format!("ctx-destroy {c}"));
    assert_eq!(used(&node, 0), 300 * MI);
}

#[test]
fn nvml_lists_a_process_with_its_context_memory() {
    let node = SimNode::builder().devices(1).memory("2Gi").build();
    node.node().set_context_memory(64 * MI);
    let out = node.run(Mode::Link, &["init", "ctx", "nvml-init", "nvml-procs"]);
    out.expect_ok();
    let line = out.get("nvml-procs");
    let pids = line.str("pids");
    let (_, mem) = pids.split_once(':').expect("one process listed");
    assert_eq!(mem.parse::<u64>().expect("bytes"), 64 * MI, "{}", line.raw);
}

#[test]
fn a_context_that_does_not_fit_is_refused() {
    let node = SimNode::builder().devices(1).memory("256Mi").build();
    node.node().set_context_memory(300 * MI);
    let mut p = spawn(&node);
    p.ok("init");
    assert_eq!(p.err("ctx 0"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(used(&node, 0), 0);
}

#[test]
fn a_node_made_from_the_environment_takes_its_context_memory_from_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = ["init", "ctx", "meminfo"];
    let free = |out: &ProbeOutput| {
        out.expect_ok();
        out.get("meminfo").u64("total") - out.get("meminfo").u64("free")
    };
    let default = dir.path().join("default");
    assert_eq!(free(&run_on_state(&default, &[], &script)), 300 * MI);
    let set = dir.path().join("set");
    let vars = [("TESSERA_SIM_CONTEXT_MEMORY", "64Mi")];
    assert_eq!(free(&run_on_state(&set, &vars, &script)), 64 * MI);
    let bad = dir.path().join("bad");
    let out = run_on_state(&bad, &[("TESSERA_SIM_CONTEXT_MEMORY", "lots")], &["init"]);
    assert_eq!(
        out.get("init").error.as_deref(),
        Some("CUDA_ERROR_OPERATING_SYSTEM")
    );
    assert!(
        out.stderr.contains("TESSERA_SIM_CONTEXT_MEMORY"),
        "{}",
        out.stderr
    );
}
