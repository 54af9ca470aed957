//! The queue bound applied to launches, for every vendor: the decision is
//! `pace.rs` (pure); this module records the marker events it is fed with
//! and waits where it says, through a small `Events` trait that each
//! vendor implements (CUDA in `gate.rs`, HIP in `hip/pace.rs`). One copy of
//! the plumbing, so a fix to how markers are kept, learned from or waited
//! on is a fix for both vendors.
//!
//! Per allocation device, the markers of the latest launches, spare events,
//! and the owner the events belong to (a CUDA context, a HIP device: an
//! event marks only streams of its owner, so another current owner starts
//! over).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tessera_shm::gate::Gate;
use tessera_shm::layout::{GRANT_START_PENDING, MAX_DEVICES};
use tessera_shm::sys::monotonic_ns;

use crate::log::Level;
use crate::pace::{DEFAULT_BUDGET_NS, MAX_DEEP, MAX_SHARED, Pace, Step};

/// What the pacer needs of a vendor's runtime: events recorded on streams,
/// queried, timed and waited on, and what they belong to. Associated
/// functions, not methods: each vendor's runtime is process-wide.
///
/// # Safety
///
/// `Event` handles are valid from any thread of the process (the pacer
/// keeps them in process-wide state, used under a mutex).
pub(crate) unsafe trait Events {
    /// An event handle.
    type Event: Copy;
    /// A stream handle.
    type Stream: Copy;
    /// What events belong to: an event marks only streams of its owner.
    type Owner: Copy + PartialEq;

    /// The calling thread's current owner; `None`: the launch goes unpaced.
    fn owner() -> Option<Self::Owner>;
    /// Whether work on `stream` is being captured into a graph, or that is
    /// unknown: then nothing is recorded there (a capture's work runs when
    /// its graph is launched, and recording into a capture would break it).
    fn capturing(stream: Self::Stream) -> bool;
    /// A new event with timing on (lengths are learned from it).
    fn create() -> Option<Self::Event>;
    fn destroy(ev: Self::Event);
    /// Records `ev` on `stream`; whether the runtime took it.
    fn record(ev: Self::Event, stream: Self::Stream) -> bool;
    /// Whether `ev` completed. Any answer but "not ready" (an error
    /// included) is done: a marker the runtime cannot answer for must not
    /// hold launches.
    fn done(ev: Self::Event) -> bool;
    /// The time from `from` to `to`, both completed, in ns; `None` when
    /// the runtime cannot say or it is not positive.
    fn elapsed_ns(from: Self::Event, to: Self::Event) -> Option<u64>;
    /// Waits until `ev` completes.
    fn synchronize(ev: Self::Event);
    /// Records `ev` on `owner`'s default stream and waits for it, from the
    /// gate's drainer right after a drain (nothing of the process's is in
    /// flight, so it completes at once); whether it completed.
    fn probe(owner: Self::Owner, ev: Self::Event) -> bool;
}

/// A launch's marker: an event recorded after it on its stream.
struct Marker<E: Events> {
    ev: E::Event,
    /// Queued while the launch before it was in flight (back to back).
    behind: bool,
    /// Its length was learned already.
    learned: bool,
    /// Seen done (a done event stays done until recorded again, and a
    /// marker's is not): not asked again.
    done: bool,
    /// An event recorded just before the launch when nothing of the
    /// process's was in flight: the launch's length is then the time
    /// between the two (a holder whose kernels outlast its quantum never
    /// queues one behind another within a grant, so this is how it learns).
    start: Option<E::Event>,
    /// The allocation's launch count with this launch (`Gate::take_launch`):
    /// the time between this marker and the one before covers every launch
    /// the allocation queued in between, the other processes' too.
    seq: u64,
    /// Nothing of the allocation's was queued before this launch, so its
    /// start event timed it alone. Otherwise the time from the start event
    /// includes the other processes' work queued ahead: it can only be too
    /// long, and teaches only a first length or a shorter one.
    clean: bool,
}

/// One device's pacing in this process: the decision, the markers of the
/// latest launches (at most `MAX_DEEP + 1`), spare events, and the
/// owner they belong to.
struct Paced<E: Events> {
    pace: Pace,
    /// Oldest first; a deque, as each launch at the bound drops the oldest.
    markers: VecDeque<Marker<E>>,
    spare: Vec<E::Event>,
    /// The event [`Pacer::ended_at`] probes with, made by a launching
    /// thread: the drainer that asks has no current context of its own to
    /// make one in, and the spare events run out while the markers kept
    /// fill up (a program of 20 ms kernels launches 97 in 2 to 6 s; until
    /// then every drain was reported at the drainer's return, not where
    /// the work ended).
    probe: Option<E::Event>,
    owner: E::Owner,
    /// The start event of the launch being submitted (see [`Marker::start`]).
    pending_start: Option<E::Event>,
    /// The allocation's launch count with the launch being submitted.
    pending_seq: u64,
    /// The allocation's launch count the launch being submitted was
    /// decided with.
    decided_at: u64,
    /// Nothing of the allocation's was queued before the launch being
    /// submitted (see [`Marker::clean`]).
    pending_clean: bool,
}

// SAFETY: the handles are valid from any thread of the process (the
// `Events` contract); the struct is only used under its mutex.
unsafe impl<E: Events> Send for Paced<E> {}

impl<E: Events> Paced<E> {
    /// A spare event of the owner's, or a new one.
    fn take_event(&mut self) -> Option<E::Event> {
        self.spare.pop().or_else(E::create)
    }

