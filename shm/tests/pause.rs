//! The pause word (`tessera pause`/`resume`): where it sits in the control
//! file, what the read-only view may do with it, how paused time adds up,
//! and that a thread blocked on it is woken by a resume in another mapping.

use std::mem::{offset_of, size_of};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_shm::layout::*;
use tessera_shm::{Control, ControlSpec, DeviceSpec, Policy, ShmError, create_allocation_files};

fn spec() -> ControlSpec {
    ControlSpec::new(
        "alloc-p",
        vec![DeviceSpec {
            uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
            memory_limit_bytes: 1 << 30,
            compute_share_ppm: 500_000,
            policy: Policy::Burst,
        }],
    )
}

#[test]
fn the_pause_words_take_reserved_space_only() {
    assert_eq!(offset_of!(ControlHeader, paused), 112);
    assert_eq!(offset_of!(ControlHeader, paused_since_ns), 120);
    assert_eq!(offset_of!(ControlHeader, paused_total_ns), 128);
    assert_eq!(offset_of!(ControlHeader, priority), 136);
    assert_eq!(offset_of!(ControlFile, devices), 192);
    assert_eq!(size_of::<ControlFile>(), 2240);
}

#[test]
fn the_priority_is_the_managers_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let ro = Control::open(&c).unwrap();
    let rw = Control::open_rw(&c).unwrap();
    assert_eq!(ro.priority(), 0);
    assert!(matches!(ro.set_priority(5), Err(ShmError::ReadOnly(_))));
    rw.set_priority(-3).unwrap();
    assert_eq!(ro.priority(), -3);
}

#[test]
fn pause_and_resume_count_paused_time() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let ro = Control::open(&c).unwrap();
    let rw = Control::open_rw(&c).unwrap();
    assert!(!ro.paused());
    assert_eq!(ro.paused_ns(1_000), 0);
    assert!(matches!(ro.pause(1), Err(ShmError::ReadOnly(_))));
    assert!(rw.pause(1_000).unwrap());
    assert!(!rw.pause(2_000).unwrap(), "already paused");
    assert!(ro.paused(), "seen through the other mapping");
    assert_eq!(ro.paused_ns(1_500), 500);
    assert!(rw.resume(4_000).unwrap());
    assert!(!rw.resume(5_000).unwrap(), "not paused");
    assert!(!ro.paused());
    assert_eq!(ro.paused_ns(9_000), 3_000);
    rw.pause(10_000).unwrap();
    assert_eq!(ro.paused_ns(10_250), 3_250);
    rw.resume(11_000).unwrap();
    assert_eq!(ro.paused_ns(20_000), 4_000);
}

#[test]
fn a_thread_blocked_on_the_pause_wakes_at_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let rw = Control::open_rw(&c).unwrap();
    let ro = Arc::new(Control::open(&c).unwrap());
    ro.wait_while_paused(); // not paused: returns at once
    rw.pause(1).unwrap();
    let through = Arc::new(AtomicBool::new(false));
    let t = {
        let (ro, through) = (ro.clone(), through.clone());
        std::thread::spawn(move || {
            ro.wait_while_paused();
            through.store(true, Ordering::Release);
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !through.load(Ordering::Acquire),
        "passed a paused allocation"
    );
    let t0 = Instant::now();
    rw.resume(2).unwrap();
    t.join().unwrap();
    assert!(through.load(Ordering::Acquire));
    // Woken by the resume, not by the one-second recheck.
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
}
