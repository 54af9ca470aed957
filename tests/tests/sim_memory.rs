//! Device memory: the simulated device enforces its capacity for every allocation
//! family across processes, memory of exited and SIGKILLed processes returns, and copies
//! are bounds-checked against live allocations while really moving bytes.

use std::time::Duration;

use tessera_e2e::{Mode, SimNode};

const MI: u64 = 1 << 20;
const T: Duration = Duration::from_secs(30);

#[test]
fn capacity_is_enforced_for_every_allocation_family() {
    let node = SimNode::builder().memory("64Mi").build();
    let over = 64 * MI + 1;
    let kinds = [
        "plain",
        "pitch",
        "managed",
        "async",
        "pool",
        "vmm",
        "array",
        "array3d",
        "mipmapped",
    ];
    let mut p = node.spawn(Mode::Dlopen, &[]);
    for cmd in ["init", "ctx"] {
        assert!(p.cmd(cmd, T).ok);
    }
    for k in kinds {
        let l = p.cmd(&format!("alloc {over} {k}"), T);
        assert_eq!(
            l.error.as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{k}: {}",
            l.raw
        );
        let l = p.cmd(&format!("alloc {} {k}", 32 * MI), T);
        assert!(l.ok, "{k}: {}", l.raw);
        let used = node.node().memory_used(0);
        assert!(used >= 32 * MI, "{k}: device shows {used} bytes used");
        let l = p.cmd(&format!("free {}", l.u64("h")), T);
        assert!(l.ok, "{k}: {}", l.raw);
        assert_eq!(node.node().memory_used(0), 0, "{k}: freed memory returned");
    }
    p.finish();
}

#[test]
fn processes_share_the_capacity_and_see_each_others_usage() {
    let node = SimNode::builder().memory("64Mi").build();
    let mut a = node.spawn(Mode::Link, &[]);
    let mut b = node.spawn(Mode::ProcAddr, &[]);
    for p in [&mut a, &mut b] {
        assert!(p.cmd("init", T).ok);
        assert!(p.cmd("ctx", T).ok);
    }
    assert!(a.cmd(&format!("alloc {}", 40 * MI), T).ok);
    let info = b.cmd("meminfo", T);
    assert_eq!(info.u64("free"), 24 * MI);
    let l = b.cmd(&format!("alloc {}", 40 * MI), T);
    assert_eq!(l.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    assert!(
        b.cmd(&format!("alloc {}", 24 * MI), T).ok,
        "exactly what is left fits"
    );
    assert_eq!(
        b.cmd("alloc 1", T).error.as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY")
    );
    let procs = node.node().processes();
    let held = |pid| procs.iter().find(|p| p.pid == pid).map(|p| p.memory[0]);
    assert_eq!(held(a.pid()), Some(40 * MI));
    assert_eq!(held(b.pid()), Some(24 * MI));
    a.finish();
    b.finish();
}

#[test]
fn a_sigkilled_processs_memory_returns_to_the_device() {
    let node = SimNode::builder().memory("64Mi").build();
    let mut victim = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx", &format!("alloc {}", 48 * MI)] {
        assert!(victim.cmd(cmd, T).ok);
    }
    assert_eq!(node.node().memory_used(0), 48 * MI);
    victim.kill();

    // The next allocation that would not fit finds the dead process and reclaims it.
    let mut next = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx"] {
        assert!(next.cmd(cmd, T).ok);
    }
    let l = next.cmd(&format!("alloc {}", 48 * MI), T);
    assert!(l.ok, "{}", l.raw);
    next.finish();

    // And the Rust API reaps on request.
    let mut other = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx", &format!("alloc {}", 16 * MI)] {
        assert!(other.cmd(cmd, T).ok);
    }
    let pid = other.pid();
    other.kill();
    assert_eq!(node.node().memory_used(0), 16 * MI, "not reaped yet");
    assert_eq!(node.node().reap_dead(), 1);
    assert_eq!(node.node().memory_used(0), 0);
    assert!(node.node().process(pid).is_none());
}

