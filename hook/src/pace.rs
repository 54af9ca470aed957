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
//!   the queue's depth when kernels are short, `1 + depth / length`, at
//!   most [`MAX_IN_FLIGHT`] at the budget's depth): wait for the oldest.
//!   The depth is the budget until the process's thread oversleeps such a
//!   wait (the whole queue ran out before it woke: a loaded host); then it
//!   goes to [`MAX_DEPTH_NS`] at once, and halves back after
//!   [`CALM_NS`] without another. Only where kernels are shorter than the
//!   budget, and the quantum's end still bounds what a revocation finds;
//! - the last one not done: a launch is running (or queued). Its end is
//!   predicted from when it could start and the kernel length learned so
//!   far; the launch is held until that end is within `budget` (250 µs),
//!   so the next kernel is queued in time to follow without a gap, and a
//!   revocation finds at most the running kernel and what fits in the
//!   budget.
//!
//! - the launch would end before the grant's quantum ends (published by the
//!   arbiter, `Gate::grant_until`): it goes at once, up to the hard bound.
//!   The arbiter revokes at the quantum's end (or for idleness, which a
//!   process with work queued is not), so such a launch is in no drain;
//!   holding it would only leave the device idle whenever the held thread
//!   wakes late (by 0.4–3 ms on the loaded 2-core box: a guaranteed 30%
//!   got 23% of the GPU with the grant held 30%);
//! - the grant's quantum ends before the last launch would be done (the
//!   arbiter publishes when the quantum ends, `Gate::grant_until`): a
//!   revocation may come at that end, so the launch is not queued to start
//!   past it. It is held until the quantum's end; then, until the arbiter
//!   renews the grant (a later end) or revokes it (the gate stops the
//!   launch), it is held until the running work is done, looked at again
//!   every [`RECHECK_NS`]. So a revocation finds at most the kernel running
//!   at the quantum's end (and what the budget let queue behind it before
//!   then), never a second long kernel: the hand-over is bounded by the
//!   longest kernel plus the budget. Kernels shorter than the budget may
//!   be queued to end up to the budget past the quantum's end, so the
//!   device runs on while the arbiter and the next holder wake;
//! - a pre-armed grant (the next holder, granted at the revocation while
//!   the revoked work drains) queues short kernels up to the queue's depth
//!   behind that drain (never further than its quantum's end is away),
//!   and nothing behind its first longer one until the arbiter says when
//!   its time started.
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
//! clock; the events and the wait are `pacer.rs`, for either vendor.

use tessera_shm::layout::GRANT_START_PENDING;

/// Work the pacer lets queue ahead of the running kernel's end, in ns:
/// enough for the next launch's host time and a thread's wake-up on a
/// loaded machine, so the device never waits for a held launch; small
/// against the 0.5 ms the hand-over may exceed the longest kernel by.
pub const DEFAULT_BUDGET_NS: u64 = 250_000;

/// The most launches the hard bound lets be in flight (short kernels) at
/// the budget's depth.
pub const MAX_IN_FLIGHT: usize = 8;

/// The deepest a process's queue of short kernels grows while its thread
/// oversleeps its waits (see [`Pace::overslept`]), in ns of work: as deep
/// as the bench's programs queue on a whole GPU (80 launches of 50 µs).
/// On the 2-core box beside four busy processes, the launching thread of a
/// governed 50 µs program woke after its whole 0.3 ms queue had run out
/// about 180 times a second, idling the device 10 % of the time and more.
pub const MAX_DEPTH_NS: u64 = 4_000_000;

/// The most launches the hard bound lets be in flight at any depth, and so
/// the markers a process keeps per device (with the one before the oldest).
pub const MAX_DEEP: usize = 96;

/// A deepened queue halves back towards the budget after this long
/// without an oversleep. Half a second: at 50 ms, a thread that
/// oversleeps less often than that lost its depth between two oversleeps
/// and ran dry at the next; beside four busy processes the 50 µs streaming
/// pairs missed by 0.65–6.00 pp (mean 3.3) in nine 3 s runs against
/// 0.48–2.87 (mean 1.5) alternated with them at 500 ms. A quantum's end
/// bounds what a revocation finds at any depth.
pub const CALM_NS: u64 = 500_000_000;

/// The most launches of an allocation believed queued at once on a device:
/// as many as its processes' hard bounds allow (one process per slot). A
/// count further apart (counts not written, wrapped, or written by a
/// hostile process of the same allocation) is not believed.
pub const MAX_SHARED: u64 = (tessera_shm::layout::MAX_SLOTS * MAX_DEEP) as u64;

/// Past the quantum's end, with the grant neither renewed nor revoked yet,
/// a held launch looks again this often (the arbiter acts within its own
/// wake-up of the end).
pub const RECHECK_NS: u64 = 50_000;

/// A launch predicted to start this little past the quantum's end still
/// goes: the arbiter acts on the end only after its own wake-up, so such a
/// launch is the running kernel when the revocation comes, not a second one
/// behind it. Holding it idled the device from the last kernel's end to the
/// next holder's first whenever kernel boundaries fell just past the end
/// (back-to-back kernels from a grant's start put one there each quantum),
/// and a prediction a little late held the kernel that would have started
/// before it.
pub const START_GRACE_NS: u64 = 100_000;

