//! The reservation and release protocol of [`crate::state`], written once
//! over the words it reads and writes ([`Words`]), so that the same code
//! runs on the mapped state file and, under `--cfg loom`, on a small model
//! of it whose every interleaving (and every point at which a process can
//! die) the `loom` test explores (`shm/tests/loom.rs`).
//!
//! The protocol itself is described in [`crate::state`]'s module docs; this
//! module holds only its lock-free core: one operation ([`apply`]), helping
//! a pending one ([`help`]), joining a free slot ([`join_slot`]) and taking
//! a slot over to empty and free it ([`take_over`]). Liveness, identities
//! and the gate stay in [`crate::state`].

use std::sync::atomic::Ordering;

use crate::layout::{Intent, MAX_BYTES, Owner, Reserved, Usage, next_gen, next_seq};

/// Why a reservation was not made: the protocol's answer, which
/// [`crate::state`] passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{requested} bytes would exceed the limit: {reserved} of {limit} reserved")]
    OverLimit {
        requested: u64,
        reserved: u64,
        limit: u64,
    },
    #[error("release of {requested} bytes, but the process holds {held}")]
    NotHeld { requested: u64, held: u64 },
    #[error("device index {0} out of range")]
    NoDevice(usize),
    #[error("size {0} out of range")]
    TooLarge(u64),
}

/// A word of the protocol: which one of the state file's atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// A device's packed [`Reserved`] word.
    Reserved { dev: usize },
    /// A slot's packed [`Usage`] on a device.
    Usage { slot: usize, dev: usize },
    /// A slot's packed [`Intent`] on a device.
    Intent { slot: usize, dev: usize },
    /// A slot's packed [`Owner`].
    Owner { slot: usize },
}

/// The 64-bit atomics the protocol works on. The state file implements it
/// over its mapped atomics; the loom model over loom's, with a process
/// death injected before any chosen access.
pub trait Words {
    /// Devices each slot has.
    fn devices(&self) -> usize;
    /// Slots there are.
    fn slots(&self) -> usize;
    fn load(&self, w: Word, order: Ordering) -> u64;
    fn store(&self, w: Word, value: u64, order: Ordering);
    /// Compare-and-swap, ordered [`CAS_SUCCESS`] when it wins and
    /// [`CAS_FAILURE`] when it loses.
    fn compare_exchange(&self, w: Word, current: u64, new: u64) -> Result<u64, u64>;
}

/// The orderings of every compare-and-swap of the protocol: a winner
/// publishes what it wrote and sees what it replaced (`AcqRel`), a loser
/// sees the word it lost to (`Acquire`). One pair, named here, so that the
/// mapped file and the loom model cannot run the protocol under different
/// orderings.
pub const CAS_SUCCESS: Ordering = Ordering::AcqRel;
pub const CAS_FAILURE: Ordering = Ordering::Acquire;

/// One operation of slot `slot` on device `dev`: a reservation (`delta`
/// above 0, refused over `limit` when one is given) or a release.
pub fn apply<W: Words + ?Sized>(
    w: &W,
    slot: usize,
    dev: usize,
    delta: i64,
    limit: Option<u64>,
) -> Result<(), Refused> {
    if dev >= w.devices() {
        return Err(Refused::NoDevice(dev));
    }
    if delta.unsigned_abs() > MAX_BYTES {
        return Err(Refused::TooLarge(delta.unsigned_abs()));
    }
    if delta == 0 {
        return Ok(());
    }
    let reserved = Word::Reserved { dev };
    loop {
        let word = w.load(reserved, Ordering::Acquire);
        let r = Reserved::unpack(word);
        if r.pending.is_some() {
            help(w, dev, r);
            continue;
        }
        let usage = Usage::unpack(w.load(Word::Usage { slot, dev }, Ordering::Acquire));
        let bytes = if delta > 0 {
            let want = r.bytes + delta as u64;
            if let Some(limit) = limit
                && want > limit
            {
                return Err(Refused::OverLimit {
                    requested: delta as u64,
                    reserved: r.bytes,
                    limit,
                });
            }
            if want > MAX_BYTES {
                return Err(Refused::TooLarge(want));
            }
            want
        } else {
            let give = delta.unsigned_abs();
            if usage.bytes < give {
                return Err(Refused::NotHeld {
                    requested: give,
                    held: usage.bytes,
                });
            }
            // The total is at least every slot's usage; saturate rather
            // than wrap should a hand-edited file break that.
            r.bytes.saturating_sub(give)
        };
        let seq = next_seq(usage.seq);
        w.store(
            Word::Intent { slot, dev },
            Intent { delta, seq }.pack(),
            Ordering::Release,
        );
        let next = Reserved {
            bytes,
            pending: Some((slot, seq)),
        };
        if w.compare_exchange(reserved, word, next.pack()).is_ok() {
            help(w, dev, next);
            return Ok(());
        }
    }
}

