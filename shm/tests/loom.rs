//! A model check of the state file's reservation and release protocol
//! ([`tessera_shm::protocol`], the code the hook and the manager run): loom
//! runs the protocol's own functions over loom's atomics in every
//! interleaving (up to a preemption bound) and, for a process that dies,
//! with its death before each of its atomic accesses in turn.
//!
//! Run by `.ci/run`:
//! `RUSTFLAGS="--cfg loom" cargo test -p tessera-shm --test loom --release`.
//! Without `--cfg loom` this file is empty.

#![cfg(loom)]

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::Ordering;

use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;
use tessera_shm::layout::{Owner, Reserved};
use tessera_shm::protocol::{self, Word, Words};

/// A small state file: `slots` slots of one device.
struct Model {
    slots: usize,
    reserved: AtomicU64,
    usage: Vec<AtomicU64>,
    intent: Vec<AtomicU64>,
    owner: Vec<AtomicU64>,
}

impl Model {
    fn new(slots: usize) -> Model {
        let words = || (0..slots).map(|_| AtomicU64::new(0)).collect();
        Model {
            slots,
            reserved: AtomicU64::new(0),
            usage: words(),
            intent: words(),
            owner: words(),
        }
    }

    fn word(&self, w: Word) -> &AtomicU64 {
        match w {
            Word::Reserved { dev: 0 } => &self.reserved,
            Word::Usage { slot, dev: 0 } => &self.usage[slot],
            Word::Intent { slot, dev: 0 } => &self.intent[slot],
            Word::Owner { slot } => &self.owner[slot],
            w => panic!("no word {w:?} in the model"),
        }
    }

    fn reserved(&self) -> Reserved {
        Reserved::unpack(self.reserved.load(Ordering::SeqCst))
    }
}

/// Payload of the unwind that stands for a process's death.
struct Died;

/// One process's view of the model: it dies (unwinds with [`Died`])
/// before its access number `dies_before`, if given.
struct Proc<'a> {
    model: &'a Model,
    dies_before: Option<usize>,
    accesses: Cell<usize>,
}

impl<'a> Proc<'a> {
    fn new(model: &'a Model) -> Self {
        Self::dying(model, None)
    }

    fn dying(model: &'a Model, dies_before: Option<usize>) -> Self {
        Proc {
            model,
            dies_before,
            accesses: Cell::new(0),
        }
    }

    fn access(&self) {
        let n = self.accesses.get();
        if self.dies_before == Some(n) {
            resume_unwind(Box::new(Died));
        }
        self.accesses.set(n + 1);
    }
}

impl Words for Proc<'_> {
    fn devices(&self) -> usize {
        1
    }

    fn slots(&self) -> usize {
        self.model.slots
    }

    fn load(&self, w: Word, order: Ordering) -> u64 {
        self.access();
        self.model.word(w).load(order)
    }

    fn store(&self, w: Word, value: u64, order: Ordering) {
        self.access();
        self.model.word(w).store(value, order)
    }

    fn compare_exchange(&self, w: Word, current: u64, new: u64) -> Result<u64, u64> {
        self.access();
        self.model.word(w).compare_exchange(
            current,
            new,
            protocol::CAS_SUCCESS,
            protocol::CAS_FAILURE,
        )
    }
}

/// Runs `f` as a process that may die; whether it lived.
fn survive(f: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => true,
        Err(p) if p.is::<Died>() => false,
        Err(p) => resume_unwind(p),
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    // Bugs of this protocol need few preemptions; the bound keeps the
    // check within CI's two minutes.
    b.preemption_bound = Some(3);
    b
}

const LIMIT: u64 = 10;

