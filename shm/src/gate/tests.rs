//! The gate's protocol with threads standing in for processes, over real
//! files in a temporary directory.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::state::Member;
use crate::sys::Sys;
use crate::{
    Control, ControlSpec, DeviceSpec, Policy, ProcIdentity, ShmError, State,
    create_allocation_files,
};

struct Files {
    arbiter: Control,
    control: &'static Control,
    state: &'static State,
}

fn files(share_ppm: u32) -> Files {
    // Leaked like the hook's statics: gates and drainers outlive tests.
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let spec = ControlSpec::new(
        "alloc-g",
        vec![DeviceSpec {
            uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
            memory_limit_bytes: 1 << 30,
            compute_share_ppm: share_ppm,
            policy: Policy::Guaranteed,
        }],
    );
    let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
    Files {
        arbiter: Control::open_rw(&c).unwrap(),
        control: Box::leak(Box::new(Control::open(&c).unwrap())),
        state: Box::leak(Box::new(State::open(&s, "alloc-g").unwrap())),
    }
}

fn member(state: &State, pid: u32) -> Member {
    // start_time 0: no liveness verdict, so joins never reclaim these.
    let me = ProcIdentity {
        pid,
        pidns: 0,
        start_time: 0,
    };
    state.join(&me, &crate::LocalLiveness::quick()).unwrap()
}

/// Stands in for the driver: counts drains, and can hold them (work
/// still in flight) until released.
#[derive(Default)]
struct FakeDrain {
    calls: AtomicUsize,
    hold: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Drain for FakeDrain {
    fn drain(&self, _dev: usize) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut held = self.hold.lock().unwrap();
        while *held {
            held = self.cv.wait(held).unwrap();
        }
    }
}

impl FakeDrain {
    fn set_hold(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.cv.notify_all();
    }
}

/// A gate for a new member `pid`, its events logged to `log`.
fn gate_on(
    f: &Files,
    pid: u32,
    drain: Arc<dyn Drain>,
    log: Arc<Mutex<Vec<GateEvent>>>,
    sys: Arc<dyn Sys>,
) -> Gate {
    let m = member(f.state, pid);
    Gate::with_sys(
        f.control,
        f.state,
        m,
        drain,
        Arc::new(move |e: &GateEvent| log.lock().unwrap().push(e.clone())),
        sys,
    )
    .unwrap()
}

fn gate(f: &Files, pid: u32, drain: Arc<FakeDrain>, log: Arc<Mutex<Vec<GateEvent>>>) -> Gate {
    gate_on(f, pid, drain, log, Arc::new(crate::sys::Linux))
}

/// The real system calls, counting the gate's sleeps on a closed grant word:
/// a waiter seen asleep there has, by construction, not passed the gate,
/// which no sleep of the test's own could prove. Its clock is the real one,
/// moved ahead by what the test asks ([`CountingSys::advance`]).
struct CountingSys {
    grant: usize,
    sleeps: AtomicUsize,
    ahead_ns: AtomicU64,
}

impl CountingSys {
    fn new(f: &Files) -> Arc<Self> {
        Arc::new(CountingSys {
            grant: f.control.device(0).grant.as_ptr() as usize,
            sleeps: AtomicUsize::new(0),
            ahead_ns: AtomicU64::new(0),
        })
    }
    fn sleeps(&self) -> usize {
        self.sleeps.load(Ordering::SeqCst)
    }
    /// Moves the gate's clock `by` ahead of the real one (and of the
    /// arbiter's beats, which only need to change).
    fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).expect("a short advance");
        self.ahead_ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Sys for CountingSys {
    fn monotonic_ns(&self) -> u64 {
        crate::sys::monotonic_ns() + self.ahead_ns.load(Ordering::SeqCst)
    }
    fn futex_wait(&self, word: &AtomicU32, expected: u32, timeout_ns: u64) {
        if word.as_ptr() as usize == self.grant && word.load(Ordering::SeqCst) == expected {
            self.sleeps.fetch_add(1, Ordering::SeqCst);
        }
        crate::sys::futex_wait(word, expected, timeout_ns)
    }
    fn futex_wake_all(&self, word: &AtomicU32) {
        crate::sys::futex_wake_all(word)
    }
    fn set_timer_slack(&self, ns: u64) {
        crate::sys::set_timer_slack(ns)
    }
}

fn counted_gate(
    f: &Files,
    pid: u32,
    sys: Arc<CountingSys>,
    log: Arc<Mutex<Vec<GateEvent>>>,
) -> Gate {
    gate_on(f, pid, Arc::new(FakeDrain::default()), log, sys)
}