    /// Whether the latest launch is still in flight (asked of the runtime
    /// unless already seen done).
    fn last_in_flight(&self) -> bool {
        self.markers
            .back()
            .is_some_and(|m| !m.done && !E::done(m.ev))
    }
}

/// A vendor's pacer: one slot per allocation device, in a `static`.
pub(crate) struct Pacer<E: Events> {
    slots: [Mutex<Option<Paced<E>>>; MAX_DEVICES],
}

impl<E: Events> Pacer<E> {
    pub(crate) const fn new() -> Self {
        Self {
            slots: [const { Mutex::new(None) }; MAX_DEVICES],
        }
    }

    /// Before a launch on `stream`, on allocation device `dev`: holds it
    /// while the process has more queued than the budget allows (see
    /// `pace.rs`). Returns whether the launch is paced: then [`Self::start`]
    /// comes after the gate and [`Self::after`] once the runtime took it.
    ///
    /// A device open to the allocation (a whole GPU; see `Gate::open`) is
    /// not paced: the bound is there so that a hand-over drains one kernel,
    /// and there no one is handed the device. Paced, a whole GPU paid for
    /// it on a busy host: a program of 50 µs kernels kept the device 62-87%
    /// busy beside four busy processes where the same program unpaced kept
    /// it 96-98% busy (its short queue ran dry whenever its thread woke
    /// late). Should an arbiter take the device back (a manager started
    /// again), the first revocation drains what was queued unpaced, once.
    pub(crate) fn before(&self, gate: &Gate, dev: usize, stream: E::Stream) -> bool {
        wake_promptly();
        gate.launch_called(dev);
        let budget = budget_ns();
        if budget == 0 || dev >= MAX_DEVICES || E::capturing(stream) || gate.open(dev) {
            return false;
        }
        let Some(owner) = E::owner() else {
            return false;
        };
        // Set after a wait for the oldest launch: the next look tells
        // whether the thread woke before the queue ran out.
        let mut woke = false;
        loop {
            let mut guard = self.slots[dev].lock();
            let p = guard.get_or_insert_with(|| Paced {
                pace: Pace::new(budget),
                markers: VecDeque::new(),
                spare: Vec::new(),
                probe: None,
                owner,
                pending_start: None,
                pending_seq: 0,
                decided_at: 0,
                pending_clean: false,
            });
            if p.owner != owner {
                // Another owner: its events cannot mark this one's streams.
                for m in p.markers.drain(..) {
                    E::destroy(m.ev);
                    m.start.into_iter().for_each(E::destroy);
                }
                p.spare
                    .drain(..)
                    .chain(p.pending_start.take())
                    .chain(p.probe.take())
                    .for_each(E::destroy);
                p.owner = owner;
            }
            // Completion is in order (one engine, FIFO): the markers are
            // asked from the oldest not yet seen done up to the first not
            // done, and the later ones are taken as not done without
            // asking. So a launch asks the runtime (a driver call each)
            // about the launches done since the last one and one more, not
            // about every marker kept; should work on another stream finish
            // first, it is counted in flight a little longer.
            let mut running = false;
            for m in p.markers.iter_mut().filter(|m| !m.done) {
                if running || !E::done(m.ev) {
                    running = true;
                } else {
                    m.done = true;
                }
            }
            // The latest launch seen done: every launch of the allocation
            // queued before it is done too.
            if let Some(m) = p.markers.iter().rev().find(|m| m.done)
                && m.seq != 0
            {
                gate.saw_done(dev, m.seq, monotonic_ns());
            }
            for i in 0..p.markers.len() {
                let m = &p.markers[i];
                if !m.done || m.learned {
                    continue;
                }
                // From the start event, the launch alone; from the marker
                // before, every launch the allocation queued in between
                // (its other processes share the device's queue), so the
                // time is split among them. Counts that do not make sense
                // (a count not written, wrapped, or far apart) teach
                // nothing: a length learned from them would be a guess.
                let est = p.pace.estimate();
                let from = match (m.start, i.checked_sub(1)) {
                    (Some(s), _) => Some((s, 1)),
                    (None, Some(j)) if m.behind => {
                        let n = m.seq.wrapping_sub(p.markers[j].seq);
                        (m.seq != 0 && p.markers[j].seq != 0 && (1..=MAX_SHARED).contains(&n))
                            .then(|| (p.markers[j].ev, n))
                    }
                    _ => None,
                };
                if let Some((from, n)) = from {
                    if let Some(ns) = E::elapsed_ns(from, p.markers[i].ev)
                        && (m.start.is_none() || m.clean || est == 0 || ns < est)
                    {
                        p.pace.learned(ns / n);
                    }
                    p.markers[i].learned = true;
                }
            }
            let in_flight = p.markers.iter().filter(|m| !m.done).count();
            let now = monotonic_ns();
            if std::mem::take(&mut woke) && in_flight == 0 {
                // Everything ran out before the thread was back: the host
                // keeps it from a CPU longer than the queue lasts.
                p.pace.overslept(now);
            } else {
                p.pace.calm(now);
            }
            // The allocation's launches not seen done: a launch of another
            // process's among them is queued on the same device, and a
            // launch of this one's goes behind it.
            let count = gate.launch_count(dev);
            let pending = u64::from((count as u32).wrapping_sub(gate.launches_done(dev)));
            let queue_end = p.pace.shared_queue_end(now, pending, gate.done_at(dev));
            let step = p.pace.before_shared(
                now,
                in_flight,
                gate.grant_until(dev),
                gate.grant_start(dev),
                queue_end,
            );
            match step {
                Step::Go => {
                    // Decided with this count: `start` numbers the launch
                    // only if it still stands.
                    p.decided_at = count;
                    return true;
                }
                Step::WaitOlder => {
                    // Completion is in order (one engine, FIFO): the first
                    // marker not done is the oldest launch in flight.
                    let Some(m) = p.markers.iter().find(|m| !m.done) else {
                        return true;
                    };
                    let ev = m.ev;
                    drop(guard);
                    // Waiting on its own work: the holder keeps its grant.
                    gate.syncing(Some(dev), || E::synchronize(ev));
                    woke = true;
                }
                Step::HoldUntil(t) => {
                    drop(guard);
                    gate.syncing(Some(dev), || hold_until(t));
                }
            }
        }
    }

