//! The exit window: processes of one allocation exit one at a time while the others
//! keep allocating, on a simulated node whose driver goes on listing an exited process,
//! with all it held, until it has torn it down (as NVIDIA's does: docs/simulator.md,
//! "Exited processes"). Here the teardown takes [`TEARDOWN_NS`], far longer than
//! anything else in a round, so every request below is made inside the window by
//! construction (each round checks the driver still lists the exited process before
//! the next request is sent), not by timing.
//!
//! The allocation is full: three processes each hold a context and a third of what is
//! left. In each round the oldest exits (and is reaped at once, as a shell's `wait`
//! would), a survivor asks for what it held, and a newcomer starts and asks for a
//! context and as much. Every answer is followed by a read of the device's ground
//! truth (the simulated driver's count, exited processes included): it never holds
//! more than the limit. Granting either request while the driver still holds the
//! exited process's memory would take the device over by that much; a dead process's
//! charge is released only once the driver no longer lists it (the manager, which
//! holds NVML, is the one that releases it: docs/security.md, "The exit window").
//!
//! Then the manager does release it: each round waits (on the state file, deadline for
//! hangs only) until the exited process's slot is gone, checks the driver had stopped
//! listing it by then, and the survivor and newcomer get what they asked for.

mod manager_support;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use manager_support::*;
use tessera_e2e::{ProbeChild, SimNode};
use tessera_shm::State;

const MI: u64 = 1 << 20;
const PAGE: u64 = 2 * MI;
/// The allocation's limit.
const LIMIT: u64 = 1 << 30;
/// What a context holds on this node (the manager measures it at start-up and writes
/// it into the control file; the shim charges it before the driver makes a context).
const CONTEXT: u64 = 128 * MI;
/// How long the simulated driver takes to tear an exited process down: far longer than
/// a round's requests take, so they all fall inside the window.
const TEARDOWN_NS: u64 = 3_000_000_000;
/// Processes holding the allocation at any time.
const HOLDERS: usize = 3;
const ROUNDS: usize = 3;
/// Deadline for what must happen (an answer, the manager's release): only a hang
/// reaches it.
const HANG: Duration = Duration::from_secs(60);

role_test!();

/// One governed probe that has its context.
fn holder(n: &SimNode, control: &str, state: &str) -> ProbeChild {
    let mut p = governed_probe(n, control, state);
    for c in ["init", "device 0", "ctx"] {
        let l = p.cmd(c, HANG);
        assert!(l.ok, "{c}: {}", l.raw);
    }
    p
}

/// Whether the simulated driver lists `pid`, as exited and still being torn down.
fn listed(n: &SimNode, pid: u32) -> bool {
    n.node().reap_dead();
    n.node().process(pid).is_some_and(|p| p.exiting)
}

/// Whether any slot of the allocation is still `pid`'s.
fn has_slot(state: &State, pid: u32) -> bool {
    state.processes(1).iter().any(|p| p.identity.pid == pid)
}

/// What the checks found: every ground-truth read over the limit, as (what was just
/// answered, bytes the device held).
#[derive(Default)]
struct Over(Vec<(String, u64)>);

