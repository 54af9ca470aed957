//! The pause word (`tessera pause`/`resume`): where it sits in the control
//! file, what the read-only view may do with it, how paused time adds up,
//! and that a thread blocked on it is woken by a resume in another mapping.

use std::mem::{offset_of, size_of};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tessera_shm::layout::*;
use tessera_shm::sys::Sys;
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

/// The real futex, with two changes a test can see: each sleep on the pause
/// word is counted (a thread seen asleep there has, by construction, not
/// passed), and the one-second recheck is stretched to a minute, so only the
/// resume's wake-up can end the sleep within the test's patience.
struct Sleeps {
    word: usize,
    n: AtomicUsize,
}

impl Sys for Sleeps {
    fn monotonic_ns(&self) -> u64 {
        tessera_shm::sys::monotonic_ns()
    }
    fn futex_wait(&self, word: &AtomicU32, expected: u32, _timeout_ns: u64) {
        if word.as_ptr() as usize == self.word {
            self.n.fetch_add(1, Ordering::SeqCst);
        }
        tessera_shm::sys::futex_wait(word, expected, 60_000_000_000)
    }
    fn futex_wake_all(&self, word: &AtomicU32) {
        tessera_shm::sys::futex_wake_all(word)
    }
    fn set_timer_slack(&self, _ns: u64) {}
}

fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no {what} in 10 s");
        std::thread::yield_now();
    }
}

#[test]
fn a_thread_blocked_on_the_pause_wakes_at_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _s) = create_allocation_files(dir.path(), &spec()).unwrap();
    let rw = Control::open_rw(&c).unwrap();
    let ro = Arc::new(Control::open(&c).unwrap());
    ro.wait_while_paused(); // not paused: returns at once
    rw.pause(1).unwrap();
    let sys = Arc::new(Sleeps {
        word: ro.raw().header.paused.as_ptr() as usize,
        n: AtomicUsize::new(0),
    });
    let through = Arc::new(AtomicBool::new(false));
    let t = {
        let (ro, through, sys) = (ro.clone(), through.clone(), sys.clone());
        std::thread::spawn(move || {
            ro.wait_while_paused_on(&*sys);
            through.store(true, Ordering::Release);
        })
    };
    until("sleep on the pause word", || {
        sys.n.load(Ordering::SeqCst) >= 1
    });
    assert!(
        !through.load(Ordering::Acquire),
        "passed a paused allocation"
    );
    rw.resume(2).unwrap();
    // Woken by the resume: the recheck is a minute away.
    until("wake-up at resume", || t.is_finished());
    t.join().unwrap();
    assert!(through.load(Ordering::Acquire));
}
