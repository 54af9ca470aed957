//! Reservation and reclaim tests: the limit holds under races, and a
//! process killed at any step of an operation leaves nothing held.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tessera_shm::layout::*;
use tessera_shm::{
    ControlSpec, DeviceSpec, Liveness, LocalLiveness, Member, Policy, ProcIdentity, Refused, State,
    create_allocation_files,
};

const LIMIT: u64 = 1 << 30;

fn setup() -> (tempfile::TempDir, State) {
    let dir = tempfile::tempdir().unwrap();
    let spec = ControlSpec::new(
        "a",
        vec![DeviceSpec {
            uuid: "GPU-0".into(),
            memory_limit_bytes: LIMIT,
            compute_share_ppm: 500_000,
            policy: Policy::Burst,
        }],
    );
    let (_, s) = create_allocation_files(dir.path(), &spec).unwrap();
    let state = State::open(&s, "a").unwrap();
    (dir, state)
}

/// Liveness decided by the test: pids listed as dead are dead, others alive.
#[derive(Default)]
struct Fake(Mutex<HashMap<u32, bool>>);
impl Fake {
    fn kill(&self, pid: u32) {
        self.0.lock().unwrap().insert(pid, false);
    }
}
impl Liveness for Fake {
    fn check(&self, id: &ProcIdentity) -> Option<bool> {
        Some(*self.0.lock().unwrap().get(&id.pid).unwrap_or(&true))
    }
}

fn ident(pid: u32) -> ProcIdentity {
    ProcIdentity {
        pid,
        pidns: 1,
        start_time: 1,
    }
}

#[test]
fn reserve_release_and_limit() {
    let (_d, st) = setup();
    let live = Fake::default();
    let a = st.join(&ident(10), &live).unwrap();
    let b = st.join(&ident(11), &live).unwrap();
    assert_ne!(a.slot, b.slot);
    st.reserve(a, 0, LIMIT / 2, LIMIT).unwrap();
    st.reserve(b, 0, LIMIT / 2, LIMIT).unwrap();
    assert_eq!(st.reserved(0), LIMIT);
    // Not one byte more.
    let e = st.reserve(a, 0, 1, LIMIT).unwrap_err();
    assert_eq!(
        e,
        Refused::OverLimit {
            requested: 1,
            reserved: LIMIT,
            limit: LIMIT
        }
    );
    assert_eq!(st.oom_refused(0), 1);
    // A process cannot release what another holds.
    st.release(b, 0, LIMIT / 2).unwrap();
    assert!(matches!(
        st.release(b, 0, 1),
        Err(Refused::NotHeld { held: 0, .. })
    ));
    assert_eq!(st.slot_usage(a.slot, 0), LIMIT / 2);
    st.audit().unwrap();
    st.leave(a);
    st.leave(b);
    assert_eq!(st.reserved(0), 0);
    assert!(st.processes(1).is_empty());
    st.audit().unwrap();
}

/// A dead process's quota is not the joiner's to return: the driver may
/// still hold that memory (it lists an exited process until it has torn it
/// down), so it stays charged, counted as the dead's, until the manager,
/// which asks the driver, reclaims it.
#[test]
fn a_dead_holders_quota_waits_for_the_manager_not_the_next_joiner() {
    let (_d, st) = setup();
    let live = Fake::default();
    let a = st.join(&ident(20), &live).unwrap();
    st.reserve(a, 0, LIMIT, LIMIT).unwrap();
    live.kill(20);
    let b = st.join(&ident(21), &live).unwrap();
    assert_eq!(st.reserved(0), LIMIT, "still charged after a join");
    assert!(st.reclaim_dead_empty(&live, b).is_empty());
    assert!(st.reserve(b, 0, 1, LIMIT).is_err());
    assert_eq!(st.dead_holding(&live, 0), LIMIT);
    let back = st.reclaim_dead(&live, None);
    assert_eq!(back.len(), 1);
    assert_eq!(st.dead_holding(&live, 0), 0);
    st.reserve(b, 0, LIMIT, LIMIT).unwrap();
    assert_eq!(st.processes(1).len(), 1);
    st.audit().unwrap();
}

