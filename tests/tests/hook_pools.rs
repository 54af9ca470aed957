//! Stream-ordered pools under a limit, with ground truth from the simulated
//! device: a pool's retained memory counts until the pool gives it back,
//! so no number of pools with any release threshold gets past the limit;
//! a program that frees and allocates again never sees a spurious
//! out-of-memory (the shim trims its own pools first); every charge lands
//! on the device that holds the memory, whatever the current context.

mod hook_support;

use hook_support::*;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

/// Ground truth: the device holds at most the limit, and exactly what the
/// allocation's books say.
fn holds(sim: &Sim, dev: usize, limit: u64, what: &str) -> u64 {
    let used = sim.used(dev);
    assert!(used <= limit, "{what}: device {dev} holds {used} > {limit}");
    assert_eq!(
        used,
        sim.state().reserved(dev),
        "{what}: the books say otherwise"
    );
    used
}

#[test]
fn the_default_pool_keeps_freed_memory_charged_and_gives_it_up_for_an_allocation() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    // The reproduction, scaled: 48 MiB from the default pool,
    // freed, then 48 MiB of plain memory, with and without a sync between.
    ok(&mut c, &format!("default-pool 0 {}", u64::MAX));
    for sync in [true, false] {
        ok(&mut c, &format!("async {} -1", 48 * MI));
        let h = 2 * u64::from(!sync);
        ok(&mut c, &format!("free-async {h} -1"));
        if sync {
            ok(&mut c, "sync");
        }
        // The pool keeps it (its threshold is maximal): it is charged.
        assert_eq!(holds(&sim, 0, LIMIT, "after the free"), 48 * MI);
        let m = ok(&mut c, "meminfo");
        assert_eq!(m.u64("free"), LIMIT - 48 * MI, "{}", m.raw);
        // Plain memory past what is left: the shim trims its pool first,
        // so the program gets it.
        ok(&mut c, &format!("alloc {}", 48 * MI));
        assert_eq!(holds(&sim, 0, LIMIT, "plain after pool"), 48 * MI);
        ok(&mut c, &format!("free {}", h + 1));
        holds(&sim, 0, LIMIT, "all freed");
    }
    assert_eq!(sim.state().oom_refused(0), 0, "no spurious refusal");
    assert!(c.finish().success());
}

#[test]
fn pools_that_keep_everything_cannot_add_up_past_the_limit() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    // Ten pools of their own, each told to keep everything.
    for p in 0..10 {
        ok(&mut c, &format!("pool 0 {}", u64::MAX));
        ok(&mut c, &format!("from-pool {} {p} 0", 24 * MI));
        ok(&mut c, &format!("free-async {p} 0"));
        ok(&mut c, "sync-stream 0");
        holds(&sim, 0, LIMIT, &format!("pool {p}"));
    }
    // Live allocations cannot be trimmed away: past the limit is refused.
    ok(&mut c, &format!("from-pool {} 0 0", 40 * MI));
    refused(&mut c, &format!("from-pool {} 1 0", 40 * MI), OOM);
    holds(&sim, 0, LIMIT, "with 40 MiB live");
    assert_eq!(sim.state().oom_refused(0), 1);
    assert!(c.finish().success());
}

#[test]
fn freeing_and_allocating_again_never_sees_a_spurious_out_of_memory() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    ok(&mut c, &format!("default-pool 0 {}", u64::MAX));
    ok(&mut c, &format!("pool 0 {}", u64::MAX));
    for round in 0..20 {
        let h = round;
        // Alternate routes: the default pool, a pool of its own, plain
        // memory; 56 of 64 MiB each time, never synchronising.
        let line = match round % 3 {
            0 => format!("async {} 0", 56 * MI),
            1 => format!("from-pool {} 1 0", 56 * MI),
            _ => format!("alloc {}", 56 * MI),
        };
        ok(&mut c, &line);
        holds(&sim, 0, LIMIT, &line);
        if round % 3 == 2 {
            ok(&mut c, &format!("free {h}"));
        } else {
            ok(&mut c, &format!("free-async {h} 0"));
        }
    }
    assert_eq!(sim.state().oom_refused(0), 0);
    assert!(c.finish().success());
}

#[test]
fn a_destroyed_pool_stays_charged_for_its_live_allocations() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    ok(&mut c, &format!("pool 0 {}", u64::MAX));
    ok(&mut c, &format!("from-pool {} 0 0", 20 * MI));
    ok(&mut c, &format!("from-pool {} 0 0", 20 * MI));
    ok(&mut c, "free-async 0 0");
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, 0, LIMIT, "before destroy"), 40 * MI);
    ok(&mut c, "destroy-pool 0");
    assert_eq!(holds(&sim, 0, LIMIT, "destroyed"), 20 * MI);
    ok(&mut c, "free-async 1 0");
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, 0, LIMIT, "last free"), 0);
    assert!(c.finish().success());
}

#[test]
fn trimming_and_a_lower_threshold_return_the_quota() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    ok(&mut c, "stream 0");
    ok(&mut c, &format!("pool 0 {}", u64::MAX));
    ok(&mut c, &format!("from-pool {} 0 0", 30 * MI));
    ok(&mut c, "free-async 0 0");
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, 0, LIMIT, "kept"), 30 * MI);
    ok(&mut c, &format!("trim 0 {}", 10 * MI));
    assert_eq!(holds(&sim, 0, LIMIT, "trimmed to 10 MiB"), 10 * MI);
    let u = ok(&mut c, "pool-usage 0");
    assert_eq!(u.u64("reserved"), 10 * MI);
    // Threshold 0: given back at the next synchronisation.
    ok(&mut c, "default-pool 0 0");
    ok(&mut c, &format!("async {} 0", 20 * MI));
    ok(&mut c, "free-async 1 0");
    ok(&mut c, "sync-stream 0");
    assert_eq!(holds(&sim, 0, LIMIT, "threshold 0"), 10 * MI);
    assert!(c.finish().success());
}

#[test]
fn every_charge_goes_to_the_device_that_holds_the_memory() {
    let sim = Sim::new(2, PHYSICAL);
    sim.allocate_with(&[(0, LIMIT), (1, 16 * MI)], 0);
    let mut c = sim.client_init(true);
    // Device 0's context is current; the stream is device 1's.
    ok(&mut c, "stream 1");
    refused(&mut c, &format!("async {} 0", 32 * MI), OOM);
    ok(&mut c, &format!("async {} 0", 8 * MI));
    assert_eq!(holds(&sim, 1, 16 * MI, "device 1"), 8 * MI);
    assert_eq!(holds(&sim, 0, LIMIT, "device 0"), 0);
    // A pool on device 1, allocated from while device 0 is current.
    ok(&mut c, &format!("pool 1 {}", u64::MAX));
    refused(&mut c, &format!("from-pool {} 0 0", 12 * MI), OOM);
    ok(&mut c, &format!("from-pool {} 0 0", 8 * MI));
    assert_eq!(holds(&sim, 1, 16 * MI, "device 1 full"), 16 * MI);
    assert_eq!(holds(&sim, 0, LIMIT, "device 0 untouched"), 0);
    // Device 0's own pool still has all of device 0's limit.
    ok(&mut c, "stream 0");
    ok(&mut c, &format!("async {} 1", 60 * MI));
    assert_eq!(holds(&sim, 0, LIMIT, "device 0"), 60 * MI);
    assert!(c.finish().success());
}
