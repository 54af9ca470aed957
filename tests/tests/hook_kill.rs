//! Two hundred processes SIGKILLed in the middle of their work: each victim
//! runs a number of allocate/free steps chosen by the test, every one of
//! them answered, then gets one more command and is killed while that
//! command is in flight (anywhere from before it is read to after its
//! reservation is made, the kill's delay is random too). No other process
//! ever waits on them (each step of a witness process running throughout
//! completes promptly), and afterwards the allocation's usage returns to
//! exactly zero and a new process can use the whole limit.
//!
//! Nothing here depends on timing: which step a victim dies in is chosen,
//! and the witness is seen to complete steps before the first victim starts
//! and after the last one died.

mod hook_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hook_support::*;
use tessera_e2e::Mode;

const LIMIT: u64 = 32 * MI;
const VICTIMS: usize = 200;
const PARALLEL: usize = 8;
const HANG: Duration = Duration::from_secs(10);
/// How long the test waits for the witness to make progress: generous, it
/// is a deadline for a hang, not a measure.
const PROGRESS: Duration = Duration::from_secs(60);
const KINDS: [&str; 4] = ["plain", "managed", "pitch", "vmm"];

/// The next random step of a victim: an allocation, or a free of one of
/// the blocks it holds (the handle is taken out of `live`).
fn next_step(rng: &mut Rng, live: &mut Vec<u64>) -> String {
    if live.is_empty() || rng.range(0, 100) < 60 {
        let bytes = rng.range(64 << 10, 6 * MI);
        let kind = *rng.pick(&KINDS);
        format!("alloc {bytes} {kind}")
    } else {
        let h = live.swap_remove((rng.next() % live.len() as u64) as usize);
        format!("free {h}")
    }
}

/// Runs one victim: `init`, `ctx`, a chosen number of answered steps, then
/// one more step that the kill interrupts. Returns whether it held memory
/// when it was killed (for the log only).
fn victim(sim: &Sim, rng: &mut Rng, mode: Mode) -> bool {
    let mut p = Conv::start(sim.probe(mode, true));
    for c in ["init", "ctx"] {
        assert!(p.ask(c, HANG).expect("victim alive").ok, "{c}");
    }
    let steps = rng.range(1, 16);
    let mut live: Vec<u64> = Vec::new();
    for _ in 0..steps {
        let cmd = next_step(rng, &mut live);
        let l = p.ask(&cmd, HANG).expect("victim alive before its kill");
        if cmd.starts_with("alloc") && l.ok {
            live.push(l.u64("h"));
        } else if cmd.starts_with("free") {
            assert!(l.ok, "{cmd}");
        }
    }
    let held = !live.is_empty();
    // The step it dies in: sent, and killed after a random short delay, so
    // the kill lands at any point of the command's run.
    p.send(&next_step(rng, &mut live))
        .expect("victim alive before its kill");
    let delay = rng.range(0, 3_000);
    if delay > 0 {
        std::thread::sleep(Duration::from_micros(delay));
    }
    // SAFETY: signals the child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(p.pid() as i32, libc::SIGKILL) }, 0);
    let status = p.finish();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "killed, not exited");
    held
}

