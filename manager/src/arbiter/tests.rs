//! The arbiter's threads over real shared-memory files, with threads
//! standing in for processes: each "process" has its own slot and gate and
//! runs "kernels" on a fake engine (one at a time, like a GPU without MPS),
//! so shares are judged by the engine's busy time. The tests run one at a
//! time and assert what holds whatever the CPU load (caps with the
//! measurement's own slack, no starvation, work conservation, no hang);
//! how close shares come to their targets is the benchmark's
//! (`tessera-bench compute`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_contract::units::FULL_COMPUTE_PPM;

use tessera_shm::gate::{Drain, Gate, GateEvent};
use tessera_shm::layout::grant;
use tessera_shm::{
    Control, ControlSpec, DeviceSpec, Member, Policy, ProcIdentity, State, create_allocation_files,
};

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
    let spec = ControlSpec::new(
        id,
        vec![DeviceSpec {
            uuid: GPU.into(),
            memory_limit_bytes: 1 << 30,
            compute_share_ppm: share_ppm,
            policy,
        }],
    );
    let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
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

/// The fake engine: one kernel at a time, busy time per allocation.
#[derive(Default)]
struct Engine {
    run: Mutex<()>,
    busy: [AtomicU64; 4],
}

/// A stand-in process: its gate, and a lock held while its kernel runs,
/// which its drain waits on.
struct Proc {
    gate: Gate,
    inflight: Arc<Mutex<()>>,
}

struct InflightDrain(Arc<Mutex<()>>);

impl Drain for InflightDrain {
    fn drain(&self, _dev: usize) {
        drop(self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
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
    let inflight = Arc::new(Mutex::new(()));
    let gate = Gate::new(
        a.control,
        a.state,
        m,
        Arc::new(InflightDrain(Arc::clone(&inflight))),
        Arc::new(move |e: &GateEvent| {
            if let Some(l) = &log {
                l.lock().unwrap().push(e.clone());
            }
        }),
    )
    .unwrap();
    Proc { gate, inflight }
}

/// Runs `kernel`-long kernels back to back through the gate until `stop`.
fn saturate(
    p: Proc,
    engine: Arc<Engine>,
    slot: usize,
    kernel: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            p.gate.before_submit(0);
            let _inflight = p.inflight.lock().unwrap();
            let _engine = engine.run.lock().unwrap();
            let t0 = Instant::now();
            std::thread::sleep(kernel);
            engine.busy[slot].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            n += 1;
        }
        p.gate.stop();
        n
    })
}

fn busy_over(engine: &Engine, slots: usize, d: Duration) -> Vec<f64> {
    let before: Vec<u64> = (0..slots)
        .map(|i| engine.busy[i].load(Ordering::Relaxed))
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(d);
    let span = t0.elapsed().as_nanos() as f64;
    (0..slots)
        .map(|i| (engine.busy[i].load(Ordering::Relaxed) - before[i]) as f64 / span * 100.0)
        .collect()
}

fn within(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got:.1}% not within {tol} pp of {want}%"
    );
}

/// Each allocation's (held ns, longest hold ns), by the arbiter's account.
fn held(arb: &Arbiter, ids: &[&str]) -> Vec<(u64, u64)> {
    let stats = arb.stats();
    ids.iter()
        .map(|id| {
            stats
                .iter()
                .find(|s| s.alloc_id == *id)
                .map_or((0, 0), |s| (s.held_ns, s.longest_hold_ns))
        })
        .collect()
}

/// How far a share measured over `span` can exceed a `share` (fraction)
/// cap, in percentage points: the cap's catch-up allowance, and a hold cut
/// by each end of the window (see `compute_shares`'s `cap_slack_pp`).
fn cap_slack_pp(share: f64, longest_hold_ns: u64, span: Duration) -> f64 {
    let catch_up = ArbiterConfig::default().catch_up.as_secs_f64();
    (share * catch_up + 2.0 * longest_hold_ns as f64 / 1e9) / span.as_secs_f64() * 100.0
}

