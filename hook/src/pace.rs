//! The queue bound: a governed process keeps at most about one kernel of
//! work queued behind the one running on each device, so that a revoked
//! grant drains in at most the running kernel plus a small budget, not the
//! whole queue a framework builds ahead (issue 36: a hand-over drained about
//! 3 ms of queued work with 1 ms kernels, 40 ms with 20 ms kernels).
//!
//! How: the shim records a marker event after every governed launch. Before
//! the next launch it looks at the last two markers:
//!
//! - too many launches not done (the hard bound: two, or as many as fit in
//!   the budget when kernels are short, `1 + budget / length`, at most
//!   [`MAX_IN_FLIGHT`]): wait for the oldest;
//! - the last one not done: a launch is running (or queued). Its end is
//!   predicted from when it could start and the kernel length learned so
//!   far; the launch is held until that end is within `budget` (250 µs),
//!   so the next kernel is queued in time to follow without a gap, and a
//!   revocation finds at most the running kernel and what fits in the
//!   budget.
//!
//! The kernel length is learned from the markers: the time between two
//! consecutive markers, when the second launch was queued behind the first
//! (so the device ran it back to back), is that launch's length plus the
//! device's gap. A moving average (a quarter per sample) follows changes.
//!
//! While a launch is held the process is waiting on its own work, so the
//! wait is marked as a synchronisation for the arbiter (`Gate::syncing`):
//! the holder keeps its grant through it.
//!
//! This module's [`Pace`] is the decision, pure and tested with a fake
//! clock; the CUDA side (events, the wait) is in `gate.rs`.

/// Work the pacer lets queue ahead of the running kernel's end, in ns:
/// enough for the next launch's host time and a thread's wake-up on a
/// loaded machine, so the device never waits for a held launch; small
/// against the 0.5 ms the hand-over may exceed the longest kernel by.
pub const DEFAULT_BUDGET_NS: u64 = 250_000;

/// The most launches the hard bound ever lets be in flight (short kernels).
pub const MAX_IN_FLIGHT: usize = 8;

/// What to do before a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Launch now.
    Go,
    /// Wait for the oldest launch not done, then ask again.
    WaitOlder,
    /// Hold the launch until this time (CLOCK_MONOTONIC ns), then launch.
    HoldUntil(u64),
}

/// One device's pacing state in one process.
#[derive(Debug, Clone)]
pub struct Pace {
    budget_ns: u64,
    /// Learned length of one launch's work (0: not learned yet).
    est_ns: u64,
    /// Predicted end of the last launch's work.
    last_end: u64,
}

impl Pace {
    pub fn new(budget_ns: u64) -> Self {
        Pace {
            budget_ns,
            est_ns: 0,
            last_end: 0,
        }
    }

    /// The learned length of one launch's work, in ns (0 until learned).
    pub fn estimate(&self) -> u64 {
        self.est_ns
    }

    /// The hard bound: launches that may be in flight at once. Two (the
    /// running one and the next) until a length is learned and whenever a
    /// launch is longer than the budget; with short kernels as many as fit
    /// in the budget, so the device is not starved by the host's wake-ups.
    pub fn limit(&self) -> usize {
        if self.est_ns == 0 {
            return 2;
        }
        let fit = self
            .budget_ns
            .div_ceil(self.est_ns)
            .min(MAX_IN_FLIGHT as u64) as usize;
        (1 + fit).clamp(2, MAX_IN_FLIGHT)
    }

    /// Decides about a launch at `now`, given how many of this process's
    /// launches on the device are not done (their markers).
    pub fn before(&self, now: u64, in_flight: usize) -> Step {
        if in_flight >= self.limit() {
            return Step::WaitOlder;
        }
        if in_flight == 0 || self.est_ns == 0 {
            return Step::Go;
        }
        // The running launch is not done: it ends no earlier than now.
        let end = self.last_end.max(now);
        let release = end.saturating_sub(self.budget_ns);
        // Never hold longer than one launch's length: an estimate gone stale
        // (a program whose kernels shrank) must not idle the device for long.
        let release = release.min(now.saturating_add(self.est_ns));
        if release > now {
            Step::HoldUntil(release)
        } else {
            Step::Go
        }
    }

    /// A launch was queued at `now`; `behind` says whether the last launch
    /// was still in flight then (so this one starts when it ends).
    pub fn launched(&mut self, now: u64, behind: bool) {
        let start = if behind { self.last_end.max(now) } else { now };
        self.last_end = start.saturating_add(self.est_ns);
    }

