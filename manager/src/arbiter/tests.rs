//! The arbiter's API and its threads over real shared-memory files, with
//! threads standing in for processes behind real gates: take-over,
//! shutdown, removal, refusals. Nothing here measures time: shares, caps,
//! drains and periods are judged on a clock the test owns, with the
//! driver stepped by hand (`driver_tests.rs`); how close shares come to
//! their targets on a real clock is the benchmark's (`tessera-bench
//! compute`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_contract::units::FULL_COMPUTE_PPM;

use tessera_shm::gate::{Drain, Gate, GateEvent};
use tessera_shm::layout::grant;
use tessera_shm::{Control, Member, Policy, ProcIdentity, State};

use super::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const GPU: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";

/// An allocation's files, kept for the test's life (gates need `'static`).
struct Alloc {
    control: &'static Control,
    state: &'static State,
    dir: &'static Path,
}

fn alloc(id: &str, share_ppm: u32, policy: Policy) -> Alloc {
    let dir: &'static tempfile::TempDir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let (c, s) = test_files(dir.path(), id, GPU, share_ppm, policy);
    Alloc {
        control: Box::leak(Box::new(Control::open(&c).unwrap())),
        state: Box::leak(Box::new(State::open(&s, id).unwrap())),
        dir: dir.path(),
    }
}

impl Alloc {
    fn files(&self) -> Arc<dyn AllocationFiles> {
        Arc::new(OpenFiles::open(&self.dir.join("control"), &self.dir.join("state")).unwrap())
    }
}

/// A stand-in process: its gate.
struct Proc {
    gate: Gate,
}

/// A process with no work in flight: its drains end at once.
struct NothingInFlight;

impl Drain for NothingInFlight {
    fn drain(&self, _dev: usize) {}
}

fn process(a: &Alloc, pid: u32, log: Option<Arc<Mutex<Vec<GateEvent>>>>) -> Proc {
    let me = ProcIdentity {
        pid,
        pidns: 0,
        start_time: 0,
    };
    let m: Member = a
        .state
        .join(&me, &tessera_shm::LocalLiveness::quick())
        .unwrap();
    let gate = Gate::new(
        a.control,
        a.state,
        m,
        Arc::new(NothingInFlight),
        Arc::new(move |e: &GateEvent| {
            if let Some(l) = &log {
                l.lock().unwrap().push(e.clone());
            }
        }),
    )
    .unwrap();
    Proc { gate }
}

#[test]
fn shutdown_opens_the_gates_and_a_new_arbiter_takes_over() {
    let _s = serial();
    let a = alloc("handover", 500_000, Policy::Guaranteed);
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    arb.add_allocation(a.files(), 0).unwrap();
    let closed = a.control.grant_word(0);
    assert!(
        !grant::may_submit(closed),
        "taken over: closed until granted"
    );
    arb.shutdown();
    arb.shutdown();
    let w = a.control.grant_word(0);
    assert_ne!(w & grant::OPEN, 0, "no arbiter: open");
    assert!(matches!(
        arb.add_allocation(a.files(), 0),
        Err(ArbiterError::ShutDown)
    ));
    // A process passes at once.
    let p = process(&a, 104, None);
    p.gate.before_submit(0);
    // The next arbiter closes the gate again, and grants it on demand.
    let arb2 = Arbiter::new(ArbiterConfig::default()).unwrap();
    arb2.add_allocation(a.files(), 0).unwrap();
    assert!(
        !grant::may_submit(a.control.grant_word(0)) || {
            // It may already have been granted to the waiting demand; either
            // way the word moved past the open one.
            grant::epoch(a.control.grant_word(0)) > grant::epoch(w)
        }
    );
    p.gate.before_submit(0);
    // It passed under a grant of the new arbiter (the word may have been
    // revoked again since: the allocation is capped at half).
    assert!(!p.gate.running_free(0));
    let passed_under = a.state.slot(p.gate.member().slot).devices[0]
        .launch_epoch
        .load(Ordering::SeqCst);
    assert!(
        passed_under > grant::epoch(w),
        "passed under epoch {passed_under}, not a grant after the open word {}",
        grant::epoch(w)
    );
    p.gate.stop();
}