fn until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn scans_stop_at_the_last_gate_slot() {
    let f = files(300_000);
    let g = gate(&f, 19, Arc::default(), Arc::default());
    let top = g.member().slot as u32 + 1;
    assert_eq!(f.state.raw().header.gate_slots.load(Ordering::SeqCst), top);
    // A slot beyond it (no gate ever set up there) is not looked at.
    let far = &f.state.slot(top as usize + 5).devices[0];
    far.launches.store(7, Ordering::SeqCst);
    assert_eq!(f.state.launches(0), 0);
    g.stop();
}

#[test]
fn open_grant_passes_and_counts() {
    let f = files(1_000_000);
    let g = gate(&f, 11, Arc::default(), Arc::default());
    for _ in 0..5 {
        g.before_submit(0);
    }
    let sd = &f.state.slot(g.member().slot).devices[0];
    assert_eq!(sd.launches.load(Ordering::Relaxed), 5);
    // Whole GPU: no epoch bookkeeping, nothing to drain.
    assert_eq!(sd.launch_epoch.load(Ordering::Relaxed), 0);
    assert_eq!(f.state.launches(0), 5);
    // Out-of-range devices are not governed and not counted.
    g.before_submit(7);
    assert_eq!(f.state.launches(0), 5);
}

#[test]
fn closed_gate_waits_for_the_grant_and_counts_demand() {
    let f = files(300_000);
    f.arbiter.beat(monotonic_ns()).unwrap();
    let sys = CountingSys::new(&f);
    let g = counted_gate(&f, 12, Arc::clone(&sys), Arc::default());
    let bell = f.state.drain_signal(0).load(Ordering::SeqCst);
    let passed = Arc::new(AtomicBool::new(false));
    let t = {
        let (g, passed) = (g.clone(), Arc::clone(&passed));
        std::thread::spawn(move || {
            g.before_submit(0);
            passed.store(true, Ordering::SeqCst);
        })
    };
    until("the waiter to register", Duration::from_secs(5), || {
        f.state.gate_waiters(0) == 1
    });
    let registered = monotonic_ns();
    // It rang the allocation's doorbell as it began to wait: an arbiter
    // with no holder sleeps on the doorbell of the allocation it expects
    // back, and sees the return within a wake-up, not a poll.
    until("the waiter to ring", Duration::from_secs(5), || {
        f.state.drain_signal(0).load(Ordering::SeqCst) != bell
    });
    until(
        "the waiter to sleep on the closed word",
        Duration::from_secs(5),
        || sys.sleeps() >= 1,
    );
    assert!(!passed.load(Ordering::SeqCst), "passed a closed gate");
    let granted_at = monotonic_ns();
    let w = f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    t.join().unwrap();
    assert!(passed.load(Ordering::SeqCst));
    assert_eq!(f.state.gate_waiters(0), 0);
    assert_eq!(f.state.device(0).waiters.load(Ordering::SeqCst), 0);
    // The wait is charged at least from when we saw it registered to the grant.
    assert!(f.state.gate_wait_ns(0) >= granted_at - registered);
    let sd = &f.state.slot(g.member().slot).devices[0];
    assert_eq!(sd.launch_epoch.load(Ordering::SeqCst), grant::epoch(w));
    g.stop();
}

#[test]
fn revocation_is_drained_before_it_reports() {
    let f = files(300_000);
    f.arbiter.beat(monotonic_ns()).unwrap();
    let drain = Arc::new(FakeDrain::default());
    let a = gate(&f, 13, Arc::clone(&drain), Arc::default());
    let b = gate(&f, 14, Arc::clone(&drain), Arc::default());
    let granted = f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    a.before_submit(0);
    a.before_submit(0);
    // b submits nothing under this grant: nothing of it to wait for.
    drain.set_hold(true);
    let bell = f.state.drain_signal(0).load(Ordering::SeqCst);
    let revoked = f.arbiter.publish_grant(0, 0).unwrap();
    let pending = f.state.undrained(0, grant::epoch(revoked));
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].slot, a.member().slot);
    assert_eq!(pending[0].launch_epoch, grant::epoch(granted));
    until(
        "the drainer to start draining",
        Duration::from_secs(5),
        || drain.calls.load(Ordering::SeqCst) >= 1,
    );
    // The drainer is inside the held drain: a report made before waiting
    // for the work (the bug this catches) would already be visible.
    assert_eq!(
        f.state.undrained(0, grant::epoch(revoked)).len(),
        1,
        "reported drained while work was in flight"
    );
    let released = monotonic_ns();
    drain.set_hold(false);
    until("the drain to be reported", Duration::from_secs(5), || {
        f.state.undrained(0, grant::epoch(revoked)).is_empty()
    });
    assert!(f.state.drain_signal(0).load(Ordering::SeqCst) > bell);
    let at = f.state.drained_at_ns(0);
    assert!(at >= released && at <= monotonic_ns(), "drained at {at}");
    assert_eq!(drain.calls.load(Ordering::SeqCst), 1, "one drain per epoch");
    a.stop();
    b.stop();
}

