//! Memory reachable through handles, on the simulated driver, by ground truth: IPC memory
//! handles opened by another process, VMM handles exported as file descriptors and
//! imported elsewhere (the descriptor really passed over a Unix socket), and sparse
//! arrays backed by VMM handles. Shared memory shares bytes, counts once on the device,
//! and stays counted for as long as any process can reach it.

mod sim_mem_support;

use sim_mem_support::*;

fn two(node: &SimNode) -> (Mem, Mem) {
    let mut a = spawn(node);
    let mut b = spawn(node);
    for p in [&mut a, &mut b] {
        p.ok("init");
        p.ok("ctx 0");
    }
    (a, b)
}

#[test]
fn an_ipc_handle_shares_bytes_and_counts_once() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let p = a.obj(&format!("alloc {}", 64 * MI));
    a.ok(&format!("write {p} 4096 7"));
    let handle = a.ok(&format!("ipc-get {p}")).str("handle").to_string();
    assert_eq!(
        a.ok(&format!("ipc-get {p}+4096")).str("handle"),
        handle,
        "one handle per allocation"
    );
    // Bytes written before the export are there after it.
    assert_eq!(a.ok(&format!("read {p} 4096")).u64("sum"), 7 * 4096);

    let opened = b.ok(&format!("ipc-open {handle}"));
    let q = format!("${}", opened.u64("h"));
    assert_eq!(b.ok(&format!("read {q} 4096")).u64("sum"), 7 * 4096);
    b.ok(&format!("write {q}+8192 4096 9"));
    assert_eq!(a.ok(&format!("read {p}+8192 4096")).u64("sum"), 9 * 4096);
    assert_eq!(
        used(&node, 0),
        64 * MI,
        "an opened handle is not charged again"
    );
    assert_eq!(held(&node, a.pid(), 0), 64 * MI);
    assert_eq!(held(&node, b.pid(), 0), 0);

    // A second open is the same mapping and needs its own close.
    let again = b.ok(&format!("ipc-open {handle}")).u64("val");
    assert_eq!(again, opened.u64("val"));
    assert_eq!(b.ok(&format!("read {again:#x} 1")).u64("first"), 7);
    b.ok(&format!("ipc-close {again:#x}"));
    assert_eq!(b.ok(&format!("read {q} 1")).u64("first"), 7);
    b.ok(&format!("ipc-close {q}"));
    assert_eq!(b.err(&format!("read {q} 1")), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(b.err(&format!("ipc-close {q}")), "CUDA_ERROR_INVALID_VALUE");

    a.ok(&format!("free {p}"));
    assert_eq!(used(&node, 0), 0);
    assert!(node.node().shared_objects().is_empty());
    // The handle of a freed allocation opens nothing.
    assert_eq!(
        b.err(&format!("ipc-open {handle}")),
        "CUDA_ERROR_INVALID_VALUE"
    );
}

#[test]
fn memory_freed_by_its_exporter_stays_counted_while_another_process_has_it_open() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let p = a.obj(&format!("alloc {}", 32 * MI));
    a.ok(&format!("write {p} 100 5"));
    let handle = a.ok(&format!("ipc-get {p}")).str("handle").to_string();
    let q = b.obj(&format!("ipc-open {handle}"));
    a.ok(&format!("free {p}"));
    assert_eq!(used(&node, 0), 32 * MI, "still reachable by the importer");
    assert_eq!(held(&node, a.pid(), 0), 0);
    assert_eq!(
        held(&node, b.pid(), 0),
        32 * MI,
        "the charge moved to the importer"
    );
    assert_eq!(b.ok(&format!("read {q} 100")).u64("sum"), 500);
    b.ok(&format!("ipc-close {q}"));
    assert_eq!(used(&node, 0), 0);
}

#[test]
fn a_killed_exporter_hands_its_charge_to_the_importer() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let p = a.obj(&format!("alloc {}", 16 * MI));
    let handle = a.ok(&format!("ipc-get {p}")).str("handle").to_string();
    let q = b.obj(&format!("ipc-open {handle}"));
    a.0.kill();
    node.node().reap_dead();
    assert_eq!(used(&node, 0), 16 * MI);
    assert_eq!(held(&node, b.pid(), 0), 16 * MI);
    b.ok(&format!("write {q} 16 1"));
    let pid = b.pid();
    assert!(b.0.finish().success());
    node.node().reap_dead();
    assert!(node.node().process(pid).is_none());
    assert_eq!(used(&node, 0), 0);
    assert!(node.node().shared_objects().is_empty());
}

