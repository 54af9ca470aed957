//! IPC and imported memory under the shim, with ground truth from the
//! simulated device: memory shared between processes of one allocation is
//! counted once (at the exporter; opening or importing it charges
//! nothing); an import of memory exported by a process of another
//! allocation, or by an ungoverned one, is refused; memory an exporter
//! frees while an importer still has it open (the driver keeps the pages)
//! stays charged until the importer lets go.

mod hook_support;

use hook_support::*;
use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;
const DENIED: &str = "CUDA_ERROR_NOT_PERMITTED";

/// A second allocation on the same node's GPU (another tenant): the
/// memclient governed by it.
fn other_tenant(sim: &Sim) -> Conv {
    let dir = sim.node.dir.path().join("alloc-b");
    let spec = ControlSpec::new(
        "other-tenant",
        vec![DeviceSpec {
            uuid: sim.uuid(0),
            memory_limit_bytes: LIMIT,
            compute_share_ppm: 1_000_000,
            policy: Policy::Burst,
        }],
    );
    let (control, _) = create_allocation_files(&dir, &spec).unwrap();
    let mut c = sim.node.command(memclient());
    c.env("LD_PRELOAD", hook_lib())
        .env("TESSERA_CONTROL", control)
        .env_remove("TESSERA_STATE");
    Conv::start(c)
}

#[test]
fn ipc_memory_is_counted_once_and_only_the_allocation_may_open_it() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut exporter = sim.client_init(true);
    ok(&mut exporter, &format!("alloc {}", 32 * MI));
    let handle = ok(&mut exporter, "ipc-get 0").str("handle").to_owned();
    // A process of the same allocation maps it: nothing more is charged,
    // and it can still allocate the rest of the limit.
    let mut peer = sim.client_init(true);
    ok(&mut peer, &format!("ipc-open {handle}"));
    assert_eq!(sim.used(0), 32 * MI);
    assert_eq!(sim.state().reserved(0), 32 * MI);
    ok(&mut peer, &format!("alloc {}", 32 * MI));
    assert_eq!(sim.used(0), LIMIT);
    assert_eq!(sim.state().reserved(0), LIMIT);
    // Another tenant's process may not open it.
    let mut other = other_tenant(&sim);
    ok(&mut other, "init");
    refused(&mut other, &format!("ipc-open {handle}"), DENIED);
    // Nor may a process of the allocation open a handle it did not export.
    let mut outsider = sim.client_init(false);
    ok(&mut outsider, &format!("alloc {}", 8 * MI));
    let foreign = ok(&mut outsider, "ipc-get 0").str("handle").to_owned();
    refused(&mut peer, &format!("ipc-open {foreign}"), DENIED);
    ok(&mut peer, "ipc-close 0");
    ok(&mut peer, "free 1");
    ok(&mut exporter, "free 0");
    assert_eq!(sim.state().reserved(0), 0);
    for c in [exporter, peer, other, outsider] {
        assert!(c.finish().success());
    }
    assert_eq!(sim.used(0), 0);
}

#[test]
fn exported_vmm_memory_is_counted_once_and_only_the_allocation_may_import_it() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut exporter = sim.client_init(true);
    let e = ok(&mut exporter, &format!("vmm-export {} 0", 32 * MI));
    let (pid, fd) = (e.u64("pid"), e.u64("fd"));
    let mut peer = sim.client_init(true);
    ok(&mut peer, &format!("vmm-import {pid} {fd} {}", 32 * MI));
    assert_eq!(sim.used(0), 32 * MI);
    assert_eq!(sim.state().reserved(0), 32 * MI, "counted once");
    ok(&mut peer, &format!("alloc {}", 32 * MI));
    assert_eq!(sim.used(0), LIMIT);
    let mut other = other_tenant(&sim);
    ok(&mut other, "init");
    refused(
        &mut other,
        &format!("vmm-import {pid} {fd} {}", 32 * MI),
        DENIED,
    );
    for c in [exporter, peer, other] {
        assert!(c.finish().success());
    }
}

#[test]
fn shared_memory_freed_by_its_exporter_stays_charged_while_open_elsewhere() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let books = || sim.state().reserved(0);
    // Legacy IPC: the exporter frees first, the importer closes later.
    let mut exporter = sim.client_init(true);
    ok(&mut exporter, &format!("alloc {}", 32 * MI));
    let handle = ok(&mut exporter, "ipc-get 0").str("handle").to_owned();
    let mut peer = sim.client_init(true);
    ok(&mut peer, &format!("ipc-open {handle}"));
    ok(&mut exporter, "free 0");
    assert_eq!(sim.used(0), 32 * MI, "the driver keeps the pages");
    assert_eq!(books(), 32 * MI, "so the allocation is still charged");
    // Only 32 MiB are left, not 64.
    refused(
        &mut peer,
        &format!("alloc {}", 40 * MI),
        "CUDA_ERROR_OUT_OF_MEMORY",
    );
    ok(&mut peer, "ipc-close 0");
    assert_eq!(sim.used(0), 0);
    ok(&mut exporter, "sync");
    assert_eq!(books(), 0, "returned once closed");
    // A VMM allocation exported as a descriptor, released by its exporter
    // while the importer maps it; the importer then exits.
    let e = ok(&mut exporter, &format!("vmm-export {} 0", 16 * MI));
    let (pid, fd) = (e.u64("pid"), e.u64("fd"));
    ok(&mut peer, &format!("vmm-import {pid} {fd} {}", 16 * MI));
    ok(&mut exporter, &format!("vmm-release {}", e.u64("v")));
    assert_eq!(sim.used(0), 16 * MI);
    assert_eq!(books(), 16 * MI);
    assert!(peer.finish().success());
    ok(&mut exporter, "sync");
    assert_eq!(books(), 0);
    assert!(exporter.finish().success());
    sim.node.node().reap_dead();
    assert_eq!(sim.used(0), 0);
}

#[test]
fn a_sparse_array_keeps_its_backing_memory_charged_until_unmapped_or_destroyed() {
    let sim = Sim::one_gpu(PHYSICAL, LIMIT);
    let mut c = sim.client_init(true);
    // Sparse and deferred-mapping arrays: charged nothing themselves;
    // 2 MiB of cuMemCreate memory mapped onto a tile of each, the handles
    // released at once.
    for (n, kind) in ["", "deferred"].into_iter().enumerate() {
        ok(&mut c, &format!("sparse 4096 {} 0 {kind}", 2 * MI));
        let held = (n as u64 + 1) * 2 * MI;
        assert_eq!(sim.used(0), held, "{kind}: backed by what is mapped");
        assert_eq!(sim.state().reserved(0), held, "{kind}: still charged");
    }
    // Unmapping the tile frees the first; destroying the array the second.
    ok(&mut c, "array-unmap 0");
    assert_eq!(sim.used(0), 2 * MI);
    assert_eq!(sim.state().reserved(0), 2 * MI);
    ok(&mut c, "array-destroy 1");
    assert_eq!(sim.used(0), 0);
    assert_eq!(sim.state().reserved(0), 0);
    ok(&mut c, "array-destroy 0");
    assert!(c.finish().success());
}
