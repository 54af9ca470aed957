//! The process's side of the gate: waiting for the grant before a submission,
//! running free when the arbiter is silent, and the drainer that reports a
//! revoked epoch's work finished.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::handshake::{self, Pass};
use super::{forget_waiting, saturating_dec};
use crate::layout::{
    DeviceControl, DeviceState, FirstLaunch, MAX_DEVICES, MAX_SLOTS, SlotDevice, grant,
};
use crate::state::Member;
use crate::sys::{Linux, Sys};
use crate::{Control, ShmError, State};

/// How a process waits for the work it submitted to one device to finish.
/// The hook implements it with the real driver (`cuCtxSynchronize` on each
/// context it submitted to); tests implement it with threads.
pub trait Drain: Send + Sync + 'static {
    /// Returns once everything this process submitted to device `dev`
    /// (the control file's index) before the call has finished.
    fn drain(&self, dev: usize);

    /// When the work the last [`Drain::drain`] of `dev` waited for ended,
    /// on CLOCK_MONOTONIC, if the implementation can tell (the hook reads
    /// it from its launch markers' timestamps); `None`, the default: the
    /// drainer reports the time the drain returned, which is later by its
    /// own wake-up. The arbiter starts a pre-armed next holder's charge
    /// there, so a late report lets that holder run uncharged (charged to
    /// this one); it never takes a report for earlier than it saw the work
    /// undrained, so an early one buys this process nothing.
    fn ended_at(&self, _dev: usize) -> Option<u64> {
        None
    }
}

/// Something the gate reports once, for the hook's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateEvent {
    /// The arbiter's heartbeat stood still: this device's gate runs free.
    RunningFree { dev: usize, silent_ms: u64 },
    /// The heartbeat moves again: the gate waits for grants again.
    Rejoined { dev: usize },
    /// The drainer thread could not start; revocations wait out the
    /// arbiter's bounded drain instead.
    DrainerFailed { dev: usize, error: String },
}

impl fmt::Display for GateEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateEvent::RunningFree { dev, silent_ms } => write!(
                f,
                "device {dev}: no arbiter heartbeat for {silent_ms} ms; submitting without a grant until it returns"
            ),
            GateEvent::Rejoined { dev } => {
                write!(f, "device {dev}: arbiter is back; waiting for grants again")
            }
            GateEvent::DrainerFailed { dev, error } => {
                write!(f, "device {dev}: drainer thread failed to start: {error}")
            }
        }
    }
}

/// The log callback the hook supplies.
pub type GateLog = Arc<dyn Fn(&GateEvent) + Send + Sync>;

#[derive(Debug, Default)]
struct DevLocal {
    /// Running free: the arbiter was found silent.
    free: AtomicBool,
    /// Pid of the process that started this device's drainer (0 = none);
    /// a forked child, which has no such thread, starts its own.
    drainer_pid: AtomicU32,
    /// When the first synchronisation since the last launch returned (own
    /// clock; 0: none since): the next launch measures the host part from it.
    synced_at: AtomicU64,
    /// Learned host part between a synchronisation's return and the next
    /// launch, ns (a moving average; 0 until learned).
    host_ns: AtomicU64,
    /// The process yielded as a synchronisation began ([`Gate::leave`]):
    /// `synced_at` holds when, so that the next launch clears the yield;
    /// the synchronisation's return restarts the host part there.
    left: AtomicBool,
}

/// A process whose host part after a synchronisation is at least this long
/// (learned) yields at the synchronisation's return: the arbiter's
/// contested idle release (0.5 ms by default), so a program yields only
/// where the arbiter would take its grant back anyway, without the wait.
pub const YIELD_AFTER_NS: u64 = 500_000;

struct Inner {
    control: &'static Control,
    state: &'static State,
    member: Member,
    n_devices: usize,
    drain: Arc<dyn Drain>,
    log: GateLog,
    /// Clock, sleeps and wake-ups (never on the hot path).
    sys: Arc<dyn Sys>,
    devs: [DevLocal; MAX_DEVICES],
    /// Threads of this process blocked at each device's gate; the slot's
    /// bit is set while the count is non-zero.
    waiting: Mutex<[u32; MAX_DEVICES]>,
    /// Threads of this process in a synchronisation on each device; the
    /// slot's `syncing` bit is set while the count is non-zero.
    syncing: Mutex<[u32; MAX_DEVICES]>,
    /// The heartbeat value last seen and when (own clock).
    hb_seen: AtomicU64,
    hb_seen_at: AtomicU64,
    /// Drainers exit when set (tests; a real process just exits).
    stop: AtomicBool,
}