/// A driver that can tell when the drained work ended (`ended_at`).
struct EndedDrain {
    ended: u64,
}

impl Drain for EndedDrain {
    fn drain(&self, _dev: usize) {}
    fn ended_at(&self, _dev: usize) -> Option<u64> {
        Some(self.ended)
    }
}

#[test]
fn the_drain_reports_when_the_work_ended_never_a_time_to_come() {
    // Two allocations' worth of files: one driver says its work ended a
    // while ago, the other claims an end still to come.
    for (ahead, pid) in [(false, 21), (true, 22)] {
        let f = files(300_000);
        f.arbiter.beat(monotonic_ns()).unwrap();
        let t0 = monotonic_ns();
        let ended = if ahead {
            t0 + 3_600_000_000_000
        } else {
            t0 - 5_000_000
        };
        let g = gate_on(
            &f,
            pid,
            Arc::new(EndedDrain { ended }),
            Arc::default(),
            Arc::new(crate::sys::Linux),
        );
        f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
        g.before_submit(0);
        let revoked = f.arbiter.publish_grant(0, 0).unwrap();
        until("the drain to be reported", Duration::from_secs(5), || {
            f.state.undrained(0, grant::epoch(revoked)).is_empty()
        });
        let at = f.state.drained_at_ns(0);
        if ahead {
            // Cut to when the drain returned: never after the report.
            assert!(at >= t0 && at <= monotonic_ns(), "drained at {at}");
        } else {
            assert_eq!(at, ended, "the driver's own end, not the report's time");
        }
        g.stop();
    }
}

/// How long the rejoin test waits for what must happen: a hang guard, never
/// a measure (the suite runs beside busy CPUs).
const HANG: Duration = Duration::from_secs(30);

/// The gate timeout once the arbiter returns in the rejoin test: longer than
/// any stall of its beater on a loaded box.
const REJOIN_TIMEOUT_NS: u64 = 10_000_000_000;

#[test]
fn silent_arbiter_opens_the_gate_once_and_it_rejoins() {
    let f = files(300_000);
    f.arbiter.set_gate_timeout(150_000_000).unwrap();
    f.arbiter.beat(monotonic_ns()).unwrap();
    let log: Arc<Mutex<Vec<GateEvent>>> = Arc::default();
    let sys = CountingSys::new(&f);
    let g = counted_gate(&f, 15, Arc::clone(&sys), Arc::clone(&log));
    let t0 = Instant::now();
    g.before_submit(0);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    // A hang guard, not a measure: a loaded box wakes the waiter late.
    assert!(waited < HANG, "{waited:?}");
    assert!(g.running_free(0));
    for _ in 0..100 {
        g.before_submit(0);
    }
    match log.lock().unwrap().as_slice() {
        [GateEvent::RunningFree { dev: 0, silent_ms }] => assert!(*silent_ms >= 150),
        other => panic!("expected one RunningFree, got {other:?}"),
    }
    assert_eq!(log.lock().unwrap().len(), 1, "said once");
    // Free-running submissions are recorded under the current epoch.
    let sd = &f.state.slot(g.member().slot).devices[0];
    assert_eq!(sd.launches.load(Ordering::Relaxed), 101);
    // From here the gate's timeout is long: with 150 ms, a beater starved
    // that long on a loaded box would let the rejoined gate run free again.
    // The gate's clock moves past the new timeout, so the arbiter is still
    // silent by it (the gate stays free, and says nothing again): the rejoin
    // below is the heartbeat's doing, not the new timeout's.
    f.arbiter.set_gate_timeout(REJOIN_TIMEOUT_NS).unwrap();
    sys.advance(Duration::from_nanos(2 * REJOIN_TIMEOUT_NS));
    g.before_submit(0);
    assert!(g.running_free(0), "silent past the long timeout too");
    assert_eq!(sd.launches.load(Ordering::Relaxed), 102);
    assert_eq!(log.lock().unwrap().len(), 1, "said once");
    // The arbiter returns: the next submission waits for a grant again.
    let passed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let beater = {
        let stop = Arc::clone(&stop);
        let c = Control::open_rw(f.arbiter.path()).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                c.beat(monotonic_ns()).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let before = f.control.heartbeat();
    until("the arbiter's first beat", HANG, || {
        f.control.heartbeat() != before
    });
    let revoked = f.arbiter.publish_grant(0, 0).unwrap();
    let t = {
        let (g, passed) = (g.clone(), Arc::clone(&passed));
        std::thread::spawn(move || {
            g.before_submit(0);
            passed.store(true, Ordering::SeqCst);
        })
    };
    until("the gate to rejoin", HANG, || f.state.gate_waiters(0) == 1);
    assert!(!g.running_free(0));
    // The work it submitted while free is drained for the new arbiter.
    until("the free-run work to drain", HANG, || {
        f.state.undrained(0, grant::epoch(revoked)).is_empty()
    });
    let slept = sys.sleeps();
    until(
        "the rejoined gate to sleep on the closed word",
        HANG,
        || sys.sleeps() > slept,
    );
    assert!(!passed.load(Ordering::SeqCst), "rejoined gate did not wait");
    f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    t.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    beater.join().unwrap();
    let events = log.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1], GateEvent::Rejoined { dev: 0 });
    g.stop();
}

