//! A model check (loom) of the compute gate's handshakes and the pause words, every
//! interleaving up to a preemption bound, with the orderings the code uses:
//!
//! - **grant/revoke** (the store-fence-load pair of `shm/src/gate/mod.rs`): a process's
//!   first submission of an epoch stores `launch_epoch` (Relaxed), fences (SeqCst) and loads
//!   the grant word again (`Gate::submit_slow`); the arbiter stores the new word (Release),
//!   fences (SeqCst) and reads `launch_epoch` (`Control::publish_grant`, then
//!   `State::undrained`). Either the arbiter sees the process as having submitted under
//!   the epoch it revoked, and waits for its drain, or the process sees the revocation and
//!   does not submit: never both missed.
//! - **the drain bell**: the arbiter bumps `revocations` after the word; a drainer that
//!   sees the bump sees the word that took the grant away.
//! - **the pause words** (`Control::pause`, `Control::resume`, `Control::paused_ns`): the
//!   paused time a reader sums is counted once and never steps back while a resume moves
//!   the running pause into the total (the manager's `pause_lock` makes the two words one
//!   value: without it this model finds the double count), and a reader that sees the
//!   word cleared sees the pause in the total.
//!
//! Unlike `loom.rs`, which runs `protocol.rs` itself, these bodies restate the code's few
//! accesses over loom's atomics (the gate and the control file are not generic over
//! their words); the grant word's encoding is the crate's own (`next_grant_word`,
//! `layout::grant`). A change to those orderings must change this model with it.
//!
//! Run by `.ci/run`:
//! `RUSTFLAGS="--cfg loom" cargo test -p tessera-shm --test loom_gate --release`.
//! Without `--cfg loom` this file is empty.

#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use loom::sync::{Arc, Mutex};
use loom::thread;
use tessera_shm::gate::next_grant_word;
use tessera_shm::layout::grant;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    // The handshakes are a few accesses each: the bound costs nothing here.
    b.preemption_bound = Some(3);
    b
}

/// One device's words of the gate: the grant word (control file), one process's
/// `launch_epoch` (state file slot) and the device's `revocations` bell.
struct Device {
    grant: AtomicU32,
    launch_epoch: AtomicU32,
    revocations: AtomicU64,
}

impl Device {
    fn granted() -> Device {
        Device {
            grant: AtomicU32::new(next_grant_word(0, grant::GRANTED)),
            launch_epoch: AtomicU32::new(0),
            revocations: AtomicU64::new(0),
        }
    }

    /// `Gate::submit_slow`'s first submission of an epoch: the epoch submitted under,
    /// or None when the process saw the grant gone (it would wait, not submit).
    fn submit(&self) -> Option<u32> {
        let w = self.grant.load(Ordering::Acquire);
        if !grant::may_submit(w) || w & grant::GRANTED == 0 || w & grant::OPEN != 0 {
            return None;
        }
        self.launch_epoch.store(grant::epoch(w), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.grant.load(Ordering::Relaxed) != w {
            return None;
        }
        Some(grant::epoch(w))
    }

    /// `Control::publish_grant` revoking, then `State::undrained`'s read: the epoch
    /// revoked and the process's `launch_epoch` as the arbiter reads it.
    fn revoke(&self) -> (u32, u32) {
        let old = self.grant.load(Ordering::Acquire);
        self.grant.store(next_grant_word(old, 0), Ordering::Release);
        fence(Ordering::SeqCst);
        self.revocations.fetch_add(1, Ordering::AcqRel);
        (grant::epoch(old), self.launch_epoch.load(Ordering::Acquire))
    }
}

#[test]
fn a_submission_under_a_revoked_epoch_is_seen_by_the_arbiter() {
    builder().check(|| {
        let d = Arc::new(Device::granted());
        let p = {
            let d = Arc::clone(&d);
            thread::spawn(move || d.submit())
        };
        let (revoked, seen) = d.revoke();
        if p.join().unwrap() == Some(revoked) {
            assert_eq!(
                seen, revoked,
                "the process submitted under the revoked epoch and the arbiter missed it"
            );
        }
    });
}

#[test]
fn a_drainer_woken_by_the_bell_sees_the_grant_taken_away() {
    builder().check(|| {
        let d = Arc::new(Device::granted());
        let epoch = grant::epoch(d.grant.load(Ordering::SeqCst));
        let drainer = {
            let d = Arc::clone(&d);
            // The drainer's check: the bell first, then the word.
            thread::spawn(move || {
                if d.revocations.load(Ordering::Acquire) > 0 {
                    let w = d.grant.load(Ordering::Acquire);
                    assert_ne!(
                        grant::epoch(w),
                        epoch,
                        "rang, but the old grant is still seen"
                    );
                    assert_eq!(w & grant::GRANTED, 0);
                }
            })
        };
        d.revoke();
        drainer.join().unwrap();
    });
}

/// The pause words of the control file's header, and the manager's lock that makes
/// their two accounting words one value (`Control::pause_lock`).
#[derive(Default)]
struct Pause {
    lock: Mutex<()>,
    paused: AtomicU32,
    since_ns: AtomicU64,
    total_ns: AtomicU64,
}

impl Pause {
    /// `Control::pause`.
    fn pause(&self, now: u64) {
        let _one = self.lock.lock().unwrap();
        if self.paused.load(Ordering::Acquire) != 0 {
            return;
        }
        self.since_ns.store(now.max(1), Ordering::Release);
        self.paused.store(1, Ordering::Release);
    }

    /// `Control::resume`.
    fn resume(&self, now: u64) {
        let _one = self.lock.lock().unwrap();
        if self.paused.load(Ordering::Acquire) == 0 {
            return;
        }
        let since = self.since_ns.swap(0, Ordering::AcqRel);
        if since != 0 {
            self.total_ns
                .fetch_add(now.saturating_sub(since), Ordering::AcqRel);
        }
        self.paused.store(0, Ordering::Release);
    }

    /// `Control::paused_ns`.
    fn paused_ns(&self, now: u64) -> u64 {
        let _one = self.lock.lock().unwrap();
        let since = self.since_ns.load(Ordering::Acquire);
        let total = self.total_ns.load(Ordering::Acquire);
        if since == 0 {
            total
        } else {
            total + now.saturating_sub(since)
        }
    }
}

#[test]
fn paused_time_is_counted_once_and_never_steps_back() {
    builder().check(|| {
        let p = Arc::new(Pause::default());
        let reader = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                // Read at 1000: before the pause 0, during it 900 (since 100), after the
                // resume its 40. A resume caught half-way would show 940 (counted twice)
                // or 0 after 900 (the counter stepping back).
                let first = p.paused_ns(1000);
                let second = p.paused_ns(1000);
                for v in [first, second] {
                    assert!([0, 900, 40].contains(&v), "paused time read as {v}");
                }
                let order = |v: u64| [0, 900, 40].iter().position(|&x| x == v);
                assert!(order(first) <= order(second), "{first} then {second}");
                // Whoever sees the word cleared after the pause sees it counted.
                if p.paused.load(Ordering::Acquire) == 0 && second != 0 {
                    assert_eq!(p.total_ns.load(Ordering::Acquire), 40);
                }
            })
        };
        // The manager's one writer.
        p.pause(100);
        p.resume(140);
        reader.join().unwrap();
        assert_eq!(p.paused_ns(1000), 40);
    });
}