    /// Just before a paced launch on `dev`, after the gate: numbers the
    /// launch among the allocation's (`Gate::take_launch`), if no other
    /// launch took a number since the pacer decided on this one; `false`
    /// if one did, and the decision is to be made again (through
    /// [`Self::before`] and the gate) with it counted: two processes
    /// deciding at once from the same count each queued a kernel to start
    /// before the quantum's end, and the second ran into the drain (a third
    /// of the hand-overs of two processes drained two kernels). Numbered
    /// here, just before the launch, the numbers follow the device's queue
    /// (numbered at the decision, a process held at the gate took its
    /// number before another's launch that ran first, and the lengths both
    /// learned were off by a kernel).
    ///
    /// When nothing of the process's is in flight there, records the start
    /// event the launch's length will be measured from; not under a
    /// pre-armed grant still behind another holder's drain (the launch
    /// waits for that work, and the wait is no part of its length).
    pub(crate) fn start(&self, gate: &Gate, dev: usize, stream: E::Stream) -> bool {
        let behind_another = gate.grant_start(dev) == Some(GRANT_START_PENDING);
        let mut guard = self.slots[dev].lock();
        let Some(p) = guard.as_mut() else {
            return true;
        };
        if let Some(old) = p.pending_start.take() {
            p.spare.push(old);
        }
        let Some(seq) = gate.take_launch(dev, p.decided_at) else {
            return false;
        };
        p.pending_seq = seq;
        let behind = p.last_in_flight();
        // Where the queue ends with this launch, for the arbiter: a holder
        // whose thread waits for a CPU with work queued is not idle
        // (`Gate::queued_until`). Only for kernels shorter than the budget,
        // whose queue may outlast the arbiter's idle release: a longer
        // kernel's process has at most two in flight and waits on them
        // marked as synchronising. Said for 20 ms kernels too, the 20 ms
        // pairs' hand-over p99 beside four busy processes went past 20.5 ms
        // in four runs of six (up to 25.2), against at most 20.25 before.
        let est = p.pace.estimate();
        if est > 0 && est <= budget_ns() {
            let now = monotonic_ns();
            let from = if behind {
                p.pace.queue_end().max(now)
            } else {
                now
            };
            gate.queued_until(dev, from.saturating_add(est));
        }
        // A start event (nothing of the process's in flight) times the
        // launch alone when nothing of the allocation's was queued before
        // it: every launch numbered before it seen done. An event on a
        // stream of its own completes at once, whatever other processes
        // queued on the device (the simulator and a real GPU alike), so
        // otherwise its time includes theirs (see [`Marker::clean`]).
        p.pending_clean = seq != 0 && gate.launches_done(dev) == seq.wrapping_sub(1) as u32;
        if behind_another || behind {
            return true;
        }
        let Some(ev) = p.take_event() else {
            return true;
        };
        if E::record(ev, stream) {
            p.pending_start = Some(ev);
        } else {
            p.spare.push(ev);
        }
        true
    }

    /// After a paced launch on `dev`: records its marker on `stream`, and
    /// whether the launch was queued behind the last one (judged now, after
    /// the gate: a launch that waited there for a grant did not follow its
    /// predecessor, and must not teach the pacer a length of that wait).
    pub(crate) fn after(&self, dev: usize, stream: E::Stream) {
        let mut guard = self.slots[dev].lock();
        let Some(p) = guard.as_mut() else {
            return;
        };
        let behind = p.last_in_flight();
        p.pace.launched(monotonic_ns(), behind);
        if p.probe.is_none() {
            p.probe = E::create();
        }
        let start = p.pending_start.take();
        let seq = std::mem::take(&mut p.pending_seq);
        let clean = std::mem::take(&mut p.pending_clean);
        let Some(ev) = p.take_event() else {
            p.spare.extend(start);
            return;
        };
        if !E::record(ev, stream) {
            // A stream of another owner, say: this launch goes unmarked.
            p.spare.push(ev);
            p.spare.extend(start);
            return;
        }
        p.markers.push_back(Marker {
            ev,
            behind,
            learned: false,
            done: false,
            start,
            seq,
            clean,
        });
        while p.markers.len() > MAX_DEEP + 1 {
            let Some(m) = p.markers.pop_front() else {
                break;
            };
            p.spare.push(m.ev);
            p.spare.extend(m.start);
        }
    }
}

