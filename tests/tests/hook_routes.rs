//! The three ways a program reaches the driver (linked, `dlopen`+`dlsym`,
//! `cuGetProcAddress`) all meet the shim: each sees the allocation's limit
//! and is refused beyond it. An ungoverned process is left alone, and
//! `cuGetProcAddress` hands out the wrapper of exactly the variant asked for.

mod hook_support;

use hook_support::*;
use tessera_e2e::Mode;

const LIMIT: u64 = 256 * MI;
const PHYSICAL: u64 = 1 << 30;

#[test]
fn every_client_style_sees_the_limit_and_is_refused_beyond_it() {
    let sim = Sim::new(2, PHYSICAL);
    sim.allocate(LIMIT);
    for mode in Mode::ALL {
        let o = sim.run(
            mode,
            true,
            &[
                "init",
                "ctx",
                "meminfo",
                "totalmem",
                &format!("alloc {}", LIMIT + 1),
                "alloc 200000000",
                &format!("alloc {}", LIMIT - 200_000_000 + 1),
                "meminfo",
                "free 0",
                &format!("alloc {LIMIT}"),
                "meminfo",
                "free 1",
            ],
        );
        let l = raw(&o);
        let ctx = format!("{mode:?}: {l:#?}\n{}", o.stderr);
        assert_eq!(l.len(), 12, "{ctx}");
        assert_eq!(
            l[2],
            format!("ok meminfo free={LIMIT} total={LIMIT}"),
            "{ctx}"
        );
        assert_eq!(l[3], format!("ok totalmem bytes={LIMIT}"), "{ctx}");
        assert_eq!(l[4], "err alloc CUDA_ERROR_OUT_OF_MEMORY", "{ctx}");
        assert!(l[5].starts_with("ok alloc h=0"), "{ctx}");
        assert_eq!(l[6], "err alloc CUDA_ERROR_OUT_OF_MEMORY", "{ctx}");
        assert_eq!(
            l[7],
            format!("ok meminfo free={} total={LIMIT}", LIMIT - 200_000_000),
            "{ctx}"
        );
        assert!(l[9].starts_with("ok alloc h=1"), "the whole limit: {ctx}");
        assert_eq!(l[10], format!("ok meminfo free=0 total={LIMIT}"), "{ctx}");
        assert_eq!(o.stderr, "", "the shim is quiet");
    }
    assert_eq!(sim.state().reserved(0), 0);
    sim.state().audit().unwrap();
}

#[test]
fn an_ungoverned_process_is_untouched() {
    let sim = Sim::new(1, PHYSICAL);
    sim.allocate(LIMIT);
    for mode in Mode::ALL {
        let o = sim.run(
            mode,
            false,
            &[
                "init",
                "ctx",
                "meminfo",
                "totalmem",
                &format!("alloc {}", LIMIT * 2),
                "meminfo",
                "nvml-init",
                "nvml-meminfo",
            ],
        );
        let l = raw(&o);
        let ctx = format!("{mode:?}: {l:#?}");
        assert_eq!(
            l[2],
            format!("ok meminfo free={PHYSICAL} total={PHYSICAL}"),
            "{ctx}"
        );
        assert_eq!(l[3], format!("ok totalmem bytes={PHYSICAL}"), "{ctx}");
        assert!(l[4].starts_with("ok alloc"), "no limit applies: {ctx}");
        assert_eq!(
            l[5],
            format!("ok meminfo free={} total={PHYSICAL}", PHYSICAL - 2 * LIMIT),
            "{ctx}"
        );
        assert_eq!(o.lines[7].u64("total"), PHYSICAL, "{ctx}");
        assert_eq!(o.stderr, "");
    }
    // It never joined the allocation.
    assert!(sim.state().processes(1).is_empty());
    assert_eq!(sim.state().reserved(0), 0);
}