#[test]
fn two_burst_allocations_share_the_gpu_and_fill_it() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let a = alloc("burst-a", 250_000, Policy::Burst);
    let b = alloc("burst-b", 250_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    arb.add_allocation(b.files(), 0).unwrap();
    let engine = Arc::new(Engine::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers = [
        saturate(
            process(&a, 101, None),
            engine.clone(),
            0,
            Duration::from_millis(1),
            stop.clone(),
        ),
        saturate(
            process(&b, 102, None),
            engine.clone(),
            1,
            Duration::from_millis(1),
            stop.clone(),
        ),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let ids = ["burst-a", "burst-b"];
    let h0 = held(&arb, &ids);
    let t0 = Instant::now();
    let busy = busy_over(&engine, 2, Duration::from_secs(2));
    let h1 = held(&arb, &ids);
    let span = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0, "a process was starved");
    }
    eprintln!("busy {busy:?}");
    // Work conservation: both always have work, and idle time goes to
    // whoever has work, so together they hold the GPU beyond the sum of
    // their 25% floors (the ends of the window cut a hold each).
    let pct = |ns: u64| ns as f64 / span.as_nanos() as f64 * 100.0;
    let together: f64 = h0.iter().zip(&h1).map(|(a, b)| pct(b.0 - a.0)).sum();
    let slack: f64 = h1.iter().map(|h| 2.0 * pct(h.1)).sum();
    assert!(
        together > 50.0 + slack,
        "held {together:.1}% together, no more than their floors (+{slack:.1} pp)"
    );
    let stats = arb.stats();
    assert_eq!(stats.len(), 2);
    for s in &stats {
        assert_eq!(s.gpu_uuid, GPU);
        assert_eq!(s.target_ppm, 250_000);
        // Neither starved; the arbiter handed the GPU over between them.
        assert!(s.grants > 0 && s.achieved_ppm > 0, "{s:?}");
        assert!(s.wait_ns > 0);
        assert!(!s.handover_ns.is_empty());
    }
    let gpu = arb.gpu_stats();
    assert_eq!(gpu.len(), 1);
    assert_eq!(gpu[0].allocations, 2);
    assert!(!gpu[0].handover_ns.is_empty());
}

#[test]
fn a_guaranteed_allocation_alone_is_held_to_its_share() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let a = alloc("capped", 300_000, Policy::Guaranteed);
    arb.add_allocation(a.files(), 0).unwrap();
    let engine = Arc::new(Engine::default());
    let stop = Arc::new(AtomicBool::new(false));
    let w = saturate(
        process(&a, 103, None),
        engine.clone(),
        0,
        Duration::from_millis(1),
        stop.clone(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let busy = busy_over(&engine, 1, Duration::from_secs(2));
    let span = t0.elapsed();
    // After the window: a hold cut by its end is charged once it ends.
    std::thread::sleep(Duration::from_millis(100));
    let (_, longest) = held(&arb, &["capped"])[0];
    stop.store(true, Ordering::Relaxed);
    assert!(w.join().unwrap() > 0, "the process was starved");
    let slack = cap_slack_pp(0.3, longest, span);
    eprintln!("busy {busy:?}, slack {slack:.2} pp");
    assert!(
        busy[0] <= 30.0 + slack,
        "capped at 30% but ran {:.1}% (+{slack:.2} pp slack)",
        busy[0]
    );
    assert!(busy[0] > 0.0, "the process was starved");
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
    ] {
        let e = Arbiter::new(cfg).unwrap_err();
        assert!(e.to_string().contains(words), "{e}");
    }
}

