//! The GPUs HIP shows a governed process are its allocation's: on a node of
//! two simulated AMD GPUs with the allocation on the second, the process
//! sees one device, its allocations land on that GPU by the simulator's
//! ground truth, and `hipSetDevice` of any other is refused; outside the
//! allocation the same client sees both.

mod hip_support;

use hip_support::*;

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