    /// A launch that was queued behind the one before it took `elapsed_ns`
    /// between their markers: one sample of the launch length.
    pub fn learned(&mut self, elapsed_ns: u64) {
        if elapsed_ns == 0 {
            return;
        }
        self.est_ns = if self.est_ns == 0 {
            elapsed_ns
        } else {
            // A quarter of each new sample: follows a change within a few
            // launches, and one odd launch moves it little.
            (self.est_ns * 3 + elapsed_ns) / 4
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn nothing_in_flight_or_nothing_learned_goes() {
        let mut p = Pace::new(DEFAULT_BUDGET_NS);
        assert_eq!(p.before(0, 0), Step::Go);
        // Unknown length: only the hard bound applies.
        assert_eq!(p.before(0, 1), Step::Go);
        assert_eq!(p.before(0, 2), Step::WaitOlder);
        p.learned(MS);
        assert_eq!(p.before(5 * MS, 0), Step::Go);
    }

    #[test]
    fn more_than_one_launch_queued_waits_for_the_older() {
        let mut p = Pace::new(DEFAULT_BUDGET_NS);
        p.learned(MS);
        assert_eq!(p.limit(), 2);
        assert_eq!(p.before(0, 2), Step::WaitOlder);
        // Short kernels: as many as fit in the budget, plus the running one.
        let mut short = Pace::new(250_000);
        short.learned(50_000);
        assert_eq!(short.limit(), 6);
        assert_eq!(short.before(0, 6), Step::WaitOlder);
        let mut tiny = Pace::new(250_000);
        tiny.learned(1_000);
        assert_eq!(tiny.limit(), MAX_IN_FLIGHT);
    }

    #[test]
    fn the_next_launch_is_held_until_the_running_one_is_within_the_budget() {
        let mut p = Pace::new(250_000);
        p.learned(MS);
        // Launched at 10 ms onto an idle device: ends at 11 ms.
        p.launched(10 * MS, false);
        assert_eq!(p.before(10 * MS + 1, 1), Step::HoldUntil(11 * MS - 250_000));
        // Within the budget of its end: go.
        assert_eq!(p.before(11 * MS - 100_000, 1), Step::Go);
        // Queued behind it at 10.8 ms: starts at 11 ms, ends at 12 ms.
        p.launched(10 * MS + 800_000, true);
        assert_eq!(p.before(11 * MS, 1), Step::HoldUntil(12 * MS - 250_000));
    }

    #[test]
    fn what_is_queued_at_any_release_is_at_most_the_budget_beyond_the_running_kernel() {
        // A program that always wants to launch: each launch is released
        // when the previous one has at most the budget left, so at the
        // moment of any release the work in flight ends within one kernel
        // plus the budget.
        for kernel in [50_000u64, MS, 20 * MS] {
            let budget = 250_000;
            let mut p = Pace::new(budget);
            p.learned(kernel);
            let mut now = 0;
            let mut engine_free = 0u64; // the fake device: FIFO, exact lengths
            let mut ends: Vec<u64> = Vec::new();
            for _ in 0..200 {
                let in_flight = ends.iter().filter(|&&e| e > now).count();
                match p.before(now, in_flight) {
                    Step::Go => {
                        let behind = in_flight > 0;
                        p.launched(now, behind);
                        let start = engine_free.max(now);
                        engine_free = start + kernel;
                        ends.push(engine_free);
                        let in_flight = engine_free - now;
                        assert!(
                            in_flight <= kernel + budget,
                            "{kernel}: {in_flight} ns in flight at a release"
                        );
                    }
                    Step::WaitOlder => {
                        now = *ends.iter().find(|&&e| e > now).expect("one in flight")
                    }
                    Step::HoldUntil(t) => {
                        assert!(t > now);
                        now = t;
                    }
                }
                now += 1_000; // the launch's own host time
            }
            // The device was kept busy: no gap between kernels beyond the
            // host time of a launch.
            let busy = ends.len() as u64 * kernel;
            let span = *ends.last().expect("launched") - (ends[0] - kernel);
            assert!(busy * 100 >= span * 99, "{kernel}: busy {busy} of {span}");
        }
    }

    #[test]
    fn the_length_is_learned_and_a_stale_estimate_holds_at_most_one_length() {
        let mut p = Pace::new(250_000);
        p.learned(20 * MS);
        assert_eq!(p.estimate(), 20 * MS);
        p.learned(MS);
        assert_eq!(p.estimate(), (60 * MS + MS) / 4);
        // Whatever the prediction, a hold is never longer than one length.
        p.launched(0, false);
        p.last_end = 100 * MS;
        assert_eq!(p.before(0, 1), Step::HoldUntil(p.estimate()));
    }
}
