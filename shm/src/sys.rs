//! The one syscall layer of the compute gate and the arbiter: the monotonic
//! clock, futex wait and wake on shared words, and timer slack. Everything
//! else in Tessera that sleeps on a shared word or reads the gate's clock
//! goes through here (the manager's arbiter included).
//!
//! [`Sys`] is the seam: [`Linux`] is the real one; tests inject a recording
//! double (see `gate/tests.rs`) to drive the gate's timing without a clock
//! or a scheduler. The gate's hot path makes no system call, so it does not
//! go through the trait at all: only waits, wake-ups and time do.
//!
//! nix provides the clock and `prctl`; it has no futex, so that one is raw
//! `libc::syscall`, in this file only.

use std::sync::atomic::AtomicU32;

use nix::time::{ClockId, clock_gettime};

/// The system calls the gate makes off its hot path.
pub trait Sys: Send + Sync + 'static {
    /// `CLOCK_MONOTONIC` in nanoseconds: the clock of heartbeats and waits.
    fn monotonic_ns(&self) -> u64;
    /// Sleeps while `word` holds `expected`, at most `timeout_ns`. Returns
    /// early on a wake-up, a signal, or when the word already differs.
    fn futex_wait(&self, word: &AtomicU32, expected: u32, timeout_ns: u64);
    /// Wakes every thread, in any process, sleeping on `word`.
    fn futex_wake_all(&self, word: &AtomicU32);
    /// Asks for sleeps of the calling thread precise to `ns`.
    fn set_timer_slack(&self, ns: u64);
}

/// The real system calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

impl Sys for Linux {
    fn monotonic_ns(&self) -> u64 {
        monotonic_ns()
    }
    fn futex_wait(&self, word: &AtomicU32, expected: u32, timeout_ns: u64) {
        futex_wait(word, expected, timeout_ns)
    }
    fn futex_wake_all(&self, word: &AtomicU32) {
        futex_wake_all(word)
    }
    fn set_timer_slack(&self, ns: u64) {
        set_timer_slack(ns)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of heartbeats and waits.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC exists on every Linux: the call cannot fail; 0 (never)
    // is the answer if it somehow did.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|ts| {
            (ts.tv_sec() as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(ts.tv_nsec() as u64)
        })
        .unwrap_or(0)
}

/// Sleeps while `word` holds `expected`, at most `timeout_ns`. Returns early
/// on a wake-up, a signal, or when the word already differs. Works across
/// processes on a shared file mapping, read-only or not.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte aligned u32 for the whole call;
    // FUTEX_WAIT (shared, not PRIVATE: other processes wake it) only reads
    // it, and `ts` outlives the call. Errors (EAGAIN: value differs, EINTR,
    // ETIMEDOUT) all mean "look again", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread, in any process, sleeping on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE neither reads nor
    // writes it, it only looks up sleepers keyed by its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Asks for sleeps of the calling thread precise to `ns` (the default 50 µs
/// of timer slack shows as idle time in short, exactly timed waits).
/// Affects only the calling thread; failure leaves the default slack.
pub fn set_timer_slack(ns: u64) {
    let _ = nix::sys::prctl::set_timerslack(ns as libc::c_ulong);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    #[test]
    fn the_clock_moves_forward() {
        let a = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = monotonic_ns();
        assert!(a > 0 && b >= a + 2_000_000, "{a} then {b}");
    }

    #[test]
    fn a_wait_on_a_changed_word_returns_at_once_and_a_wake_ends_a_wait() {
        let word = AtomicU32::new(5);
        // Not the expected value: no sleep at all (a 10 s timeout would show).
        let t0 = monotonic_ns();
        futex_wait(&word, 4, 10_000_000_000);
        assert!(monotonic_ns() - t0 < 5_000_000_000);
        // A sleeper is woken by the store-then-wake the gate's callers do.
        let word = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let word = Arc::clone(&word);
            std::thread::spawn(move || {
                while word.load(Ordering::Acquire) == 0 {
                    futex_wait(&word, 0, 60_000_000_000);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        word.store(1, Ordering::Release);
        futex_wake_all(&word);
        // Would hang for a minute if the wake were lost.
        sleeper.join().unwrap();
    }

    #[test]
    fn a_timed_wait_ends_by_itself() {
        let word = AtomicU32::new(0);
        let t0 = monotonic_ns();
        futex_wait(&word, 0, 20_000_000);
        assert!(monotonic_ns() - t0 >= 20_000_000);
    }
}