/// A quantum's end passed this long ago with the grant still held is not
/// believed: the arbiter would have renewed or revoked by now, so the end
/// is stale or on another clock (a time namespace), and only the budget
/// applies.
pub const STALE_AFTER_NS: u64 = 2_000_000;

/// A quantum's end further ahead than the longest quantum the arbiter
/// accepts (10 s) is on another clock: not believed either.
pub const MAX_AHEAD_NS: u64 = 10_000_000_000;

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
    /// How much work short kernels may queue (ns): the budget, or more
    /// while the thread oversleeps its waits ([`Pace::overslept`]).
    depth_ns: u64,
    /// The last oversleep, or the last halving of the depth since.
    calm_since: u64,
}

impl Pace {
    pub fn new(budget_ns: u64) -> Self {
        Pace {
            budget_ns,
            est_ns: 0,
            last_end: 0,
            depth_ns: budget_ns,
            calm_since: 0,
        }
    }

    /// The learned length of one launch's work, in ns (0 until learned).
    pub fn estimate(&self) -> u64 {
        self.est_ns
    }

    /// How far past the quantum's end a launch may be queued to end.
    ///
    /// Kernels shorter than the budget may run up to the budget past the
    /// quantum's end: that much is queued when the revocation comes, so
    /// the device runs on while the arbiter wakes and the next holder's
    /// thread wakes to queue its first kernel behind it. Holding them at
    /// the end left the device idle through both wake-ups (with 50 µs
    /// kernels, more than the kernel itself); the drain is then at most
    /// the budget, within the half millisecond the hand-over may exceed
    /// the longest kernel by, and charged to this holder. Longer kernels
    /// may only start before the end: one running past it is the drain.
    fn tail(&self) -> u64 {
        if self.est_ns <= self.budget_ns {
            self.budget_ns
        } else {
            0
        }
    }

    /// The hard bound: launches that may be in flight at once. Two (the
    /// running one and the next) until a length is learned and whenever a
    /// launch is longer than the budget; with short kernels as many as fit
    /// in the queue's depth, so the device is not starved by the host's
    /// wake-ups.
    pub fn limit(&self) -> usize {
        if self.est_ns == 0 || self.est_ns > self.budget_ns {
            return 2;
        }
        let cap = if self.depth_ns > self.budget_ns {
            MAX_DEEP
        } else {
            MAX_IN_FLIGHT
        };
        let fit = self.depth_ns.div_ceil(self.est_ns).min(cap as u64) as usize;
        (1 + fit).clamp(2, cap)
    }

    /// The process's thread woke from a wait for its oldest launch at `now`
    /// and found nothing of its left in flight: the device ran out of its
    /// work while the thread waited for a CPU. The queue of short kernels
    /// goes to [`MAX_DEPTH_NS`] at once.
    ///
    /// Beside four busy processes on the 2-core box, a governed program of
    /// 50 µs kernels kept 0.3 ms queued and its thread woke after it had run
    /// out (by 0.5 ms on average, a few ms at worst) about 180 times a
    /// second: the device idled 10–25 % of the grant the program was
    /// charged for, while the same program on a whole GPU, 4 ms queued,
    /// kept it 96–98 % busy. A fixed deeper queue was tried (eighteenth
    /// session) and not kept, for the idle box's hand-overs; deepened only
    /// while the host is seen to be late, the idle box keeps the budget.
    /// Doubling from the budget at each oversleep (the rule before the
    /// twenty-first session) left the queue at 1–2 ms most of the time
    /// there, with the depth halving back between oversleeps, and the
    /// thread, taken off its CPU while it ran, found it empty: at once to
    /// the deepest, the 50 µs streaming pairs missed by 0.82–1.89 pp in six
    /// 3 s runs, against 0.08–2.98 alternated with them.
    /// The quantum's end still bounds what a revocation finds (a launch is
    /// queued only to end within the budget past it), and the arbiter,
    /// told where the queue ends (`Gate::queued_until`), does not take the
    /// grant for idleness while it runs.
    pub fn overslept(&mut self, now: u64) {
        self.depth_ns = MAX_DEPTH_NS.max(self.budget_ns);
        self.calm_since = now;
    }

    /// At `now`, before a launch: a queue deepened by [`Pace::overslept`]
    /// halves back towards the budget once [`CALM_NS`] passed without an
    /// oversleep (or since the last halving).
    pub fn calm(&mut self, now: u64) {
        if self.depth_ns > self.budget_ns && now.saturating_sub(self.calm_since) >= CALM_NS {
            self.depth_ns = (self.depth_ns / 2).max(self.budget_ns);
            self.calm_since = now;
        }
    }

    /// How deep short kernels may queue now (ns of work).
    pub fn depth(&self) -> u64 {
        self.depth_ns
    }

    /// Where the work this process queued is predicted to end (0: nothing
    /// learned or queued yet).
    pub fn queue_end(&self) -> u64 {
        self.last_end
    }

    /// Decides about a launch at `now`, given how many of this process's
    /// launches on the device are not done (their markers), when the
    /// grant's quantum ends and when its time started (`None`: unknown, or
    /// no grant held; a start of [`GRANT_START_PENDING`]: a pre-armed grant
    /// still behind another holder's drain). For a process alone in its
    /// allocation; [`Pace::before_shared`] with the allocation's queue.
    pub fn before(
        &self,
        now: u64,
        in_flight: usize,
        quantum_end: Option<u64>,
        grant_start: Option<u64>,
    ) -> Step {
        self.before_shared(now, in_flight, quantum_end, grant_start, 0)
    }

