//! Two hundred processes SIGKILLed at random moments while they allocate and
//! free: no other process ever waits on them (each step of a witness process
//! running throughout completes promptly), and afterwards the allocation's
//! usage returns to exactly zero and a new process can use the whole limit.

mod hook_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hook_support::*;
use tessera_e2e::Mode;
use tessera_shm::LocalLiveness;

const LIMIT: u64 = 32 * MI;
const VICTIMS: usize = 200;
const PARALLEL: usize = 8;
const HANG: Duration = Duration::from_secs(10);
const KINDS: [&str; 4] = ["plain", "managed", "pitch", "vmm"];

/// Runs one victim: allocates and frees at random until killed.
fn victim(sim: &Sim, rng: &mut Rng, mode: Mode, killed_mid_run: &AtomicU64) {
    let mut p = Conv::start(sim.probe(mode, true));
    let pid = p.pid() as i32;
    let delay = Duration::from_micros(rng.range(500, 40_000));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SAFETY: signals the child this test spawned and has not reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let mut live: Vec<u64> = Vec::new();
    let mut steps = 0;
    for c in ["init", "ctx"] {
        if p.ask(c, HANG).is_err() {
            break;
        }
    }
    loop {
        let r = if live.is_empty() || rng.range(0, 100) < 60 {
            let bytes = rng.range(64 << 10, 6 * MI);
            let kind = *rng.pick(&KINDS);
            p.ask(&format!("alloc {bytes} {kind}"), HANG).map(|l| {
                if l.ok {
                    live.push(l.u64("h"));
                }
            })
        } else {
            let h = live.swap_remove((rng.next() % live.len() as u64) as usize);
            p.ask(&format!("free {h}"), HANG).map(|_| ())
        };
        if r.is_err() {
            break;
        }
        steps += 1;
    }
    if steps > 0 {
        killed_mid_run.fetch_add(1, Ordering::Relaxed);
    }
    killer.join().unwrap();
    let status = p.finish();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[test]
fn killed_processes_leave_nothing_held_and_nobody_waiting() {
    let seed = seed("killed_processes_leave_nothing_held_and_nobody_waiting");
    let sim = Arc::new(Sim::new(1, 8 * LIMIT));
    sim.allocate(LIMIT);

    // A witness allocating and freeing throughout: every step must answer.
    let stop = Arc::new(AtomicBool::new(false));
    let witness = {
        let (sim, stop) = (sim.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut p = Conv::start(sim.probe(Mode::Link, true));
            for c in ["init", "ctx"] {
                assert!(p.ask(c, HANG).unwrap().ok);
            }
            let (mut slowest, mut steps) = (Duration::ZERO, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let l = p.ask("alloc 1048576", HANG).expect("witness alive");
                if l.ok {
                    let h = l.u64("h");
                    assert!(p.ask(&format!("free {h}"), HANG).unwrap().ok);
                }
                slowest = slowest.max(t.elapsed());
                steps += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(p.finish().success());
            (slowest, steps)
        })
    };

    let killed_mid_run = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..PARALLEL)
        .map(|t| {
            let (sim, killed) = (sim.clone(), killed_mid_run.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
                for i in 0..VICTIMS / PARALLEL {
                    victim(&sim, &mut rng, Mode::ALL[(t + i) % 3], &killed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("victims");
    }
    stop.store(true, Ordering::Relaxed);
    let (slowest, steps) = witness.join().expect("witness");
    let killed = killed_mid_run.load(Ordering::Relaxed);
    eprintln!("{killed} of {VICTIMS} killed mid-run; witness: {steps} steps, slowest {slowest:?}");
    assert!(killed > VICTIMS as u64 / 2, "most died mid-run: {killed}");
    assert!(steps > 10);

    // As the manager would: reclaim the dead, and the books balance at zero.
    let state = sim.state();
    state.reclaim_dead(&LocalLiveness::thorough(), None);
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

#[test]
fn a_new_process_reclaims_what_killed_ones_held() {
    // Without the manager: the joiner itself returns the dead's quota.
    let sim = Sim::new(1, 8 * LIMIT);
    sim.allocate(LIMIT);
    for mode in Mode::ALL {
        let mut p = Conv::start(sim.probe(mode, true));
        for c in ["init", "ctx", &format!("alloc {LIMIT}")] {
            assert!(p.ask(c, HANG).unwrap().ok);
        }
        assert_eq!(sim.state().reserved(0), LIMIT);
        // SAFETY: signals our own unreaped child.
        unsafe { libc::kill(p.pid() as i32, libc::SIGKILL) };
        p.finish();
        assert_eq!(sim.state().reserved(0), LIMIT, "held until reclaimed");
        let o = sim.run(mode, true, &["init", "ctx", &format!("alloc {LIMIT}")]);
        o.expect_ok();
    }
}
