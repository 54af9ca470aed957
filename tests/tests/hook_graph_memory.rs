//! Graph memory under a limit, with ground truth from the simulated device:
//! allocation nodes (added directly or captured from `cuMemAllocAsync`)
//! take memory when a graph is launched or uploaded; the device's graph
//! memory keeps it until trimmed, and is charged for it until then; a
//! launch that would pass the limit is refused before anything runs; a
//! program that frees a graph's allocation and allocates again gets its
//! memory (the shim trims the graph memory first).

mod hook_support;

use hook_support::*;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

/// Ground truth: the device holds at most the limit, and exactly what the
/// allocation's books say.
fn holds(sim: &Sim, what: &str) -> u64 {
    let used = sim.used(0);
    assert!(used <= LIMIT, "{what}: device holds {used} > {LIMIT}");
    assert_eq!(
        used,
        sim.state().reserved(0),
        "{what}: the books say otherwise"
    );
    used
}

#[test]
fn graph_memory_is_charged_from_launch_until_trimmed() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    let g = ok(&mut c, &format!("graph-node {} 0", 48 * MI));
    let (e, h) = (g.u64("e"), g.u64("h"));
    assert_eq!(
        holds(&sim, "instantiated"),
        0,
        "nothing is mapped before launch"
    );
    ok(&mut c, &format!("launch {e} 0"));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "launched"), 48 * MI);
    // The graph's allocation freed: the graph memory keeps it, charged.
    ok(&mut c, &format!("free-async {h} 0"));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "freed, not trimmed"), 48 * MI);
    // Plain memory that needs it: the shim trims the graph memory first.
    ok(&mut c, &format!("alloc {}", 48 * MI));
    assert_eq!(holds(&sim, "plain after trim"), 48 * MI);
    // Now the graph does not fit: refused, nothing launched.
    refused(&mut c, &format!("launch {e} 0"), OOM);
    assert_eq!(holds(&sim, "refused launch"), 48 * MI);
    ok(&mut c, "free 1");
    ok(&mut c, &format!("launch {e} 0"));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "relaunched"), 48 * MI);
    ok(&mut c, &format!("free-async {h} 0"));
    ok(&mut c, "sync-stream 0");
    ok(&mut c, "graph-trim 0");
    assert_eq!(holds(&sim, "trimmed by the program"), 0);
    assert_eq!(sim.state().oom_refused(0), 1);
    assert!(c.finish().success());
}

#[test]
fn graphs_reuse_graph_memory_and_uploads_and_captures_are_charged() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    let a = ok(&mut c, &format!("graph-node {} 0", 40 * MI));
    let b = ok(&mut c, &format!("graph-node {} 0", 40 * MI));
    // Uploading maps the memory as a first launch would.
    ok(&mut c, &format!("upload {} 0", a.u64("e")));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "uploaded"), 40 * MI);
    ok(&mut c, &format!("launch {} 0", a.u64("e")));
    ok(&mut c, &format!("free-async {} 0", a.u64("h")));
    ok(&mut c, "sync-stream 0");
    // The second graph reuses the first's graph memory: no growth.
    ok(&mut c, &format!("launch {} 0", b.u64("e")));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "second graph"), 40 * MI);
    // With the second's allocation live, a third 40 MiB graph, captured
    // from cuMemAllocAsync, cannot fit beside it.
    let cap = ok(&mut c, &format!("capture {} 0", 40 * MI));
    assert_eq!(holds(&sim, "captured, not launched"), 40 * MI);
    refused(&mut c, &format!("launch {} 0", cap.u64("e")), OOM);
    ok(&mut c, &format!("free-async {} 0", b.u64("h")));
    ok(&mut c, "sync-stream 0");
    ok(&mut c, &format!("launch {} 0", cap.u64("e")));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "captured graph launched"), 40 * MI);
    // A captured allocation charged nothing at capture: a plain 20 MiB
    // allocation fits beside the live 40.
    ok(&mut c, &format!("alloc {}", 20 * MI));
    assert_eq!(holds(&sim, "plain beside"), 60 * MI);
    assert!(c.finish().success());
}

#[test]
fn instantiating_with_upload_is_admitted_like_a_launch() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    let g = ok(&mut c, &format!("graph-upload {} 0 0", 40 * MI));
    assert_eq!(g.u64("result"), 0, "CUDA_GRAPH_INSTANTIATE_SUCCESS");
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "uploaded at instantiation"), 40 * MI);
    // A second one reuses that reserve (nothing is live yet).
    let g2 = ok(&mut c, &format!("graph-upload {} 0 0", 40 * MI));
    assert_eq!(holds(&sim, "second upload"), 40 * MI);
    // Launched, the first's allocation is live: the second no longer fits.
    ok(&mut c, &format!("launch {} 0", g.u64("e")));
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, "first launched"), 40 * MI);
    refused(&mut c, &format!("launch {} 0", g2.u64("e")), OOM);
    assert_eq!(holds(&sim, "second refused"), 40 * MI);
    assert!(c.finish().success());
}
