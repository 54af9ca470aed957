//! Pages: the simulated driver holds every allocation family in whole 2 MiB device pages,
//! as the real driver does (an H200 held `cuMemAlloc` of n bytes at n rounded up to 2 MiB,
//! docs/simulator.md), and the shim charges what the driver holds, not what was asked. A
//! shim that charged the request would let a process of small allocations hold up to a
//! page per allocation past its limit: here it would admit far more than the limit's page
//! count, and the device would hold more than the limit, which these tests refuse.
//!
//! Ground truth is the simulated node's own count of what each process holds (what its
//! NVML reports per process), read by the test, never by the process under test.

mod hook_support;

use std::time::Duration;

use hook_support::*;
use tessera_e2e::{Mode, ProbeChild, probe_binary};

const PAGE: u64 = 2 << 20;
const T: Duration = Duration::from_secs(30);

/// Each family, a size that is not a whole page, and the pages the device holds for it.
/// (`pitch` rows are 512 bytes; `vmm` sizes are rounded by the probe to the granularity
/// it reads from the driver, as cuMemCreate requires.)
const FAMILIES: &[(&str, u64, u64)] = &[
    ("plain", 1, 1),
    ("plain", PAGE + 1, 2),
    ("managed", 3, 1),
    ("pitch", 513, 1),
    ("pitch", PAGE + 512, 2),
    ("array", 1000, 1),
    ("array3d", PAGE + 1, 2),
    ("mipmapped", 4096, 1),
    ("vmm", 1, 1),
    ("async", 1, 1),
    ("pool", PAGE + 1, 2),
];

/// What process `pid` holds on device 0 by ground truth.
fn held(sim: &Sim, pid: u32) -> u64 {
    sim.node
        .node()
        .process(pid)
        .map_or(0, |p| p.memory.first().copied().unwrap_or(0))
}

fn start(sim: &Sim, governed: bool) -> ProbeChild {
    let mut p = if governed {
        sim.spawn(Mode::Link, true)
    } else {
        // No shim at all: the simulated driver alone.
        ProbeChild::start(sim.node.command(probe_binary(Mode::Link)))
    };
    for c in ["init", "ctx"] {
        let l = p.cmd(c, T);
        assert!(l.ok, "{c}: {}", l.raw);
    }
    p
}

#[test]
fn the_simulated_driver_holds_every_family_in_whole_pages() {
    let sim = Sim::new(1, 1 << 30);
    let mut p = start(&sim, false);
    let pid = p.pid();
    for &(kind, bytes, pages) in FAMILIES {
        let before = held(&sim, pid);
        let free_before = p.cmd("meminfo", T).u64("free");
        let l = p.cmd(&format!("alloc {bytes} {kind}"), T);
        assert!(l.ok, "alloc {bytes} {kind}: {}", l.raw);
        let grew = held(&sim, pid) - before;
        assert_eq!(grew, pages * PAGE, "{kind} of {bytes} bytes: held {grew}");
        // cuMemGetInfo (the device's view, bare) shows the same pages gone.
        let free_after = p.cmd("meminfo", T).u64("free");
        assert_eq!(
            free_before - free_after,
            pages * PAGE,
            "{kind}: cuMemGetInfo"
        );
        let f = p.cmd(&format!("free {}", l.u64("h")), T);
        assert!(f.ok, "free {kind}: {}", f.raw);
        // Pools give their pages back at the synchronisation the probe's free makes
        // (the default release threshold is 0).
        assert_eq!(held(&sim, pid), before, "{kind}: its pages come back");
    }
}