/// One process's gate for every device of its allocation. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("alloc", &self.inner.control.alloc_id())
            .field("member", &self.inner.member)
            .finish()
    }
}

impl Gate {
    /// A gate for the process that joined `state` as `member`. The files
    /// live as long as the process (the hook keeps them in statics).
    pub fn new(
        control: &'static Control,
        state: &'static State,
        member: Member,
        drain: Arc<dyn Drain>,
        log: GateLog,
    ) -> Result<Self, ShmError> {
        Self::with_sys(control, state, member, drain, log, Arc::new(Linux))
    }

    /// [`Gate::new`] with the system calls `sys` (a test double).
    pub fn with_sys(
        control: &'static Control,
        state: &'static State,
        member: Member,
        drain: Arc<dyn Drain>,
        log: GateLog,
        sys: Arc<dyn Sys>,
    ) -> Result<Self, ShmError> {
        if member.slot >= MAX_SLOTS {
            return Err(ShmError::BadSpec(format!(
                "slot {} out of range",
                member.slot
            )));
        }
        if state.raw().header.alloc_id != control.raw().header.alloc_id {
            return Err(ShmError::BadSpec(format!(
                "state file {} does not belong to allocation {}",
                state.path().display(),
                control.alloc_id()
            )));
        }
        // Bits a previous occupant of the slot left are not ours.
        forget_waiting(state.raw(), member.slot);
        // Before any submission: the arbiter's scans must reach this slot.
        state
            .raw()
            .header
            .gate_slots
            .fetch_max(member.slot as u32 + 1, Ordering::AcqRel);
        let n_devices = control.n_devices();
        Ok(Gate {
            inner: Arc::new(Inner {
                control,
                state,
                member,
                n_devices,
                drain,
                log,
                sys,
                devs: Default::default(),
                waiting: Mutex::new([0; MAX_DEVICES]),
                syncing: Mutex::new([0; MAX_DEVICES]),
                hb_seen: AtomicU64::new(0),
                hb_seen_at: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            }),
        })
    }

    /// Called before every submission of work to device `dev` (the control
    /// file's index). Returns when the process may submit: at once while its
    /// allocation holds the grant (one atomic load), after a wait otherwise.
    /// Devices outside the allocation are not governed.
    #[inline]
    pub fn before_submit(&self, dev: usize) {
        let i = &*self.inner;
        if dev >= i.n_devices {
            return;
        }
        i.launch_called(dev);
        let w = i.control.device(dev).grant.load(Ordering::Acquire);
        let sd = i.slot_dev(dev);
        if grant::may_submit(w)
            && (w & grant::OPEN != 0 || sd.launch_epoch.load(Ordering::Relaxed) == grant::epoch(w))
        {
            count_launch(sd);
            return;
        }
        i.submit_slow(&self.inner, dev);
    }

    /// Runs `wait`, a synchronisation on device `dev` (a thread waiting
    /// for this process's own work), with the slot's `syncing` bit set:
    /// the arbiter counts a holder that waits on its work in flight as
    /// busy, not idle, so it keeps its grant through a training step's
    /// `loss.item()`. Not the hot path: a mutex and two atomic operations
    /// around a wait that sleeps anyway.
    pub fn syncing<R>(&self, dev: Option<usize>, wait: impl FnOnce() -> R) -> R {
        let i = &*self.inner;
        let Some(dev) = dev.filter(|&d| d < i.n_devices) else {
            return wait();
        };
        let bit = 1u32 << dev;
        let slot = i.state.slot(i.member.slot);
        {
            let mut counts = i.syncing.lock().unwrap_or_else(|p| p.into_inner());
            counts[dev] += 1;
            if counts[dev] == 1 {
                slot.syncing.fetch_or(bit, Ordering::AcqRel);
            }
        }
        let r = wait();
        let mut counts = i.syncing.lock().unwrap_or_else(|p| p.into_inner());
        counts[dev] = counts[dev].saturating_sub(1);
        if counts[dev] == 0 {
            slot.syncing.fetch_and(!bit, Ordering::AcqRel);
        }
        r
    }

