//! A model check (loom) of the compute gate's handshakes and the pause words, every
//! interleaving up to a preemption bound. The bodies are the crate's own code: the
//! handshake's accesses (`tessera_shm::gate::handshake`, what `Gate`, the drainer,
//! `Control::publish_grant` and `State::undrained` run) and the pause words'
//! (`tessera_shm::pause`, what `Control::pause`, `resume` and `paused_ns` run), generic
//! over the words and run here on loom's atomics; only the system calls around them
//! (futex wake-ups) are left out.
//!
//! - **grant/revoke** (the store-fence-load pair of `shm/src/gate/mod.rs`): a process's
//!   first submission of an epoch records `launch_epoch`, fences and loads the grant word
//!   again (`handshake::pass`); the arbiter stores the new word, fences
//!   (`handshake::publish`) and reads `launch_epoch` (`handshake::undrained_epoch`).
//!   Either the arbiter sees the process as having submitted under the epoch it revoked,
//!   and waits for its drain, or the process sees the revocation and does not submit:
//!   never both missed.
//! - **the drain bell**: the arbiter bumps `revocations` after the word; a drainer that
//!   sees the bump (`handshake::drain_check`) sees the word that took the grant away,
//!   and the epoch its process submitted under as due; the drain it then reports
//!   (`handshake::drained`) is seen by the arbiter's next read.
//! - **the pause words**: the paused time a reader sums is counted once and never steps
//!   back while a resume moves the running pause into the total (the manager's
//!   `pause_lock`, a loom mutex here, makes the two words one value: without it this
//!   model finds the double count), and a reader that sees the word cleared (without
//!   the lock, as a process reads it) sees the pause in the total.
//!
//! Run by `.ci/run`:
//! `RUSTFLAGS="--cfg loom" cargo test -p tessera-shm --test loom_gate --release`.
//! Without `--cfg loom` this file is empty.

#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use tessera_shm::gate::handshake::{self, Pass};
use tessera_shm::gate::next_grant_word;
use tessera_shm::layout::grant;
use tessera_shm::pause::PauseWords;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    // The handshakes are a few accesses each: the bound costs nothing here.
    b.preemption_bound = Some(3);
    b
}

/// One device's words of the gate: the grant word and the drainers' bell (control
/// file), one process's `launch_epoch` and `drained_epoch` (its state file slot) and the
/// arbiter's doorbell (`drain_signal`).
struct Device {
    grant: AtomicU32,
    revocations: AtomicU32,
    launch_epoch: AtomicU32,
    drained_epoch: AtomicU32,
    drain_signal: AtomicU32,
}

impl Device {
    fn granted() -> Device {
        Device {
            grant: AtomicU32::new(next_grant_word(0, grant::GRANTED)),
            revocations: AtomicU32::new(0),
            launch_epoch: AtomicU32::new(0),
            drained_epoch: AtomicU32::new(0),
            drain_signal: AtomicU32::new(0),
        }
    }

    /// The epoch the process submitted under, or None when it saw the grant gone (it
    /// would wait, not submit). A moved word is looked at again, as `Gate` does.
    fn submit(&self) -> Option<u32> {
        loop {
            match handshake::pass(&self.grant, &self.launch_epoch) {
                Pass::Recorded(epoch) => return Some(epoch),
                Pass::Moved => continue,
                Pass::Closed(_) => return None,
                Pass::Open => panic!("the model's device is never open"),
            }
        }
    }

    /// The arbiter revokes: the epoch revoked, and the process's undrained epoch as the
    /// arbiter then reads it.
    fn revoke(&self) -> (u32, Option<u32>) {
        let old = self.grant.load(Ordering::Acquire);
        let new = handshake::publish(&self.grant, &self.revocations, 0, |_| {});
        let undrained =
            handshake::undrained_epoch(&self.launch_epoch, &self.drained_epoch, grant::epoch(new));
        (grant::epoch(old), undrained)
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
        let (revoked, undrained) = d.revoke();
        if p.join().unwrap() == Some(revoked) {
            assert_eq!(
                undrained,
                Some(revoked),
                "the process submitted under the revoked epoch and the arbiter missed it"
            );
        }
    });
}

