//! The one syscall layer of the compute gate and the arbiter: the monotonic
//! clock, futex wait and wake on shared words, timer slack, and the
//! scheduler slice of the threads that must wake promptly. Everything
//! else in Tessera that sleeps on a shared word or reads the gate's clock
//! goes through here (the manager's arbiter included).
//!
//! [`Sys`] is the seam: [`Linux`] is the real one; tests inject a recording
//! double (see `gate/tests.rs`) to drive the gate's timing without a clock
//! or a scheduler. The gate's hot path makes no system call, so it does not
//! go through the trait at all: only waits, wake-ups and time do.
//!
//! nix provides the clock and `prctl`; it has no futex nor
//! `sched_setattr`, so those are raw `libc::syscall`, in this file only.

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
    /// Asks the scheduler to run the calling thread soon after it wakes
    /// ([`request_wake_slice`]); test doubles leave their threads alone.
    fn wake_promptly(&self) {}
    /// Raises the calling thread's priority to nice value `nice`
    /// ([`raise_thread_priority`]); test doubles leave their threads alone
    /// and say so.
    fn raise_priority(&self, _nice: i32) -> Priority {
        Priority::Kept
    }
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
    fn wake_promptly(&self) {
        let _ = request_wake_slice(WAKE_SLICE_NS);
    }
    fn raise_priority(&self, nice: i32) -> Priority {
        raise_thread_priority(nice)
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

/// The slice a latency-sensitive thread asks the scheduler for, in ns: the
/// shortest Linux accepts for a `SCHED_OTHER` thread (0.1 ms).
pub const WAKE_SLICE_NS: u64 = 100_000;

/// What [`request_wake_slice`] did to the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeSlice {
    /// Its slice is now the one asked for.
    Set,
    /// Left as it was: its policy is not `SCHED_OTHER` (the program chose
    /// FIFO, RR, BATCH, IDLE or deadline), its slice is already that short,
    /// or the kernel keeps no slice per thread (before Linux 6.12).
    Kept,
    /// The kernel refused (a seccomp filter, say): left as it was.
    Refused,
}

/// `struct sched_attr` as `sched_setattr(2)` takes it (the first version,
/// 48 bytes; the kernel accepts any size it knows).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Asks the scheduler to let the calling thread preempt sooner when it
/// wakes, by a shorter slice (`ns`, at least 0.1 ms): under EEVDF (Linux
/// 6.6+; per-thread slices since 6.12) a woken thread with a shorter slice
/// has an earlier deadline, so it runs within about that slice instead of
/// after the running thread's whole one (about 3 ms on a busy two-core
/// host). The threads that wait for the GPU's work or the arbiter's word
/// are these: a drain reported late is charged to its allocation, and a
/// launch queued late idles the device. Their share of the CPU is
/// unchanged (a slice is not a weight), and so are their policy and nice
/// value; a thread whose policy the program set, or whose slice is
/// already as short, is left alone.
pub fn request_wake_slice(ns: u64) -> WakeSlice {
    let Some(attr) = getattr() else {
        return WakeSlice::Refused;
    };
    // A kernel without per-thread slices reports none (0) for SCHED_OTHER.
    if attr.policy != libc::SCHED_OTHER as u32 || attr.runtime == 0 || attr.runtime <= ns {
        return WakeSlice::Kept;
    }
    let want = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: attr.policy,
        nice: attr.nice,
        runtime: ns,
        ..SchedAttr::default()
    };
    // SAFETY: as above; the kernel only reads `want`.
    let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &want as *const SchedAttr, 0u32) };
    if set == 0 {
        WakeSlice::Set
    } else {
        WakeSlice::Refused
    }
}

/// What [`raise_thread_priority`] did to the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Its nice value is now the one asked for.
    Set,
    /// Left as it was: already at that priority or higher, not a
    /// `SCHED_OTHER` thread, or nothing was asked (0).
    Kept,
    /// The kernel refused (`EPERM`/`EACCES`: raising a priority needs
    /// `CAP_SYS_NICE` or a `RLIMIT_NICE` that allows it): left as it was.
    Refused,
}

/// Raises the calling thread's priority to nice value `nice` (-20..=0), a
/// weight, not a policy: under CPU load the thread is picked about
/// `1.25^-nice` times as often as a nice-0 one, and it still shares the
/// CPU (unlike a real-time policy, a thread that spins by mistake cannot
/// take a CPU from everyone else). Only ever raises it: a thread already
/// at that priority or higher, or whose policy is not `SCHED_OTHER`, is
/// left alone. Linux keeps a nice value per thread, so the process's other
/// threads are not touched.
pub fn raise_thread_priority(nice: i32) -> Priority {
    let nice = nice.clamp(-20, 19);
    let Some(attr) = getattr() else {
        return Priority::Refused;
    };
    if nice >= 0 || attr.policy != libc::SCHED_OTHER as u32 || attr.nice <= nice {
        return Priority::Kept;
    }
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: plain integer arguments; PRIO_PROCESS with a thread id
    // changes that one thread.
    let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if set == 0 {
        Priority::Set
    } else {
        Priority::Refused
    }
}