    /// [`Pace::before`], knowing where the work the allocation's other
    /// processes queued on the device ends (`queue_end`, as far as their
    /// launches not seen done say, see `Pacer::before`; 0: none known).
    /// The device runs every process's work in one queue, so a launch
    /// queued now starts after the others' work too, and a revocation at
    /// the quantum's end drains all of it: with two processes each keeping
    /// one kernel behind its running one, a hand-over drained up to three
    /// kernels (issue 36, p99 3.0 ms with 1 ms kernels). The others' work
    /// counts only where the quantum's end is concerned, never for the
    /// budget's hold: that end is an estimate from counts, and holding on
    /// it would idle the device between the processes' work wherever it
    /// runs ahead.
    pub fn before_shared(
        &self,
        now: u64,
        in_flight: usize,
        quantum_end: Option<u64>,
        grant_start: Option<u64>,
        queue_end: u64,
    ) -> Step {
        if in_flight >= self.limit() {
            return Step::WaitOlder;
        }
        let quantum_end = quantum_end.filter(|&q| {
            q <= now.saturating_add(MAX_AHEAD_NS) && now < q.saturating_add(STALE_AFTER_NS)
        });
        let others = if queue_end > now { queue_end } else { 0 };
        if in_flight == 0 {
            // Nothing of this process's in flight: the launch starts when
            // the others' work ends. Past the quantum's end it would be a
            // second kernel in the drain: held until the end, then until
            // the grant is renewed or revoked (the gate stops it then), or
            // until the others' work is about to end.
            if let Some(q) = quantum_end
                && self.est_ns > 0
                && others.saturating_add(self.est_ns) > q.saturating_add(self.tail())
                && others >= q.saturating_add(START_GRACE_NS)
            {
                if now < q {
                    return Step::HoldUntil(q);
                }
                // (`others` is later than now whenever it is not 0.)
                return Step::HoldUntil(others.min(now.saturating_add(RECHECK_NS)));
            }
            return Step::Go;
        }
        if grant_start == Some(GRANT_START_PENDING) {
            // A pre-armed grant: the launch in flight is queued behind the
            // revoked holder's last kernel, so it starts when that ends,
            // not known here; predicted from now, a second 20 ms kernel
            // went behind it and into the next drain (hand-over p99 30 ms).
            // Short kernels may fill the queue's depth behind it (the
            // budget, or more on a late host), and never more than the
            // quantum's end is away: however late they start, they end
            // that much after the drain, inside this grant's quantum
            // (which starts at the drain's end). One 50 µs kernel alone ran
            // out long before the arbiter had read the drain's report and
            // said when this grant's time started (the device idled about
            // 450 µs per hand-over); beside four busy processes, the
            // budget alone ran out too before the thread woke to that
            // word, while a deepened queue was held back to it.
            let room = quantum_end.map_or(self.depth_ns, |q| {
                self.depth_ns.min(q.saturating_sub(now)).max(self.budget_ns)
            });
            if self.est_ns > 0 && (in_flight as u64 + 1) * self.est_ns <= room {
                return Step::Go;
            }
            // Otherwise nothing more is queued until the arbiter says
            // when this grant's time started; look again shortly.
            return Step::HoldUntil(now.saturating_add(RECHECK_NS));
        }
        if self.est_ns == 0 && quantum_end.is_some() {
            // Under a grant, with no length learned yet, a launch queued
            // behind the running one may end any time after the quantum's
            // end (a program's first kernels: 20 ms ones put 30 ms in the
            // first drain): launch onto an empty queue until the first
            // length is learned.
            return Step::WaitOlder;
        }
        // The last launch is not done: it ends no earlier than now, nor
        // before one length after the grant's time started (every launch
        // in flight was queued under this grant, so started no earlier).
        let mut end = self.last_end.max(now);
        if self.est_ns > 0
            && let Some(s) = grant_start.filter(|&s| s <= now.saturating_add(MAX_AHEAD_NS))
        {
            end = end.max(s.saturating_add(self.est_ns));
        }
        // Where the quantum's end is concerned, the launch starts after the
        // others' work as well.
        let start = end.max(others);
        if self.est_ns > 0
            && let Some(q) = quantum_end
            && start.saturating_add(self.est_ns) <= q.saturating_add(self.tail())
        {
            // Queued now, it would end before the quantum does (or within
            // the short kernels' tail), where the arbiter's revocation
            // comes: it is in no drain beyond that, so it is not held (a
            // hold woken late on a loaded host idles the device the holder
            // is charged for). The hard bound still applies.
            return Step::Go;
        }
        let mut release = if self.est_ns == 0 {
            now
        } else {
            // Never hold longer than one launch's length: an estimate gone
            // stale (a program whose kernels shrank) must not idle the
            // device for long.
            end.saturating_sub(self.budget_ns)
                .min(now.saturating_add(self.est_ns))
        };
        // Queued now, this launch would start when the last one ends: at or
        // past the quantum's end it would be a second kernel in the drain.
        // (With no length learned, `end` is now: past the quantum's end the
        // launch waits for the work in flight.)
        if let Some(q) = quantum_end
            && start >= q.saturating_add(START_GRACE_NS)
        {
            if now < q {
                release = q;
            } else if start > now.saturating_add(RECHECK_NS) {
                // Past the end, neither renewed nor revoked yet: nothing
                // more is queued; look again shortly for the arbiter's word.
                return Step::HoldUntil(now.saturating_add(RECHECK_NS));
            } else {
                // The running work ends soon: launch onto an empty queue.
                return Step::WaitOlder;
            }
        }
        if release > now {
            Step::HoldUntil(release)
        } else {
            Step::Go
        }
    }