#[test]
fn a_process_that_exits_without_freeing_gives_its_memory_back() {
    let node = SimNode::builder().memory("64Mi").build();
    let out = node.run(
        Mode::Link,
        &["init", "ctx", "alloc 1048576", "alloc 4096 pool"],
    );
    out.expect_ok();
    assert_eq!(node.node().memory_used(0), 0);
    assert!(node.node().processes().is_empty());
}

#[test]
fn pool_memory_is_released_at_synchronisation() {
    let node = SimNode::builder().memory("64Mi").build();
    let mut p = node.spawn(Mode::Dlopen, &[]);
    for cmd in ["init", "ctx"] {
        assert!(p.cmd(cmd, T).ok);
    }
    let h = p.cmd(&format!("alloc {} async", 8 * MI), T).u64("h");
    assert_eq!(node.node().memory_used(0), 8 * MI);
    // The probe's free is cuMemFreeAsync followed by a stream synchronisation.
    assert!(p.cmd(&format!("free {h}"), T).ok);
    assert_eq!(node.node().memory_used(0), 0);
    p.finish();
}

#[test]
fn copies_move_bytes_and_are_bounds_checked() {
    let node = SimNode::new();
    let out = node.run(
        Mode::Link,
        &[
            "init",
            "ctx",
            "alloc 4096",
            "alloc 4096",
            "alloc 3000000 vmm",
            // 0: fill a range, read it back
            "write h0+100 200 171",
            "read h0+100 200",
            // 1: past the end of the allocation
            "read h0+4000 200",
            // 2: device to device, then read the copy
            "copy h1 h0+100 200",
            "read h1 200",
            // 3: memset
            "memset h1+10 5 7",
            "read h1+10 5",
            // 4: VMM memory is usable once mapped with access
            "write h2+2097000 1000 9",
            "read h2+2097000 1000",
            // 5: a copy overrunning its source
            "copy h1 h0+4000 200",
            // 6: memset overrunning
            "memset h0+4090 10 1",
            // 5: not device memory at all
            "read 0x10 1",
        ],
    );
    assert!(out.status.success());
    let reads = out.all("read");
    assert!(reads[0].ok && reads[0].u64("sum") == 171 * 200 && reads[0].u64("first") == 171);
    assert_eq!(reads[1].error.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    assert!(
        reads[2].ok && reads[2].u64("sum") == 171 * 200,
        "{}",
        reads[2].raw
    );
    assert!(reads[3].ok && reads[3].u64("sum") == 35, "{}", reads[3].raw);
    assert!(
        reads[4].ok && reads[4].u64("sum") == 9000,
        "{}",
        reads[4].raw
    );
    assert_eq!(reads[5].error.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    let copies = out.all("copy");
    assert!(copies[0].ok);
    assert_eq!(copies[1].error.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    let memsets = out.all("memset");
    assert!(memsets[0].ok);
    assert_eq!(
        memsets[1].error.as_deref(),
        Some("CUDA_ERROR_INVALID_VALUE")
    );
}

#[test]
fn a_freed_allocation_cannot_be_read() {
    let node = SimNode::new();
    let mut p = node.spawn(Mode::Dlopen, &[]);
    for cmd in ["init", "ctx"] {
        assert!(p.cmd(cmd, T).ok);
    }
    let a = p.cmd("alloc 8192", T);
    let ptr = a.u64("ptr");
    assert!(p.cmd(&format!("read {ptr:#x} 16"), T).ok);
    assert!(p.cmd(&format!("free {}", a.u64("h")), T).ok);
    let l = p.cmd(&format!("read {ptr:#x} 16"), T);
    assert_eq!(l.error.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    let l = p.cmd(&format!("write {:#x} 16 1", ptr + 4096), T);
    assert_eq!(l.error.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    p.finish();
}