    /// The program called a launch on `dev`: its host part ends here, not
    /// when the launch is let through. The pacer may hold the launch for
    /// up to a kernel first (waiting on the process's own work), and counted
    /// in, that hold made a program that syncs every 2 20 ms kernels learn
    /// a 20 ms host part: it yielded at every synchronisation.
    /// [`Gate::before_submit`] does the same for a launch the pacer does not
    /// see.
    pub fn launch_called(&self, dev: usize) {
        let i = &*self.inner;
        if dev < i.n_devices {
            i.launch_called(dev);
        }
    }

    /// Whether a synchronisation on `dev` beginning now precedes a host part
    /// learned to be long (at least [`YIELD_AFTER_NS`]) and follows a
    /// launch: then, once at most the running kernel of the process's is
    /// left, it may give its grant back at once ([`Gate::leave`]) rather
    /// than when the wait returns.
    pub fn would_leave(&self, dev: usize) -> bool {
        self.local(dev).is_some_and(|d| {
            d.synced_at.load(Ordering::Relaxed) == 0
                && d.host_ns.load(Ordering::Relaxed) >= YIELD_AFTER_NS
        })
    }

    /// Yields device `dev` as a synchronisation begins (see
    /// [`Gate::would_leave`]): the process launches nothing more before a
    /// host part it learned is long, so the arbiter may revoke while its
    /// last kernel still runs and grant the next holder behind it. The
    /// holder's sync return, the arbiter's wake-up and the next holder's
    /// then overlap that kernel instead of idling the GPU one after another
    /// (issue 36: 50–120 µs per hand-over with 1 ms kernels and 2 ms host
    /// gaps). The kernel is the revocation's drain, charged to this
    /// allocation as any drain is; a launch before the host part ends
    /// clears the yield and waits for the next grant. A hint, as every
    /// yield is: it can only give this allocation's own grant away.
    pub fn leave(&self, dev: usize) {
        let Some(d) = self.local(dev) else {
            return;
        };
        let i = &*self.inner;
        d.left.store(true, Ordering::Relaxed);
        // Non-zero: the next launch goes through `host_part_ended`, which
        // clears the yield.
        d.synced_at
            .store(i.sys.monotonic_ns().max(1), Ordering::Relaxed);
        i.yield_device(dev);
    }