/// A process of the allocation frees the slots of dead processes that hold
/// nothing (no quota comes back, so the driver's word is not needed), never
/// one that holds memory.
#[test]
fn a_member_reclaims_only_dead_slots_that_hold_nothing() {
    let (_d, st) = setup();
    let live = Fake::default();
    let holder = st.join(&ident(80), &live).unwrap();
    let _idle = st.join(&ident(81), &live).unwrap();
    st.reserve(holder, 0, 4096, LIMIT).unwrap();
    live.kill(80);
    live.kill(81);
    let me = st.join(&ident(82), &live).unwrap();
    let back = st.reclaim_dead_empty(&live, me);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].identity.pid, 81);
    assert_eq!(st.reserved(0), 4096);
    let pids: Vec<u32> = st.processes(1).iter().map(|p| p.identity.pid).collect();
    assert!(pids.contains(&80) && !pids.contains(&81), "{pids:?}");
    let reaped = st.reclaim_dead(&live, None);
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].identity.pid, 80);
    assert_eq!(st.reserved(0), 0);
    assert_eq!(st.processes(1).len(), 1);
}

/// Simulates a process killed after writing its intent but before the
/// admission CAS: nothing was admitted, so nothing must be charged.
#[test]
fn killed_before_admission_leaves_nothing() {
    let (_d, st) = setup();
    let live = Fake::default();
    let a = st.join(&ident(30), &live).unwrap();
    st.reserve(a, 0, 100, LIMIT).unwrap();
    let sd = &st.slot(a.slot).devices[0];
    let u = Usage::unpack(sd.usage.load(Ordering::Relaxed));
    sd.intent.store(
        Intent {
            delta: 500,
            seq: next_seq(u.seq),
        }
        .pack(),
        Ordering::Relaxed,
    );
    live.kill(30);
    let reclaimed = st.reclaim_dead(&live, None);
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(reclaimed[0].freed[0], 100);
    assert_eq!(st.reserved(0), 0);
    st.audit().unwrap();
}

/// Simulates a process killed between the admission CAS and its slot
/// update: the next operation by anyone finishes it, then reclaim frees it.
#[test]
fn killed_after_admission_is_finished_by_helpers() {
    let (_d, st) = setup();
    let live = Fake::default();
    let a = st.join(&ident(40), &live).unwrap();
    let b = st.join(&ident(41), &live).unwrap();
    let sd = &st.slot(a.slot).devices[0];
    let seq = next_seq(Usage::unpack(sd.usage.load(Ordering::Relaxed)).seq);
    sd.intent
        .store(Intent { delta: 700, seq }.pack(), Ordering::Relaxed);
    st.device(0).reserved.store(
        Reserved {
            bytes: 700,
            pending: Some((a.slot, seq)),
        }
        .pack(),
        Ordering::Relaxed,
    );
    assert!(st.audit().is_err(), "mid-operation state is visible");
    // b's operation must not wait on a's: it helps, then proceeds.
    st.reserve(b, 0, 300, LIMIT).unwrap();
    assert_eq!(st.slot_usage(a.slot, 0), 700);
    assert_eq!(st.reserved(0), 1000);
    st.audit().unwrap();
    // The limit counted a's admitted bytes.
    assert!(st.reserve(b, 0, LIMIT - 999, LIMIT).is_err());
    live.kill(40);
    st.reclaim_dead(&live, None);
    assert_eq!(st.reserved(0), 300);
    st.audit().unwrap();
}