impl<E: Events> Pacer<E> {
    /// Whether nothing of this process's paced work is in flight on `dev`
    /// (its latest launch's marker is done); `false` when that is not known
    /// (nothing paced yet, or pacing off).
    /// Before a synchronisation at which the process gives its grant back
    /// (`Gate::leave`): waits, marked as a synchronisation, until at most
    /// its last paced launch on `dev` is in flight, so that the
    /// revocation's drain is that one kernel and not the queue behind it.
    /// Returns whether the process may leave: its launches there are paced
    /// (otherwise what it has queued is not known) and the last is still
    /// in flight.
    pub(crate) fn settle(&self, gate: &Gate, dev: usize) -> bool {
        if dev >= MAX_DEVICES || budget_ns() == 0 {
            return false;
        }
        loop {
            let guard = self.slots[dev].lock();
            let Some(p) = guard.as_ref() else {
                return false;
            };
            let n = p.markers.len();
            // Nothing in flight: the wait returns at once, and leaving
            // would only send the next launch to wait for a grant.
            if n == 0 || E::done(p.markers[n - 1].ev) {
                return false;
            }
            if n < 2 || E::done(p.markers[n - 2].ev) {
                return true;
            }
            let ev = p.markers[n - 2].ev;
            drop(guard);
            gate.syncing(Some(dev), || E::synchronize(ev));
        }
    }

    pub(crate) fn idle(&self, dev: usize) -> bool {
        if dev >= MAX_DEVICES || budget_ns() == 0 {
            return false;
        }
        let guard = self.slots[dev].lock();
        guard
            .as_ref()
            .is_some_and(|p| !p.markers.is_empty() && !p.last_in_flight())
    }

    /// When the last paced launch on `dev` ended, on CLOCK_MONOTONIC (see
    /// `Drain::ended_at`): the device's own timestamps, anchored to the host
    /// clock by a probe event recorded after the drain, on an idle device,
    /// whose timestamp is no earlier than the clock read before it. So the
    /// answer is the marker's end or up to a few µs before it, never after:
    /// a pre-armed next holder is charged from here, and an early answer
    /// only charges it a little more. Work launched unpaced after the last
    /// marker makes the answer earlier still, the same way.
    pub(crate) fn ended_at(&self, dev: usize) -> Option<u64> {
        if dev >= MAX_DEVICES {
            return None;
        }
        let mut guard = self.slots[dev].lock();
        let p = guard.as_mut()?;
        let last = p.markers.back()?.ev;
        let probe = p.probe?;
        let before = monotonic_ns();
        E::probe(p.owner, probe)
            .then(|| E::elapsed_ns(last, probe).map_or(before, |ns| before.saturating_sub(ns)))
    }
}

/// Sleeps until CLOCK_MONOTONIC `t` with a 1 µs timer slack (the default
/// 50 µs would eat a fifth of the budget), put back after.
fn hold_until(t: u64) {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and reads the thread's own slack.
    let old = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    tessera_shm::sys::set_timer_slack(1_000);
    let now = monotonic_ns();
    if t > now {
        std::thread::sleep(std::time::Duration::from_nanos(t - now));
    }
    if old > 0 {
        tessera_shm::sys::set_timer_slack(old as u64);
    }
}

/// The pacer's budget, in the process's environment (`250us`, or `0` to
/// turn the queue bound off): a tenant's setting, so it only changes how
/// long the tenant's own drains take, which the arbiter charges to it.
pub const ENV_QUEUE_BUDGET: &str = "TESSERA_QUEUE_BUDGET";

/// The budget in force (ns); 0: launches are not paced.
static BUDGET_NS: AtomicU64 = AtomicU64::new(DEFAULT_BUDGET_NS);

fn budget_ns() -> u64 {
    BUDGET_NS.load(Ordering::Relaxed)
}

/// The slice a launching thread asks the scheduler for, in the process's
/// environment (`100us`, the default, up to `100ms`; `0` leaves the
/// program's threads as they are): see `wake_promptly`. A tenant's
/// setting, which only changes how promptly its own threads wake.
pub const ENV_WAKE_SLICE: &str = "TESSERA_WAKE_SLICE";

/// The wake slice in force (ns); 0: threads are left alone.
static WAKE_SLICE: AtomicU64 = AtomicU64::new(tessera_shm::sys::WAKE_SLICE_NS);

/// Reads [`ENV_QUEUE_BUDGET`] and [`ENV_WAKE_SLICE`]: once per process,
/// when it joins (either vendor's gate), never on a launch. A bad value is
/// logged and the default stays.
pub(crate) fn read_settings() {
    read_ns(
        ENV_QUEUE_BUDGET,
        &BUDGET_NS,
        parse_budget,
        "the queue stays bounded",
    );
    read_ns(
        ENV_WAKE_SLICE,
        &WAKE_SLICE,
        parse_wake_slice,
        "the default stays",
    );
}

/// Reads the setting `name` into `into` with `parse`; a bad value is logged
/// (with what happens instead, `otherwise`) and `into` is left as it is.
fn read_ns(name: &str, into: &AtomicU64, parse: fn(&str) -> Result<u64, String>, otherwise: &str) {
    match std::env::var(name).ok().map(|v| parse(&v)) {
        Some(Err(e)) => crate::log!(Level::Error, "{e}; {otherwise}"),
        Some(Ok(ns)) => into.store(ns, Ordering::Relaxed),
        None => {}
    }
}

/// A setting's duration in ns, or `0`; `None` when it is neither or outside
/// `range` (`0` is accepted whatever the range: it turns the setting off).
fn parse_ns(v: &str, range: std::ops::RangeInclusive<u64>) -> Option<u64> {
    let t = v.trim();
    if t == "0" {
        return Some(0);
    }
    tessera_contract::units::parse_duration(t)
        .ok()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .filter(|ns| range.contains(ns))
}