/// Finishes the pending operation recorded in `r`, read from device
/// `dev`'s reserved word.
pub fn help<W: Words + ?Sized>(w: &W, dev: usize, r: Reserved) {
    let Some((slot, seq_low)) = r.pending else {
        return;
    };
    if slot < w.slots() {
        let intent = Intent::unpack(w.load(Word::Intent { slot, dev }, Ordering::Acquire));
        if Reserved::pending_matches(seq_low, intent.seq) {
            let usage_word = Word::Usage { slot, dev };
            let word = w.load(usage_word, Ordering::Acquire);
            let usage = Usage::unpack(word);
            // The reserved word keeps only the low bits of the pending
            // sequence: a helper that was descheduled while the slot ran
            // through 2^11 operations could otherwise match a later,
            // not-yet-admitted intent. Re-reading the whole word (bytes
            // included) proves the operation is still the pending one.
            let still_pending = w.load(Word::Reserved { dev }, Ordering::Acquire) == r.pack();
            if still_pending && next_seq(usage.seq) == intent.seq {
                let bytes = (usage.bytes as i64 + intent.delta).max(0) as u64;
                let done = Usage {
                    bytes,
                    seq: intent.seq,
                };
                // Losing this race means another helper applied it.
                let _ = w.compare_exchange(usage_word, word, done.pack());
            }
        }
    }
    let cleared = Reserved {
        bytes: r.bytes,
        pending: None,
    };
    let _ = w.compare_exchange(Word::Reserved { dev }, r.pack(), cleared.pack());
}

/// Bytes slot `slot` holds on `dev`.
pub fn usage<W: Words + ?Sized>(w: &W, slot: usize, dev: usize) -> u64 {
    Usage::unpack(w.load(Word::Usage { slot, dev }, Ordering::Acquire)).bytes
}

/// Claims slot `slot` for process `pid` if it is free; the generation it
/// joined at.
pub fn join_slot<W: Words + ?Sized>(w: &W, slot: usize, pid: u32) -> Option<u32> {
    let owner = Word::Owner { slot };
    let word = w.load(owner, Ordering::Acquire);
    let Owner::Free { generation } = Owner::unpack(word) else {
        return None;
    };
    let alive = Owner::Alive { generation, pid }.pack();
    w.compare_exchange(owner, word, alive)
        .is_ok()
        .then_some(generation)
}

/// Takes slot `slot` over from the owner word `seen` (read earlier, and
/// judged by the caller: a dead process, an abandoned claim, or the
/// caller's own slot as it leaves) by compare-and-swapping it to `claim`;
/// whoever wins brings the slot's usage to zero, runs `cleanup` and frees
/// the slot at the next generation. Returns the bytes freed per device, or
/// `None` when another took it first (a slot is emptied exactly once).
pub fn take_over<W: Words + ?Sized>(
    w: &W,
    slot: usize,
    seen: u64,
    claim: Owner,
    cleanup: impl FnOnce(),
) -> Option<Vec<u64>> {
    let owner = Word::Owner { slot };
    w.compare_exchange(owner, seen, claim.pack()).ok()?;
    let freed = empty(w, slot);
    cleanup();
    w.store(
        owner,
        Owner::Free {
            generation: next_gen(claim.generation()),
        }
        .pack(),
        Ordering::Release,
    );
    Some(freed)
}

/// Brings a claimed slot's usage to zero on every device; what was freed.
fn empty<W: Words + ?Sized>(w: &W, slot: usize) -> Vec<u64> {
    let mut freed = vec![0; w.devices()];
    for (dev, f) in freed.iter_mut().enumerate() {
        // Each pass either finishes someone's pending operation or
        // applies ours; the bound only guards against a file broken by
        // hand, where no pass could ever succeed: never spin forever.
        for _ in 0..1_000_000 {
            // Finish whatever this slot (or anyone) left pending first,
            // so the usage read below is final.
            let r = Reserved::unpack(w.load(Word::Reserved { dev }, Ordering::Acquire));
            if r.pending.is_some() {
                help(w, dev, r);
                continue;
            }
            let held = usage(w, slot, dev);
            if held == 0 {
                break;
            }
            if apply(w, slot, dev, -(held as i64), None).is_ok() {
                *f += held;
            }
        }
    }
    freed
}