/// Allocates `bytes` of `kind` until refused; returns how many were admitted, checking
/// after each that the device never holds more than `limit` for the process and that
/// what the shim charged (the state file) is within one page of it.
fn fill(sim: &Sim, p: &mut ProbeChild, kind: &str, bytes: u64, limit: u64) -> (u64, Vec<u64>) {
    let state = sim.state();
    let pid = p.pid();
    let mut handles = Vec::new();
    loop {
        let l = p.cmd(&format!("alloc {bytes} {kind}"), T);
        let truth = held(sim, pid);
        let charged = state.reserved(0);
        assert!(
            truth <= limit,
            "{kind} of {bytes}: the device holds {truth} for the process, over the limit {limit}"
        );
        assert!(
            charged.abs_diff(truth) <= PAGE,
            "{kind} of {bytes}: charged {charged}, the device holds {truth} (more than a page apart)"
        );
        if !l.ok {
            assert_eq!(
                l.error.as_deref(),
                Some("CUDA_ERROR_OUT_OF_MEMORY"),
                "{kind}: {}",
                l.raw
            );
            break;
        }
        handles.push(l.u64("h"));
        assert!(handles.len() < 1000, "{kind} of {bytes}: never refused");
    }
    (handles.len() as u64, handles)
}

fn free_all(p: &mut ProbeChild, handles: &[u64]) {
    for h in handles {
        let l = p.cmd(&format!("free {h}"), T);
        assert!(l.ok, "free {h}: {}", l.raw);
    }
}

#[test]
fn small_allocations_reach_the_limit_at_its_page_count() {
    const LIMIT: u64 = 16 * PAGE;
    let sim = Sim::one_gpu(1 << 30, LIMIT);
    let mut p = start(&sim, true);
    // One page each: exactly the limit's page count is admitted, not the millions of
    // bytes-sized allocations a shim charging the request would let through.
    for (kind, bytes) in [
        ("plain", 1),
        ("managed", 1),
        ("pitch", 1),
        ("array", 1),
        ("vmm", 1),
    ] {
        let (n, handles) = fill(&sim, &mut p, kind, bytes, LIMIT);
        assert_eq!(n, LIMIT / PAGE, "{kind} of {bytes} byte(s)");
        free_all(&mut p, &handles);
    }
    // Two pages each: half as many.
    for kind in ["plain", "managed", "array3d", "mipmapped"] {
        let (n, handles) = fill(&sim, &mut p, kind, PAGE + 1, LIMIT);
        assert_eq!(n, LIMIT / PAGE / 2, "{kind} of a page and a byte");
        free_all(&mut p, &handles);
    }
    // Stream-ordered memory shares its pool's pages; the limit still holds and the
    // charge follows the pool's pages (checked at every step by `fill`).
    for kind in ["async", "pool"] {
        let (n, handles) = fill(&sim, &mut p, kind, PAGE + 1, LIMIT);
        assert!(n >= LIMIT / PAGE / 2 - 1, "{kind}: {n} admitted");
        free_all(&mut p, &handles);
    }
    sim.state().audit().expect("the state file is consistent");
}

#[test]
fn what_the_shim_charges_equals_what_the_process_holds_within_a_page() {
    const LIMIT: u64 = 256 * PAGE;
    let sim = Sim::one_gpu(1 << 30, LIMIT);
    let mut p = start(&sim, true);
    let pid = p.pid();
    let state = sim.state();
    // Sizes that are not whole pages, mixed over the families.
    let mut x: u64 = 0x05ee_d0f9_a9e5;
    let mut live = Vec::new();
    for i in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = 1 + x % (8 << 20);
        let (kind, _, _) = FAMILIES[i % FAMILIES.len()];
        let l = p.cmd(&format!("alloc {bytes} {kind}"), T);
        assert!(l.ok, "alloc {bytes} {kind}: {}", l.raw);
        live.push(l.u64("h"));
        let (truth, charged) = (held(&sim, pid), state.reserved(0));
        assert!(
            charged.abs_diff(truth) <= PAGE,
            "after {kind} of {bytes}: charged {charged}, held {truth}"
        );
        // Every other one freed again: pages come back to both.
        if i % 2 == 1 {
            let h = live.remove(0);
            assert!(p.cmd(&format!("free {h}"), T).ok);
            let (truth, charged) = (held(&sim, pid), state.reserved(0));
            assert!(
                charged.abs_diff(truth) <= PAGE,
                "after a free: charged {charged}, held {truth}"
            );
        }
    }
    free_all(&mut p, &live);
    assert_eq!(held(&sim, pid), 0, "everything freed");
    assert_eq!(state.reserved(0), 0, "nothing left charged");
}
