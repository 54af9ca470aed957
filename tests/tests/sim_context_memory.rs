//! The memory a CUDA context holds for itself on the simulated node: charged to the
//! device when a context is created (primary or not), returned when it is destroyed,
//! visible in ground truth, `cuMemGetInfo` and NVML's per-process memory, and configured
//! per node (`TESSERA_SIM_CONTEXT_MEMORY`, 518 MiB by default for nodes made from the
//! environment: what a context held on an H200). What an exited process held stays on
//! the device, and NVML lists the process, until the driver has torn it down
//! (`TESSERA_SIM_CONTEXT_TEARDOWN`).

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
    assert_eq!(
        free(&run_on_state(&default, &[], &script)),
        tessera_sim::node::DEFAULT_CONTEXT_MEMORY
    );
    assert_eq!(tessera_sim::node::DEFAULT_CONTEXT_MEMORY, 518 * MI);
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

#[test]
fn an_exited_process_is_listed_with_its_memory_until_the_driver_has_torn_it_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("node");
    let vars = [
        ("TESSERA_SIM_CONTEXT_MEMORY", "64Mi"),
        ("TESSERA_SIM_CONTEXT_TEARDOWN", "1s"),
    ];
    let out = run_on_state(&state, &vars, &["init", "ctx", "alloc 2097152", "pid"]);
    out.expect_ok();
    let pid: u32 = out.get("pid").u64("pid") as u32;
    // The process is gone; the node (as the environment made it) still holds its context
    // and its allocation, and NVML lists it, until its teardown is done.
    let node = tessera_sim::Node::open(&state, &tessera_sim::NodeConfig::default())
        .expect("the node the probe made");
    assert_eq!(node.context_teardown(), 1_000_000_000);
    let listed = node.process(pid).expect("still listed after its exit");
    assert!(listed.exiting, "{listed:?}");
    assert_eq!(listed.memory[0], 66 * MI);
    let t0 = std::time::Instant::now();
    while node.process(pid).is_some() {
        node.reap_dead();
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "never torn down"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(node.memory_used(0), 0);
    // A bad value is refused, naming the variable.
    let bad = dir.path().join("bad");
    let out = run_on_state(&bad, &[("TESSERA_SIM_CONTEXT_TEARDOWN", "soon")], &["init"]);
    assert!(
        out.stderr.contains("TESSERA_SIM_CONTEXT_TEARDOWN"),
        "{}",
        out.stderr
    );
}
