//! Hundreds of processes: 500 joining one allocation, and 500 allocations on one node,
//! each accounted for exactly (one slot per live process, every byte reserved where the
//! driver holds it); what processes SIGKILLed while holding the whole limit were
//! charged goes to the ones that come after once the manager (here one pass of its
//! stand-in) has seen the driver let the dead go. The timings are the bench's
//! (`tessera-bench many`), not asserted here.

mod hook_support;

use std::collections::BTreeSet;
use std::time::Duration;

use hook_support::*;
use tessera_e2e::{Mode, ProbeChild, probe_binary};
use tessera_shm::{ControlSpec, DeviceSpec, LocalLiveness, Policy, State, create_allocation_files};

const N: usize = 500;
const T: Duration = Duration::from_secs(120);

/// Starts `n` probes from `command` and has each run `script`, pipelined: every probe
/// gets its commands before any answer is read, so they all start and join at once.
fn herd(
    n: usize,
    command: impl Fn(usize) -> std::process::Command,
    script: &[&str],
) -> Vec<ProbeChild> {
    let mut probes: Vec<ProbeChild> = (0..n).map(|i| ProbeChild::start(command(i))).collect();
    for p in &mut probes {
        for cmd in script {
            p.send(cmd);
        }
    }
    for (i, p) in probes.iter_mut().enumerate() {
        for cmd in script {
            let l = p.next(T);
            assert!(l.ok, "process {i}, {cmd}: {}", l.raw);
        }
    }
    probes
}

/// One herd at a time: each is 500 processes on the test machine's CPUs.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pids(state: &State) -> BTreeSet<u32> {
    state.processes(1).iter().map(|p| p.identity.pid).collect()
}

#[test]
fn five_hundred_processes_in_one_allocation_are_each_accounted_for() {
    let _one = one_at_a_time();
    // The limit is exactly what the 500 processes take: 1 MiB each.
    let sim = Sim::one_gpu(4 << 30, N as u64 * PAGE);
    // One device page each (the device holds any smaller allocation as a page).
    let alloc = format!("alloc {PAGE}");
    let script = ["init", "ctx", alloc.as_str()];
    let mut probes = herd(N, |_| sim.probe(Mode::Link, true), &script);
    let state = sim.state();
    let live: BTreeSet<u32> = probes.iter().map(ProbeChild::pid).collect();
    assert_eq!(pids(&state), live, "one slot per live process");
    assert_eq!(state.reserved(0), N as u64 * PAGE);
    assert_eq!(
        sim.used(0),
        N as u64 * PAGE,
        "the driver holds what is reserved"
    );
    // Full: one more byte is refused.
    let over = probes[0].cmd("alloc 1", T);
    assert!(!over.ok, "{}", over.raw);

    // Half are SIGKILLed holding their share of the full limit; once the manager has
    // seen the driver let them go and returned their quota, 250 newcomers each get
    // 1 MiB of it.
    let killed: Vec<ProbeChild> = probes.drain(..N / 2).collect();
    for mut p in killed {
        p.kill();
    }
    assert_eq!(
        state.reserved(0),
        N as u64 * PAGE,
        "the dead's quota is still charged"
    );
    assert_eq!(reclaim_released(&sim, &state), N / 2);
    let newcomers = herd(N / 2, |_| sim.probe(Mode::Link, true), &script);
    probes.extend(newcomers);
    let live: BTreeSet<u32> = probes.iter().map(ProbeChild::pid).collect();
    assert_eq!(live.len(), N);
    assert_eq!(pids(&state), live, "exactly the live processes hold slots");
    assert_eq!(state.reserved(0), N as u64 * PAGE);
    assert_eq!(sim.used(0), N as u64 * PAGE);
    for p in probes {
        assert!(p.finish().success());
    }
    // They exited holding memory: a reaper (the manager's) gets back exactly theirs.
    let back = state.reclaim_dead(&LocalLiveness::thorough(), None);
    assert_eq!(back.len(), N);
    assert!(pids(&state).is_empty(), "{:?}", pids(&state));
    assert_eq!(state.reserved(0), 0);
}

#[test]
fn five_hundred_allocations_on_one_node_are_each_accounted_for() {
    let _one = one_at_a_time();
    let sim = Sim::new(1, 4 << 30);
    let uuid = sim.uuid(0);
    let root = sim.node.dir.path().join("allocs");
    let ids: Vec<String> = (0..N).map(|i| format!("many-{i}")).collect();
    for id in &ids {
        let spec = ControlSpec::new(
            id.clone(),
            vec![DeviceSpec {
                uuid: uuid.clone(),
                memory_limit_bytes: 2 * PAGE,
                compute_share_ppm: 1_000_000,
                policy: Policy::Burst,
            }],
        );
        let mut spec = spec;
        spec.context_overhead_bytes = 0;
        create_allocation_files(&root.join(id), &spec).expect("allocation files");
    }
    // One device page each (the device holds any smaller allocation as a page).
    let alloc = format!("alloc {PAGE}");
    let probes = herd(
        N,
        |i| {
            let mut c = sim.node.command(probe_binary(Mode::Link));
            c.env("LD_PRELOAD", hook_lib())
                .env("TESSERA_CONTROL", root.join(&ids[i]).join("control"))
                .env("TESSERA_STATE", root.join(&ids[i]).join("state"))
                .env_remove("TESSERA_LOG");
            c
        },
        &["init", "ctx", alloc.as_str()],
    );
    for (p, id) in probes.iter().zip(&ids) {
        let state = State::open(&root.join(id).join("state"), id).expect("state");
        assert_eq!(pids(&state), BTreeSet::from([p.pid()]), "{id}");
        assert_eq!(state.reserved(0), PAGE, "{id}");
    }
    assert_eq!(sim.used(0), N as u64 * PAGE);
    for p in probes {
        assert!(p.finish().success());
    }
    sim.node.node().reap_dead();
    assert_eq!(sim.used(0), 0);
}