#[test]
fn a_dead_process_does_not_hold_up_a_drain() {
    let _s = serial();
    let cfg = ArbiterConfig {
        drain_timeout: Duration::from_secs(10),
        ..ArbiterConfig::default()
    };
    let arb = Arbiter::new(cfg).unwrap();
    let a = alloc("dead-holder", 500_000, Policy::Burst);
    let b = alloc("live-waiter", 500_000, Policy::Burst);
    // A process of `a` that submitted under a grant and then died without
    // draining: a real pid that has exited, in our pid namespace.
    let dead = tessera_shm::testing::exited_process();
    let m = a
        .state
        .join(&dead, &tessera_shm::testing::AssumeAlive)
        .unwrap();
    // It had set up its gate.
    a.state
        .raw()
        .header
        .gate_slots
        .fetch_max(m.slot as u32 + 1, Ordering::SeqCst);
    arb.add_allocation(a.files(), 0).unwrap();
    arb.add_allocation(b.files(), 0).unwrap();
    // `a` asks for the GPU through a live process, gets it, and the dead
    // one is recorded as having submitted under that grant.
    let pa = process(&a, 105, None);
    pa.gate.before_submit(0);
    let epoch = grant::epoch(a.control.grant_word(0));
    a.state.slot(m.slot).devices[0]
        .launch_epoch
        .store(epoch, Ordering::SeqCst);
    // `b` wants the GPU: `a` is revoked when idle, and its drain must not
    // wait 10 s on the dead process.
    let pb = process(&b, 106, None);
    let t0 = Instant::now();
    pb.gate.before_submit(0);
    // Half the drain timeout: waiting on the dead process would take all of it.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "waited {:?} on a dead process",
        t0.elapsed()
    );
    pa.gate.stop();
    pb.gate.stop();
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
fn processes_of_one_allocation_share_its_grant() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let a = alloc("two-procs", 500_000, Policy::Burst);
    let b = alloc("one-proc", 500_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    arb.add_allocation(b.files(), 0).unwrap();
    let engine = Arc::new(Engine::default());
    let stop = Arc::new(AtomicBool::new(false));
    let k = Duration::from_millis(1);
    // Two processes of `a` count in one slot of the engine's books.
    let workers = [
        saturate(process(&a, 111, None), engine.clone(), 0, k, stop.clone()),
        saturate(process(&a, 112, None), engine.clone(), 0, k, stop.clone()),
        saturate(process(&b, 113, None), engine.clone(), 1, k, stop.clone()),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let ids = ["two-procs", "one-proc"];
    let h0 = held(&arb, &ids);
    let busy = busy_over(&engine, 2, Duration::from_secs(2));
    let h1 = held(&arb, &ids);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0, "a process was starved");
    }
    eprintln!("busy {busy:?}");
    // One client per allocation, however many processes it has.
    assert_eq!(arb.stats().len(), 2);
    // The arbiter's account of the GPU's time, which a grant per process
    // would tilt to two thirds for `a` (its processes wait at the gate
    // whenever `b` holds it, so both always have demand).
    let got: Vec<u64> = h0.iter().zip(&h1).map(|(x, y)| y.0 - x.0).collect();
    within(
        "a's part of the held time",
        got[0] as f64 / (got[0] + got[1]).max(1) as f64 * 100.0,
        50.0,
        8.0,
    );
}

#[test]
fn shares_and_policies_are_reread_from_the_control_file() {
    let _s = serial();
    let arb = Arbiter::new(ArbiterConfig::default()).unwrap();
    let a = alloc("reread", 200_000, Policy::Burst);
    arb.add_allocation(a.files(), 0).unwrap();
    let rw = Control::open_rw(&a.dir.join("control")).unwrap();
    rw.set_compute_share(0, 400_000).unwrap();
    rw.set_policy(0, Policy::Guaranteed).unwrap();
    let t0 = Instant::now();
    loop {
        let s = &arb.stats()[0];
        if s.target_ppm == 400_000 && s.policy == Policy::Guaranteed {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "still {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
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
    p.gate.stop();
}