    /// Where the allocation's queued work ends, for
    /// [`Pace::before_shared`], when `pending` of its launches on the
    /// device are not seen done and the latest seen done was seen so at
    /// `done_at` (0: no launch pending, no length learned, or a count not
    /// believed). From counts, not from times predicted at each launch:
    /// those fell behind where work was queued that no prediction saw (a
    /// grant's first kernels behind another holder's drain, or behind the
    /// others' work), and the hard bounds then kept the queue that deep for
    /// the whole grant. The launch after the one seen done started about
    /// when it was seen (the process that saw it was waiting for it), and
    /// the pending ones run a length each from there; that is kept between
    /// the running one ending now and a whole length from now, so a late
    /// or stale sighting moves the answer by less than one length.
    pub fn shared_queue_end(&self, now: u64, pending: u64, done_at: u64) -> u64 {
        if self.est_ns == 0 || pending == 0 || pending > MAX_SHARED {
            return 0;
        }
        let least = now.saturating_add((pending - 1).saturating_mul(self.est_ns));
        let most = now.saturating_add(pending.saturating_mul(self.est_ns));
        done_at
            .saturating_add(pending.saturating_mul(self.est_ns))
            .clamp(least, most)
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
        // A quarter of each new sample: follows a change within a few
        // launches, and one odd launch moves it little.
        self.est_ns = tessera_contract::quarter_average(self.est_ns, elapsed_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn nothing_in_flight_or_nothing_learned_goes() {
        let mut p = Pace::new(DEFAULT_BUDGET_NS);
        assert_eq!(p.before(0, 0, None, None), Step::Go);
        // Unknown length: only the hard bound applies.
        assert_eq!(p.before(0, 1, None, None), Step::Go);
        assert_eq!(p.before(0, 2, None, None), Step::WaitOlder);
        p.learned(MS);
        assert_eq!(p.before(5 * MS, 0, None, None), Step::Go);
    }

    #[test]
    fn more_than_one_launch_queued_waits_for_the_older() {
        let mut p = Pace::new(DEFAULT_BUDGET_NS);
        p.learned(MS);
        assert_eq!(p.limit(), 2);
        assert_eq!(p.before(0, 2, None, None), Step::WaitOlder);
        // Short kernels: as many as fit in the budget, plus the running one.
        let mut short = Pace::new(250_000);
        short.learned(50_000);
        assert_eq!(short.limit(), 6);
        assert_eq!(short.before(0, 6, None, None), Step::WaitOlder);
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
        assert_eq!(
            p.before(10 * MS + 1, 1, None, None),
            Step::HoldUntil(11 * MS - 250_000)
        );
        // Within the budget of its end: go.
        assert_eq!(p.before(11 * MS - 100_000, 1, None, None), Step::Go);
        // Queued behind it at 10.8 ms: starts at 11 ms, ends at 12 ms.
        p.launched(10 * MS + 800_000, true);
        assert_eq!(
            p.before(11 * MS, 1, None, None),
            Step::HoldUntil(12 * MS - 250_000)
        );
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
                match p.before(now, in_flight, None, None) {
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
    fn a_launch_that_ends_before_the_quantum_end_is_not_held() {
        let mut p = Pace::new(250_000);
        p.learned(MS);
        p.launched(0, false); // runs 0..1 ms
        // The next would run 1..2 ms, inside a quantum ending at 10 ms: go,
        // where without the end it would be held until 0.75 ms.
        assert_eq!(p.before(1_000, 1, Some(10 * MS), None), Step::Go);
        assert_eq!(
            p.before(1_000, 1, None, None),
            Step::HoldUntil(MS - 250_000)
        );
        // The hard bound still holds.
        assert_eq!(p.before(1_000, 2, Some(10 * MS), None), Step::WaitOlder);
        // One that would end past the quantum's end: the budget rule.
        p.launched(1_000, true); // runs 1..2 ms
        assert_eq!(
            p.before(1_100_000, 1, Some(2_500_000), None),
            Step::HoldUntil(2 * MS - 250_000)
        );
    }

    #[test]
    fn no_launch_is_queued_to_start_past_the_quantum_end() {
        let mut p = Pace::new(250_000);
        p.learned(20 * MS);
        p.launched(0, false); // runs 0..20 ms
        let q = Some(10 * MS);
        // Before the end: held until it, not until 250 µs before 20 ms.
        assert_eq!(p.before(MS, 1, q, None), Step::HoldUntil(10 * MS));
        // Past it, neither renewed nor revoked: held in short looks.
        assert_eq!(
            p.before(10 * MS + 1, 1, q, None),
            Step::HoldUntil(10 * MS + 1 + RECHECK_NS)
        );
        // The running kernel about to end: launch onto an empty queue.
        assert_eq!(
            p.before(
                20 * MS - 10_000,
                1,
                Some(20 * MS - START_GRACE_NS - 50_000),
                None
            ),
            Step::WaitOlder
        );
        // Within the grace past the end, the launch goes: it would start
        // before the arbiter acts on the end, as the running kernel.
        assert_eq!(
            p.before(20 * MS - 10_000, 1, Some(20 * MS - 50_000), None),
            Step::Go
        );
        // Renewed (a later end): the budget rule again.
        assert_eq!(
            p.before(11 * MS, 1, Some(30 * MS), None),
            Step::HoldUntil(20 * MS - 250_000)
        );
        // An end long past, or too far ahead, is another clock: ignored.
        assert_eq!(
            p.before(15 * MS, 1, Some(12 * MS), None),
            Step::HoldUntil(20 * MS - 250_000)
        );
        assert_eq!(
            p.before(15 * MS, 1, Some(15 * MS + MAX_AHEAD_NS + 1), None),
            Step::HoldUntil(20 * MS - 250_000)
        );
        // Nothing in flight: a launch past the end goes (it is then the
        // only kernel a revocation finds).
        assert_eq!(p.before(25 * MS, 0, Some(21 * MS), None), Step::Go);
        // No length learned yet: under a grant, nothing queues behind the
        // running launch; with no grant's end known, the hard bound alone.
        let fresh = Pace::new(250_000);
        assert_eq!(fresh.before(0, 1, Some(10 * MS), None), Step::WaitOlder);
        assert_eq!(fresh.before(0, 0, Some(10 * MS), None), Step::Go);
        assert_eq!(fresh.before(0, 1, None, None), Step::Go);
    }

    /// The work in flight at each of the fake arbiter's acts (`late` after
    /// every quantum end, up to `until`), from the launches made (queued
    /// at, ends): how long the last launch queued before the act runs on.
    fn left_at_acts(launches: &[(u64, u64)], quantum: u64, late: u64, until: u64) -> Vec<u64> {
        (1..)
            .map(|k| k * quantum + late)
            .take_while(|&r| r < until)
            .map(|r| {
                let last = launches
                    .iter()
                    .filter(|(at, _)| *at < r)
                    .map(|(_, e)| *e)
                    .max()
                    .unwrap_or(0);
                last.saturating_sub(r)
            })
            .collect()
    }

    /// A program that always wants to launch, on a fake FIFO device, under
    /// a fake arbiter whose quantum ends every 10 ms and which acts `late`
    /// after each end (renewing the grant, so the program runs on; each
    /// act is where a revocation could have come). Returns, per act, the
    /// work in flight then, and the device's busy fraction (ppm).
    fn run_with_quantum(kernel: u64, budget: u64, ends_known: bool) -> (Vec<u64>, u64) {
        let (acts, busy, _) = run_woken_late(kernel, budget, ends_known, 0, true);
        (acts, busy)
    }

    /// [`run_with_quantum`], the program's thread waking `wake_late` after
    /// the oldest launch it waits for ends (a loaded host), and telling its
    /// pace when the whole queue ran out meanwhile, as the pacer does; also
    /// returns the most launches in flight at once. `deepen`: false keeps
    /// the budget's depth (the rule before).
    fn run_woken_late(
        kernel: u64,
        budget: u64,
        ends_known: bool,
        wake_late: u64,
        deepen: bool,
    ) -> (Vec<u64>, u64, usize) {
        let quantum = 10 * MS;
        let late = 30_000;
        let mut p = Pace::new(budget);
        p.learned(kernel);
        let mut most = 0;
        let mut now = 0u64;
        let mut engine_free = 0u64;
        let mut ends: Vec<u64> = Vec::new();
        let mut launches: Vec<(u64, u64)> = Vec::new(); // (queued at, ends)
        let mut q = quantum;
        let horizon = 200 * MS;
        while now < horizon {
            // The arbiter renews `late` after the end.
            while now >= q + late {
                q += quantum;
            }
            let in_flight = ends.iter().filter(|&&e| e > now).count();
            most = most.max(in_flight);
            p.calm(now);
            match p.before(now, in_flight, ends_known.then_some(q), None) {
                Step::Go => {
                    p.launched(now, in_flight > 0);
                    let start = engine_free.max(now);
                    engine_free = start + kernel;
                    ends.push(engine_free);
                    launches.push((now, engine_free));
                }
                Step::WaitOlder => {
                    now = *ends.iter().find(|&&e| e > now).expect("one in flight") + wake_late;
                    if deepen && ends.iter().all(|&e| e <= now) {
                        p.overslept(now);
                    }
                }
                Step::HoldUntil(t) => {
                    assert!(t > now);
                    now = t;
                }
            }
            now += 1_000; // the launch's host time
        }
        let acts = left_at_acts(&launches, quantum, late, horizon - 2 * kernel);
        let busy = ends.len() as u64 * kernel;
        let span = ends.last().copied().unwrap_or(1);
        (acts, busy * 1_000_000 / span, most)
    }

    /// A thread that wakes 1 ms after the oldest of its short kernels ends
    /// (the loaded box's late wake-ups) starves the device at the budget's
    /// depth; the queue deepens as it oversleeps and the device stays busy,
    /// yet every quantum end still finds at most the budget in flight.
    /// Longer kernels never queue deeper. On time, nothing deepens.
    #[test]
    fn a_thread_that_oversleeps_deepens_its_queue_but_not_past_a_quantum_end() {
        let kernel = 50_000;
        let (_, on_time, most) = run_woken_late(kernel, 250_000, true, 0, true);
        assert!(on_time >= 970_000, "on time: busy {on_time} ppm");
        assert!(most <= MAX_IN_FLIGHT, "on time, {most} in flight");
        let (acts, busy, most) = run_woken_late(kernel, 250_000, true, MS, true);
        assert!(busy >= 900_000, "woken late: busy {busy} ppm");
        assert!(
            most > MAX_IN_FLIGHT,
            "{most} in flight at most: the queue did not deepen"
        );
        for (i, left) in acts.iter().enumerate() {
            assert!(*left <= 250_000, "{left} ns in flight at quantum end {i}");
        }
        // At the budget's depth, the same late thread idles the device.
        let (_, starved, _) = run_woken_late(kernel, 250_000, true, MS, false);
        assert!(starved < 500_000, "the test can fail: busy {starved} ppm");
        // 1 ms kernels: two in flight, however late the thread.
        let (acts, _, most) = run_woken_late(MS, 250_000, true, MS, true);
        assert_eq!(most, 2);
        assert!(acts.iter().all(|&left| left <= MS));
    }

    /// An oversleep deepens the queue of short kernels to
    /// `MAX_DEPTH_NS`; `CALM_NS` without one halves it back, down to the
    /// budget. Kernels longer than the budget keep two in flight.
    #[test]
    fn the_depth_goes_to_the_deepest_at_an_oversleep_and_halves_when_calm() {
        let mut p = Pace::new(250_000);
        p.learned(50_000);
        assert_eq!((p.depth(), p.limit()), (250_000, 6));
        let mut t = 10 * MS;
        for _ in 0..2 {
            p.overslept(t);
            assert_eq!((p.depth(), p.limit()), (4 * MS, 81));
        }
        // Calm only after CALM_NS since the last oversleep, and since each
        // halving.
        p.calm(t + CALM_NS - 1);
        assert_eq!(p.depth(), 4 * MS);
        for depth in [2 * MS, MS, 500_000, 250_000, 250_000] {
            t += CALM_NS;
            p.calm(t);
            assert_eq!(p.depth(), depth);
        }
        assert_eq!(p.limit(), 6);
        let mut long = Pace::new(250_000);
        long.learned(MS);
        long.overslept(0);
        long.overslept(0);
        assert_eq!(long.limit(), 2);
        // Tiny kernels: at most MAX_DEEP in flight.
        let mut tiny = Pace::new(250_000);
        tiny.learned(1_000);
        assert_eq!(tiny.limit(), MAX_IN_FLIGHT);
        tiny.overslept(0);
        assert_eq!(tiny.limit(), MAX_DEEP);
    }

    #[test]
    fn a_revocation_at_any_quantum_end_finds_at_most_the_running_kernel() {
        for kernel in [50_000u64, MS, 20 * MS] {
            let (acts, busy_ppm) = run_with_quantum(kernel, 250_000, true);
            assert!(!acts.is_empty());
            // Kernels shorter than the budget may run up to the budget
            // past the end; a longer one only when it started before it.
            for (i, left) in acts.iter().enumerate() {
                assert!(
                    *left <= kernel.max(250_000),
                    "{kernel} ns kernels: {left} ns in flight at quantum end {i}"
                );
            }
            // Holding at the ends costs the device little: a renewal found
            // late leaves at most the arbiter's delay idle.
            assert!(
                busy_ppm >= 970_000,
                "{kernel} ns kernels: busy {busy_ppm} ppm"
            );
        }
        // Without the ends, a second long kernel is queued at some act
        // (20.1 ms kernels, so that some act falls in a kernel's last
        // 250 µs, when the next one is queued behind it).
        let kernel = 20 * MS + 100_000;
        let (acts, _) = run_with_quantum(kernel, 250_000, false);
        assert!(
            acts.iter().any(|&left| left > kernel),
            "the test can fail: {acts:?}"
        );
    }

    /// Short kernels keep the device busy through the revocation's
    /// signalling: they may be queued to end up to the budget past the
    /// quantum's end (so the next holder's first kernel, queued when its
    /// thread wakes, follows without a gap), never further.
    #[test]
    fn short_kernels_may_run_up_to_the_budget_past_the_quantum_end() {
        let us = 1_000;
        let mut p = Pace::new(250 * us);
        p.learned(50 * us);
        let q = Some(MS);
        // Running until 1 ms, the quantum's end: the next ends at 1.05 ms,
        // inside the tail: go (before, it was held until the end).
        p.launched(950 * us, false);
        assert_eq!(p.before(960 * us, 1, q, None), Step::Go);
        // Queued work ends at 1.2 ms: one more ends at 1.25 ms, the tail's
        // end: go.
        p.last_end = 1_200 * us;
        assert_eq!(p.before(1_100 * us, 3, q, None), Step::Go);
        // Past the tail: nothing more is queued; looked at again shortly.
        p.last_end = 1_210 * us;
        assert_eq!(
            p.before(1_100 * us, 3, q, None),
            Step::HoldUntil(1_100 * us + RECHECK_NS)
        );
        // The test can fail: a 1 ms kernel gets no tail, it may only start
        // before the end (held until it, then looked at again past it).
        let mut long = Pace::new(250 * us);
        long.learned(MS);
        long.launched(9 * MS + START_GRACE_NS, false); // runs to 10 ms + the grace
        let q = Some(10 * MS);
        assert_eq!(
            long.before(9 * MS + START_GRACE_NS + 1, 1, q, None),
            Step::HoldUntil(10 * MS)
        );
        assert_eq!(
            long.before(10 * MS + START_GRACE_NS, 1, Some(10 * MS - 50 * us), None),
            Step::WaitOlder
        );
    }

    /// A pre-armed grant with short kernels fills the queue's depth behind
    /// the revoked holder's drain (one 50 µs kernel ran out long before the
    /// arbiter said when the grant's time started), no further than its
    /// quantum's end is away; longer ones queue nothing behind the first.
    #[test]
    fn a_pre_armed_grant_queues_short_kernels_up_to_the_depth() {
        let pending = Some(GRANT_START_PENDING);
        let mut p = Pace::new(250_000);
        p.learned(50_000);
        let q = Some(20 * MS);
        assert_eq!(p.before(MS, 1, q, pending), Step::Go);
        assert_eq!(p.before(MS, 4, q, pending), Step::Go);
        assert_eq!(
            p.before(MS, 5, q, pending),
            Step::HoldUntil(MS + RECHECK_NS)
        );
        // Deepened (a late host): up to 4 ms behind the drain.
        p.overslept(MS);
        assert_eq!(p.before(MS, 79, q, pending), Step::Go);
        assert_eq!(
            p.before(MS, 80, q, pending),
            Step::HoldUntil(MS + RECHECK_NS)
        );
        // ...and never further than the quantum's end is away.
        assert_eq!(p.before(18 * MS, 39, q, pending), Step::Go);
        assert_eq!(
            p.before(18 * MS, 40, q, pending),
            Step::HoldUntil(18 * MS + RECHECK_NS)
        );
        let mut long = Pace::new(250_000);
        long.learned(200_000);
        assert_eq!(
            long.before(MS, 1, q, pending),
            Step::HoldUntil(MS + RECHECK_NS)
        );
        // Nothing learned: nothing queued behind the first.
        let fresh = Pace::new(250_000);
        assert_eq!(
            fresh.before(MS, 1, q, pending),
            Step::HoldUntil(MS + RECHECK_NS)
        );
    }

    /// Two processes of one allocation, each always wanting to launch
    /// `kernel`-long work, on one fake FIFO device, under the fake arbiter
    /// of [`run_with_quantum`] (quantum 10 ms, renewed 30 µs after each
    /// end). `shared`: their pacers see each other's queue through the
    /// shared end; otherwise each paces alone. Returns the work in flight
    /// at each act and the device's busy fraction (ppm).
    fn run_two_with_quantum(kernel: u64, shared: bool) -> (Vec<u64>, u64) {
        let quantum = 10 * MS;
        let late = 30_000;
        let horizon = 200 * MS;
        let mut paces = [Pace::new(250_000), Pace::new(250_000)];
        for p in &mut paces {
            p.learned(kernel);
        }
        // Each process's own clock (its thread), its launches' ends.
        let mut clocks = [0u64, 7_000];
        let mut own_ends: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let mut engine_free = 0u64;
        let mut launches: Vec<(u64, u64)> = Vec::new();
        let mut busy = 0u64;
        loop {
            let i = usize::from(clocks[1] < clocks[0]);
            let now = clocks[i];
            if now >= horizon {
                break;
            }
            let q = now.saturating_sub(late) / quantum * quantum + quantum;
            let in_flight = own_ends[i].iter().filter(|&&e| e > now).count();
            // Every launch not done, as the pacer counts them (seen done
            // at once here).
            let pending = launches.iter().filter(|(_, e)| *e > now).count() as u64;
            let done_at = launches
                .iter()
                .map(|(_, e)| *e)
                .filter(|&e| e <= now)
                .max()
                .unwrap_or(0);
            let queue_end = if shared {
                paces[i].shared_queue_end(now, pending, done_at)
            } else {
                0
            };
            match paces[i].before_shared(now, in_flight, Some(q), None, queue_end) {
                Step::Go => {
                    paces[i].launched(now, in_flight > 0);
                    let start = engine_free.max(now);
                    engine_free = start + kernel;
                    busy += kernel;
                    own_ends[i].push(engine_free);
                    launches.push((now, engine_free));
                    clocks[i] = now + 1_000; // the launch's host time
                }
                Step::WaitOlder => {
                    clocks[i] = *own_ends[i].iter().find(|&&e| e > now).expect("in flight");
                }
                Step::HoldUntil(t) => {
                    assert!(t > now, "a hold must move time on");
                    clocks[i] = t;
                }
            }
        }
        let acts = left_at_acts(&launches, quantum, late, horizon - 2 * kernel);
        let span = engine_free.max(1);
        (acts, busy * 1_000_000 / span)
    }

    #[test]
    fn two_processes_of_one_allocation_leave_at_most_the_running_kernel_at_a_quantum_end() {
        for kernel in [50_000u64, MS, 20 * MS] {
            let (acts, busy_ppm) = run_two_with_quantum(kernel, true);
            assert!(!acts.is_empty());
            // As for one process: kernels shorter than the budget may run
            // up to the budget past the end, a longer one only when it
            // started before it.
            for (i, left) in acts.iter().enumerate() {
                assert!(
                    *left <= kernel.max(250_000),
                    "{kernel} ns kernels: {left} ns in flight at quantum end {i}"
                );
            }
            assert!(
                busy_ppm >= 970_000,
                "{kernel} ns kernels: busy {busy_ppm} ppm"
            );
        }
        // The test can fail: each pacing alone, a revocation finds the
        // other's kernel queued behind the running one.
        let (acts, _) = run_two_with_quantum(MS, false);
        assert!(
            acts.iter().any(|&left| left > MS),
            "the test can fail: {acts:?}"
        );
    }

    #[test]
    fn the_others_work_holds_a_launch_only_at_the_quantum_end() {
        let mut p = Pace::new(250_000);
        p.learned(MS);
        let q = Some(10 * MS);
        // Nothing pending, or nothing learned: no end.
        assert_eq!(p.shared_queue_end(5 * MS, 0, 4 * MS), 0);
        assert_eq!(Pace::new(250_000).shared_queue_end(5 * MS, 3, 4 * MS), 0);
        // Three launches pending, the first started when the one before was
        // seen done: a length each from there.
        assert_eq!(p.shared_queue_end(5 * MS, 3, 4_600_000), 7_600_000);
        // A stale sighting: at least the running one ending now and the
        // others after it; a sighting just now: at most a length each.
        assert_eq!(p.shared_queue_end(5 * MS, 3, MS), 7 * MS);
        assert_eq!(p.shared_queue_end(5 * MS, 3, 6 * MS), 8 * MS);
        // A count past what the hard bounds allow is not believed.
        assert_eq!(p.shared_queue_end(5 * MS, MAX_SHARED + 1, 4 * MS), 0);
        // Another's work past the quantum's end: held until the end, then
        // until that work is about to end (in short looks).
        assert_eq!(
            p.before_shared(5 * MS, 0, q, None, 12 * MS),
            Step::HoldUntil(10 * MS)
        );
        assert_eq!(
            p.before_shared(10 * MS + 1, 0, q, None, 12 * MS),
            Step::HoldUntil(10 * MS + 1 + RECHECK_NS)
        );
        let late = 10 * MS + START_GRACE_NS;
        assert_eq!(
            p.before_shared(late, 0, q, None, late + 20_000),
            Step::HoldUntil(late + 20_000)
        );
        // Ending within the grace past the end: the launch would start
        // before the arbiter acts on the end, as the running kernel: go.
        assert_eq!(
            p.before_shared(10 * MS + 1, 0, q, None, 10 * MS + 20_000),
            Step::Go
        );
        // Another's work ending before the quantum does: no hold.
        assert_eq!(p.before_shared(5 * MS, 0, q, None, 6 * MS), Step::Go);
        // Never for the budget's hold: with no quantum's end, a launch
        // behind its own running one waits only for its own work.
        p.launched(5 * MS, false);
        assert_eq!(
            p.before_shared(5 * MS, 1, None, None, 9 * MS),
            p.before(5 * MS, 1, None, None)
        );
        // With its own work in flight, one that would start past the end
        // behind the others' work is held; one ending before it goes.
        assert_eq!(
            p.before_shared(8 * MS, 1, q, None, 10 * MS + START_GRACE_NS),
            Step::HoldUntil(10 * MS)
        );
        assert_eq!(p.before_shared(8 * MS, 1, q, None, 0), Step::Go);
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
        assert_eq!(p.before(0, 1, None, None), Step::HoldUntil(p.estimate()));
    }

    /// A pre-armed grant: its first 20 ms kernel is queued behind the
    /// revoked holder's last one, which runs 15 ms more. Until the arbiter
    /// says when the grant's time started, nothing is queued behind it;
    /// then the kernel in flight is known to end one length after that
    /// start, so a second kernel waits for the quantum's end instead of
    /// joining the next drain.
    #[test]
    fn a_pre_armed_grant_queues_nothing_behind_a_kernel_of_unknown_start() {
        let kernel = 20 * MS;
        let mut p = Pace::new(250_000);
        p.learned(kernel);
        let g = 100 * MS;
        // Granted at g behind another's drain: quantum end g + 10 ms as
        // published at the grant, start pending.
        p.launched(g, false);
        let pending = Some(GRANT_START_PENDING);
        assert_eq!(
            p.before(g + MS, 1, Some(g + 10 * MS), pending),
            Step::HoldUntil(g + MS + RECHECK_NS)
        );
        // Nothing in flight: nothing to queue behind.
        assert_eq!(p.before(g + MS, 0, Some(g + 10 * MS), pending), Step::Go);
        // The drain ended at g + 15 ms: the grant's time starts there, its
        // quantum ends at g + 25 ms, and the kernel in flight ends at
        // g + 35 ms, not g + 20 ms as predicted from its launch.
        let (s, q) = (g + 15 * MS, g + 25 * MS);
        assert_eq!(
            p.before(g + 19 * MS + 900_000, 1, Some(q), Some(s)),
            Step::HoldUntil(q)
        );
        // The test can fail: without the start, the kernel is predicted to
        // end at g + 20 ms and a second one goes behind it, into the drain
        // at g + 25 ms.
        assert_eq!(p.before(g + 19 * MS + 900_000, 1, Some(q), None), Step::Go);
        // A start long past changes nothing: the launch's own prediction
        // is later.
        let mut q2 = Pace::new(250_000);
        q2.learned(MS);
        q2.launched(50 * MS, false);
        assert_eq!(
            q2.before(50 * MS + 800_000, 1, Some(60 * MS), Some(10 * MS)),
            Step::Go
        );
    }
}