/// The system calls with a clock of their own: time moves only when the
/// gate sleeps on the grant word (by the whole timeout it asked for, as if
/// nobody woke it), so the gate's timing is exact whatever the machine's
/// load. Every wait is recorded; other words (the drainer's) get the real
/// futex, so a real thread sleeps there and `stop()` wakes it.
struct FakeSys {
    now: AtomicU64,
    /// The grant word whose waits are faked, by address.
    grant: usize,
    /// Timeouts the gate asked for on the grant word, in order.
    waits: Mutex<Vec<u64>>,
    /// Runs before each faked wait sleeps, with the wait's index: what the
    /// arbiter does meanwhile.
    meanwhile: Mutex<Box<dyn FnMut(usize) + Send>>,
}

impl FakeSys {
    fn new(grant: &AtomicU32, meanwhile: impl FnMut(usize) + Send + 'static) -> Arc<Self> {
        Arc::new(FakeSys {
            now: AtomicU64::new(1_000_000_000),
            grant: grant.as_ptr() as usize,
            waits: Mutex::default(),
            meanwhile: Mutex::new(Box::new(meanwhile)),
        })
    }
}

impl Sys for FakeSys {
    fn monotonic_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn futex_wait(&self, word: &AtomicU32, expected: u32, timeout_ns: u64) {
        if word.as_ptr() as usize != self.grant {
            return crate::sys::futex_wait(word, expected, timeout_ns);
        }
        let n = {
            let mut w = self.waits.lock().unwrap();
            w.push(timeout_ns);
            w.len() - 1
        };
        (self.meanwhile.lock().unwrap())(n);
        if word.load(Ordering::SeqCst) == expected {
            self.now.fetch_add(timeout_ns, Ordering::SeqCst);
        }
    }
    fn futex_wake_all(&self, word: &AtomicU32) {
        crate::sys::futex_wake_all(word)
    }
    fn set_timer_slack(&self, _ns: u64) {}
}

fn fake_gate(f: &Files, pid: u32, sys: Arc<FakeSys>, log: Arc<Mutex<Vec<GateEvent>>>) -> Gate {
    gate_on(f, pid, Arc::new(FakeDrain::default()), log, sys)
}

#[test]
fn a_waiter_runs_free_exactly_one_timeout_after_the_heartbeat_last_moved() {
    const T: u64 = 800_000_000;
    const BEATS: usize = 5;
    let f = files(300_000);
    f.arbiter.set_gate_timeout(T).unwrap();
    f.arbiter.beat(1).unwrap();
    // The arbiter beats during the first waits (it never grants), then dies.
    let arbiter = Control::open_rw(f.arbiter.path()).unwrap();
    let sys = FakeSys::new(&f.control.device(0).grant, move |n| {
        if n < BEATS {
            arbiter.beat(2 + n as u64).unwrap();
        }
    });
    let log: Arc<Mutex<Vec<GateEvent>>> = Arc::default();
    let g = fake_gate(&f, 20, Arc::clone(&sys), Arc::clone(&log));
    g.before_submit(0);
    assert!(g.running_free(0));
    let waits = sys.waits.lock().unwrap().clone();
    // Every sleep is at most an eighth of the timeout, so silence is seen
    // within an eighth of it: here exactly, as the clock lands on it.
    assert!(waits.iter().all(|&w| w > 0 && w <= T / 8), "{waits:?}");
    // The beat of the last busy wait is seen when it returns; from then on
    // eight sleeps of T/8 and not one more.
    assert_eq!(waits.len(), BEATS + 8, "{waits:?}");
    match log.lock().unwrap().as_slice() {
        [GateEvent::RunningFree { dev: 0, silent_ms }] => {
            assert_eq!(*silent_ms, T / 1_000_000)
        }
        other => panic!("expected one RunningFree, got {other:?}"),
    }
    g.stop();
}