#[test]
fn removing_an_allocation_opens_its_gate_and_bad_requests_are_refused() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let a = alloc("removed", 200_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    let e = arb.add_allocation(a.files(), 0).unwrap_err();
    assert!(matches!(e, ArbiterError::AlreadyAdded { .. }), "{e}");
    let e = arb.add_allocation(a.files(), 3).unwrap_err();
    assert!(e.to_string().contains("no device 3 (it has 1)"), "{e}");
    arb.remove_allocation("removed").unwrap();
    assert_ne!(a.control.grant_word(0) & grant::OPEN, 0);
    assert!(arb.stats().is_empty());
    let e = arb.remove_allocation("removed").unwrap_err();
    assert!(matches!(e, ArbiterError::NotFound(_)), "{e}");
    // A whole GPU is not arbitrated: its gate stays open.
    let whole = alloc("whole", FULL_COMPUTE_PPM, Policy::Burst);
    arb.add_allocation(whole.files(), 0).unwrap();
    assert_ne!(whole.control.grant_word(0) & grant::OPEN, 0);
    assert!(arb.stats().is_empty());
    // Files that do not open are refused with their path.
    let e = OpenFiles::open(Path::new("/nonexistent/control"), Path::new("/x")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/control"), "{e}");
}

#[test]
fn bad_configurations_are_refused() {
    let d = ArbiterConfig::default();
    d.validate().unwrap();
    for (cfg, words) in [
        (
            ArbiterConfig {
                quantum: Duration::from_micros(10),
                ..d
            },
            "quantum",
        ),
        (
            ArbiterConfig {
                idle_release: Duration::from_millis(20),
                ..d
            },
            "idle release",
        ),
        (
            ArbiterConfig {
                contested_idle_release: Duration::from_millis(2),
                ..d
            },
            "contested idle release",
        ),
        (
            ArbiterConfig {
                contested_idle_release: Duration::ZERO,
                ..d
            },
            "contested idle release",
        ),
        (
            ArbiterConfig {
                grant_ahead: Duration::from_millis(1),
                ..d
            },
            "grant ahead",
        ),
        (
            ArbiterConfig {
                poll: Duration::ZERO,
                ..d
            },
            "poll period",
        ),
        (
            ArbiterConfig {
                drain_timeout: Duration::from_secs(61),
                ..d
            },
            "drain timeout",
        ),
        (
            ArbiterConfig {
                idle_poll: Duration::from_secs(1),
                ..d
            },
            "idle poll",
        ),
        (
            ArbiterConfig {
                stats_window: Duration::from_millis(1),
                ..d
            },
            "stats window",
        ),
        (ArbiterConfig { nice: -21, ..d }, "nice value -21"),
        (ArbiterConfig { nice: 5, ..d }, "nice value 5"),
    ] {
        let e = Arbiter::new(cfg).unwrap_err();
        assert!(e.to_string().contains(words), "{e}");
    }
}

/// The nice value of this process's thread named `name`: its thread id
/// from procfs, its priority from the kernel (`getpriority` takes a
/// thread id), so no second `stat` parser is needed.
fn thread_nice(name: &str) -> Option<i32> {
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = t.ok()?.path();
        if std::fs::read_to_string(dir.join("comm")).ok()?.trim() != name {
            continue;
        }
        let tid: libc::id_t = dir.file_name()?.to_str()?.parse().ok()?;
        // SAFETY: plain integer arguments; it only reads. (-1 is also a
        // valid nice value, so errno is not consulted: the thread exists.)
        return Some(unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) });
    }
    None
}

/// Each GPU's thread raises itself to the configured nice value where the
/// process may (`CAP_SYS_NICE`: root in CI), and stays at the process's
/// own where it may not or where 0 is asked; no other thread moves.
#[test]
fn the_arbiters_thread_runs_at_the_configured_priority() {
    let _s = serial();
    // Whether this process may raise a thread's priority: a thread of its
    // own asks for one step.
    let may = std::thread::spawn(|| {
        tessera_shm::sys::raise_thread_priority(-1) == tessera_shm::sys::Priority::Set
    })
    .join()
    .unwrap();
    let own = tessera_shm::sys::thread_sched().unwrap().1;
    for (nice, want) in [(-7, if may { -7 } else { own }), (0, own)] {
        let arb = Arbiter::new(ArbiterConfig {
            nice,
            ..ArbiterConfig::default()
        })
        .unwrap();
        let a = alloc(&format!("nice{}", -nice), 300_000, Policy::Guaranteed);
        arb.add_allocation(a.files(), 0).unwrap();
        // The thread sets its priority before its first command is read,
        // so the allocation added means it is done.
        // (A thread's name is cut to 15 bytes.)
        let name: String = format!("arbiter-{}", &GPU[4..12])
            .chars()
            .take(15)
            .collect();
        assert_eq!(
            thread_nice(&name),
            Some(want),
            "asked for {nice}, may: {may}"
        );
        assert_eq!(tessera_shm::sys::thread_sched().unwrap().1, own);
        arb.shutdown();
    }
}

#[test]
fn percentiles_are_nearest_rank() {
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[7], 99.0), Some(7));
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&v, 50.0), Some(50));
    assert_eq!(percentile(&v, 99.0), Some(99));
    assert_eq!(percentile(&v, 100.0), Some(100));
    assert_eq!(percentile(&v, 0.0), Some(1));
}

