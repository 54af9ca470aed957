//! What a process inside an allocation sees and is charged beyond its
//! allocations: NVML's memory info, `cuMemGetInfo` / `cuDeviceTotalMem`,
//! and the per-context overhead.

mod hook_support;

use std::time::Duration;

use hook_support::*;
use tessera_e2e::Mode;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;
const T: Duration = Duration::from_secs(20);

#[test]
fn an_nvml_client_inside_the_allocation_sees_the_virtualised_memory() {
    let sim = Sim::new(2, PHYSICAL);
    sim.allocate(LIMIT);
    // Another process of the allocation holds 5 MiB, which the device holds
    // (and the shim charges) as three 2 MiB pages.
    let mut holder = sim.spawn(Mode::Link, true);
    for c in ["init", "ctx", "alloc 5242880"] {
        assert!(holder.cmd(c, T).ok);
    }
    for mode in Mode::ALL {
        let o = sim.run(
            mode,
            true,
            &["nvml-init", "nvml-meminfo", "nvml-meminfo2", "nvml-count"],
        );
        o.expect_ok();
        let m = &o.all("nvml-meminfo");
        assert_eq!(m[0].u64("total"), LIMIT, "{}", o.stdout);
        assert_eq!(m[0].u64("used"), 6 * MI, "{}", o.stdout);
        assert_eq!(m[0].u64("free"), LIMIT - 6 * MI, "{}", o.stdout);
        let v2 = o.get("nvml-meminfo2");
        assert_eq!(v2.u64("total"), LIMIT, "{}", o.stdout);
        assert_eq!(v2.u64("used"), 6 * MI, "{}", o.stdout);
        assert_eq!(v2.u64("free"), LIMIT - 6 * MI, "{}", o.stdout);
        assert_eq!(v2.u64("reserved"), 0, "{}", o.stdout);
        // The node's other GPU is not part of the allocation: not shown
        // (hook_nvml_isolation.rs checks every way to reach it).
        assert_eq!(o.get("nvml-count").u64("n"), 1, "{}", o.stdout);
    }
    // NVML monitors do not join: only the holder has a slot.
    assert_eq!(sim.state().processes(1).len(), 1);
    // Outside the allocation, NVML is the device's own.
    let o = sim.run(Mode::Link, false, &["nvml-init", "nvml-meminfo"]);
    o.expect_ok();
    assert_eq!(o.get("nvml-meminfo").u64("total"), PHYSICAL);
    assert!(o.get("nvml-meminfo").u64("used") >= 5 * MI);
    assert!(holder.finish().success());
}

#[test]
fn the_view_is_capped_by_the_device_when_the_limit_is_larger() {
    let sim = Sim::new(1, PHYSICAL);
    sim.allocate(4 * PHYSICAL);
    let o = sim.run(
        Mode::Dlopen,
        true,
        &[
            "init",
            "ctx",
            "totalmem",
            "meminfo",
            "nvml-init",
            "nvml-meminfo",
        ],
    );
    o.expect_ok();
    assert_eq!(o.get("totalmem").u64("bytes"), PHYSICAL);
    assert_eq!(o.get("meminfo").u64("total"), PHYSICAL);
    assert_eq!(o.get("nvml-meminfo").u64("total"), PHYSICAL);
}

#[test]
fn each_context_is_charged_its_overhead_and_returns_it() {
    const OVERHEAD: u64 = 3 * MI;
    let sim = Sim::new(1, PHYSICAL);
    // The shim charges what the driver really holds per context (measured
    // through NVML, see hook_context.rs): the device holds the overhead.
    sim.node.node().set_context_memory(OVERHEAD);
    sim.allocate_with(&[(0, LIMIT)], OVERHEAD);
    let mut p = sim.spawn(Mode::ProcAddr, true);
    let mut step = |c: &str, reserved: u64| {
        let l = p.cmd(c, T);
        assert!(l.ok, "{}", l.raw);
        assert_eq!(sim.state().reserved(0), reserved, "after {c}");
    };
    step("init", 0);
    step("ctx", OVERHEAD);
    step("ctx-create", 2 * OVERHEAD);
    // Memory of a created context goes with it.
    // 1 MiB is held (and charged) as a 2 MiB page.
    step("alloc 1048576", 2 * OVERHEAD + PAGE);
    step("ctx-destroy", OVERHEAD);
    step("ctx-release", 0);
    assert!(p.finish().success());
    sim.state().audit().unwrap();

    // The overhead counts against the limit like any allocation.
    let o = sim.run(
        Mode::Link,
        true,
        &[
            "init",
            "ctx",
            "meminfo",
            &format!("alloc {}", LIMIT - OVERHEAD + 1),
            // What is left in whole pages (the device holds no less).
            &format!("alloc {}", (LIMIT - OVERHEAD) / PAGE * PAGE),
        ],
    );
    let l = raw(&o);
    assert_eq!(
        l[2],
        format!("ok meminfo free={} total={LIMIT}", LIMIT - OVERHEAD)
    );
    assert_eq!(l[3], "err alloc CUDA_ERROR_OUT_OF_MEMORY");
    assert!(l[4].starts_with("ok alloc"), "{l:#?}");
}
