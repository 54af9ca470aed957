//! The compute gate over shared memory: what a process does before it
//! submits work (pass only while its allocation holds the grant), the
//! drainer that reports its work finished once a grant is revoked, and the
//! arbiter's primitive operations on the same words. CUDA-free: the hook
//! says how to synchronise through [`Drain`].
//!
//! # Protocol
//!
//! The arbiter owns each device's grant word
//! ([`DeviceControl::grant`](crate::layout::DeviceControl::grant)): a
//! `GRANTED` or `OPEN` flag and an epoch that grows on every transition.
//!
//! - **Submit.** A process loads the word. If it may submit and the process
//!   already recorded this epoch in its slot (`launch_epoch`), it goes: one
//!   atomic load. The first submission of an epoch stores `launch_epoch`,
//!   fences, and loads the word again; the arbiter stores the word, fences,
//!   then reads `launch_epoch` (a Dekker pair), so either the arbiter sees
//!   the process as having submitted under the epoch it revokes, or the
//!   process sees the revocation and does not submit.
//! - **Wait.** Otherwise the process counts itself in `waiters` (demand), and
//!   sleeps on the grant word with `FUTEX_WAIT`, which works on the
//!   read-only mapping of the control file.
//! - **Drain.** A per-process drainer thread per device sleeps on the
//!   device's `revocations` word, which the arbiter bumps after every
//!   transition that takes the grant away (grants do not wake it). When
//!   the epoch its process last submitted under has ended, it
//!   synchronises what the process submitted ([`Drain`]), stores
//!   `drained_epoch` and rings
//!   [`DeviceState::drain_signal`](crate::layout::DeviceState::drain_signal). The arbiter
//!   moves the grant on only when every live process that submitted under
//!   the revoked epoch has drained (or a bounded wait ends).
//! - **No arbiter, no hang.** A gate that sees the arbiter's heartbeat stand
//!   still for `gate_timeout_ns` (measured on its own clock, so clocks of
//!   different namespaces need not agree; a waiter looks at it every eighth
//!   of the timeout) runs free, says so once through the log callback, and
//!   rejoins as soon as the heartbeat moves again.
//!
//! The handshake's accesses, without the system calls around them, are
//! [`handshake`]'s, generic over the words so that the loom model
//! (`shm/tests/loom_gate.rs`) runs the same code.
//! The arbiter's operations are in `arbiter.rs` (methods of [`crate::Control`] and
//! [`crate::State`]); the process's side, [`Gate`], in `process.rs`; the system calls
//! both make in [`crate::sys`].

use std::sync::atomic::{AtomicU32, Ordering};

use crate::layout::grant;

mod arbiter;
pub mod handshake;
mod process;
#[cfg(test)]
mod tests;

pub use arbiter::Undrained;
pub(crate) use arbiter::forget_waiting;
pub use process::{Drain, Gate, GateEvent, GateLog, YIELD_AFTER_NS};
// The gate's clock and futex, where the arbiter has always found them.
pub use crate::sys::{futex_wait, futex_wake_all, monotonic_ns};

/// The grant word after `old` with `flags`: the next epoch, skipping 0 on
/// wrap-around (0 is what a never-used slot records).
pub fn next_grant_word(old: u32, flags: u32) -> u32 {
    let mask = u32::MAX >> grant::EPOCH_SHIFT;
    let mut epoch = grant::epoch(old).wrapping_add(1) & mask;
    if epoch == 0 {
        epoch = 1;
    }
    (epoch << grant::EPOCH_SHIFT) | (flags & (grant::GRANTED | grant::OPEN))
}

fn saturating_dec(word: &AtomicU32) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}
