//! Graph memory on the simulated driver, by ground truth: allocation nodes get an address
//! at creation and memory at upload or launch, the device's graph memory keeps it after
//! the allocations are freed until `cuDeviceGraphMemTrim`, the graph memory attributes
//! say so, and stream capture turns stream-ordered allocations into graph memory.

mod sim_mem_support;

use sim_mem_support::*;

fn start(node: &SimNode) -> (Mem, String) {
    let mut p = spawn(node);
    p.ok("init");
    p.ok("ctx 0");
    let s = p.obj("stream");
    (p, s)
}

fn attrs(p: &mut Mem) -> (u64, u64, u64, u64) {
    let l = p.ok("graph-attrs 0");
    (
        l.u64("used"),
        l.u64("used_high"),
        l.u64("reserved"),
        l.u64("reserved_high"),
    )
}

#[test]
fn graph_memory_is_reserved_at_launch_and_kept_until_trimmed() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut p, s) = start(&node);
    let g = p.obj("graph-create");
    let a = p.obj(&format!("graph-alloc {g} {} 0", 64 * MI));
    let x = p.obj(&format!("graph-inst {g}"));
    assert_eq!(used(&node, 0), 0, "no memory before the graph runs");
    assert_eq!(p.err(&format!("read {a} 16")), "CUDA_ERROR_INVALID_VALUE");

    p.ok(&format!("graph-launch {x} {s}"));
    assert_eq!(used(&node, 0), 64 * MI);
    assert_eq!(held(&node, p.pid(), 0), 64 * MI);
    assert_eq!(attrs(&mut p), (64 * MI, 64 * MI, 64 * MI, 64 * MI));
    p.ok(&format!("write {a} 4096 4"));
    assert_eq!(p.ok(&format!("read {a} 4096")).u64("sum"), 4 * 4096);
    assert_eq!(
        p.err(&format!("graph-launch {x} {s}")),
        "CUDA_ERROR_INVALID_VALUE",
        "its allocation is still live"
    );

    p.ok(&format!("free-async {a} {s}"));
    p.ok(&format!("sync {s}"));
    assert_eq!(attrs(&mut p).0, 0);
    assert_eq!(used(&node, 0), 64 * MI, "freed graph memory stays reserved");
    p.ok(&format!("graph-launch {x} {s}"));
    assert_eq!(used(&node, 0), 64 * MI, "a relaunch reuses the reserve");
    p.ok(&format!("free {a}"));
    p.ok("graph-trim 0");
    assert_eq!(used(&node, 0), 0);
    assert_eq!(attrs(&mut p), (0, 64 * MI, 0, 64 * MI));
    p.ok("graph-reset-high 0");
    assert_eq!(attrs(&mut p), (0, 0, 0, 0));
}

#[test]
fn a_graph_that_frees_its_allocation_keeps_the_reserve_not_the_allocation() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut p, s) = start(&node);
    let g = p.obj("graph-create");
    let a = p.obj(&format!("graph-alloc {g} {} 0", 32 * MI));
    p.ok(&format!("graph-free {g} {a}"));
    let x = p.obj(&format!("graph-inst {g}"));
    for _ in 0..3 {
        p.ok(&format!("graph-launch {x} {s}"));
        assert_eq!(used(&node, 0), 32 * MI);
        assert_eq!(attrs(&mut p).0, 0, "freed inside the graph");
    }
    assert_eq!(p.err(&format!("read {a} 16")), "CUDA_ERROR_INVALID_VALUE");
    // Trimming keeps nothing once no graph allocation is live, even with the
    // executable alive.
    p.ok("graph-trim 0");
    assert_eq!(used(&node, 0), 0);
    // A graph with memory nodes has one executable at a time.
    assert_eq!(
        p.err(&format!("graph-inst {g}")),
        "CUDA_ERROR_INVALID_VALUE"
    );
    p.ok(&format!("exec-destroy {x}"));
    p.obj(&format!("graph-inst {g}"));
}

