//! The simulated driver through the three ways programs reach a driver: linked with
//! `-lcuda`, `dlopen` + `dlsym`, and `cuGetProcAddress_v2` (as the CUDA 12 runtime).
//! Each client creates a context, allocates and frees every kind of memory, loads a
//! module, launches every kind of launch and synchronises, and reads NVML.

use tessera_e2e::{Mode, SimNode};

const MI: u64 = 1 << 20;

fn full_session(mode: Mode) {
    let node = SimNode::builder().memory("256Mi").build();
    let dev0 = node.node().device_info(0).expect("device 0");
    let out = node.run(
        mode,
        &[
            "init",
            "version",
            "count",
            "name",
            "uuid",
            "ctx",
            "totalmem",
            "meminfo",
            "alloc 1048576",
            "alloc 100000 pitch",
            "alloc 3000 managed",
            "alloc 4096 async",
            "alloc 8192 pool",
            "alloc 3000000 vmm",
            "alloc 100000 array",
            "alloc 100000 array3d",
            "alloc 70000 mipmapped",
            "meminfo",
            "nvml-init",
            "nvml-count",
            "nvml-name",
            "nvml-uuid",
            "nvml-meminfo",
            "nvml-meminfo2",
            "nvml-procs",
            "free 0",
            "free 1",
            "free 2",
            "free 3",
            "free 4",
            "free 5",
            "free 6",
            "free 7",
            "free 8",
            "meminfo",
            "load kernel short 2ms; kernel noop 0",
            "launch short 3",
            "launch noop 5 ptsz",
            "launch short 1 ex",
            "launch short 1 coop",
            "launch short 2 graph",
            "launch short 1 stream",
            "sync",
            "elapsed short 5",
            "nvml-shutdown",
        ],
    );
    out.expect_ok();

    assert_eq!(out.get("version").u64("driver"), 12090);
    assert_eq!(out.get("count").u64("n"), 2);
    assert_eq!(out.get("name").str("name"), dev0.name);
    assert_eq!(out.get("uuid").str("uuid"), dev0.uuid);
    assert_eq!(out.get("totalmem").u64("bytes"), 256 * MI);

    // Every allocation is charged to the device while held and returned when freed.
    let allocs = out.all("alloc");
    assert_eq!(allocs.len(), 9);
    // The device holds each in whole 2 MiB pages (docs/simulator.md, "Pages").
    let held: u64 = allocs
        .iter()
        .map(|l| l.u64("bytes").div_ceil(2 * MI) * 2 * MI)
        .sum();
    let info = out.all("meminfo");
    assert_eq!(info[0].u64("free"), 256 * MI);
    assert_eq!(info[1].u64("free"), 256 * MI - held);
    assert_eq!(info[2].u64("free"), 256 * MI);
    // Pitched rows are padded to 512 bytes; VMM rounds up to the 2 MiB granularity.
    assert_eq!(allocs[1].u64("bytes"), 100352);
    assert_eq!(allocs[5].u64("bytes"), 4 * MI);

    // NVML sees the same memory and this process.
    assert_eq!(out.get("nvml-count").u64("n"), 2);
    assert_eq!(out.get("nvml-name").str("name"), dev0.name);
    assert_eq!(out.get("nvml-uuid").str("uuid"), dev0.uuid);
    let nv = out.get("nvml-meminfo");
    assert_eq!(nv.u64("total"), 256 * MI);
    assert_eq!(nv.u64("used"), held);
    assert_eq!(out.get("nvml-meminfo2").u64("used"), held);
    let procs = out.get("nvml-procs");
    assert_eq!(procs.u64("n"), 1);
    assert!(
        procs.str("pids").ends_with(&format!(":{held}")),
        "{:?}",
        procs.raw
    );

    // Launched work is on the engine and the events around five 2 ms kernels saw it.
    let ms = out.get("elapsed").f64("ms");
    assert!(ms >= 9.9, "5 x 2 ms took {ms} ms by the events");
    let busy = node.node().device_usage(0).expect("usage").busy_ns;
    // 3 + 1 + 1 + 2 + 1 + 5 kernels of 2 ms (the noops cost nothing).
    assert_eq!(busy, 13 * 2_000_000);
}

#[test]
fn linked_client() {
    full_session(Mode::Link);
}

#[test]
fn dlopen_client() {
    full_session(Mode::Dlopen);
}

#[test]
fn proc_address_client() {
    full_session(Mode::ProcAddr);
}

#[test]
fn bad_modules_and_unknown_kernels_are_errors() {
    let node = SimNode::new();
    let out = node.run(
        Mode::Dlopen,
        &[
            "init",
            "ctx",
            "load this is not a module",
            "load kernel a 5parsecs",
            "load kernel a 1ms",
            "launch missing",
            "launch a 1",
        ],
    );
    let loads = out.all("load");
    assert_eq!(loads[0].error.as_deref(), Some("CUDA_ERROR_INVALID_IMAGE"));
    assert_eq!(loads[1].error.as_deref(), Some("CUDA_ERROR_INVALID_IMAGE"));
    assert!(loads[2].ok);
    let launches = out.all("launch");
    assert_eq!(launches[0].error.as_deref(), Some("CUDA_ERROR_NOT_FOUND"));
    assert!(launches[1].ok);
    assert!(out.status.success(), "API errors are reported, not fatal");
}

#[test]
fn calls_before_init_or_without_a_context_fail_like_the_driver() {
    let node = SimNode::new();
    let out = node.run(
        Mode::Link,
        &[
            "count",
            "init",
            "alloc 1024",
            "meminfo",
            "ctx",
            "alloc 1024",
        ],
    );
    assert_eq!(
        out.get("count").error.as_deref(),
        Some("CUDA_ERROR_NOT_INITIALIZED")
    );
    let allocs = out.all("alloc");
    assert_eq!(
        allocs[0].error.as_deref(),
        Some("CUDA_ERROR_INVALID_CONTEXT")
    );
    assert_eq!(
        out.get("meminfo").error.as_deref(),
        Some("CUDA_ERROR_INVALID_CONTEXT")
    );
    assert!(allocs[1].ok);
}

#[test]
fn a_malformed_script_is_exit_status_2() {
    let node = SimNode::new();
    let out = node.run(Mode::Link, &["init", "frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.contains("bad frobnicate"), "{}", out.stderr);
}