/// Simulates a process killed after updating its slot but before clearing
/// the pending mark: helping must not apply the change twice.
#[test]
fn killed_before_clearing_pending_is_not_applied_twice() {
    let (_d, st) = setup();
    let live = Fake::default();
    let a = st.join(&ident(50), &live).unwrap();
    let b = st.join(&ident(51), &live).unwrap();
    let sd = &st.slot(a.slot).devices[0];
    let seq = next_seq(Usage::unpack(sd.usage.load(Ordering::Relaxed)).seq);
    sd.intent
        .store(Intent { delta: 64, seq }.pack(), Ordering::Relaxed);
    sd.usage
        .store(Usage { bytes: 64, seq }.pack(), Ordering::Relaxed);
    st.device(0).reserved.store(
        Reserved {
            bytes: 64,
            pending: Some((a.slot, seq)),
        }
        .pack(),
        Ordering::Relaxed,
    );
    st.reserve(b, 0, 1, LIMIT).unwrap();
    assert_eq!(st.slot_usage(a.slot, 0), 64);
    assert_eq!(st.reserved(0), 65);
    st.audit().unwrap();
}

/// A reclaimer that dies mid-reclaim is taken over once it is seen dead;
/// a live one is left alone.
#[test]
fn abandoned_reclaim_is_taken_over() {
    let (_d, st) = setup();
    let live = Fake::default();
    let victim = st.join(&ident(60), &live).unwrap();
    let reclaimer = st.join(&ident(61), &live).unwrap();
    st.reserve(victim, 0, 4096, LIMIT).unwrap();
    // The reclaimer claimed the victim's slot, then stalled.
    st.slot(victim.slot).owner.store(
        Owner::Reclaiming {
            generation: victim.generation,
            by: reclaimer.slot as u32,
            by_gen: gen_low(reclaimer.generation),
        }
        .pack(),
        Ordering::Relaxed,
    );
    live.kill(60);
    assert!(
        st.reclaim_dead(&live, None).is_empty(),
        "claimant still alive"
    );
    assert_eq!(st.reserved(0), 4096);
    live.kill(61);
    let got = st.reclaim_dead(&live, None);
    let mut slots: Vec<_> = got.iter().map(|r| r.slot).collect();
    slots.sort();
    let mut want = vec![victim.slot, reclaimer.slot];
    want.sort();
    assert_eq!(slots, want);
    assert_eq!(st.reserved(0), 0);
    st.audit().unwrap();
}

#[test]
fn slots_run_out_with_a_clear_error() {
    let (_d, st) = setup();
    let live = Fake::default();
    for pid in 0..MAX_SLOTS as u32 {
        st.join(&ident(1000 + pid), &live).unwrap();
    }
    let e = st.join(&ident(5000), &live).unwrap_err();
    assert!(e.to_string().contains("every process slot is taken"), "{e}");
}

/// Threads standing in for processes race reservations against one limit;
/// an observer checks the total never passes it.
#[test]
fn racing_reservations_never_exceed_the_limit() {
    let (_d, st) = setup();
    let st = Arc::new(st);
    let live = Arc::new(Fake::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (st, stop) = (st.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(st.reserved(0));
            }
            max
        })
    };
    let workers: Vec<_> = (0..8u32)
        .map(|t| {
            let (st, live) = (st.clone(), live.clone());
            std::thread::spawn(move || {
                let m = st.join(&ident(100 + t), &*live).unwrap();
                let mut held = Vec::new();
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(t);
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if !x.is_multiple_of(3) || held.is_empty() {
                        let size = 1 + x % (LIMIT / 4);
                        if st.reserve(m, 0, size, LIMIT).is_ok() {
                            held.push(size);
                        }
                    } else {
                        let size = held.swap_remove((x as usize / 3) % held.len());
                        st.release(m, 0, size).unwrap();
                    }
                }
                let total: u64 = held.iter().sum();
                assert_eq!(st.slot_usage(m.slot, 0), total);
                total
            })
        })
        .collect();
    let sum: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let max = observer.join().unwrap();
    assert!(max <= LIMIT, "observed {max} > {LIMIT}");
    assert_eq!(st.reserved(0), sum);
    st.audit().unwrap();
}

