//! The pause words of the control file's header (`paused`, the futex word;
//! `paused_since_ns`; `paused_total_ns`), their accesses only, generic over
//! the words ([`Atomic`]) so that `shm/tests/loom_gate.rs` runs this code on
//! loom's atomics. [`crate::Control`] holds its pause lock around each call
//! and wakes the threads waiting on `paused` after a resume: the two
//! accounting words are one value only under that lock (the model, without
//! it, finds a pause counted twice).

use std::sync::atomic::Ordering;

use crate::atomics::Atomic;

/// One allocation's pause words.
#[derive(Debug, Clone, Copy)]
pub struct PauseWords<'a, P, T> {
    /// Non-zero while paused.
    pub paused: &'a P,
    /// When the current pause began (0: not paused).
    pub since_ns: &'a T,
    /// Nanoseconds of the pauses that ended.
    pub total_ns: &'a T,
}

impl<P: Atomic<Value = u32>, T: Atomic<Value = u64>> PauseWords<'_, P, T> {
    /// Pauses at `now_ns`; false if it already was paused.
    pub fn pause(&self, now_ns: u64) -> bool {
        if self.paused.load(Ordering::Acquire) != 0 {
            return false;
        }
        // The start first: a reader that sees the word set sees when.
        self.since_ns.store(now_ns.max(1), Ordering::Release);
        self.paused.store(1, Ordering::Release);
        true
    }

    /// Resumes at `now_ns`, the running pause moved into the total; false if
    /// it was not paused. The caller wakes the waiters on `paused`.
    pub fn resume(&self, now_ns: u64) -> bool {
        if self.paused.load(Ordering::Acquire) == 0 {
            return false;
        }
        let since = self.since_ns.swap(0, Ordering::AcqRel);
        if since != 0 {
            self.total_ns
                .fetch_add(now_ns.saturating_sub(since), Ordering::AcqRel);
        }
        // The total first: a reader that sees the word cleared sees the
        // pause counted.
        self.paused.store(0, Ordering::Release);
        true
    }

    /// Nanoseconds spent paused up to `now_ns`, the current pause included.
    pub fn paused_ns(&self, now_ns: u64) -> u64 {
        let since = self.since_ns.load(Ordering::Acquire);
        let total = self.total_ns.load(Ordering::Acquire);
        if since == 0 {
            total
        } else {
            total + now_ns.saturating_sub(since)
        }
    }
}
