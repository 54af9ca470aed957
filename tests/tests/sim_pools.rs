//! Stream-ordered pools on the simulated driver, checked against the node's ground truth:
//! a pool keeps freed memory on the device up to its release threshold until it is
//! trimmed or a synchronisation releases the excess, every pool attribute says so, and
//! allocations land on the pool's (or stream's) device whatever the current context.

mod sim_mem_support;

use sim_mem_support::*;

#[test]
fn a_pool_keeps_freed_memory_up_to_its_threshold_until_trimmed() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let mut p = spawn(&node);
    p.ok("init");
    p.ok("ctx 0");
    let s = p.obj("stream");
    let pool = p.obj("pool-create 0");
    p.ok(&format!("pool-threshold {pool} {}", 64 * MI));

    let a = p.obj(&format!("alloc-pool {} {pool} {s}", 48 * MI));
    assert_eq!(used(&node, 0), 48 * MI);
    p.ok(&format!("free-async {a} {s}"));
    assert_eq!(used(&node, 0), 48 * MI, "freed memory stays in the pool");
    let at = p.ok(&format!("pool-attrs {pool}"));
    assert_eq!((at.u64("used"), at.u64("reserved")), (0, 48 * MI));

    // Re-allocation comes out of the pool: the device does not grow.
    let b = p.obj(&format!("alloc-pool {} {pool} {s}", 32 * MI));
    assert_eq!(used(&node, 0), 48 * MI);
    p.ok(&format!("free-async {b} {s}"));
    p.ok(&format!("sync {s}"));
    assert_eq!(
        used(&node, 0),
        48 * MI,
        "under the threshold a sync keeps it"
    );

    p.ok(&format!("pool-threshold {pool} {}", 16 * MI));
    p.ok(&format!("sync {s}"));
    assert_eq!(
        used(&node, 0),
        16 * MI,
        "a sync releases what exceeds the threshold"
    );
    let at = p.ok(&format!("pool-attrs {pool}"));
    assert_eq!(at.u64("reserved"), 16 * MI);
    assert_eq!(
        (at.u64("reserved_high"), at.u64("used_high")),
        (48 * MI, 48 * MI)
    );

    p.ok(&format!("pool-trim {pool} 0"));
    assert_eq!(used(&node, 0), 0);
    p.ok(&format!("pool-reset-high {pool}"));
    let at = p.ok(&format!("pool-attrs {pool}"));
    assert_eq!(
        (
            at.u64("reserved"),
            at.u64("reserved_high"),
            at.u64("used_high")
        ),
        (0, 0, 0)
    );
    assert_eq!(held(&node, p.pid(), 0), 0);
}

#[test]
fn every_kind_of_synchronisation_releases_above_the_threshold() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let mut p = spawn(&node);
    p.ok("init");
    p.ok("ctx 0");
    let s = p.obj("stream");
    for sync in [
        format!("sync {s}"),
        "ctx-sync".to_string(),
        format!("event-sync {s}"),
    ] {
        // The default pool, threshold 0.
        let a = p.obj(&format!("alloc-async {} {s}", 8 * MI));
        p.ok(&format!("free-async {a} {s}"));
        assert_eq!(used(&node, 0), 8 * MI, "kept until {sync}");
        p.ok(&sync);
        assert_eq!(used(&node, 0), 0, "released by {sync}");
    }
}

#[test]
fn pools_with_a_high_threshold_hold_the_device_until_trimmed() {
    // Three pools that keep everything fill a 1 GiB device: the fourth allocation is
    // refused by the device itself, and trimming one pool makes room.
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let mut p = spawn(&node);
    p.ok("init");
    p.ok("ctx 0");
    let s = p.obj("stream");
    let mut pools = Vec::new();
    for _ in 0..3 {
        let pool = p.obj("pool-create 0");
        p.ok(&format!("pool-threshold {pool} 0xffffffffffffffff"));
        let a = p.obj(&format!("alloc-pool {} {pool} {s}", 300 * MI));
        p.ok(&format!("free-async {a} {s}"));
        p.ok(&format!("sync {s}"));
        pools.push(pool);
    }
    assert_eq!(used(&node, 0), 900 * MI);
    assert_eq!(held(&node, p.pid(), 0), 900 * MI);
    let last = p.obj("pool-create 0");
    assert_eq!(
        p.err(&format!("alloc-pool {} {last} {s}", 300 * MI)),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    p.ok(&format!("pool-trim {} 0", pools[0]));
    assert_eq!(used(&node, 0), 600 * MI);
    p.obj(&format!("alloc-pool {} {last} {s}", 300 * MI));
    assert_eq!(used(&node, 0), 900 * MI);
    // Destroying a pool returns what it keeps.
    p.ok(&format!("pool-destroy {}", pools[1]));
    assert_eq!(used(&node, 0), 600 * MI);
}

#[test]
fn allocations_land_on_the_pools_or_the_streams_device() {
    let node = SimNode::builder().memory("1Gi").build();
    let mut p = spawn(&node);
    p.ok("init");
    p.ok("ctx 1");
    let s1 = p.obj("stream");
    p.ok("ctx 0");
    let s0 = p.obj("stream");
    // cuMemAllocAsync on a device-1 stream while device 0's context is current.
    p.obj(&format!("alloc-async {} {s1}", 64 * MI));
    assert_eq!(held(&node, p.pid(), 1), 64 * MI);
    assert_eq!(held(&node, p.pid(), 0), 0);
    // A device-1 pool used from a device-0 stream.
    let pool1 = p.obj("pool-create 1");
    p.obj(&format!("alloc-pool {} {pool1} {s0}", 32 * MI));
    assert_eq!(held(&node, p.pid(), 1), 96 * MI);
    assert_eq!(held(&node, p.pid(), 0), 0);
    assert_eq!(used(&node, 0), 0);
}

#[test]
fn the_current_pool_is_the_default_until_set_and_after_its_destruction() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let mut p = spawn(&node);
    p.ok("init");
    p.ok("ctx 0");
    let s = p.obj("stream");
    let default = p.ok("pool-default 0").u64("val");
    assert_eq!(p.ok("pool-current 0").u64("val"), default);
    let at = p.ok(&format!("pool-attrs {:#x}", default));
    assert_eq!(
        (
            at.u64("reuse_follow"),
            at.u64("reuse_opportunistic"),
            at.u64("reuse_internal"),
            at.u64("threshold")
        ),
        (1, 1, 1, 0)
    );
    let mine = p.obj("pool-create 0");
    p.ok(&format!("pool-set 0 {mine}"));
    p.obj(&format!("alloc-async {} {s}", 4 * MI));
    assert_eq!(p.ok(&format!("pool-attrs {mine}")).u64("used"), 4 * MI);
    assert_eq!(p.ok(&format!("pool-attrs {:#x}", default)).u64("used"), 0);
    // A pool with a maximum size refuses to grow past it.
    let small = p.obj(&format!("pool-create 0 {}", 16 * MI));
    assert_eq!(
        p.err(&format!("alloc-pool {} {small} {s}", 32 * MI)),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    // Destroying the current pool (with an allocation in it) reverts to the default; its
    // allocation stays until freed.
    p.ok(&format!("pool-destroy {mine}"));
    assert_eq!(p.ok("pool-current 0").u64("val"), default);
    assert_eq!(used(&node, 0), 4 * MI);
}
