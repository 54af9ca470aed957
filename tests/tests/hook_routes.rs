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
                // One byte past the limit once the first's pages are counted.
                &format!("alloc {}", LIMIT - pages(200_000_000) + 1),
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
            format!(
                "ok meminfo free={} total={LIMIT}",
                LIMIT - pages(200_000_000)
            ),
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
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
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
    // Differential: the driver alone answers each query with some variant;
    // through the shim the answer must be the same variant, as the shim's
    // wrapper when it governs the function and the driver's own otherwise.
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let cases = [
        ("procaddr cuMemAlloc 12000", true),
        ("procaddr cuMemAlloc 3010", true),
        ("procaddr cuLaunchKernel 12000", true),
        ("procaddr cuLaunchKernel 12000 pt", true),
        ("procaddr cuMemFreeAsync 12000 pt", true),
        ("procaddr cuCtxCreate 3020", true),
        ("procaddr cuCtxCreate 11040", true),
        ("procaddr cuCtxCreate 12080", true),
        ("procaddr cuDevicePrimaryCtxRelease 12000", true),
        ("procaddr cuGetProcAddress 12000", true),
        ("procaddr cuMemcpyHtoD 12000", false),
        ("procaddr cuCtxSetCurrent 12000", false),
    ];
    let script: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let mut direct = sim.node.probe(Mode::ProcAddr, &script);
    direct.env_remove("LD_PRELOAD");
    let direct = tessera_e2e::ProbeOutput::from_output(direct.output().unwrap());
    direct.expect_ok();
    for governed in [true, false] {
        let o = sim.run(Mode::ProcAddr, governed, &script);
        o.expect_ok();
        assert_eq!(o.lines.len(), cases.len(), "{}", o.stdout);
        for ((line, want), (cmd, ours)) in o.lines.iter().zip(&direct.lines).zip(cases) {
            assert_eq!(want.str("lib"), "libcuda.so.1", "{}", want.raw);
            assert_eq!(line.str("resolved"), want.str("resolved"), "{cmd}");
            let lib = if ours {
                "libtessera.so"
            } else {
                "libcuda.so.1"
            };
            assert_eq!(line.str("lib"), lib, "{cmd}: {}", line.raw);
        }
    }
    // The variants differ where they should (the test would not notice a
    // shim that always handed out the newest one otherwise).
    let resolved = |i: usize| direct.lines[i].str("resolved");
    assert_ne!(resolved(0), resolved(1));
    assert_ne!(resolved(2), resolved(3));
    assert_ne!(resolved(5), resolved(6));
}

#[test]
fn a_device_outside_the_allocation_is_not_seen() {
    let sim = Sim::new(2, PHYSICAL);
    // Only the node's second GPU, listed by UUID; the probe has no
    // CUDA_VISIBLE_DEVICES (the shim pins it to the allocation at cuInit).
    sim.allocate_with(&[(1, LIMIT)], 0);
    let o = sim.run(
        Mode::Link,
        true,
        &[
            "init",
            "device 0",
            "ctx",
            "meminfo",
            &format!("alloc {LIMIT}"),
            "alloc 1",
            "device 1",
            "ctx",
        ],
    );
    let l = raw(&o);
    assert_eq!(
        l[3],
        format!("ok meminfo free={LIMIT} total={LIMIT}"),
        "{l:#?}"
    );
    assert!(l[4].starts_with("ok alloc"), "{l:#?}");
    assert_eq!(l[5], "err alloc CUDA_ERROR_OUT_OF_MEMORY", "{l:#?}");
    // The driver sees one device: there is no ordinal 1 to make a context on.
    assert!(l[7].starts_with("err ctx"), "{l:#?}");
}

#[test]
fn devices_map_by_uuid_whatever_the_order() {
    let sim = Sim::new(2, PHYSICAL);
    // The control file lists the node's GPU 1 first; the process asks for
    // the node's order (as a launcher may: the variable may reorder within
    // the allocation).
    sim.allocate_with(&[(1, 64 * MI), (0, 128 * MI)], 0);
    let mut c = sim.probe(Mode::Dlopen, true);
    c.env(
        "CUDA_VISIBLE_DEVICES",
        format!("{},{}", sim.uuid(0), sim.uuid(1)),
    );
    c.args([
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
    ]);
    let o = tessera_e2e::ProbeOutput::from_output(c.output().unwrap());
    let l = &o.lines;
    assert_eq!(l[3].u64("total"), 128 * MI, "{}", o.stdout);
    assert_eq!(l[7].u64("total"), 64 * MI, "{}", o.stdout);
    // The process still holds both allocations after exiting: the state
    // file charged each to its GPU's entry.
    let state = sim.state();
    assert_eq!(state.reserved(0), pages(3000), "control index 0 is GPU 1");
    assert_eq!(state.reserved(1), pages(1000), "control index 1 is GPU 0");
}

#[test]
fn limits_follow_the_gpu_whatever_cuda_visible_devices_selects() {
    let sim = Sim::new(2, PHYSICAL);
    sim.allocate_with(&[(0, 64 * MI), (1, 128 * MI)], 0);
    let gpu1 = sim.uuid(1);
    // (CUDA_VISIBLE_DEVICES, totals seen at ordinals 0 and 1)
    let cases = [
        ("1", vec![128 * MI]),
        ("1,0", vec![128 * MI, 64 * MI]),
        (gpu1.as_str(), vec![128 * MI]),
        ("0,1", vec![64 * MI, 128 * MI]),
    ];
    for (visible, totals) in cases {
        let mut script = vec!["init".to_string()];
        for i in 0..totals.len() {
            script.extend([format!("device {i}"), "ctx".into(), "meminfo".into()]);
        }
        // The last visible ordinal is refused one byte over its limit.
        let last = *totals.last().unwrap();
        script.push(format!("alloc {}", last + 1));
        script.push(format!("alloc {last}"));
        let mut c = sim.probe(Mode::Link, true);
        c.env("CUDA_VISIBLE_DEVICES", visible).args(&script);
        let o = tessera_e2e::ProbeOutput::from_output(c.output().unwrap());
        let seen: Vec<u64> = o.all("meminfo").iter().map(|l| l.u64("total")).collect();
        assert_eq!(seen, totals, "CUDA_VISIBLE_DEVICES={visible}: {}", o.stdout);
        let allocs = o.all("alloc");
        assert_eq!(
            allocs[0].error.as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{visible}: {}",
            o.stdout
        );
        assert!(allocs[1].ok, "{visible}: {}", o.stdout);
        // It exited holding its limit: the manager (here one pass of its stand-in)
        // returns that once the driver has let the process go, for the next case.
        assert_eq!(reclaim_released(&sim, &sim.state()), 1);
    }
}