/// The calling thread's scheduling policy, nice value and slice in ns
/// (0 where the kernel keeps none per thread), as `sched_getattr(2)`
/// reports them; `None` if refused.
pub fn thread_sched() -> Option<(u32, i32, u64)> {
    getattr().map(|a| (a.policy, a.nice, a.runtime))
}

fn getattr() -> Option<SchedAttr> {
    let mut attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        ..SchedAttr::default()
    };
    // SAFETY: `attr` is a live sched_attr of the size it says; pid 0 is the
    // calling thread; the kernel writes at most `size` bytes.
    let got = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0u32,
        )
    };
    (got == 0).then_some(attr)
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

    /// The slice is asked for per thread, and nothing else about the thread
    /// changes: its nice value and policy stay the program's.
    #[test]
    fn a_thread_asks_for_a_short_slice_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            // One step nicer than the runner: lowering one's own priority
            // is allowed to anyone.
            let nicer = (thread_sched().expect("sched_getattr").1 + 1).min(19);
            // SAFETY: gettid has no arguments and cannot fail.
            let tid = unsafe { libc::gettid() };
            // SAFETY: plain integer arguments; PRIO_PROCESS with a tid
            // changes that one thread.
            let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nicer) };
            assert_eq!(set, 0);
            let (policy, nice, before) = thread_sched().expect("sched_getattr");
            assert_eq!((policy, nice), (libc::SCHED_OTHER as u32, nicer));
            let got = request_wake_slice(WAKE_SLICE_NS);
            let (policy, nice, after) = thread_sched().expect("sched_getattr");
            assert_eq!((policy, nice), (libc::SCHED_OTHER as u32, nicer), "{got:?}");
            if before == 0 {
                // No per-thread slices in this kernel: nothing to set.
                assert_eq!((got, after), (WakeSlice::Kept, 0));
            } else {
                assert_eq!(got, WakeSlice::Set, "slice was {before} ns");
                assert_eq!(after, WAKE_SLICE_NS);
                // Asked again: already that short.
                assert_eq!(request_wake_slice(WAKE_SLICE_NS), WakeSlice::Kept);
            }
        })
        .join()
        .unwrap();
        // Another thread's slice is its own.
        let other = std::thread::spawn(|| thread_sched().unwrap().2)
            .join()
            .unwrap();
        assert_ne!(other, WAKE_SLICE_NS);
    }

    /// The arbiter's thread asks for a higher priority: with the privilege
    /// (`CAP_SYS_NICE`, root in CI) it gets it, without it nothing changes;
    /// either way its policy and slice stay, and no other thread moves.
    #[test]
    fn a_thread_raises_its_own_priority_where_allowed_and_no_other() {
        let before_other = std::thread::spawn(|| thread_sched().unwrap().1)
            .join()
            .unwrap();
        std::thread::spawn(|| {
            let (policy, nice, slice) = thread_sched().expect("sched_getattr");
            let got = raise_thread_priority(-5);
            let after = thread_sched().expect("sched_getattr");
            match got {
                Priority::Set => assert_eq!(after, (policy, -5, slice)),
                Priority::Refused => assert_eq!(after, (policy, nice, slice)),
                Priority::Kept => assert!(nice <= -5, "kept at {nice}"),
            }
            // Asked for less than it has: never lowered.
            assert_eq!(raise_thread_priority(0), Priority::Kept);
            assert_eq!(raise_thread_priority(3), Priority::Kept);
            assert_eq!(thread_sched().unwrap(), after);
            if got == Priority::Set {
                assert_eq!(raise_thread_priority(-5), Priority::Kept);
            }
        })
        .join()
        .unwrap();
        let other = std::thread::spawn(|| thread_sched().unwrap().1)
            .join()
            .unwrap();
        assert_eq!(other, before_other);
    }

    /// A program that chose its threads' policy keeps it.
    #[test]
    fn a_thread_whose_policy_the_program_chose_is_left_alone() {
        std::thread::spawn(|| {
            let p = libc::sched_param { sched_priority: 0 };
            // SAFETY: pid 0 is this thread and `p` outlives the call;
            // SCHED_BATCH needs no privilege.
            let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &p) };
            assert_eq!(set, 0);
            let before = thread_sched().unwrap();
            assert_eq!(request_wake_slice(WAKE_SLICE_NS), WakeSlice::Kept);
            assert_eq!(thread_sched().unwrap(), before);
            assert_eq!(before.0, libc::SCHED_BATCH as u32);
        })
        .join()
        .unwrap();
    }
}