/// Real processes (forked) reserving and releasing in a loop are SIGKILLed
/// at arbitrary instructions; afterwards the reaper's reclaim returns every
/// byte and the books balance exactly.
#[test]
fn sigkilled_processes_leave_nothing_held() {
    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::waitpid;
    use nix::unistd::{ForkResult, fork};

    let (_d, st) = setup();
    let mut children = Vec::new();
    for round in 0..4u64 {
        for i in 0..6u64 {
            // SAFETY: the child only runs lock-free atomic operations on the
            // mapping and raw syscalls, never returning into the test
            // harness; it ends by SIGKILL (or _exit).
            match unsafe { fork() }.unwrap() {
                ForkResult::Child => {
                    let me = ProcIdentity::current();
                    let Ok(m) = st.join(&me, &LocalLiveness::quick()) else {
                        // SAFETY: _exit is async-signal-safe.
                        unsafe { libc::_exit(1) }
                    };
                    let mut held = [0u64; 64];
                    let mut n = 0;
                    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (round * 64 + i);
                    loop {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if n < held.len() && (x & 1 == 0 || n == 0) {
                            let size = 1 + x % (1 << 20);
                            if st.reserve(m, 0, size, LIMIT).is_ok() {
                                held[n] = size;
                                n += 1;
                            }
                        } else {
                            n -= 1;
                            let _ = st.release(m, 0, held[n]);
                        }
                    }
                }
                ForkResult::Parent { child } => children.push(child),
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        for c in children.drain(..) {
            kill(c, Signal::SIGKILL).unwrap();
            waitpid(c, None).unwrap();
        }
    }
    // The reaper (no driver holds anything here) reclaims everything the
    // dead held, holding or not.
    st.reclaim_dead(&LocalLiveness::thorough(), None);
    assert_eq!(st.reserved(0), 0);
    st.audit().unwrap();
    let me = st
        .join(&ProcIdentity::current(), &LocalLiveness::quick())
        .unwrap();
    st.reserve(me, 0, LIMIT, LIMIT).unwrap();
    assert_eq!(st.processes(1).len(), 1);
    let _: Member = me;
}

/// Every 2^11 operations the sequence kept in the reserved word wraps; a
/// long single-slot run must keep slot usage and totals exact across it.
#[test]
fn sequence_wrap_keeps_books_exact() {
    let (_d, st) = setup();
    let m = st.join(&ident(7), &Fake::default()).unwrap();
    let mut total = 0;
    for i in 0..5000u64 {
        let size = 1 + i % 977;
        st.reserve(m, 0, size, LIMIT).unwrap();
        total += size;
        if i % 2 == 0 {
            st.release(m, 0, size).unwrap();
            total -= size;
        }
        assert_eq!(st.slot_usage(m.slot, 0), total, "op {i}");
    }
    assert_eq!(st.reserved(0), total);
    st.audit().unwrap();
}

/// A new state file is its whole size, but only its header is written: the
/// slots are a hole (a create costs one page, not half a megabyte), read as
/// zeros, so every slot starts free.
#[test]
fn a_new_state_file_is_sparse_and_every_slot_starts_free() {
    use std::os::unix::fs::MetadataExt;
    let (d, st) = setup();
    let meta = std::fs::metadata(d.path().join("state")).unwrap();
    let size = std::mem::size_of::<StateFile>() as u64;
    assert_eq!(meta.len(), size);
    assert!(
        meta.blocks() * 512 < size / 4,
        "{} bytes allocated for a {size}-byte state file",
        meta.blocks() * 512
    );
    let live = Fake::default();
    for pid in 0..MAX_SLOTS as u32 {
        st.join(&ident(100 + pid), &live).unwrap();
    }
    assert!(
        st.join(&ident(99), &live).is_err(),
        "more slots than MAX_SLOTS"
    );
}