/// Two reservations race for room for one while a third process releases:
/// at most one is admitted, the total never exceeds the limit, and the
/// total equals what the slots hold.
#[test]
fn concurrent_reservations_never_exceed_the_limit() {
    builder().check(|| {
        let m = Arc::new(Model::new(3));
        protocol::apply(&Proc::new(&m), 2, 0, 4, Some(LIMIT)).unwrap();
        let racers: Vec<_> = (0..2)
            .map(|slot| {
                let m = m.clone();
                loom::thread::spawn(move || {
                    let ok = protocol::apply(&Proc::new(&m), slot, 0, 5, Some(LIMIT)).is_ok();
                    assert!(m.reserved().bytes <= LIMIT);
                    ok
                })
            })
            .collect();
        protocol::apply(&Proc::new(&m), 2, 0, -2, None).unwrap();
        let ok: Vec<bool> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        // 2 + 5 + 5 and 4 + 5 + 5 are both over 10; 4 + 5 is not.
        assert_eq!(ok.iter().filter(|ok| **ok).count(), 1, "{ok:?}");
        let r = m.reserved();
        assert_eq!(r.pending, None);
        let p = Proc::new(&m);
        let held: u64 = (0..3).map(|s| protocol::usage(&p, s, 0)).sum();
        assert_eq!(r.bytes, held, "the total is what the slots hold");
        assert_eq!(held, 2 + 5);
    });
}

/// Accesses of one reservation when no one else is pending: load the
/// total, load the usage, store the intent, swap the total; then helping
/// it: load the intent, the usage and the total, swap the usage, swap the
/// total.
const RESERVE_ACCESSES: usize = 9;

/// A process holding 3 bytes dies at each point of a reservation of 4
/// more, while another process reserves beside it; then the manager and a
/// joining process race to reclaim its slot. Exactly one of them does, it
/// frees exactly what the dead process held (3, or 7 if its reservation
/// was admitted), the totals balance, and the slot is free again.
#[test]
fn a_dead_holders_bytes_are_reclaimed_exactly_once() {
    for dies_before in (0..RESERVE_ACCESSES).map(Some).chain([None]) {
        builder().check(move || {
            let m = Arc::new(Model::new(3));
            let setup = Proc::new(&m);
            let g0 = protocol::join_slot(&setup, 0, 100).unwrap();
            protocol::join_slot(&setup, 1, 101).unwrap();
            protocol::apply(&setup, 0, 0, 3, Some(LIMIT)).unwrap();

            let victim = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    survive(|| {
                        let p = Proc::dying(&m, dies_before);
                        protocol::apply(&p, 0, 0, 4, Some(LIMIT)).unwrap();
                    })
                })
            };
            let neighbour = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    protocol::apply(&Proc::new(&m), 1, 0, 2, Some(LIMIT)).is_ok()
                })
            };
            // A victim whose run took fewer accesses than its death point
            // (another finished its operation for it) lives.
            let lived = victim.join().unwrap();
            assert!(lived || dies_before.is_some());
            let neighbour_ok = neighbour.join().unwrap();
            assert!(neighbour_ok, "3 + 4 + 2 fits in 10");

            // The victim is dead (or, having lived, leaves): two reclaimers.
            let reclaimers: Vec<_> = [MANAGER, 1]
                .into_iter()
                .map(|by| {
                    let m = m.clone();
                    loom::thread::spawn(move || {
                        let p = Proc::new(&m);
                        let seen = p.load(Word::Owner { slot: 0 }, Ordering::Acquire);
                        let Owner::Alive { generation, .. } = Owner::unpack(seen) else {
                            return None;
                        };
                        let claim = Owner::Reclaiming {
                            generation,
                            by,
                            by_gen: 0,
                        };
                        protocol::take_over(&p, 0, seen, claim, || {})
                    })
                })
                .collect();
            let freed: Vec<Vec<u64>> = reclaimers
                .into_iter()
                .filter_map(|t| t.join().unwrap())
                .collect();
            assert_eq!(freed.len(), 1, "reclaimed exactly once: {freed:?}");
            let freed = freed[0][0];
            assert!(freed == 3 || freed == 7, "freed {freed}");
            if lived {
                assert_eq!(freed, 7, "a finished reservation is held");
            }
            let p = Proc::new(&m);
            let r = m.reserved();
            assert_eq!(r.pending, None);
            assert_eq!(protocol::usage(&p, 0, 0), 0);
            assert_eq!(protocol::usage(&p, 1, 0), 2);
            assert_eq!(r.bytes, 2, "only the neighbour's bytes remain");
            let owner = Owner::unpack(p.load(Word::Owner { slot: 0 }, Ordering::Acquire));
            assert_eq!(owner, Owner::Free { generation: g0 + 1 });
        });
    }
}

/// `Owner::Reclaiming::by` of the manager.
const MANAGER: u32 = tessera_shm::layout::MANAGER_RECLAIMER;