#[test]
fn a_grant_publishes_its_quantum_end_and_a_renewal_moves_it() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let quantum = ArbiterConfig::default().quantum.as_nanos() as u64;
    let a = alloc("ends", 300_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    let p = process(&a, 104, None);
    let before = tessera_shm::sys::monotonic_ns();
    p.gate.before_submit(0);
    let first = p.gate.grant_until(0).expect("a held grant has an end");
    let after = tessera_shm::sys::monotonic_ns();
    assert!(
        first > before && first <= after + quantum,
        "end {first} outside {before}..={}",
        after + quantum
    );
    // Granted on an idle GPU, no drain ahead of it: its time started at
    // once (not pending), one quantum before its end.
    let start = p.gate.grant_start(0).expect("a held grant has a start");
    assert_eq!(start + quantum, first, "start {start}, end {first}");
    // Alone and busy, the burst holder is renewed at the end without a
    // hand-over: the end it sees moves on (within the wait's bound).
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        p.gate.before_submit(0);
        match p.gate.grant_until(0) {
            Some(t) if t > first => break Some(t),
            _ if Instant::now() > deadline => break None,
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    };
    let renewed = renewed.expect("the renewal published no new end");
    assert!(
        renewed >= first + quantum,
        "{renewed} < {first} + {quantum}"
    );
    // Without an arbiter the gate is open: no grant, no end to pace by.
    drop(arb);
    let deadline = Instant::now() + Duration::from_secs(10);
    while grant::may_submit(a.control.grant_word(0)) && a.control.grant_word(0) & grant::OPEN == 0 {
        assert!(Instant::now() < deadline, "the gate never opened");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.gate.grant_until(0), None);
    assert_eq!(p.gate.grant_start(0), None);
    p.gate.stop();
}

/// Tenants are hostile: the doorbell the arbiter sleeps on while a grant is
/// held lives in the holder's own state file, so its processes can ring it
/// as often as they like. A ring that changes nothing does not cut the next
/// sleep short, so the GPU thread wakes at most about twice per poll
/// however fast the bell rings (a bound in wake-ups, not in time: it holds
/// whatever the machine's load).
#[test]
fn a_tenant_ringing_its_own_doorbell_wakes_the_arbiter_at_most_twice_per_poll() {
    let _s = serial();
    let cfg = ArbiterConfig::default();
    let poll = cfg.poll.as_nanos() as u64;
    let quantum = cfg.quantum.as_nanos() as u64;
    let arb = Arbiter::new(cfg).unwrap();
    let a = alloc("bell", 300_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    let p = process(&a, 105, None);
    p.gate.before_submit(0);
    assert!(p.gate.grant_until(0).is_some(), "held");
    let wakeups = || arb.gpu_stats()[0].wakeups;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ringer = {
        let (stop, bell) = (Arc::clone(&stop), a.state.drain_signal(0));
        std::thread::spawn(move || {
            let mut rings = 0u64;
            while !stop.load(Ordering::Relaxed) {
                bell.fetch_add(1, Ordering::AcqRel);
                tessera_shm::sys::futex_wake_all(bell);
                rings += 1;
            }
            rings
        })
    };
    let (w0, t0) = (wakeups(), Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    let (w1, span) = (wakeups(), t0.elapsed().as_nanos() as u64);
    stop.store(true, Ordering::Relaxed);
    let rings = ringer.join().unwrap();
    // Two per poll, one per quantum end, and a few for the reads' edges.
    let bound = 2 * span / poll + span / quantum + 10;
    assert!(
        w1 - w0 <= bound,
        "{} wake-ups in {span} ns with {rings} rings (bound {bound})",
        w1 - w0
    );
    p.gate.stop();
}

/// One GPU's statistics read alone are that GPU's, and a GPU the arbiter
/// does not govern has none.
#[test]
fn one_gpus_statistics_are_read_alone() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    assert!(arb.gpu_stats_of(GPU).is_none(), "no allocation yet");
    let a = alloc("one", 300_000, Policy::Burst);
    let b = alloc("two", 300_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    arb.add_allocation(b.files(), 0).unwrap();
    let one = arb.gpu_stats_of(GPU).expect("the GPU's statistics");
    assert_eq!((one.gpu_uuid.as_str(), one.allocations), (GPU, 2));
    let all = arb.gpu_stats();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].gpu_uuid, one.gpu_uuid);
    assert!(
        arb.gpu_stats_of("GPU-aaaaaaaa-0000-0000-0000-000000000002")
            .is_none()
    );
    arb.shutdown();
    assert!(arb.gpu_stats_of(GPU).is_none(), "shut down");
}