#[test]
fn get_proc_address_keeps_the_version_and_flavour_asked_for() {
    let sim = Sim::new(1, PHYSICAL);
    sim.allocate(LIMIT);
    let cases = [
        (
            "procaddr cuMemAlloc 12000",
            "cuMemAlloc_v2",
            "libtessera.so",
        ),
        ("procaddr cuMemAlloc 3010", "cuMemAlloc", "libtessera.so"),
        (
            "procaddr cuLaunchKernel 12000",
            "cuLaunchKernel",
            "libtessera.so",
        ),
        (
            "procaddr cuLaunchKernel 12000 pt",
            "cuLaunchKernel_ptsz",
            "libtessera.so",
        ),
        (
            "procaddr cuMemFreeAsync 12000 pt",
            "cuMemFreeAsync_ptsz",
            "libtessera.so",
        ),
        (
            "procaddr cuCtxCreate 12080",
            "cuCtxCreate_v4",
            "libtessera.so",
        ),
        (
            "procaddr cuCtxCreate 11040",
            "cuCtxCreate_v3",
            "libtessera.so",
        ),
        (
            "procaddr cuGetProcAddress 12000",
            "cuGetProcAddress_v2",
            "libtessera.so",
        ),
        // Ungoverned: the driver's own function.
        (
            "procaddr cuMemcpyHtoD 12000",
            "cuMemcpyHtoD_v2",
            "libcuda.so.1",
        ),
        (
            "procaddr cuCtxSetCurrent 12000",
            "cuCtxSetCurrent",
            "libcuda.so.1",
        ),
    ];
    for governed in [true, false] {
        let script: Vec<&str> = cases.iter().map(|c| c.0).collect();
        let o = sim.run(Mode::ProcAddr, governed, &script);
        assert_eq!(o.lines.len(), cases.len(), "{}", o.stdout);
        for (line, (cmd, sym, lib)) in o.lines.iter().zip(cases) {
            assert_eq!(line.str("resolved"), sym, "{cmd}: {}", line.raw);
            assert_eq!(line.str("lib"), lib, "{cmd}: {}", line.raw);
        }
    }
}

#[test]
fn a_device_outside_the_allocation_has_no_memory() {
    let sim = Sim::new(2, PHYSICAL);
    // Only the node's second GPU, listed by UUID.
    sim.allocate_with(&[(1, LIMIT)], 0);
    let o = sim.run(
        Mode::Link,
        true,
        &[
            "init",
            "device 0",
            "ctx",
            "meminfo",
            "alloc 1",
            "device 1",
            "ctx",
            "meminfo",
            &format!("alloc {LIMIT}"),
            "alloc 1",
        ],
    );
    let l = raw(&o);
    assert_eq!(l[3], "ok meminfo free=0 total=0", "{l:#?}");
    assert_eq!(l[4], "err alloc CUDA_ERROR_OUT_OF_MEMORY", "{l:#?}");
    assert_eq!(
        l[7],
        format!("ok meminfo free={LIMIT} total={LIMIT}"),
        "{l:#?}"
    );
    assert!(l[8].starts_with("ok alloc"), "{l:#?}");
    assert_eq!(l[9], "err alloc CUDA_ERROR_OUT_OF_MEMORY", "{l:#?}");
}

#[test]
fn devices_map_by_uuid_whatever_the_order() {
    let sim = Sim::new(2, PHYSICAL);
    // The control file lists the node's GPU 1 first.
    sim.allocate_with(&[(1, 64 * MI), (0, 128 * MI)], 0);
    let o = sim.run(
        Mode::Dlopen,
        true,
        &[
            "init",
            "device 0",
            "ctx",
            "meminfo",
            "alloc 1000",
            "device 1",
            "ctx",
            "meminfo",
            "alloc 3000",
            "sleep 1",
        ],
    );
    let l = &o.lines;
    assert_eq!(l[3].u64("total"), 128 * MI, "{}", o.stdout);
    assert_eq!(l[7].u64("total"), 64 * MI, "{}", o.stdout);
    // The process still holds both allocations after exiting: the state
    // file charged each to its GPU's entry.
    let state = sim.state();
    assert_eq!(state.reserved(0), 3000, "control index 0 is GPU 1");
    assert_eq!(state.reserved(1), 1000, "control index 1 is GPU 0");
}