#[test]
fn bad_ipc_handles_are_refused() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let zeros = "0".repeat(128);
    assert_eq!(
        b.err(&format!("ipc-open {zeros}")),
        "CUDA_ERROR_INVALID_VALUE"
    );
    let p = a.obj(&format!("alloc {}", MI));
    let handle = a.ok(&format!("ipc-get {p}")).str("handle").to_string();
    assert_eq!(
        a.err(&format!("ipc-open {handle}")),
        "CUDA_ERROR_INVALID_CONTEXT",
        "a process cannot open its own handle"
    );
    // A forged handle: the right magic, a wrong object.
    let mut forged = handle.clone().into_bytes();
    forged[40] = if forged[40] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).expect("hex");
    assert_eq!(
        b.err(&format!("ipc-open {forged}")),
        "CUDA_ERROR_INVALID_VALUE"
    );
    // Pool memory has no IPC handle (it is exported through its pool).
    let s = a.obj("stream");
    let pooled = a.obj(&format!("alloc-async {MI} {s}"));
    assert_eq!(
        a.err(&format!("ipc-get {pooled}")),
        "CUDA_ERROR_INVALID_VALUE"
    );
    assert_eq!(a.err("ipc-get 0x1000"), "CUDA_ERROR_INVALID_VALUE");
}

#[test]
fn a_vmm_handle_passed_as_a_file_descriptor_shares_memory_and_counts_once() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let size = 16 * MI;
    let v = a.obj(&format!("vmm-create {size} 0 fd"));
    let p = a.obj(&format!("vmm-map {v} {size}"));
    a.ok(&format!("write {p} 4096 3"));
    let fd = a.obj(&format!("vmm-export {v}"));
    let sock = node.dir.path().join("fd.sock");
    b.ok(&format!("fd-listen {}", sock.display()));
    a.ok(&format!("fd-send {} {fd}", sock.display()));
    let bfd = b.obj("fd-accept");
    let w = b.obj(&format!("vmm-import {bfd}"));
    let props = b.ok(&format!("vmm-props {w}"));
    assert_eq!((props.u64("dev"), props.u64("types")), (0, 1));
    let q = b.obj(&format!("vmm-map {w} {size}"));
    assert_eq!(b.ok(&format!("read {q} 4096")).u64("sum"), 3 * 4096);
    b.ok(&format!("write {q}+4096 10 2"));
    assert_eq!(a.ok(&format!("read {p}+4096 10")).u64("sum"), 20);
    assert_eq!(used(&node, 0), size, "imported memory is not charged again");
    assert_eq!(held(&node, b.pid(), 0), 0);

    // The exporter unmaps and releases: the importer's mapping keeps the memory, and now
    // carries its charge.
    a.ok(&format!("vmm-unmap {p} {size}"));
    a.ok(&format!("vmm-release {v}"));
    assert_eq!(used(&node, 0), size);
    assert_eq!(held(&node, a.pid(), 0), 0);
    assert_eq!(held(&node, b.pid(), 0), size);
    // A retained handle of the mapping counts as one more reference.
    let r = b.obj(&format!("vmm-retain {q}"));
    b.ok(&format!("vmm-release {w}"));
    b.ok(&format!("vmm-unmap {q} {size}"));
    assert_eq!(used(&node, 0), size, "the retained reference holds it");
    b.ok(&format!("vmm-release {r}"));
    assert_eq!(used(&node, 0), 0);
    assert!(node.node().shared_objects().is_empty());
}

#[test]
fn vmm_export_and_import_refuse_what_they_cannot_share() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, _b) = two(&node);
    let plain = a.obj(&format!("vmm-create {} 0", 2 * MI));
    assert_eq!(
        a.err(&format!("vmm-export {plain}")),
        "CUDA_ERROR_INVALID_VALUE",
        "not created with the file descriptor type requested"
    );
    // A descriptor that is no exported handle (the probe's stdin).
    assert_eq!(a.err("vmm-import 0"), "CUDA_ERROR_INVALID_VALUE");
    // Importing one's own export gives a second handle to the same memory.
    let v = a.obj(&format!("vmm-create {} 0 fd", 2 * MI));
    let fd = a.obj(&format!("vmm-export {v}"));
    let w = a.obj(&format!("vmm-import {fd}"));
    assert_eq!(used(&node, 0), 4 * MI);
    a.ok(&format!("vmm-release {v}"));
    assert_eq!(used(&node, 0), 4 * MI, "the import still holds it");
    a.ok(&format!("vmm-release {w}"));
    assert_eq!(used(&node, 0), 2 * MI);
}