fn parse_wake_slice(v: &str) -> Result<u64, String> {
    parse_ns(v, 100_000..=100_000_000)
        .ok_or_else(|| format!("{ENV_WAKE_SLICE}={v:?}: a duration from 100us to 100ms, or 0"))
}

/// Once per launching thread of a governed process: asks the scheduler for
/// a short slice (`tessera_shm::sys::request_wake_slice`), so the thread
/// runs soon after it wakes even while other work keeps the CPUs busy.
/// These threads wait in the pacer's holds, at the gate and in
/// synchronisations, and each late wake-up is GPU time lost to the
/// allocation: beside four busy processes on two cores, a guaranteed 30%
/// of 1 ms kernels got 24.6% of the GPU against a target of 27.8, and
/// 28.9 with the slice. The thread's CPU share, policy and nice value do
/// not change.
fn wake_promptly() {
    thread_local! {
        static ASKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if ASKED.with(|a| a.replace(true)) {
        return;
    }
    let ns = WAKE_SLICE.load(Ordering::Relaxed);
    if ns != 0 {
        let got = tessera_shm::sys::request_wake_slice(ns);
        crate::log!(Level::Debug, "wake slice of a launching thread: {got:?}");
    }
}

fn parse_budget(v: &str) -> Result<u64, String> {
    parse_ns(v, 0..=1_000_000_000)
        .ok_or_else(|| format!("{ENV_QUEUE_BUDGET}={v:?}: a duration up to 1s, or 0"))
}

#[cfg(test)]
mod tests {
    //! The plumbing over a fake runtime, per test thread: events are
    //! indices into a table that records what the pacer did with them.

    use std::cell::RefCell;
    use std::sync::Arc;

    use tessera_shm::Member;
    use tessera_shm::gate::{Drain, GateEvent};

    use super::*;
    use crate::governor::tests::leaked_files_with_share;

    #[derive(Default)]
    struct Fake {
        /// Per event: alive, recorded (and when, fake ns), done.
        events: Vec<(bool, Option<u64>, bool)>,
        owner: u32,
        clock: u64,
        created: usize,
        syncs: Vec<usize>,
        /// Completion queries asked.
        queries: usize,
        /// The calling thread has no current context (the drainer's):
        /// events cannot be made.
        no_context: bool,
    }

    thread_local! {
        static FAKE: RefCell<Fake> = RefCell::new(Fake { owner: 1, ..Fake::default() });
    }

    fn fake<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
        FAKE.with(|c| f(&mut c.borrow_mut()))
    }

    struct FakeEvents;

    // SAFETY: the handles are plain indices.
    unsafe impl Events for FakeEvents {
        type Event = usize;
        type Stream = ();
        type Owner = u32;

        fn owner() -> Option<u32> {
            Some(fake(|f| f.owner))
        }
        fn capturing((): ()) -> bool {
            false
        }
        fn create() -> Option<usize> {
            fake(|f| {
                if f.no_context {
                    return None;
                }
                f.created += 1;
                f.events.push((true, None, false));
                Some(f.events.len() - 1)
            })
        }
        fn destroy(ev: usize) {
            fake(|f| f.events[ev].0 = false);
        }
        fn record(ev: usize, (): ()) -> bool {
            fake(|f| {
                assert!(f.events[ev].0, "recorded a destroyed event");
                f.events[ev] = (true, Some(f.clock), false);
            });
            true
        }
        fn done(ev: usize) -> bool {
            fake(|f| {
                f.queries += 1;
                f.events[ev].2
            })
        }
        fn elapsed_ns(from: usize, to: usize) -> Option<u64> {
            fake(|f| Some(f.events[to].1? - f.events[from].1?)).filter(|&ns| ns > 0)
        }
        fn synchronize(ev: usize) {
            // One engine, in order: everything recorded up to `ev` is done.
            fake(|f| {
                f.syncs.push(ev);
                let at = f.events[ev].1;
                for e in f.events.iter_mut().filter(|e| e.1.is_some() && e.1 <= at) {
                    e.2 = true;
                }
            });
        }
        fn probe(_: u32, ev: usize) -> bool {
            Self::record(ev, ());
            Self::synchronize(ev);
            true
        }
    }

    struct NoDrain;
    impl Drain for NoDrain {
        fn drain(&self, _: usize) {}
    }

    /// A gate on a fresh allocation of half a GPU with no arbiter: no
    /// grant, so no quantum's end; only the hard bound and the learned
    /// length apply.
    fn gate() -> Gate {
        gate_with_share(500_000)
    }

    fn gate_with_share(share_ppm: u32) -> Gate {
        let files = leaked_files_with_share(&[1 << 30], share_ppm);
        let member = Member {
            slot: 0,
            generation: 1,
        };
        let log = Arc::new(|_: &GateEvent| {});
        Gate::new(&files.control, &files.state, member, Arc::new(NoDrain), log).unwrap()
    }

    /// One launch through the pacer, at fake time `t`; whether it was paced.
    fn launch(p: &Pacer<FakeEvents>, gate: &Gate, t: u64) -> bool {
        fake(|f| f.clock = t);
        let paced = p.before(gate, 0, ());
        if paced {
            assert!(p.start(gate, 0, ()), "no other process numbered a launch");
            p.after(0, ());
        }
        paced
    }

    fn finish_all() {
        fake(|f| f.events.iter_mut().for_each(|e| e.2 = e.1.is_some()));
    }

    fn in_flight() -> usize {
        fake(|f| {
            f.events
                .iter()
                .filter(|e| e.0 && e.1.is_some() && !e.2)
                .count()
        })
    }

    #[test]
    fn ended_at_is_the_last_marker_on_the_host_clock_never_later() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        assert_eq!(
            p.ended_at(0),
            None,
            "nothing launched: the drainer's own time"
        );
        assert!(launch(&p, &gate, 1_000));
        finish_all();
        // The probe is recorded 5 ms (device time) after the last marker.
        fake(|f| f.clock = 5_001_000);
        let before = monotonic_ns();
        let ended = p.ended_at(0).expect("a marker and a probe");
        let after = monotonic_ns();
        assert!(
            ended + 5_000_000 >= before && ended + 5_000_000 <= after,
            "ended {ended} not 5 ms before the probe's host time [{before}, {after}]"
        );
        assert_eq!(p.ended_at(MAX_DEVICES), None);
    }

    /// The drainer asks with no context current, so it can make no event;
    /// a program that launched a few kernels has no spare one either.
    #[test]
    fn the_drainer_reads_the_work_s_end_with_no_context_of_its_own() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        for i in 0..3 {
            assert!(launch(&p, &gate, 1_000 + i * 20_000_000));
            finish_all();
        }
        assert!(p.slots[0].lock().as_ref().unwrap().spare.is_empty());
        fake(|f| {
            f.clock = 70_000_000;
            f.no_context = true;
        });
        let before = monotonic_ns();
        let ended = p.ended_at(0);
        fake(|f| f.no_context = false);
        let ended = ended.expect("the probe made at a launch");
        assert!(
            ended + 29_000_000 <= before,
            "{ended} not the last marker's end"
        );
    }

    #[test]
    fn events_are_reused_and_the_markers_kept_are_bounded() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        for i in 0..200 {
            assert!(launch(&p, &gate, i * 1000));
            finish_all();
        }
        let created = fake(|f| f.created);
        // The markers kept, each with its start event (every launch here
        // found the device empty), the pair being recorded, and the probe.
        assert!(
            created <= 2 * (MAX_DEEP + 1) + 3,
            "{created} events for 200 launches"
        );
        assert!(p.slots[0].lock().as_ref().unwrap().markers.len() <= MAX_DEEP + 1);
    }

    #[test]
    fn a_third_launch_waits_for_the_oldest_and_learns_its_length() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        // Nothing in flight: the first launch gets a start event too.
        assert!(launch(&p, &gate, 0));
        assert!(launch(&p, &gate, 0));
        assert_eq!(in_flight(), 3, "start, and two markers");
        // The hard bound: two launches not done; the third waits on the
        // oldest marker (which, done at fake time 0, teaches nothing).
        fake(|f| f.clock = 5);
        assert!(launch(&p, &gate, 5));
        assert_eq!(fake(|f| f.syncs.len()), 1, "waited once, on the oldest");
        assert!(in_flight() <= 2);
        // A fourth launch, alone on an empty device after a later start:
        // its length (start event to marker) is learned.
        fake(|f| f.syncs.clear());
        finish_all();
        assert!(launch(&p, &gate, 1_000));
        let (start, last) = {
            let slot = p.slots[0].lock();
            let m = slot.as_ref().unwrap().markers.back().unwrap();
            (m.start.expect("a start event"), m.ev)
        };
        assert_ne!(start, last);
        // The device ran it from 1 µs to 1.4 ms.
        fake(|f| f.events[last] = (true, Some(1_400_000), true));
        finish_all();
        assert!(launch(&p, &gate, 2_000_000));
        assert_eq!(
            p.slots[0].lock().as_ref().unwrap().pace.estimate(),
            1_399_000
        );
    }

    /// Once a short length is learned, each launch tells the arbiter where
    /// the process's queue ends (its slot's `queued_until`): about one
    /// length past now, on its device. A process of longer kernels says
    /// nothing (two in flight at most; its waits are marked syncing).
    #[test]
    fn a_launch_of_short_kernels_says_where_the_queue_ends() {
        for (length, says) in [(100_000u64, true), (1_399_000, false)] {
            let files = leaked_files_with_share(&[1 << 30], 500_000);
            let member = Member {
                slot: 0,
                generation: 1,
            };
            let log = Arc::new(|_: &GateEvent| {});
            let gate =
                Gate::new(&files.control, &files.state, member, Arc::new(NoDrain), log).unwrap();
            let word = || {
                tessera_shm::layout::FirstLaunch::unpack(
                    files.state.slot(0).queued_until.load(Ordering::SeqCst),
                )
            };
            let p = Pacer::<FakeEvents>::new();
            // A launch alone on the device, timed by its start event.
            assert!(launch(&p, &gate, 1_000));
            assert_eq!(word(), None, "nothing learned yet: nothing said");
            let last = p.slots[0].lock().as_ref().unwrap().markers[0].ev;
            fake(|f| f.events[last] = (true, Some(1_000 + length), true));
            finish_all();
            let before = monotonic_ns();
            assert!(launch(&p, &gate, 2_000_000));
            let after = monotonic_ns();
            let learned = p.slots[0].lock().as_ref().unwrap().pace.estimate();
            assert_eq!(learned, length);
            match word() {
                Some(w) if says => {
                    assert_eq!(w.dev, 0);
                    assert!(
                        w.at_ns >= before + learned && w.at_ns <= after + learned,
                        "{} not one length past the launch",
                        w.at_ns
                    );
                }
                w => assert!(!says && w.is_none(), "{length} ns kernels: {w:?}"),
            }
        }
    }

    /// A whole GPU is handed to no one, so its queue is not bounded: a
    /// launch goes however much is in flight, unmarked, and teaches nothing.
    #[test]
    fn a_whole_gpu_is_not_paced() {
        let (p, whole) = (Pacer::<FakeEvents>::new(), gate_with_share(1_000_000));
        for _ in 0..20 {
            assert!(!launch(&p, &whole, 0), "a launch on a whole GPU was paced");
        }
        assert_eq!(fake(|f| f.syncs.len()), 0, "a launch waited");
        assert_eq!(fake(|f| f.created), 0, "events were made for markers");
        assert!(p.slots[0].lock().is_none());
        // The same launches on half a GPU: the hard bound holds.
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        for _ in 0..20 {
            assert!(launch(&p, &gate, 0));
        }
        assert!(fake(|f| f.syncs.len()) > 0, "nothing waited");
        assert!(in_flight() <= 2 + 1, "more than two markers and a start");
    }

    /// Each launch asks the runtime about the markers it has not seen done
    /// yet, up to the first not done: a few driver calls, not one per
    /// marker kept.
    #[test]
    fn a_launch_asks_only_about_launches_not_seen_done() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        for i in 0..20 {
            assert!(launch(&p, &gate, i * 1000));
            finish_all();
        }
        assert_eq!(
            p.slots[0].lock().as_ref().unwrap().markers.len(),
            20.min(MAX_DEEP + 1)
        );
        fake(|f| f.queries = 0);
        for i in 20..40 {
            assert!(launch(&p, &gate, i * 1000));
            finish_all();
        }
        // The marker before (now done), and the last one's in `start` and
        // `after`: three a launch. Asking every marker kept, nine or more.
        let queries = fake(|f| f.queries);
        assert!(queries <= 20 * 3, "{queries} queries for 20 launches");
        // Seen not done, a marker and those after it are asked again.
        assert!(launch(&p, &gate, 50_000));
        fake(|f| f.queries = 0);
        assert!(launch(&p, &gate, 51_000));
        assert!(fake(|f| f.queries) >= 1);
        assert_eq!(in_flight(), 2 + 1, "two markers and a start event");
    }

    /// Before leaving at a synchronisation, the process waits until only
    /// its last launch is in flight (the drain is one kernel), and does not
    /// leave with nothing in flight or nothing paced.
    #[test]
    fn settling_leaves_at_most_the_last_launch_in_flight() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        assert!(!p.settle(&gate, 0), "nothing paced");
        assert!(launch(&p, &gate, 0));
        assert!(launch(&p, &gate, 10));
        // Two markers in flight: it waits for the older one only.
        assert!(p.settle(&gate, 0));
        let last = p.slots[0]
            .lock()
            .as_ref()
            .unwrap()
            .markers
            .back()
            .unwrap()
            .ev;
        assert!(!FakeEvents::done(last), "the last one still runs");
        let older = {
            let slot = p.slots[0].lock();
            let m = &slot.as_ref().unwrap().markers;
            m[m.len() - 2].ev
        };
        assert!(FakeEvents::done(older));
        assert_eq!(fake(|f| f.syncs.clone()), vec![older]);
        // Only the last in flight: no wait.
        assert!(p.settle(&gate, 0));
        assert_eq!(fake(|f| f.syncs.len()), 1);
        // Everything done: the wait returns at once; no reason to leave.
        finish_all();
        assert!(!p.settle(&gate, 0));
        assert!(!p.settle(&gate, MAX_DEVICES));
    }

    /// Only a wait for all of a stream's, context's or device's work
    /// leaves, and only once the pacer has settled: a wait on one event may
    /// be on a launch long done, just before the next launch (the bench's
    /// programs bound how far they run ahead so), and leaving there sent
    /// that launch to wait for a grant of its own.
    #[test]
    fn only_a_wait_for_all_the_work_leaves() {
        use crate::gate::{Awaits, leave_as_sync_begins};
        let gate = gate();
        // A host part of over 0.5 ms learned, then a launch.
        gate.before_submit(0);
        gate.syncing(Some(0), || ());
        gate.synced(0, true);
        std::thread::sleep(std::time::Duration::from_micros(700));
        gate.before_submit(0);
        assert!(gate.would_leave(0));
        assert!(!leave_as_sync_begins(&gate, Some(0), Awaits::Event, |_| {
            true
        }));
        assert!(!leave_as_sync_begins(&gate, Some(0), Awaits::Work, |_| {
            false
        }));
        assert!(!leave_as_sync_begins(&gate, None, Awaits::Work, |_| true));
        assert!(gate.would_leave(0), "nothing left yet");
        assert!(leave_as_sync_begins(&gate, Some(0), Awaits::Work, |_| true));
        assert!(!gate.would_leave(0), "left: not again before a launch");
        // The wait returns; the next launch's host part ends as the pacer
        // sees the launch, before any hold of its.
        gate.synced(0, true);
        let p = Pacer::<FakeEvents>::new();
        assert!(launch(&p, &gate, 0));
        assert!(gate.would_leave(0), "the launch ended the host part");
    }

    const MS: u64 = 1_000_000;

    /// The markers and start events of the latest launches, oldest first.
    fn markers(p: &Pacer<FakeEvents>) -> Vec<(usize, Option<usize>)> {
        let slot = p.slots[0].lock();
        let m = &slot.as_ref().unwrap().markers;
        m.iter().map(|m| (m.ev, m.start)).collect()
    }

    fn estimate(p: &Pacer<FakeEvents>) -> u64 {
        p.slots[0].lock().as_ref().unwrap().pace.estimate()
    }

    /// Another process of the same allocation numbers a launch.
    fn another_launch(gate: &Gate) {
        assert!(gate.take_launch(0, gate.launch_count(0)).is_some());
    }

    /// The device runs the work of all of an allocation's processes in one
    /// queue: the time between two markers of one process covers the
    /// others' launches queued in between, and is split among them all.
    #[test]
    fn a_length_is_learned_per_launch_of_the_whole_allocation() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        // Alone: learned from its start event, 1 ms.
        assert!(launch(&p, &gate, 0));
        let (m1, _) = markers(&p)[0];
        fake(|f| f.events[m1] = (true, Some(MS), true));
        // Another's launch queued behind it, then this one's next behind
        // both; the device ran them to 2 and 3 ms.
        another_launch(&gate);
        fake(|f| f.events[m1].2 = false);
        assert!(launch(&p, &gate, 10));
        let (m2, start2) = markers(&p)[1];
        assert_eq!(start2, None, "queued behind its own");
        fake(|f| {
            f.events[m1].2 = true;
            f.events[m2] = (true, Some(3 * MS), true);
        });
        assert!(launch(&p, &gate, 3 * MS));
        // 2 ms over two launches: 1 ms; taken whole, (3 + 2) / 4 ms.
        assert_eq!(estimate(&p), MS);
        // Alone again on the device but for another's launch not seen
        // done: its start event times that one too. Longer than what was
        // learned, it teaches nothing (a shorter one would).
        finish_all();
        assert!(launch(&p, &gate, 4 * MS));
        another_launch(&gate);
        finish_all();
        assert!(launch(&p, &gate, 5 * MS));
        let (m4, start4) = *markers(&p).last().unwrap();
        assert!(start4.is_some(), "nothing of its own in flight");
        fake(|f| f.events[m4] = (true, Some(5 * MS + 1_800_000), true));
        assert!(launch(&p, &gate, 7 * MS));
        assert_eq!(estimate(&p), MS);
    }

    /// A launch decided with a count that another process's launch moved
    /// on before this one was numbered is decided again (through the gate)
    /// with it counted.
    #[test]
    fn a_launch_decided_before_another_was_numbered_is_decided_again() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        assert!(p.before(&gate, 0, ()));
        another_launch(&gate);
        assert!(
            !p.start(&gate, 0, ()),
            "numbered with a count that moved on"
        );
        assert!(p.before(&gate, 0, ()));
        assert!(p.start(&gate, 0, ()));
        p.after(0, ());
        assert_eq!(gate.launch_count(0), 2);
    }

    #[test]
    fn another_owner_starts_over_with_its_own_events() {
        let (p, gate) = (Pacer::<FakeEvents>::new(), gate());
        assert!(launch(&p, &gate, 0));
        assert!(launch(&p, &gate, 0));
        let old = fake(|f| f.created);
        fake(|f| f.owner = 2);
        assert!(launch(&p, &gate, 10));
        // Every event of the first owner is destroyed; none is recorded
        // again (the fake's `record` would fail the test).
        fake(|f| {
            assert!(f.events[..old].iter().all(|e| !e.0), "old events alive");
            assert!(f.created > old, "the new owner's own events");
        });
    }

    #[test]
    fn the_budget_is_a_duration_up_to_a_second_or_zero() {
        assert_eq!(parse_budget("0"), Ok(0));
        assert_eq!(parse_budget(" 250us "), Ok(250_000));
        assert!(parse_budget("2s").is_err());
        assert!(parse_budget("fast").unwrap_err().contains(ENV_QUEUE_BUDGET));
    }

    #[test]
    fn the_wake_slice_is_what_linux_accepts_or_zero() {
        assert_eq!(parse_wake_slice("0"), Ok(0));
        assert_eq!(parse_wake_slice(" 100us "), Ok(100_000));
        assert_eq!(parse_wake_slice("3ms"), Ok(3_000_000));
        // Outside 0.1 to 100 ms the kernel would clamp it: said, not guessed.
        assert!(parse_wake_slice("50us").is_err());
        assert!(parse_wake_slice("1s").is_err());
        assert!(
            parse_wake_slice("soon")
                .unwrap_err()
                .contains(ENV_WAKE_SLICE)
        );
    }

    /// A launching thread asks for the wake slice and keeps its policy and
    /// nice value.
    #[test]
    fn a_launching_thread_asks_for_the_wake_slice() {
        std::thread::spawn(|| {
            let (_, nice, before) = tessera_shm::sys::thread_sched().unwrap();
            wake_promptly();
            let (policy, nice_after, after) = tessera_shm::sys::thread_sched().unwrap();
            assert_eq!((policy, nice_after), (libc::SCHED_OTHER as u32, nice));
            if before == 0 {
                assert_eq!(after, 0, "no per-thread slices in this kernel");
            } else {
                assert_eq!(after, tessera_shm::sys::WAKE_SLICE_NS);
            }
        })
        .join()
        .unwrap();
    }
}
