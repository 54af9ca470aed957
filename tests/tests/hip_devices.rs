//! The GPUs HIP shows a governed process are its allocation's: on a node of
//! two simulated AMD GPUs with the allocation on the second, the process
//! sees one device, its allocations land on that GPU by the simulator's
//! ground truth, and `hipSetDevice` of any other is refused; outside the
//! allocation the same client sees both. Where ROCm 6 moved a field, the
//! shim reads the layout of the version the runtime reports.

mod hip_support;

use std::time::Duration;

use hip_support::*;

const T: Duration = Duration::from_secs(60);
const PHYSICAL: u64 = 4096 * MI;
const LIMIT: u64 = 1024 * MI;

#[test]
fn hip_sees_only_the_allocations_gpu() {
    let sim = HipSim::with_gpus(2, 1, PHYSICAL, LIMIT);
    let o = sim.run(
        Client::Link,
        true,
        &[
            "count", "setdev", "1", "setdev", "0", "malloc", "3145728", "meminfo",
        ],
    );
    assert!(o.status.success(), "{}{}", o.stdout, o.stderr);
    assert_eq!(o.get("count").u64("devices"), 1, "{}", o.stdout);
    // Device 1 does not exist in the narrowed view (the runtime or the shim
    // refuses it: either is hipErrorInvalidDevice).
    let set = o.all("setdev");
    assert_eq!(
        set[0].error.as_deref(),
        Some("HIP_ERROR_101"),
        "{}",
        o.stdout
    );
    assert!(set[1].ok, "{}", o.stdout);
    assert!(o.get("malloc").ok, "{}", o.stdout);
    assert_eq!(o.get("meminfo").u64("total"), LIMIT, "{}", o.stdout);
    // Ground truth: the allocation's GPU held it, the other GPU nothing.
    let node = sim.node.node();
    assert_eq!(
        node.memory_used(0),
        0,
        "memory landed outside the allocation"
    );
    sim.reclaim_ended();
    assert_eq!(sim.used(), 0);
    assert_eq!(sim.state().reserved(0), 0);

    // Ungoverned, the same client sees the node's two GPUs.
    let o = sim.run(Client::Link, false, &["count"]);
    assert_eq!(o.get("count").u64("devices"), 2, "{}", o.stdout);
}

#[test]
fn rocm6_layouts_are_read_as_the_runtime_reports_its_version() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    // The simulated runtime in ROCm 6 mode reports 6.2 and reads
    // hipMemAllocationProp with `location` at byte 8: read at HIP 5's byte
    // 4, the device would be `location.type` (1), outside the allocation,
    // and the allocation refused.
    let mut cmd = sim.command(
        Client::Link,
        true,
        &[
            "vmm6", "4194304", "props6", "ready", "freeall", "ready", "wait",
        ],
    );
    cmd.env("TESSERA_SIM_HIP_ROCM6", "1");
    let mut c = tessera_e2e::ProbeChild::start(cmd);
    let v = c.wait_for("vmm6", T);
    assert!(v.ok, "{}", v.raw);
    // hip-python's properties call shows the allocation's view.
    let p = c.wait_for("props6", T);
    assert!(p.ok, "{}", p.raw);
    assert_eq!(p.u64("total"), LIMIT, "{}", p.raw);
    assert!(c.wait_for("ready", T).ok);
    let used = sim.used();
    assert_eq!(used, CONTEXT + 4 * MI, "the device holds the mapping");
    assert_eq!(
        sim.state().reserved(0),
        used,
        "the books and the device differ"
    );
    c.send("go");
    assert!(c.wait_for("freeall", T).ok);
    assert!(c.wait_for("ready", T).ok);
    assert_eq!(sim.state().reserved(0), CONTEXT, "still charged");
    c.send("go");
    assert!(c.finish().success());
}