#[test]
fn sparse_and_deferred_arrays_are_backed_only_by_what_is_mapped() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, _b) = two(&node);
    // 8192 x 8192 floats would be 256 MiB if backed in full.
    let sparse = a.obj("array-sparse 8192 8192");
    let deferred = a.obj("array-sparse 4096 4096 deferred");
    assert_eq!(used(&node, 0), 0, "nothing is backed at creation");
    let req = a.ok(&format!("array-reqs {deferred} 0"));
    assert_eq!(req.u64("size"), 64 * MI);
    let v = a.obj(&format!("vmm-create {} 0", 2 * MI));
    assert_eq!(used(&node, 0), 2 * MI);
    a.ok(&format!("array-map {sparse} {v}"));
    // The binding keeps the memory after its handle is released.
    a.ok(&format!("vmm-release {v}"));
    assert_eq!(used(&node, 0), 2 * MI);
    a.ok(&format!("array-map {sparse} {v} unmap"));
    assert_eq!(used(&node, 0), 0);
    // Destroying an array drops its bindings.
    let w = a.obj(&format!("vmm-create {} 0", 64 * MI));
    a.ok(&format!("array-map {deferred} {w}"));
    a.ok(&format!("vmm-release {w}"));
    assert_eq!(used(&node, 0), 64 * MI);
    a.ok(&format!("array-destroy {deferred}"));
    a.ok(&format!("array-destroy {sparse}"));
    assert_eq!(used(&node, 0), 0);
}

#[test]
#[allow(non_snake_case)]
fn the_new_memory_entry_points_resolve_through_cuGetProcAddress() {
    // What the CUDA 12 runtime (and the shim's own lookups) ask for, at 12.0.
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let asks = [
        ("cuIpcGetMemHandle", "", "cuIpcGetMemHandle"),
        ("cuIpcOpenMemHandle", "", "cuIpcOpenMemHandle_v2"),
        ("cuIpcCloseMemHandle", "", "cuIpcCloseMemHandle"),
        (
            "cuMemExportToShareableHandle",
            "",
            "cuMemExportToShareableHandle",
        ),
        (
            "cuMemImportFromShareableHandle",
            "",
            "cuMemImportFromShareableHandle",
        ),
        ("cuMemMapArrayAsync", " pt", "cuMemMapArrayAsync_ptsz"),
        (
            "cuArrayGetMemoryRequirements",
            "",
            "cuArrayGetMemoryRequirements",
        ),
        ("cuGraphAddMemAllocNode", "", "cuGraphAddMemAllocNode"),
        ("cuGraphAddMemFreeNode", "", "cuGraphAddMemFreeNode"),
        ("cuDeviceGraphMemTrim", "", "cuDeviceGraphMemTrim"),
        (
            "cuDeviceGetGraphMemAttribute",
            "",
            "cuDeviceGetGraphMemAttribute",
        ),
        (
            "cuDeviceSetGraphMemAttribute",
            "",
            "cuDeviceSetGraphMemAttribute",
        ),
        ("cuStreamBeginCapture", "", "cuStreamBeginCapture_v2"),
        (
            "cuStreamBeginCapture",
            " pt",
            "cuStreamBeginCapture_v2_ptsz",
        ),
        ("cuStreamEndCapture", "", "cuStreamEndCapture"),
        ("cuStreamGetCaptureInfo", "", "cuStreamGetCaptureInfo_v2"),
    ];
    let script: Vec<String> = asks
        .iter()
        .map(|(name, pt, _)| format!("procaddr {name} 12000{pt}"))
        .collect();
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let out = node.run(tessera_e2e::Mode::ProcAddr, &script);
    out.expect_ok();
    let got: Vec<&str> = out.fields("procaddr", "resolved");
    let want: Vec<&str> = asks.iter().map(|(_, _, w)| *w).collect();
    assert_eq!(got, want);
}

#[test]
fn an_ipc_event_handle_shares_the_events_completion_across_processes() {
    let node = SimNode::builder().devices(1).memory("1Gi").build();
    let (mut a, mut b) = two(&node);
    let e = a.obj("event-ipc-create");
    let handle = a
        .ok(&format!("event-ipc-get {e}"))
        .str("handle")
        .to_string();
    assert_eq!(
        a.err(&format!("event-ipc-open {handle}")),
        "CUDA_ERROR_INVALID_CONTEXT"
    );
    let f = b.obj(&format!("event-ipc-open {handle}"));
    b.ok(&format!("event-query {f}"));
    // A records the event behind three seconds of work: B sees it pending (it asks at
    // once), and B's synchronisation returns only once A's work is done.
    let s = a.obj("stream");
    let k = a.obj("kernel slow 3s");
    a.ok(&format!("launch {k} {s}"));
    a.ok(&format!("event-record {e} {s}"));
    assert_eq!(b.err(&format!("event-query {f}")), "CUDA_ERROR_NOT_READY");
    b.ok(&format!("event-synchronize {f}"));
    a.ok(&format!("event-query {e}"));
    b.ok(&format!("event-query {f}"));
    // A stream in B can wait for it too (already complete: no error).
    let sb = b.obj("stream");
    b.ok(&format!("event-wait {sb} {f}"));
    assert_eq!(
        b.err(&format!("event-ipc-open {}", "0".repeat(128))),
        "CUDA_ERROR_INVALID_VALUE"
    );
}
