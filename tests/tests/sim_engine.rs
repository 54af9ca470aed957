//! One execution engine per device, shared by every process: launches are asynchronous,
//! work from two processes never overlaps, and the recorded busy time is what was
//! launched. These tests measure time, so they run one at a time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_e2e::{Mode, ProbeChild, SimNode};
use tessera_sim::clock::now_ns;
use tessera_sim::layout::DEVICE_BUCKET_NS;

const T: Duration = Duration::from_secs(30);
const MS: u64 = 1_000_000;

/// Timing tests share the CPU; running them one at a time keeps their bounds honest.
static SERIAL: Mutex<()> = Mutex::new(());

fn ready(node: &SimNode, kernel: &str) -> ProbeChild {
    let mut p = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx", &format!("load {kernel}")] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    p
}

#[test]
fn two_processes_are_serialised_and_busy_time_matches_what_was_launched() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = SimNode::builder().devices(1).build();
    let (n, k) = (20u64, 10 * MS);
    let mut a = ready(&node, "kernel step 10ms");
    let mut b = ready(&node, "kernel step 10ms");

    let t0 = now_ns();
    let started = Instant::now();
    a.send(&format!("launch step {n}"));
    b.send(&format!("launch step {n}"));
    assert!(a.wait_for("launch", T).ok);
    assert!(b.wait_for("launch", T).ok);
    a.send("sync");
    b.send("sync");
    assert!(a.wait_for("sync", T).ok);
    assert!(b.wait_for("sync", T).ok);
    let wall = started.elapsed();

    // Ground truth: each process is charged exactly what it launched, the device the sum.
    let total = 2 * n * k;
    for p in [&a, &b] {
        let usage = node.node().process(p.pid()).expect("process is listed");
        let busy = usage.busy_ns[0];
        assert!(
            busy.abs_diff(n * k) * 50 <= n * k,
            "process busy {busy} ns, launched {} ns",
            n * k
        );
        assert_eq!(usage.launches[0], n);
    }
    let dev = node.node().device_usage(0).expect("usage");
    assert!(
        dev.busy_ns.abs_diff(total) * 50 <= total,
        "device busy {}",
        dev.busy_ns
    );

    // The engine's history holds the same busy time (within 2%) in the time it ran.
    let from = t0 / DEVICE_BUCKET_NS * DEVICE_BUCKET_NS;
    let to = now_ns().div_ceil(DEVICE_BUCKET_NS) * DEVICE_BUCKET_NS + DEVICE_BUCKET_NS;
    let history = node
        .node()
        .device(0)
        .expect("device")
        .busy
        .busy_between(from, to);
    assert!(
        history.abs_diff(total) * 50 <= total,
        "history {history} ns of {total} ns"
    );

    // Serialised: both waited for all 400 ms (in parallel they would have taken 200 ms).
    assert!(
        wall >= Duration::from_nanos(total * 98 / 100),
        "both processes were done after {wall:?}, less than the {} ms of work queued",
        total / MS
    );
    assert!(
        dev.busy_until_ns >= t0 + total,
        "the engine ran the work back to back"
    );
    assert!(
        wall < Duration::from_nanos(total) + Duration::from_secs(10),
        "{wall:?}"
    );
    a.finish();
    b.finish();
}

#[test]
fn launches_return_before_the_work_is_done_and_sync_waits_for_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = SimNode::builder().devices(1).build();
    let mut p = ready(&node, "kernel long 1500ms");
    let l = p.cmd("launch long 1", T);
    assert!(l.ok);
    // The launch has returned; the engine is still busy with it.
    let after_launch = now_ns();
    let until = node.node().device_usage(0).expect("usage").busy_until_ns;
    assert!(
        until > after_launch,
        "the kernel was still running when the launch returned"
    );
    let l = p.cmd("sync", T);
    assert!(l.ok);
    assert!(
        now_ns() >= until,
        "synchronize returned before the kernel ended"
    );
    p.finish();
}

#[test]
fn zero_duration_kernels_wait_for_work_queued_before_them() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = SimNode::builder().devices(1).build();
    let mut p = ready(&node, "kernel long 300ms; kernel noop 0");
    assert!(p.cmd("launch long 1", T).ok);
    let until = node.node().device_usage(0).expect("usage").busy_until_ns;
    // Events around noops launched after the long kernel: they complete only when the
    // long kernel has, so waiting for the end event waits for it.
    let l = p.cmd("elapsed noop 3", T);
    assert!(l.ok, "{}", l.raw);
    assert!(now_ns() >= until);
    let usage = node.node().process(p.pid()).expect("listed");
    assert_eq!(usage.busy_ns[0], 300 * MS, "noops add no busy time");
    assert_eq!(usage.launches[0], 4);
    p.finish();
}