/// Waits until `counter` exceeds `than`, panicking after [`PROGRESS`].
fn wait_past(counter: &AtomicU64, than: u64, what: &str) -> u64 {
    let deadline = Instant::now() + PROGRESS;
    loop {
        let n = counter.load(Ordering::Acquire);
        if n > than {
            return n;
        }
        assert!(Instant::now() < deadline, "{what}: no progress past {than}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn killed_processes_leave_nothing_held_and_nobody_waiting() {
    let seed = seed("killed_processes_leave_nothing_held_and_nobody_waiting");
    let sim = Arc::new(Sim::new(1, 8 * LIMIT));
    sim.allocate(LIMIT);
    // The manager's reaper: what a victim held returns once the driver has let it go.
    let reaper = StandIn::reaper(sim.clone());

    // A witness allocating and freeing throughout: every step must answer
    // within HANG.
    let stop = Arc::new(AtomicBool::new(false));
    let witness_steps = Arc::new(AtomicU64::new(0));
    let witness = {
        let (sim, stop, steps) = (sim.clone(), stop.clone(), witness_steps.clone());
        std::thread::spawn(move || {
            let mut p = Conv::start(sim.probe(Mode::Link, true));
            for c in ["init", "ctx"] {
                assert!(p.ask(c, HANG).unwrap().ok);
            }
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let l = p.ask("alloc 1048576", HANG).expect("witness alive");
                if l.ok {
                    let h = l.u64("h");
                    assert!(p.ask(&format!("free {h}"), HANG).unwrap().ok);
                }
                slowest = slowest.max(t.elapsed());
                steps.fetch_add(1, Ordering::Release);
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(p.finish().success());
            slowest
        })
    };
    // The witness runs before the first victim starts...
    wait_past(&witness_steps, 0, "witness before the victims");

    let held_at_kill = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..PARALLEL)
        .map(|t| {
            let (sim, held) = (sim.clone(), held_at_kill.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
                for i in 0..VICTIMS / PARALLEL {
                    if victim(&sim, &mut rng, Mode::ALL[(t + i) % 3]) {
                        held.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("victims");
    }
    // ...and completes two more steps after the last one died (one may
    // have begun before): the dead leave nothing it waits on.
    let after = witness_steps.load(Ordering::Acquire);
    wait_past(&witness_steps, after + 1, "witness after the victims");
    stop.store(true, Ordering::Relaxed);
    let slowest = witness.join().expect("witness");
    let held = held_at_kill.load(Ordering::Relaxed);
    let steps = witness_steps.load(Ordering::Relaxed);
    eprintln!(
        "{VICTIMS} killed mid-command, {held} of them holding memory; \
         witness: {steps} steps, slowest {slowest:?}"
    );

    // As the manager would: reclaim the dead, and the books balance at zero.
    drop(reaper);
    let state = sim.state();
    reclaim_released(&sim, &state);
    state.audit().unwrap();
    assert_eq!(state.reserved(0), 0);
    assert!(state.processes(1).is_empty());

    // A new process gets the whole limit, through every client style.
    for mode in Mode::ALL {
        let o = sim.run(
            mode,
            true,
            &["init", "ctx", &format!("alloc {LIMIT}"), "free 0"],
        );
        o.expect_ok();
    }
    assert_eq!(state.reserved(0), 0);
}

/// What a killed process held stays charged, whoever joins next, until the manager
/// (here its stand-in, [`reclaim_released`]) has seen the driver let the process go:
/// only then may another process have it.
#[test]
fn a_killed_processs_quota_returns_only_once_the_driver_lets_it_go() {
    let sim = Sim::new(1, 8 * LIMIT);
    sim.allocate(LIMIT);
    let state = sim.state();
    for mode in Mode::ALL {
        let mut p = Conv::start(sim.probe(mode, true));
        for c in ["init", "ctx", &format!("alloc {LIMIT}")] {
            assert!(p.ask(c, HANG).unwrap().ok);
        }
        assert_eq!(state.reserved(0), LIMIT);
        // SAFETY: signals our own unreaped child.
        unsafe { libc::kill(p.pid() as i32, libc::SIGKILL) };
        p.finish();
        let o = sim.run(mode, true, &["init", "ctx", &format!("alloc {LIMIT}")]);
        assert_eq!(
            o.get("alloc").error.as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "the next process did not wait for the manager"
        );
        assert_eq!(
            state.reserved(0),
            LIMIT,
            "held until the manager reclaims it"
        );
        // (The refused one held nothing, and left its slot as it exited.)
        assert_eq!(reclaim_released(&sim, &state), 1, "the killed one");
        let o = sim.run(mode, true, &["init", "ctx", &format!("alloc {LIMIT}")]);
        o.expect_ok();
        assert_eq!(reclaim_released(&sim, &state), 1);
        assert_eq!(state.reserved(0), 0);
    }
}