impl Over {
    /// Fails with every read over the limit, and by how much.
    fn assert_none(&self) {
        assert!(
            self.0.is_empty(),
            "the device went past the {} MiB limit: {}",
            LIMIT / MI,
            self.0
                .iter()
                .map(|(w, u)| format!("{w}: {} bytes over", u - LIMIT))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }

    /// Reads the device after an answer to `what`; records it when over the limit.
    fn check(&mut self, n: &SimNode, what: String) -> u64 {
        let used = n.node().memory_used(0);
        if used > LIMIT {
            self.0.push((what, used));
        }
        used
    }
}

#[test]
fn processes_exiting_one_at_a_time_never_let_the_others_past_the_limit() {
    let _serial = serial();
    let n = SimNode::builder().devices(1).memory("16Gi").build();
    n.node().set_context_memory(CONTEXT);
    n.node().set_context_teardown(TEARDOWN_NS);
    let m = ManagerProc::on(&n);
    let uuid = n.node().device_info(0).expect("device 0").uuid;
    let a = create(&m.socket, "window", &uuid, LIMIT, 1_000_000);
    let state = State::open(std::path::Path::new(&a.state_path), "window").expect("state");
    let (control, state_path) = (a.control_path.clone(), a.state_path.clone());

    // Fill the allocation: HOLDERS contexts and a share each of what is left, in pages.
    let mut pool: VecDeque<ProbeChild> = (0..HOLDERS)
        .map(|_| holder(&n, &control, &state_path))
        .collect();
    let free = field(&pool[0].cmd("meminfo", HANG).raw, "free")
        .and_then(|v| v.parse::<u64>().ok())
        .expect("meminfo free");
    let share = free / HOLDERS as u64 / PAGE * PAGE;
    assert!(share >= 64 * MI, "a share of {} MiB", share / MI);
    for p in &mut pool {
        let l = p.cmd(&format!("alloc {share}"), HANG);
        assert!(l.ok, "{}", l.raw);
    }
    let full = state.reserved(0);
    assert!(
        full + share > LIMIT,
        "no room for another share: {full} + {share}"
    );

    let mut over = Over::default();
    let (mut peak, mut refused_in_window, mut waited) = (0u64, 0u32, Duration::ZERO);
    for round in 0..ROUNDS {
        let gone = pool.pop_front().expect("a holder");
        let gone_pid = gone.pid();
        assert!(gone.finish().success(), "round {round}: the probe's exit");
        let exited = Instant::now();
        // The window is open: the driver still holds everything the exited one had.
        assert!(
            listed(&n, gone_pid),
            "round {round}: the driver had already torn the exited process down"
        );

        // A survivor asks for what the exited one held.
        let l = pool[0].cmd(&format!("alloc {share}"), HANG);
        peak = peak.max(over.check(&n, format!("round {round}: survivor alloc {share}")));
        let survivor_got = l.ok.then(|| l.u64("h"));
        if !l.ok {
            l.assert_refused("CUDA_ERROR_OUT_OF_MEMORY");
        }
        // A newcomer asks for a context and as much.
        let mut newcomer = governed_probe(&n, &control, &state_path);
        let mut newcomer_has = Vec::new();
        for c in ["init", "device 0", "ctx", &format!("alloc {share}")] {
            let l = newcomer.cmd(c, HANG);
            peak = peak.max(over.check(&n, format!("round {round}: newcomer {c}")));
            if l.ok {
                newcomer_has.push(c.to_owned());
            } else {
                l.assert_refused("CUDA_ERROR_OUT_OF_MEMORY");
                break;
            }
        }
        let still_listed = listed(&n, gone_pid);
        if still_listed && (survivor_got.is_none() || newcomer_has.len() < 4) {
            refused_in_window += 1;
        }
        over.assert_none();

        // The manager releases the exited process's charge, and only once the driver
        // no longer lists it (read the books first: the listing never comes back).
        let released = eventually(HANG, || !has_slot(&state, gone_pid));
        assert!(
            released.is_some(),
            "round {round}: the exited process's charge was never released:\n{}",
            m.log()
        );
        assert!(
            !listed(&n, gone_pid),
            "round {round}: released while the driver still listed the exited process"
        );
        waited += exited.elapsed();

        // Now what was asked for fits: a share the survivor got goes back, and the
        // newcomer gets its context and share.
        if let Some(h) = survivor_got {
            let l = pool[0].cmd(&format!("free {h}"), HANG);
            assert!(l.ok, "{}", l.raw);
        }
        let rest: Vec<String> = ["init", "device 0", "ctx", &format!("alloc {share}")]
            .iter()
            .skip(newcomer_has.len())
            .map(|s| s.to_string())
            .collect();
        for c in &rest {
            let l = newcomer.cmd(c, HANG);
            peak = peak.max(over.check(&n, format!("round {round}: newcomer again {c}")));
            assert!(
                l.ok,
                "round {round}: newcomer after the release, {c}: {}",
                l.raw
            );
        }
        pool.push_back(newcomer);
    }
    for p in pool {
        assert!(p.finish().success());
    }
    eprintln!(
        "exit window: {ROUNDS} rounds, teardown {} ms: device peak {} MiB of {} MiB, \
         {} reads over (worst {} MiB over); {refused_in_window} rounds refused inside the \
         window; release {} ms after each exit on average",
        TEARDOWN_NS / 1_000_000,
        peak / MI,
        LIMIT / MI,
        over.0.len(),
        over.0.iter().map(|(_, u)| u - LIMIT).max().unwrap_or(0) / MI,
        waited.as_millis() / ROUNDS as u128,
    );
    over.assert_none();
    m.stop();
}
