//! The gate's grant/revoke handshake, the accesses only (no system call, no
//! clock), generic over the words ([`Atomic`]): what the process's side
//! ([`super::Gate`]), the drainer and the arbiter's side
//! ([`crate::Control::publish_grant`], [`crate::State::undrained`]) run on
//! the mapped files, and what `shm/tests/loom_gate.rs` runs on loom's
//! atomics. The protocol is described in [`super`]'s module docs; a change of
//! an ordering here changes both.

use std::sync::atomic::Ordering;

use super::next_grant_word;
use crate::atomics::Atomic;
use crate::layout::grant;

/// What a process found at the gate on its way to a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The device is open (not arbitrated): submit.
    Open,
    /// Granted, and this process recorded the grant's epoch in its
    /// `launch_epoch` and saw the word unchanged after the fence: submit
    /// under that epoch. The arbiter, once it revokes the epoch, sees the
    /// record ([`undrained_epoch`]).
    Recorded(u32),
    /// The word moved between the record and the second look: look again.
    Moved,
    /// Not granted: the word as loaded (wait on it, or run free).
    Closed(u32),
}

/// A process's look at the grant word before its first submission of an
/// epoch: records the epoch, fences (SeqCst), loads the word again (the
/// process's half of the Dekker pair; [`publish`] is the arbiter's).
#[inline]
pub fn pass<A: Atomic<Value = u32>>(grant: &A, launch_epoch: &A) -> Pass {
    let w = grant.load(Ordering::Acquire);
    if !grant::may_submit(w) {
        return Pass::Closed(w);
    }
    if w & grant::GRANTED == 0 || w & grant::OPEN != 0 {
        return Pass::Open;
    }
    launch_epoch.store(grant::epoch(w), Ordering::Relaxed);
    A::fence(Ordering::SeqCst);
    if grant.load(Ordering::Relaxed) != w {
        return Pass::Moved;
    }
    Pass::Recorded(grant::epoch(w))
}

/// The arbiter moves the grant word to the next epoch with `flags`
/// (`GRANTED`, `OPEN`, or 0 to revoke): stores it (Release), fences
/// (SeqCst: a `launch_epoch` read after this sees every process that saw
/// the old word), calls `wake` on the word; on a revocation then bumps the
/// drainers' bell, `revocations`, after the word, and calls `wake` on it.
/// Returns the new word.
#[inline]
pub fn publish<A: Atomic<Value = u32>>(
    grant: &A,
    revocations: &A,
    flags: u32,
    mut wake: impl FnMut(&A),
) -> u32 {
    let new = next_grant_word(grant.load(Ordering::Acquire), flags);
    grant.store(new, Ordering::Release);
    A::fence(Ordering::SeqCst);
    wake(grant);
    if flags & grant::GRANTED == 0 {
        // After the word: a drainer reads the bell, then the word.
        revocations.fetch_add(1, Ordering::AcqRel);
        wake(revocations);
    }
    new
}

/// The arbiter's read of one process's slot after [`publish`] moved the
/// word to epoch `current`: the epoch the process submitted under and has
/// not drained, if any.
#[inline]
pub fn undrained_epoch<A: Atomic<Value = u32>>(
    launch_epoch: &A,
    drained_epoch: &A,
    current: u32,
) -> Option<u32> {
    let le = launch_epoch.load(Ordering::Acquire);
    (le != current && le != drained_epoch.load(Ordering::Acquire)).then_some(le)
}

/// What a drainer saw in one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainCheck {
    /// The bell (`revocations`) as read first: the drainer sleeps on this
    /// value, so a revocation after the look wakes it.
    pub bell: u32,
    /// The grant word, read after the bell.
    pub word: u32,
    /// The epoch this process submitted under that is over and not yet
    /// drained: drain it, then [`drained`].
    pub due: Option<u32>,
}

/// The drainer's look: the bell first, then the word, then its process's
/// epochs.
#[inline]
pub fn drain_check<A: Atomic<Value = u32>>(
    revocations: &A,
    grant: &A,
    launch_epoch: &A,
    drained_epoch: &A,
) -> DrainCheck {
    let bell = revocations.load(Ordering::Acquire);
    let word = grant.load(Ordering::Acquire);
    let le = launch_epoch.load(Ordering::Acquire);
    let due =
        (le != grant::epoch(word) && drained_epoch.load(Ordering::Relaxed) != le).then_some(le);
    DrainCheck { bell, word, due }
}

/// The drainer has drained epoch `epoch`: records it (Release: the arbiter's
/// [`undrained_epoch`] that sees it sees the work done) and rings the
/// arbiter's `drain_signal` (the caller wakes it).
#[inline]
pub fn drained<A: Atomic<Value = u32>>(drained_epoch: &A, drain_signal: &A, epoch: u32) {
    drained_epoch.store(epoch, Ordering::Release);
    drain_signal.fetch_add(1, Ordering::AcqRel);
}