#[test]
fn a_drainer_woken_by_the_bell_sees_the_grant_taken_away() {
    builder().check(|| {
        let d = Arc::new(Device::granted());
        // The process submitted under the first epoch before the revocation.
        let epoch = d.submit().expect("granted");
        let drainer = {
            let d = Arc::clone(&d);
            thread::spawn(move || {
                let check = handshake::drain_check(
                    &d.revocations,
                    &d.grant,
                    &d.launch_epoch,
                    &d.drained_epoch,
                );
                if check.bell > 0 {
                    assert_ne!(
                        grant::epoch(check.word),
                        epoch,
                        "rang, but the old grant is still seen"
                    );
                    assert_eq!(check.word & grant::GRANTED, 0);
                    assert_eq!(check.due, Some(epoch), "rang, but nothing is due");
                }
                if let Some(due) = check.due {
                    handshake::drained(&d.drained_epoch, &d.drain_signal, due);
                }
                check.due
            })
        };
        let (revoked, _) = d.revoke();
        assert_eq!(revoked, epoch);
        let drained = drainer.join().unwrap();
        // The arbiter's look after the doorbell rang: a reported drain is seen.
        if d.drain_signal.load(Ordering::Acquire) > 0 {
            let current = grant::epoch(d.grant.load(Ordering::Acquire));
            assert_eq!(drained, Some(epoch));
            assert_eq!(
                handshake::undrained_epoch(&d.launch_epoch, &d.drained_epoch, current),
                None,
                "the doorbell rang, but the drain is not seen"
            );
        }
    });
}

/// The pause words of the control file's header, and the manager's lock that makes
/// their two accounting words one value (`Control`'s `pause_lock`).
#[derive(Default)]
struct Pause {
    lock: Mutex<()>,
    paused: AtomicU32,
    since_ns: AtomicU64,
    total_ns: AtomicU64,
}

impl Pause {
    fn words(&self) -> PauseWords<'_, AtomicU32, AtomicU64> {
        PauseWords {
            paused: &self.paused,
            since_ns: &self.since_ns,
            total_ns: &self.total_ns,
        }
    }

    /// `Control::pause`.
    fn pause(&self, now: u64) -> bool {
        let _one = self.lock.lock().unwrap();
        self.words().pause(now)
    }

    /// `Control::resume`.
    fn resume(&self, now: u64) -> bool {
        let _one = self.lock.lock().unwrap();
        self.words().resume(now)
    }

    /// `Control::paused_ns`.
    fn paused_ns(&self, now: u64) -> u64 {
        let _one = self.lock.lock().unwrap();
        self.words().paused_ns(now)
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
            })
        };
        // The manager's one writer.
        assert!(p.pause(100));
        assert!(!p.pause(120), "a second pause is refused");
        assert!(p.resume(140));
        assert!(!p.resume(150), "a second resume is refused");
        reader.join().unwrap();
        assert_eq!(p.paused_ns(1000), 40);
    });
}

#[test]
fn a_reader_that_sees_the_word_cleared_sees_the_pause_counted() {
    builder().check(|| {
        let p = Arc::new(Pause::default());
        let reader = {
            let p = Arc::clone(&p);
            // Without the lock, as a process reads the word: seen set, then cleared, the
            // resume that cleared it has counted the pause.
            thread::spawn(move || {
                let before = p.paused.load(Ordering::Acquire);
                let after = p.paused.load(Ordering::Acquire);
                if before != 0 && after == 0 {
                    assert_eq!(
                        p.total_ns.load(Ordering::Acquire),
                        40,
                        "cleared, not counted"
                    );
                }
            })
        };
        assert!(p.pause(100));
        assert!(p.resume(140));
        reader.join().unwrap();
    });
}