    /// A synchronisation on device `dev` (see [`Gate::syncing`]) returned;
    /// `idle`: nothing of this process's is in flight on it now. The next
    /// launch learns how long the host part was; when what was learned is
    /// at least [`YIELD_AFTER_NS`] and the process is idle, it yields
    /// ([`crate::layout::Slot::yielding`]) and wakes the arbiter, which
    /// then need not wait out its idle release to see a host gap.
    pub fn synced(&self, dev: usize, idle: bool) {
        let Some(d) = self.local(dev) else {
            return;
        };
        let i = &*self.inner;
        // The host part runs from the first return since the last launch:
        // a later wait on work already done (a program's `cuEventSynchronize`
        // just before its next launch) returns at once and does not end it.
        let now = i.sys.monotonic_ns().max(1);
        if d.left.swap(false, Ordering::Relaxed) {
            // Yielded as the wait began: the host part starts now, not then
            // (counted from then, it would hold the awaited kernel too, and
            // a program with short host parts would learn long ones).
            d.synced_at.store(now, Ordering::Relaxed);
        } else {
            let _ = d
                .synced_at
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        let bit = 1u32 << dev;
        let slot = i.state.slot(i.member.slot);
        if !idle
            || d.host_ns.load(Ordering::Relaxed) < YIELD_AFTER_NS
            || slot.syncing.load(Ordering::Acquire) & bit != 0
        {
            return;
        }
        i.yield_device(dev);
    }

    /// The learned host part after a synchronisation on `dev`, ns (0 until
    /// learned). For the tests: the arbiter reads only the yield bit.
    #[cfg(test)]
    pub(crate) fn host_part_ns(&self, dev: usize) -> u64 {
        self.inner
            .devs
            .get(dev)
            .map_or(0, |d| d.host_ns.load(Ordering::Relaxed))
    }

    /// Device `dev`'s counters in the allocation's state file, `None` for a
    /// device outside the allocation: the one bound check of the accessors
    /// below.
    fn shared(&self, dev: usize) -> Option<&crate::layout::DeviceState> {
        let i = &*self.inner;
        (dev < i.n_devices).then(|| i.state.device(dev))
    }

    /// This process's own record of device `dev`, `None` outside the
    /// allocation.
    fn local(&self, dev: usize) -> Option<&DevLocal> {
        let i = &*self.inner;
        (dev < i.n_devices).then(|| &i.devs[dev])
    }

    /// Whether this process's allocation holds a grant on device `dev` that
    /// the arbiter times (granted, not open, not running free): the one
    /// check before reading a grant's published times. The grant word is
    /// read with Acquire, so a time read after it is this grant's or a
    /// later renewal's.
    fn holds_grant(&self, dev: usize) -> bool {
        if self
            .local(dev)
            .is_none_or(|d| d.free.load(Ordering::Relaxed))
        {
            return false;
        }
        let i = &*self.inner;
        let w = i.control.device(dev).grant.load(Ordering::Acquire);
        w & grant::GRANTED != 0 && w & grant::OPEN == 0
    }

    /// Where the work this process queued on device `dev` is predicted to
    /// end, `at_ns` on CLOCK_MONOTONIC (the pacer's word, before each paced
    /// launch; see [`crate::layout::Slot::queued_until`]). One store to the
    /// slot; the arbiter reads it as activity.
    pub fn queued_until(&self, dev: usize, at_ns: u64) {
        let i = &*self.inner;
        if dev < i.n_devices {
            i.state
                .slot(i.member.slot)
                .queued_until
                .store(FirstLaunch { dev, at_ns }.pack(), Ordering::Release);
        }
    }

    /// Whether device `dev` is open to this process's allocation: no
    /// arbitration there (a whole GPU, an allocation the arbiter let go, or
    /// no arbiter since one shut down), so nothing it queues is ever drained
    /// for another holder. `false` outside the allocation.
    pub fn open(&self, dev: usize) -> bool {
        let i = &*self.inner;
        dev < i.n_devices && i.control.device(dev).grant.load(Ordering::Acquire) & grant::OPEN != 0
    }

    /// When the quantum of the grant this process holds on device `dev`
    /// ends, as the arbiter published it (its CLOCK_MONOTONIC): `None` when
    /// the allocation does not hold a grant there (revoked, open, running
    /// free) or no end was published. The pacer's hint; never trusted.
    pub fn grant_until(&self, dev: usize) -> Option<u64> {
        if !self.holds_grant(dev) {
            return None;
        }
        let until = self.inner.control.grant_until(dev);
        // Written before the grant it belongs to; read after the word, so
        // it is this grant's or a later renewal's.
        (until != 0).then_some(until)
    }

    /// When the time of the grant this process holds on device `dev`
    /// started, as the arbiter published it: `Some(GRANT_START_PENDING)`
    /// while a pre-armed grant waits behind another holder's drain; `None`
    /// when no grant is held there or nothing was published. The pacer's
    /// hint; never trusted.
    pub fn grant_start(&self, dev: usize) -> Option<u64> {
        if !self.holds_grant(dev) {
            return None;
        }
        let start = self.inner.control.grant_start(dev);
        (start != 0).then_some(start)
    }

    /// Numbers a paced launch this process decided on, on device `dev`,
    /// among all its allocation's processes' (the state file's `launches`):
    /// the next number, if the count is still `seen` (what the decision was
    /// made with), so that the decision and the count are one step among
    /// the allocation's processes; `None`: another launch was numbered
    /// meanwhile, decide again. Between two launches of one process, the
    /// numbers say how many launches of the allocation were queued, its
    /// own second one included. `Some(0)` for a device outside the
    /// allocation (nothing shared, no number). A hint among the
    /// allocation's own processes, never read by the arbiter.
    pub fn take_launch(&self, dev: usize, seen: u64) -> Option<u64> {
        let Some(d) = self.shared(dev) else {
            return Some(0);
        };
        let next = seen.wrapping_add(1).max(1);
        d.launches
            .compare_exchange(seen, next, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| next)
    }

    /// The allocation's paced launches on device `dev` so far (see
    /// [`Gate::take_launch`]; 0 outside the allocation).
    pub fn launch_count(&self, dev: usize) -> u64 {
        self.shared(dev)
            .map_or(0, |d| d.launches.load(Ordering::Relaxed))
    }

    /// The latest of the allocation's launches on device `dev` any of its
    /// processes saw done (the low 32 bits of its count; 0 outside the
    /// allocation or before any was seen).
    pub fn launches_done(&self, dev: usize) -> u32 {
        self.shared(dev)
            .map_or(0, |d| d.launches_done.load(Ordering::Relaxed))
    }

    /// Records that this process saw the allocation's launch number `seq`
    /// (see [`Gate::take_launch`]) done on device `dev` at `now`: the
    /// shared number moves forward only (in wrapping order; a number more
    /// than half the range behind is taken as behind), and when it does,
    /// `now` is recorded with it.
    pub fn saw_done(&self, dev: usize, seq: u64, now: u64) {
        let Some(d) = self.shared(dev) else {
            return;
        };
        let seq = seq as u32;
        let mut cur = d.launches_done.load(Ordering::Relaxed);
        while (seq.wrapping_sub(cur) as i32) > 0 {
            match d.launches_done.compare_exchange_weak(
                cur,
                seq,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    d.done_at_ns.store(now, Ordering::Relaxed);
                    return;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// When the allocation's latest launch seen done on device `dev` was
    /// seen so (0: never, or outside the allocation).
    pub fn done_at(&self, dev: usize) -> u64 {
        self.shared(dev)
            .map_or(0, |d| d.done_at_ns.load(Ordering::Relaxed))
    }

    /// Whether device `dev`'s gate currently runs free (arbiter silent).
    pub fn running_free(&self, dev: usize) -> bool {
        dev < MAX_DEVICES && self.inner.devs[dev].free.load(Ordering::Relaxed)
    }

    /// The membership this gate records in.
    pub fn member(&self) -> Member {
        self.inner.member
    }

    /// Stops this gate's drainer threads (within their poll period). A real
    /// process never needs this; tests that stand threads in for processes
    /// do.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        for dev in 0..self.inner.n_devices {
            self.inner
                .sys
                .futex_wake_all(&self.inner.control.device(dev).revocations);
        }
    }
}

#[inline]
fn count_launch(sd: &SlotDevice) {
    // Owner-only word: a plain load and store, no locked instruction. Two
    // threads racing may lose a count, never the fact that it moved.
    let n = sd.launches.load(Ordering::Relaxed);
    sd.launches.store(n.wrapping_add(1), Ordering::Relaxed);
}

impl Inner {
    /// The first launch after a synchronisation on `dev`: the host part
    /// ended. Learns its length ([`tessera_contract::quarter_average`], as
    /// the pacer learns kernels) and takes back a yield. Off the hot path: only after a
    /// synchronisation.
    /// The program called a launch on `dev` (inside the allocation): ends
    /// a host part begun by a synchronisation. One load on the hot path.
    #[inline]
    fn launch_called(&self, dev: usize) {
        if self.devs[dev].synced_at.load(Ordering::Relaxed) != 0 {
            self.host_part_ended(dev);
        }
    }

    /// Sets this slot's `yielding` bit for `dev` and rings the device's
    /// doorbell, so the arbiter sees the yield within a wake-up.
    fn yield_device(&self, dev: usize) {
        let slot = self.state.slot(self.member.slot);
        slot.yielding.fetch_or(1u32 << dev, Ordering::AcqRel);
        let bell = &self.state.device(dev).drain_signal;
        bell.fetch_add(1, Ordering::AcqRel);
        self.sys.futex_wake_all(bell);
    }

    #[cold]
    fn host_part_ended(&self, dev: usize) {
        let d = &self.devs[dev];
        let since = d.synced_at.swap(0, Ordering::Relaxed);
        if since != 0 {
            let sample = self.sys.monotonic_ns().saturating_sub(since);
            let est = d.host_ns.load(Ordering::Relaxed);
            d.host_ns.store(
                tessera_contract::quarter_average(est, sample),
                Ordering::Relaxed,
            );
        }
        let bit = 1u32 << dev;
        let slot = self.state.slot(self.member.slot);
        if slot.yielding.load(Ordering::Relaxed) & bit != 0 {
            slot.yielding.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    #[inline]
    fn slot_dev(&self, dev: usize) -> &SlotDevice {
        &self.state.slot(self.member.slot).devices[dev]
    }

    fn dev_control(&self, dev: usize) -> &DeviceControl {
        self.control.device(dev)
    }

    fn dev_state(&self, dev: usize) -> &DeviceState {
        self.state.device(dev)
    }

    /// Everything but the common case: first submission of an epoch,
    /// waiting for the grant, running free.
    #[cold]
    #[inline(never)]
    fn submit_slow(&self, me: &Arc<Inner>, dev: usize) {
        let g = &self.dev_control(dev).grant;
        let sd = self.slot_dev(dev);
        let mut waited_since: Option<u64> = None;
        loop {
            // Record the epoch, then make sure it is still current (the
            // Dekker pair in the module docs).
            let w = match handshake::pass(g, &sd.launch_epoch) {
                Pass::Moved => continue,
                Pass::Closed(w) => w,
                pass => {
                    if let Pass::Recorded(_) = pass {
                        // The first submission of the epoch: where the
                        // holder's time may start (`Slot::first_launch`),
                        // not at the grant, when this thread woke late.
                        let at_ns = self.sys.monotonic_ns();
                        self.state
                            .slot(self.member.slot)
                            .first_launch
                            .store(FirstLaunch { dev, at_ns }.pack(), Ordering::Release);
                        self.ensure_drainer(me, dev);
                    }
                    self.stop_waiting(dev, waited_since);
                    self.note_rejoined(dev);
                    count_launch(sd);
                    return;
                }
            };
            let now = self.sys.monotonic_ns();
            if let Some(silent) = self.arbiter_silent_for(now) {
                self.stop_waiting(dev, waited_since);
                if !self.devs[dev].free.swap(true, Ordering::AcqRel) {
                    (self.log)(&GateEvent::RunningFree {
                        dev,
                        silent_ms: silent / 1_000_000,
                    });
                }
                // Record the epoch we ran under, so the arbiter, once back,
                // waits for this work to drain before granting anyone.
                let e = grant::epoch(w);
                if sd.launch_epoch.load(Ordering::Relaxed) != e {
                    sd.launch_epoch.store(e, Ordering::Relaxed);
                }
                self.ensure_drainer(me, dev);
                count_launch(sd);
                return;
            }
            self.note_rejoined(dev);
            if waited_since.is_none() {
                self.start_waiting(dev);
                waited_since = Some(now);
                continue; // the word may have moved while we registered
            }
            // Look at the heartbeat several times per timeout: silence is
            // judged from the last time we saw it move, so a waiter that
            // slept through the arbiter's last beats would otherwise wait
            // up to twice the timeout.
            let timeout = self.control.gate_timeout_ns().max(1);
            let seen_at = self.hb_seen_at.load(Ordering::Acquire);
            let left = (seen_at.saturating_add(timeout))
                .saturating_sub(now)
                .clamp(1, (timeout / 8).max(1));
            self.sys.futex_wait(g, w, left);
        }
    }

    /// How long the arbiter has been silent, if longer than the gate
    /// timeout. Judged by whether the heartbeat *value* moved, on this
    /// process's own clock.
    fn arbiter_silent_for(&self, now: u64) -> Option<u64> {
        let hb = self.control.heartbeat();
        let seen = self.hb_seen.load(Ordering::Acquire);
        let seen_at = self.hb_seen_at.load(Ordering::Acquire);
        if seen_at == 0 || hb != seen {
            self.hb_seen.store(hb, Ordering::Release);
            self.hb_seen_at.store(now, Ordering::Release);
            return None;
        }
        let silent = now.saturating_sub(seen_at);
        (silent >= self.control.gate_timeout_ns()).then_some(silent)
    }

    fn note_rejoined(&self, dev: usize) {
        if self.devs[dev].free.load(Ordering::Relaxed)
            && self.devs[dev].free.swap(false, Ordering::AcqRel)
        {
            (self.log)(&GateEvent::Rejoined { dev });
        }
    }

    fn start_waiting(&self, dev: usize) {
        let mut counts = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        counts[dev] += 1;
        if counts[dev] == 1 {
            // Counter first, bit second: a process killed in between leaves
            // a count no live bit backs, which readers ignore.
            self.dev_state(dev).waiters.fetch_add(1, Ordering::AcqRel);
            self.state
                .slot(self.member.slot)
                .gate_waiting
                .fetch_or(1 << dev, Ordering::AcqRel);
            // Then the doorbell: an arbiter with no holder sleeps on the
            // one of the allocation it expects back from a host gap, and
            // grants within a wake-up of this, not at its next poll (the
            // poll's half on average was a twentieth of a 2 ms gap).
            let bell = &self.dev_state(dev).drain_signal;
            bell.fetch_add(1, Ordering::AcqRel);
            self.sys.futex_wake_all(bell);
        }
    }

    fn stop_waiting(&self, dev: usize, since: Option<u64>) {
        let Some(since) = since else { return };
        {
            let mut counts = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            counts[dev] = counts[dev].saturating_sub(1);
            if counts[dev] == 0 {
                let prev = self
                    .state
                    .slot(self.member.slot)
                    .gate_waiting
                    .fetch_and(!(1 << dev), Ordering::AcqRel);
                if prev & (1 << dev) != 0 {
                    saturating_dec(&self.dev_state(dev).waiters);
                }
            }
        }
        let waited = self.sys.monotonic_ns().saturating_sub(since);
        self.dev_state(dev)
            .wait_ns
            .fetch_add(waited, Ordering::Relaxed);
    }

    /// Starts this process's drainer for `dev` unless it runs already.
    fn ensure_drainer(&self, me: &Arc<Inner>, dev: usize) {
        let pid = std::process::id();
        let slot = &self.devs[dev].drainer_pid;
        let cur = slot.load(Ordering::Acquire);
        if cur == pid
            || slot
                .compare_exchange(cur, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let inner = Arc::clone(me);
        let spawned = std::thread::Builder::new()
            .name(format!("tessera-drain{dev}"))
            .spawn(move || inner.drainer(dev));
        if let Err(e) = spawned {
            (self.log)(&GateEvent::DrainerFailed {
                dev,
                error: e.to_string(),
            });
        }
    }

    /// The drainer: sleeps on the grant word; when the epoch this process
    /// last submitted under is over, waits for that work and says so.
    fn drainer(&self, dev: usize) {
        // The drainer's `cuCtxSynchronize` sleeps until the work ends: the
        // default 50 µs of timer slack would show as idle time charged to
        // the allocation.
        self.sys.set_timer_slack(1_000);
        // Its report ends the allocation's charge for the drain: woken
        // after a busy thread's whole slice, it charged about 2 ms more per
        // grant on a loaded host (a guaranteed 30% alone got 24.6% of the
        // GPU against 27.8).
        self.sys.wake_promptly();
        let g = &self.dev_control(dev).grant;
        let rev = &self.dev_control(dev).revocations;
        let sd = self.slot_dev(dev);
        let ds = self.dev_state(dev);
        while !self.stop.load(Ordering::Acquire) {
            // The counter first: a revocation after this read changes it,
            // so the sleep below cannot miss one.
            let check = handshake::drain_check(rev, g, &sd.launch_epoch, &sd.drained_epoch);
            if let Some(le) = check.due {
                // A thread that loaded the old word just before the
                // revocation may still be on its way into the driver:
                // let it get there, and catch it with a second pass. (The
                // yield delays the report, not the next holder: it is
                // granted at the revocation and its charge starts where
                // the work ended, `Drain::ended_at`.)
                std::thread::yield_now();
                let before = sd.launches.load(Ordering::Relaxed);
                self.drain.drain(dev);
                if sd.launches.load(Ordering::Relaxed) != before {
                    std::thread::yield_now();
                    self.drain.drain(dev);
                }
                let now = self.sys.monotonic_ns();
                // Never later than now: the drain has returned.
                let ended = self.drain.ended_at(dev).map_or(now, |t| t.min(now));
                ds.drained_at_ns.fetch_max(ended, Ordering::AcqRel);
                handshake::drained(&sd.drained_epoch, &ds.drain_signal, le);
                self.sys.futex_wake_all(&ds.drain_signal);
                continue;
            }
            // Sleeps through grants (the launching threads need the CPU
            // then), wakes on revocations.
            self.sys.futex_wait(rev, check.bell, 500_000_000);
        }
    }
}