#[test]
fn upload_reserves_and_a_graph_too_big_for_the_device_is_refused_whole() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut p, s) = start(&node);
    let g = p.obj("graph-create");
    p.obj(&format!("graph-alloc {g} {} 0", 16 * MI));
    let x = p.obj(&format!("graph-inst {g}"));
    p.ok(&format!("graph-upload {x} {s}"));
    assert_eq!(used(&node, 0), 16 * MI);
    assert_eq!(attrs(&mut p).2, 16 * MI);

    let big = p.obj("graph-create");
    let b1 = p.obj(&format!("graph-alloc {big} {} 0", 600 * MI));
    p.obj(&format!("graph-alloc {big} {} 0", 600 * MI));
    let bx = p.obj(&format!("graph-inst {big}"));
    assert_eq!(
        p.err(&format!("graph-launch {bx} {s}")),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(
        used(&node, 0),
        16 * MI,
        "nothing of the refused launch remains"
    );
    assert_eq!(p.err(&format!("read {b1} 1")), "CUDA_ERROR_INVALID_VALUE");
}

#[test]
fn stream_capture_turns_stream_ordered_allocations_into_graph_memory() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut p, s) = start(&node);
    assert_eq!(p.ok(&format!("capturing {s}")).u64("status"), 0);
    assert_eq!(
        p.err("capture-begin 0"),
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "the legacy stream cannot be captured"
    );
    p.ok(&format!("capture-begin {s}"));
    assert_eq!(p.ok(&format!("capturing {s}")).u64("status"), 1);
    let a = p.obj(&format!("alloc-async {} {s}", 16 * MI));
    let b = p.obj(&format!("alloc-async {} {s}", 8 * MI));
    p.ok(&format!("free-async {a} {s}"));
    assert_eq!(used(&node, 0), 0, "captured, not allocated");
    assert_eq!(
        p.err(&format!("sync {s}")),
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    );
    let g = p.obj(&format!("capture-end {s}"));
    assert_eq!(p.ok(&format!("capturing {s}")).u64("status"), 0);
    let x = p.obj(&format!("graph-inst {g}"));
    p.ok(&format!("graph-launch {x} {s}"));
    assert_eq!(used(&node, 0), 24 * MI);
    assert_eq!(
        attrs(&mut p).0,
        8 * MI,
        "b is live, a was freed in the graph"
    );
    p.ok(&format!("write {b} 10 1"));
    p.ok(&format!("free-async {b} {s}"));
    p.ok(&format!("sync {s}"));
    assert_eq!(
        used(&node, 0),
        24 * MI,
        "graph memory is not pool memory: a sync keeps it"
    );
    p.ok("graph-trim 0");
    assert_eq!(used(&node, 0), 0);
    assert_eq!(held(&node, p.pid(), 0), 0);
}

#[test]
fn kernels_launched_on_a_capturing_stream_run_when_the_graph_does() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut p, s) = start(&node);
    let k = p.obj("kernel step 20ms");
    let busy = || node.node().device_usage(0).expect("device").busy_ns;
    p.ok(&format!("capture-begin {s}"));
    let a = p.obj(&format!("alloc-async {} {s}", 4 * MI));
    p.ok(&format!("launch {k} {s}"));
    p.ok(&format!("launch {k} {s}"));
    p.ok(&format!("free-async {a} {s}"));
    let g = p.obj(&format!("capture-end {s}"));
    assert_eq!(busy(), 0, "captured, not run");
    let x = p.obj(&format!("graph-inst {g}"));
    p.ok(&format!("graph-launch {x} {s}"));
    assert_eq!(busy(), 40_000_000, "both kernels ran with the graph");
    p.ok(&format!("graph-launch {x} {s}"));
    assert_eq!(busy(), 80_000_000);
    p.ok(&format!("sync {s}"));
}