#[test]
fn time_at_a_closed_gate_is_charged_on_the_gate_clock() {
    let f = files(300_000);
    f.arbiter.set_gate_timeout(800_000_000).unwrap();
    let arbiter = Control::open_rw(f.arbiter.path()).unwrap();
    // The arbiter beats at every wait and grants at the fourth.
    let sys = FakeSys::new(&f.control.device(0).grant, move |n| {
        arbiter.beat(1 + n as u64).unwrap();
        if n == 3 {
            arbiter.publish_grant(0, grant::GRANTED).unwrap();
        }
    });
    let g = fake_gate(&f, 21, Arc::clone(&sys), Arc::default());
    let t0 = sys.monotonic_ns();
    g.before_submit(0);
    assert!(!g.running_free(0));
    let waits = sys.waits.lock().unwrap().clone();
    assert_eq!(waits.len(), 4, "{waits:?}");
    // The woken wait took no time; the three before it took what they asked.
    let slept: u64 = waits[..3].iter().sum();
    assert_eq!(sys.monotonic_ns() - t0, slept);
    assert_eq!(f.state.gate_wait_ns(0), slept);
    assert_eq!(f.state.gate_waiters(0), 0, "left the waiter count");
    g.stop();
}

#[test]
fn a_killed_waiter_leaves_no_demand() {
    let f = files(300_000);
    let m = member(f.state, 16);
    // As if the process set up its gate, registered at it, then was
    // killed.
    f.state
        .raw()
        .header
        .gate_slots
        .fetch_max(m.slot as u32 + 1, Ordering::SeqCst);
    f.state.device(0).waiters.fetch_add(1, Ordering::SeqCst);
    f.state
        .slot(m.slot)
        .gate_waiting
        .fetch_or(1, Ordering::SeqCst);
    assert_eq!(f.state.gate_waiters(0), 1);
    // A counter no live bit backs is not demand...
    f.state.device(0).waiters.fetch_add(1, Ordering::SeqCst);
    assert_eq!(f.state.gate_waiters(0), 1);
    // ...and reclaiming the slot takes its bit and count away.
    struct Dead;
    impl crate::Liveness for Dead {
        fn check(&self, _: &ProcIdentity) -> Option<bool> {
            Some(false)
        }
    }
    let reclaimed = f.state.reclaim_dead(&Dead, None);
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(f.state.gate_waiters(0), 0);
    assert_eq!(f.state.device(0).waiters.load(Ordering::SeqCst), 1);
    assert_eq!(f.state.slot(m.slot).gate_waiting.load(Ordering::SeqCst), 0);
}

#[test]
fn arbiter_writes_need_a_writable_mapping_and_a_real_device() {
    let f = files(300_000);
    assert!(matches!(
        f.control.publish_grant(0, grant::GRANTED),
        Err(ShmError::ReadOnly(_))
    ));
    assert!(matches!(f.control.beat(1), Err(ShmError::ReadOnly(_))));
    // Drainers sleep on the revocation counter: grants leave it alone.
    let rev = || f.control.device(0).revocations.load(Ordering::SeqCst);
    f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    assert_eq!(rev(), 0);
    f.arbiter.publish_grant(0, 0).unwrap();
    f.arbiter.publish_grant(0, grant::OPEN).unwrap();
    assert_eq!(rev(), 2);
    let e = f.arbiter.publish_grant(3, grant::GRANTED).unwrap_err();
    assert!(e.to_string().contains("device index 3"), "{e}");
    assert!(f.arbiter.set_gate_timeout(0).is_err());
}

#[test]
fn epochs_grow_and_skip_zero() {
    let w = next_grant_word(0, grant::GRANTED);
    assert_eq!(grant::epoch(w), 1);
    assert!(grant::may_submit(w));
    let last = (u32::MAX >> grant::EPOCH_SHIFT) << grant::EPOCH_SHIFT;
    let wrapped = next_grant_word(last, 0);
    assert_eq!(grant::epoch(wrapped), 1);
    assert!(!grant::may_submit(wrapped));
    assert_eq!(next_grant_word(w, 0xffff_fff0) & 3, 0, "only flag bits");
}

#[test]
fn a_gate_refuses_another_allocations_state() {
    let f = files(300_000);
    let dir = tempfile::tempdir().unwrap();
    let other = ControlSpec::new("other", f.control.spec().devices);
    let (_, s2) = create_allocation_files(dir.path(), &other).unwrap();
    let state2: &'static State = Box::leak(Box::new(State::open(&s2, "other").unwrap()));
    let m = member(state2, 17);
    let e = Gate::new(
        f.control,
        state2,
        m,
        Arc::new(FakeDrain::default()),
        Arc::new(|_: &GateEvent| {}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
}

#[test]
fn a_synchronising_process_is_seen_until_its_last_wait_ends() {
    let f = files(300_000);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = gate(&f, 18, Arc::new(FakeDrain::default()), log);
    assert!(!f.state.syncing(0));
    // Two threads in a wait at once: seen while either waits.
    let (in_wait, release) = (
        Arc::new(std::sync::Barrier::new(2)),
        Arc::new(std::sync::Barrier::new(2)),
    );
    let other = {
        let (g, in_wait, release) = (g.clone(), in_wait.clone(), release.clone());
        std::thread::spawn(move || {
            g.syncing(Some(0), || {
                in_wait.wait();
                release.wait();
            })
        })
    };
    in_wait.wait();
    let inner = g.syncing(Some(0), || f.state.syncing(0));
    assert!(inner, "seen during its own wait");
    assert!(f.state.syncing(0), "the other thread still waits");
    release.wait();
    other.join().unwrap();
    assert!(!f.state.syncing(0), "both waits ended");
    // Outside the allocation's devices, or on none: just the wait.
    assert_eq!(g.syncing(None, || 7), 7);
    assert!(!g.syncing(Some(5), || f.state.syncing(0)));
    // A process killed in a wait leaves no activity behind.
    g.syncing(Some(0), || {
        struct Dead;
        impl crate::Liveness for Dead {
            fn check(&self, _: &ProcIdentity) -> Option<bool> {
                Some(false)
            }
        }
        assert!(f.state.syncing(0));
        assert_eq!(f.state.reclaim_dead(&Dead, None).len(), 1);
        assert!(!f.state.syncing(0));
    });
    g.stop();
}

#[test]
fn a_process_whose_host_part_is_long_yields_at_its_synchronisations_until_it_launches() {
    use crate::gate::YIELD_AFTER_NS;
    let f = files(1_000_000);
    let sys = FakeSys::new(&f.control.device(0).grant, |_| {});
    let g = fake_gate(&f, 23, Arc::clone(&sys), Arc::default());
    let bell = || f.state.drain_signal(0).load(Ordering::SeqCst);
    // A step: launch, wait for it, back on the host for `host_ns`.
    let step = |host_ns: u64, idle: bool| {
        g.before_submit(0);
        g.syncing(Some(0), || ());
        g.synced(0, idle);
        let yielded = f.state.yielding(0);
        sys.now.fetch_add(host_ns, Ordering::SeqCst);
        yielded
    };
    // Nothing learned yet: no yield.
    assert!(!step(2_000_000, true));
    // A second wait on work already done, just before the launch (the
    // program's own event wait), does not restart the host part.
    g.syncing(Some(0), || ());
    g.synced(0, true);
    // 2 ms on the host learned: the next return yields, and rings the
    // arbiter's doorbell.
    let rung = bell();
    assert!(step(2_000_000, true));
    assert!(bell() > rung, "the arbiter is woken");
    assert_eq!(g.host_part_ns(0), 2_000_000);
    // The next launch takes it back.
    g.before_submit(0);
    assert!(!f.state.yielding(0));
    // Work still in flight at the return: no yield.
    g.syncing(Some(0), || ());
    g.synced(0, false);
    assert!(!f.state.yielding(0));
    // Another thread still in a synchronisation: no yield either.
    sys.now.fetch_add(2_000_000, Ordering::SeqCst);
    g.syncing(Some(0), || {
        g.before_submit(0);
        g.synced(0, true);
        assert!(!f.state.yielding(0));
    });
    // Another live process of the allocation that launched and neither
    // yields nor waits at the gate keeps the allocation busy.
    let other = gate(&f, 24, Arc::default(), Arc::default());
    other.before_submit(0);
    g.before_submit(0);
    g.syncing(Some(0), || ());
    g.synced(0, true);
    assert!(
        f.state
            .slot(g.member().slot)
            .yielding
            .load(Ordering::SeqCst)
            & 1
            != 0,
        "this process yields"
    );
    assert!(!f.state.yielding(0), "the other streams");
    // Short host parts learned: no more yields (a quarter per sample).
    let mine = || {
        f.state
            .slot(g.member().slot)
            .yielding
            .load(Ordering::SeqCst)
            & 1
            != 0
    };
    for _ in 0..16 {
        step(10_000, true);
    }
    assert!(g.host_part_ns(0) < YIELD_AFTER_NS);
    step(10_000, true);
    assert!(!mine());
}

/// A process that learned its host parts are long leaves as its
/// synchronisation begins, once per step: the arbiter may revoke while the
/// awaited kernel runs. The host part it then learns starts at the wait's
/// return, not at the leave (or short host parts would be learned long),
/// and its next launch takes the yield back.
#[test]
fn a_process_with_long_host_parts_leaves_as_its_synchronisation_begins() {
    let f = files(1_000_000);
    let sys = FakeSys::new(&f.control.device(0).grant, |_| {});
    let g = fake_gate(&f, 25, Arc::clone(&sys), Arc::default());
    let bell = || f.state.drain_signal(0).load(Ordering::SeqCst);
    // Nothing learned: it does not leave.
    g.before_submit(0);
    assert!(!g.would_leave(0));
    g.syncing(Some(0), || ());
    g.synced(0, true);
    sys.now.fetch_add(2_000_000, Ordering::SeqCst);
    g.before_submit(0);
    assert_eq!(g.host_part_ns(0), 2_000_000);
    // A long host part learned, after a launch: it leaves, and the arbiter
    // hears it.
    assert!(g.would_leave(0));
    let rung = bell();
    g.leave(0);
    assert!(f.state.yielding(0));
    assert!(bell() > rung, "the arbiter is woken");
    // Left, it does not leave again before it launches.
    assert!(!g.would_leave(0));
    // The awaited kernel runs 1 ms; the wait returns; 100 us on the host.
    sys.now.fetch_add(1_000_000, Ordering::SeqCst);
    g.synced(0, true);
    sys.now.fetch_add(100_000, Ordering::SeqCst);
    g.before_submit(0);
    assert!(!f.state.yielding(0), "the launch takes the yield back");
    // Learned from the return (100 us), not from the leave (1.1 ms).
    assert_eq!(g.host_part_ns(0), (3 * 2_000_000 + 100_000) / 4);
    // A launch before the wait returns (another thread) takes it back too.
    g.leave(0);
    g.before_submit(0);
    assert!(!f.state.yielding(0));
    // The host part ends when the launch is called, not when the pacer
    // lets it through: a hold on the process's own work is not host time.
    let before = g.host_part_ns(0);
    g.syncing(Some(0), || ());
    g.synced(0, true);
    sys.now.fetch_add(100_000, Ordering::SeqCst);
    g.launch_called(0);
    sys.now.fetch_add(20_000_000, Ordering::SeqCst);
    g.before_submit(0);
    assert_eq!(g.host_part_ns(0), (3 * before + 100_000) / 4);
    // Outside the allocation's devices: nothing.
    assert!(!g.would_leave(5));
    g.leave(5);
    g.launch_called(5);
    g.stop();
}

/// The allocation's launch numbers, shared by its processes' pacers: a
/// number is taken only with the count the decision was made with, and
/// the latest launch seen done moves forward only, with when it was seen.
#[test]
fn launch_numbers_are_taken_in_one_step_with_the_decision() {
    let f = files(300_000);
    let a = gate(&f, 21, Arc::default(), Arc::default());
    let b = gate(&f, 22, Arc::default(), Arc::default());
    assert_eq!(a.launch_count(0), 0);
    // Both decided with the count at 0: the first to number its launch
    // gets 1, the other is told to decide again, and then gets 2.
    assert_eq!(a.take_launch(0, 0), Some(1));
    assert_eq!(b.take_launch(0, 0), None);
    assert_eq!(b.take_launch(0, b.launch_count(0)), Some(2));
    assert_eq!(a.launch_count(0), 2, "the processes share one count");
    // Seen done: forward only, and the time moves with it.
    assert_eq!((a.launches_done(0), a.done_at(0)), (0, 0));
    b.saw_done(0, 2, 5_000);
    a.saw_done(0, 1, 6_000);
    assert_eq!((a.launches_done(0), a.done_at(0)), (2, 5_000));
    // In wrapping order: a number just past the 32-bit wrap (its low bits
    // 2) is ahead of one just before it.
    f.state
        .device(0)
        .launches_done
        .store(u32::MAX - 1, Ordering::SeqCst);
    a.saw_done(0, u64::from(u32::MAX) + 3, 7_000);
    assert_eq!((b.launches_done(0), b.done_at(0)), (2, 7_000));
    a.saw_done(0, u64::from(u32::MAX), 8_000);
    assert_eq!((b.launches_done(0), b.done_at(0)), (2, 7_000));
    // A device outside the allocation: nothing shared, no number.
    assert_eq!(a.take_launch(5, 0), Some(0));
    assert_eq!(a.launch_count(5), 0);
}

/// A process records its first submission of each grant epoch (only the
/// first: later ones are the one-load fast path), and the arbiter reads the
/// allocation's earliest at or after the grant, passing over records of
/// earlier epochs.
#[test]
fn the_first_launch_of_each_epoch_is_recorded() {
    let f = files(300_000);
    f.arbiter.beat(monotonic_ns()).unwrap();
    let a = gate(&f, 31, Arc::default(), Arc::default());
    let b = gate(&f, 32, Arc::default(), Arc::default());
    let first = |g: &Gate| {
        crate::layout::FirstLaunch::unpack(
            f.state
                .slot(g.member().slot)
                .first_launch
                .load(Ordering::SeqCst),
        )
    };
    assert_eq!(first(&a), None, "no submission yet");
    let granted = monotonic_ns();
    f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    a.before_submit(0);
    let at = first(&a).expect("recorded at the first submission");
    assert_eq!(at.dev, 0);
    assert!(at.at_ns >= granted && at.at_ns <= monotonic_ns());
    a.before_submit(0);
    assert_eq!(
        first(&a),
        Some(at),
        "the epoch's later submissions record nothing"
    );
    std::thread::sleep(Duration::from_millis(2));
    b.before_submit(0);
    let at_b = first(&b).unwrap().at_ns;
    assert!(at_b > at.at_ns);
    assert_eq!(f.state.first_launch_since(0, granted), Some(at.at_ns));
    // The next epoch: what was recorded under the last one is passed over.
    let regranted = monotonic_ns();
    f.arbiter.publish_grant(0, 0).unwrap();
    f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    assert_eq!(f.state.first_launch_since(0, regranted), None);
    b.before_submit(0);
    let again = first(&b).unwrap().at_ns;
    assert!(again >= regranted);
    assert_eq!(f.state.first_launch_since(0, regranted), Some(again));
    // Another device's record is not this one's.
    assert_eq!(f.state.first_launch_since(1, granted), None);
    a.stop();
    b.stop();
}

/// `open` is what the pacer reads to leave a device's queue alone: a whole
/// GPU's (open from the start), or one the arbiter let go; never a device
/// the arbiter grants and revokes, nor one outside the allocation.
#[test]
fn a_device_is_open_only_while_its_grant_word_says_so() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let whole = files(1_000_000);
    let g = gate(&whole, 4_201, Arc::new(FakeDrain::default()), log.clone());
    assert!(g.open(0), "a whole GPU is never arbitrated");
    assert!(!g.open(1), "outside the allocation");

    let part = files(300_000);
    let g = gate(&part, 4_202, Arc::new(FakeDrain::default()), log);
    assert!(!g.open(0), "not granted yet");
    part.arbiter.publish_grant(0, grant::GRANTED).unwrap();
    assert!(!g.open(0), "granted: a hand-over drains what it queued");
    part.arbiter.publish_grant(0, grant::OPEN).unwrap();
    assert!(g.open(0), "let go by the arbiter");
    part.arbiter.publish_grant(0, 0).unwrap();
    assert!(!g.open(0), "taken back: revoked");
}

/// The pacer's word of where a process's queued work ends: the arbiter
/// reads the latest of the allocation's live processes on that device, and
/// a process reclaimed dead says nothing more.
#[test]
fn the_latest_queued_end_of_the_live_processes_is_read_per_device() {
    let f = files(300_000);
    f.arbiter.beat(monotonic_ns()).unwrap();
    let a = gate(&f, 41, Arc::default(), Arc::default());
    let b = gate(&f, 42, Arc::default(), Arc::default());
    assert_eq!(f.state.queued_until(0), None, "nothing said yet");
    a.queued_until(0, 5_000);
    b.queued_until(0, 9_000);
    assert_eq!(f.state.queued_until(0), Some(9_000));
    // Each process's last word stands, later or earlier.
    b.queued_until(0, 7_000);
    assert_eq!(f.state.queued_until(0), Some(7_000));
    // Outside the allocation's devices nothing is written, and the word
    // of device 0 is no other device's.
    a.queued_until(1, 20_000);
    assert_eq!(f.state.queued_until(1), None);
    assert_eq!(f.state.queued_until(0), Some(7_000));
    // A process killed with work queued leaves no activity behind.
    struct Dead;
    impl crate::Liveness for Dead {
        fn check(&self, _: &ProcIdentity) -> Option<bool> {
            Some(false)
        }
    }
    a.stop();
    b.stop();
    assert_eq!(f.state.reclaim_dead(&Dead, None).len(), 2);
    assert_eq!(f.state.queued_until(0), None);
}
