//! The compute gate over shared memory: what a process does before it
//! submits work (pass only while its allocation holds the grant), the
//! drainer that reports its work finished once a grant is revoked, and the
//! arbiter's primitive operations on the same words. CUDA-free: the hook
//! says how to synchronise through [`Drain`].
//!
//! # Protocol
//!
//! The arbiter owns each device's grant word ([`DeviceControl::grant`]): a
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
//!   `drained_epoch` and rings [`DeviceState::drain_signal`]. The arbiter
//!   moves the grant on only when every live process that submitted under
//!   the revoked epoch has drained (or a bounded wait ends).
//! - **No arbiter, no hang.** A gate that sees the arbiter's heartbeat stand
//!   still for `gate_timeout_ns` (measured on its own clock, so clocks of
//!   different namespaces need not agree; a waiter looks at it every eighth
//!   of the timeout) runs free, says so once through the log callback, and
//!   rejoins as soon as the heartbeat moves again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};

use crate::layout::{
    DeviceControl, DeviceState, MAX_DEVICES, MAX_SLOTS, Owner, SlotDevice, StateFile, grant,
};
use crate::state::Member;
use crate::{Control, ShmError, State};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of heartbeats and waits.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
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

// ---------------------------------------------------------------------------
// The arbiter's side.

impl Control {
    fn check_dev(&self, dev: usize) -> Result<(), ShmError> {
        if dev >= self.n_devices() {
            return Err(ShmError::BadSpec(format!(
                "device index {dev}: the allocation has {} devices",
                self.n_devices()
            )));
        }
        Ok(())
    }

    /// The current grant word of device `dev`.
    pub fn grant_word(&self, dev: usize) -> u32 {
        self.device(dev).grant.load(Ordering::Acquire)
    }

    /// Moves device `dev`'s grant to the next epoch with `flags` (`GRANTED`,
    /// `OPEN`, or 0 for revoked) and wakes every gate and drainer sleeping
    /// on it. Returns the new word. Only the arbiter calls this.
    pub fn publish_grant(&self, dev: usize, flags: u32) -> Result<u32, ShmError> {
        self.require_writable()?;
        self.check_dev(dev)?;
        let word = &self.device(dev).grant;
        let new = next_grant_word(word.load(Ordering::Acquire), flags);
        word.store(new, Ordering::Release);
        // Pairs with the fence in a gate's first submission of an epoch:
        // after it, reading `launch_epoch` sees every process that saw the
        // old word (see the module docs).
        fence(Ordering::SeqCst);
        futex_wake_all(word);
        if flags & grant::GRANTED == 0 {
            // After the word: a drainer reads the counter, then the word.
            let rev = &self.device(dev).revocations;
            rev.fetch_add(1, Ordering::AcqRel);
            futex_wake_all(rev);
        }
        Ok(new)
    }

    /// Records that the arbiter is alive (a `CLOCK_MONOTONIC` time).
    pub fn beat(&self, now_ns: u64) -> Result<(), ShmError> {
        self.require_writable()?;
        self.raw()
            .header
            .arbiter_heartbeat_ns
            .store(now_ns, Ordering::Release);
        Ok(())
    }

    /// The arbiter's latest heartbeat; 0 = never.
    pub fn heartbeat(&self) -> u64 {
        self.raw()
            .header
            .arbiter_heartbeat_ns
            .load(Ordering::Acquire)
    }

    /// How long a gate waits on a silent arbiter.
    pub fn gate_timeout_ns(&self) -> u64 {
        self.raw().header.gate_timeout_ns.load(Ordering::Acquire)
    }

    /// Changes how long gates wait on a silent arbiter.
    pub fn set_gate_timeout(&self, ns: u64) -> Result<(), ShmError> {
        self.require_writable()?;
        if ns == 0 {
            return Err(ShmError::BadSpec("gate timeout must be positive".into()));
        }
        self.raw()
            .header
            .gate_timeout_ns
            .store(ns, Ordering::Release);
        Ok(())
    }
}

/// A slot whose process has not reported its work drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undrained {
    pub slot: usize,
    /// The slot's owner word when read, so a later liveness verdict applies
    /// to the same occupant.
    pub owner: u64,
    pub launch_epoch: u32,
}

impl State {
    /// The slots a compute gate was ever set up in (the rest never
    /// submitted work, waited or drained).
    fn gate_slot_range(&self) -> &[crate::layout::Slot] {
        let n = (self.raw().header.gate_slots.load(Ordering::Acquire) as usize).min(MAX_SLOTS);
        &self.raw().slots[..n]
    }

    /// Processes with a thread blocked at device `dev`'s gate. The shared
    /// counter is only a filter: what counts are the live slots' own bits,
    /// so a count left behind by a killed process is not demand.
    pub fn gate_waiters(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES || self.device(dev).waiters.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let bit = 1u32 << dev;
        self.gate_slot_range()
            .iter()
            .filter(|s| {
                matches!(
                    Owner::unpack(s.owner.load(Ordering::Acquire)),
                    Owner::Alive { .. }
                ) && s.gate_waiting.load(Ordering::Acquire) & bit != 0
            })
            .count() as u32
    }

    /// Submissions to device `dev` by all processes: a counter whose
    /// changes show activity (it may also drop when a slot is reused).
    pub fn launches(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.gate_slot_range().iter().fold(0u64, |acc, s| {
            acc.wrapping_add(s.devices[dev].launches.load(Ordering::Relaxed))
        })
    }

    /// Total time processes spent blocked at device `dev`'s gate.
    pub fn gate_wait_ns(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.device(dev).wait_ns.load(Ordering::Relaxed)
    }

    /// Live processes that submitted to `dev` under an epoch other than
    /// `current` and have not drained it. Call after [`Control::publish_grant`]
    /// moved the word to `current` (its fence orders this read).
    pub fn undrained(&self, dev: usize, current_epoch: u32) -> Vec<Undrained> {
        if dev >= MAX_DEVICES {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, s) in self.gate_slot_range().iter().enumerate() {
            let owner = s.owner.load(Ordering::Acquire);
            if !matches!(Owner::unpack(owner), Owner::Alive { .. }) {
                continue;
            }
            let sd = &s.devices[dev];
            let le = sd.launch_epoch.load(Ordering::Acquire);
            if le != current_epoch && le != sd.drained_epoch.load(Ordering::Acquire) {
                out.push(Undrained {
                    slot: i,
                    owner,
                    launch_epoch: le,
                });
            }
        }
        out
    }

    /// The doorbell processes ring after draining device `dev`.
    pub fn drain_signal(&self, dev: usize) -> &AtomicU32 {
        &self.device(dev.min(MAX_DEVICES - 1)).drain_signal
    }

    /// When a process last reported a drain on device `dev` (its own
    /// clock; the arbiter clamps it to what it observed).
    pub fn drained_at_ns(&self, dev: usize) -> u64 {
        self.device(dev.min(MAX_DEVICES - 1))
            .drained_at_ns
            .load(Ordering::Acquire)
    }
}

/// Clears a reclaimed slot's gate bits and takes them out of the waiter
/// counts, so a process killed at the gate leaves no phantom demand.
pub(crate) fn forget_waiting(file: &StateFile, slot: usize) {
    let bits = file.slots[slot].gate_waiting.swap(0, Ordering::AcqRel);
    for dev in 0..MAX_DEVICES {
        if bits & (1 << dev) != 0 {
            saturating_dec(&file.devices[dev].waiters);
        }
    }
}

fn saturating_dec(word: &AtomicU32) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

// ---------------------------------------------------------------------------
// The process's side.

/// How a process waits for the work it submitted to one device to finish.
/// The hook implements it with the real driver (`cuCtxSynchronize` on each
/// context it submitted to); tests implement it with threads.
pub trait Drain: Send + Sync + 'static {
    /// Returns once everything this process submitted to device `dev`
    /// (the control file's index) before the call has finished.
    fn drain(&self, dev: usize);
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
}

struct Inner {
    control: &'static Control,
    state: &'static State,
    member: Member,
    n_devices: usize,
    drain: Arc<dyn Drain>,
    log: GateLog,
    devs: [DevLocal; MAX_DEVICES],
    /// Threads of this process blocked at each device's gate; the slot's
    /// bit is set while the count is non-zero.
    waiting: Mutex<[u32; MAX_DEVICES]>,
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
                devs: Default::default(),
                waiting: Mutex::new([0; MAX_DEVICES]),
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
            futex_wake_all(&self.inner.control.device(dev).revocations);
        }
    }
}

/// Asks for precise sleeps on the calling thread: the drainer's
/// `cuCtxSynchronize` sleeps until the work ends, and the default 50 µs of
/// timer slack would show as idle time charged to the allocation.
fn set_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer and affects only the
    // calling thread (ours); failure leaves the default slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
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
            let w = g.load(Ordering::Acquire);
            if grant::may_submit(w) {
                if w & grant::GRANTED != 0 && w & grant::OPEN == 0 {
                    // Record the epoch, then make sure it is still current
                    // (the Dekker pair in the module docs).
                    sd.launch_epoch.store(grant::epoch(w), Ordering::Relaxed);
                    fence(Ordering::SeqCst);
                    if g.load(Ordering::Relaxed) != w {
                        continue;
                    }
                    self.ensure_drainer(me, dev);
                }
                self.stop_waiting(dev, waited_since);
                self.note_rejoined(dev);
                count_launch(sd);
                return;
            }
            let now = monotonic_ns();
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
            futex_wait(g, w, left);
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
        let waited = monotonic_ns().saturating_sub(since);
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
        set_timer_slack();
        let g = &self.dev_control(dev).grant;
        let rev = &self.dev_control(dev).revocations;
        let sd = self.slot_dev(dev);
        let ds = self.dev_state(dev);
        while !self.stop.load(Ordering::Acquire) {
            // The counter first: a revocation after this read changes it,
            // so the sleep below cannot miss one.
            let r = rev.load(Ordering::Acquire);
            let w = g.load(Ordering::Acquire);
            let le = sd.launch_epoch.load(Ordering::Acquire);
            if le != grant::epoch(w) && sd.drained_epoch.load(Ordering::Relaxed) != le {
                // A thread that loaded the old word just before the
                // revocation may still be on its way into the driver:
                // let it get there, and catch it with a second pass.
                std::thread::yield_now();
                let before = sd.launches.load(Ordering::Relaxed);
                self.drain.drain(dev);
                if sd.launches.load(Ordering::Relaxed) != before {
                    std::thread::yield_now();
                    self.drain.drain(dev);
                }
                ds.drained_at_ns.fetch_max(monotonic_ns(), Ordering::AcqRel);
                sd.drained_epoch.store(le, Ordering::Release);
                ds.drain_signal.fetch_add(1, Ordering::AcqRel);
                futex_wake_all(&ds.drain_signal);
                continue;
            }
            // Sleeps through grants (the launching threads need the CPU
            // then), wakes on revocations.
            futex_wait(rev, r, 500_000_000);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ControlSpec, DeviceSpec, Policy, ProcIdentity, create_allocation_files};
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    struct Files {
        arbiter: Control,
        control: &'static Control,
        state: &'static State,
    }

    fn files(share_ppm: u32) -> Files {
        // Leaked like the hook's statics: gates and drainers outlive tests.
        let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
        let spec = ControlSpec::new(
            "alloc-g",
            vec![DeviceSpec {
                uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
                memory_limit_bytes: 1 << 30,
                compute_share_ppm: share_ppm,
                policy: Policy::Guaranteed,
            }],
        );
        let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
        Files {
            arbiter: Control::open_rw(&c).unwrap(),
            control: Box::leak(Box::new(Control::open(&c).unwrap())),
            state: Box::leak(Box::new(State::open(&s, "alloc-g").unwrap())),
        }
    }

    fn member(state: &State, pid: u32) -> Member {
        // start_time 0: no liveness verdict, so joins never reclaim these.
        let me = ProcIdentity {
            pid,
            pidns: 0,
            start_time: 0,
        };
        state.join(&me, &crate::LocalLiveness::quick()).unwrap()
    }

    /// Stands in for the driver: counts drains, and can hold them (work
    /// still in flight) until released.
    #[derive(Default)]
    struct FakeDrain {
        calls: AtomicUsize,
        hold: Mutex<bool>,
        cv: std::sync::Condvar,
    }

    impl Drain for FakeDrain {
        fn drain(&self, _dev: usize) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut held = self.hold.lock().unwrap();
            while *held {
                held = self.cv.wait(held).unwrap();
            }
        }
    }

    impl FakeDrain {
        fn set_hold(&self, on: bool) {
            *self.hold.lock().unwrap() = on;
            self.cv.notify_all();
        }
    }

    fn gate(f: &Files, pid: u32, drain: Arc<FakeDrain>, log: Arc<Mutex<Vec<GateEvent>>>) -> Gate {
        let m = member(f.state, pid);
        Gate::new(
            f.control,
            f.state,
            m,
            drain,
            Arc::new(move |e: &GateEvent| log.lock().unwrap().push(e.clone())),
        )
        .unwrap()
    }

    fn until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !cond() {
            assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn scans_stop_at_the_last_gate_slot() {
        let f = files(300_000);
        let g = gate(&f, 19, Arc::default(), Arc::default());
        let top = g.member().slot as u32 + 1;
        assert_eq!(f.state.raw().header.gate_slots.load(Ordering::SeqCst), top);
        // A slot beyond it (no gate ever set up there) is not looked at.
        let far = &f.state.slot(top as usize + 5).devices[0];
        far.launches.store(7, Ordering::SeqCst);
        assert_eq!(f.state.launches(0), 0);
        g.stop();
    }

    #[test]
    fn open_grant_passes_and_counts() {
        let f = files(1_000_000);
        let g = gate(&f, 11, Arc::default(), Arc::default());
        for _ in 0..5 {
            g.before_submit(0);
        }
        let sd = &f.state.slot(g.member().slot).devices[0];
        assert_eq!(sd.launches.load(Ordering::Relaxed), 5);
        // Whole GPU: no epoch bookkeeping, nothing to drain.
        assert_eq!(sd.launch_epoch.load(Ordering::Relaxed), 0);
        assert_eq!(f.state.launches(0), 5);
        // Out-of-range devices are not governed and not counted.
        g.before_submit(7);
        assert_eq!(f.state.launches(0), 5);
    }

    #[test]
    fn closed_gate_waits_for_the_grant_and_counts_demand() {
        let f = files(300_000);
        f.arbiter.beat(monotonic_ns()).unwrap();
        let g = gate(&f, 12, Arc::default(), Arc::default());
        let passed = Arc::new(AtomicBool::new(false));
        let t = {
            let (g, passed) = (g.clone(), Arc::clone(&passed));
            std::thread::spawn(move || {
                g.before_submit(0);
                passed.store(true, Ordering::SeqCst);
            })
        };
        until("the waiter to register", Duration::from_secs(5), || {
            f.state.gate_waiters(0) == 1
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!passed.load(Ordering::SeqCst), "passed a closed gate");
        let w = f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
        t.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
        assert_eq!(f.state.gate_waiters(0), 0);
        assert_eq!(f.state.device(0).waiters.load(Ordering::SeqCst), 0);
        assert!(f.state.gate_wait_ns(0) >= 20_000_000);
        let sd = &f.state.slot(g.member().slot).devices[0];
        assert_eq!(sd.launch_epoch.load(Ordering::SeqCst), grant::epoch(w));
        g.stop();
    }

    #[test]
    fn revocation_is_drained_before_it_reports() {
        let f = files(300_000);
        f.arbiter.beat(monotonic_ns()).unwrap();
        let drain = Arc::new(FakeDrain::default());
        let a = gate(&f, 13, Arc::clone(&drain), Arc::default());
        let b = gate(&f, 14, Arc::clone(&drain), Arc::default());
        let granted = f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
        a.before_submit(0);
        a.before_submit(0);
        // b submits nothing under this grant: nothing of it to wait for.
        drain.set_hold(true);
        let bell = f.state.drain_signal(0).load(Ordering::SeqCst);
        let revoked = f.arbiter.publish_grant(0, 0).unwrap();
        let pending = f.state.undrained(0, grant::epoch(revoked));
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].slot, a.member().slot);
        assert_eq!(pending[0].launch_epoch, grant::epoch(granted));
        until(
            "the drainer to start draining",
            Duration::from_secs(5),
            || drain.calls.load(Ordering::SeqCst) >= 1,
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            f.state.undrained(0, grant::epoch(revoked)).len(),
            1,
            "reported drained while work was in flight"
        );
        let released = monotonic_ns();
        drain.set_hold(false);
        until("the drain to be reported", Duration::from_secs(5), || {
            f.state.undrained(0, grant::epoch(revoked)).is_empty()
        });
        assert!(f.state.drain_signal(0).load(Ordering::SeqCst) > bell);
        let at = f.state.drained_at_ns(0);
        assert!(at >= released && at <= monotonic_ns(), "drained at {at}");
        assert_eq!(drain.calls.load(Ordering::SeqCst), 1, "one drain per epoch");
        a.stop();
        b.stop();
    }

    #[test]
    fn silent_arbiter_opens_the_gate_once_and_it_rejoins() {
        let f = files(300_000);
        f.arbiter.set_gate_timeout(150_000_000).unwrap();
        f.arbiter.beat(monotonic_ns()).unwrap();
        let log: Arc<Mutex<Vec<GateEvent>>> = Arc::default();
        let g = gate(&f, 15, Arc::default(), Arc::clone(&log));
        let t0 = Instant::now();
        g.before_submit(0);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        assert!(g.running_free(0));
        for _ in 0..100 {
            g.before_submit(0);
        }
        match log.lock().unwrap().as_slice() {
            [GateEvent::RunningFree { dev: 0, silent_ms }] => assert!(*silent_ms >= 150),
            other => panic!("expected one RunningFree, got {other:?}"),
        }
        assert_eq!(log.lock().unwrap().len(), 1, "said once");
        // Free-running submissions are recorded under the current epoch.
        let sd = &f.state.slot(g.member().slot).devices[0];
        assert_eq!(sd.launches.load(Ordering::Relaxed), 101);
        // The arbiter returns: the next submission waits for a grant again.
        let passed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let beater = {
            let stop = Arc::clone(&stop);
            let c = Control::open_rw(f.arbiter.path()).unwrap();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    c.beat(monotonic_ns()).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let before = f.control.heartbeat();
        until("the arbiter's first beat", Duration::from_secs(5), || {
            f.control.heartbeat() != before
        });
        let revoked = f.arbiter.publish_grant(0, 0).unwrap();
        let t = {
            let (g, passed) = (g.clone(), Arc::clone(&passed));
            std::thread::spawn(move || {
                g.before_submit(0);
                passed.store(true, Ordering::SeqCst);
            })
        };
        until("the gate to rejoin", Duration::from_secs(5), || {
            f.state.gate_waiters(0) == 1
        });
        assert!(!g.running_free(0));
        // The work it submitted while free is drained for the new arbiter.
        until("the free-run work to drain", Duration::from_secs(5), || {
            f.state.undrained(0, grant::epoch(revoked)).is_empty()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!passed.load(Ordering::SeqCst), "rejoined gate did not wait");
        f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
        t.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        beater.join().unwrap();
        let events = log.lock().unwrap().clone();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[1], GateEvent::Rejoined { dev: 0 });
        g.stop();
    }

    #[test]
    fn a_waiter_runs_free_one_timeout_after_the_last_beat() {
        let f = files(300_000);
        f.arbiter.set_gate_timeout(200_000_000).unwrap();
        let g = gate(&f, 18, Arc::default(), Arc::default());
        // The arbiter beats for a while as the process waits (it never
        // grants), then dies.
        let last_beat = {
            let c = Control::open_rw(f.arbiter.path()).unwrap();
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_millis(610);
                while Instant::now() < until {
                    c.beat(monotonic_ns()).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                }
                Instant::now()
            })
        };
        g.before_submit(0);
        let opened = Instant::now();
        let last_beat = last_beat.join().unwrap();
        assert!(opened > last_beat, "opened while the arbiter lived");
        let late = opened - last_beat;
        // One timeout, plus at most the eighth between two looks, plus
        // scheduling on a loaded machine. (Looking only once per timeout,
        // it would take about 390 ms here.)
        assert!(
            late >= Duration::from_millis(200) && late < Duration::from_millis(320),
            "ran free {late:?} after the last beat"
        );
        g.stop();
    }

    #[test]
    fn a_killed_waiter_leaves_no_demand() {
        let f = files(300_000);
        let m = member(f.state, 16);
        // As if the process set up its gate, registered at it, then was
        // killed.
        f.state
            .raw()
            .header
            .gate_slots
            .fetch_max(m.slot as u32 + 1, Ordering::SeqCst);
        f.state.device(0).waiters.fetch_add(1, Ordering::SeqCst);
        f.state
            .slot(m.slot)
            .gate_waiting
            .fetch_or(1, Ordering::SeqCst);
        assert_eq!(f.state.gate_waiters(0), 1);
        // A counter no live bit backs is not demand...
        f.state.device(0).waiters.fetch_add(1, Ordering::SeqCst);
        assert_eq!(f.state.gate_waiters(0), 1);
        // ...and reclaiming the slot takes its bit and count away.
        struct Dead;
        impl crate::Liveness for Dead {
            fn check(&self, _: &ProcIdentity) -> Option<bool> {
                Some(false)
            }
        }
        let reclaimed = f.state.reclaim_dead(&Dead, None);
        assert_eq!(reclaimed.len(), 1);
        assert_eq!(f.state.gate_waiters(0), 0);
        assert_eq!(f.state.device(0).waiters.load(Ordering::SeqCst), 1);
        assert_eq!(f.state.slot(m.slot).gate_waiting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn arbiter_writes_need_a_writable_mapping_and_a_real_device() {
        let f = files(300_000);
        assert!(matches!(
            f.control.publish_grant(0, grant::GRANTED),
            Err(ShmError::ReadOnly(_))
        ));
        assert!(matches!(f.control.beat(1), Err(ShmError::ReadOnly(_))));
        // Drainers sleep on the revocation counter: grants leave it alone.
        let rev = || f.control.device(0).revocations.load(Ordering::SeqCst);
        f.arbiter.publish_grant(0, grant::GRANTED).unwrap();
        assert_eq!(rev(), 0);
        f.arbiter.publish_grant(0, 0).unwrap();
        f.arbiter.publish_grant(0, grant::OPEN).unwrap();
        assert_eq!(rev(), 2);
        let e = f.arbiter.publish_grant(3, grant::GRANTED).unwrap_err();
        assert!(e.to_string().contains("device index 3"), "{e}");
        assert!(f.arbiter.set_gate_timeout(0).is_err());
    }

    #[test]
    fn epochs_grow_and_skip_zero() {
        let w = next_grant_word(0, grant::GRANTED);
        assert_eq!(grant::epoch(w), 1);
        assert!(grant::may_submit(w));
        let last = (u32::MAX >> grant::EPOCH_SHIFT) << grant::EPOCH_SHIFT;
        let wrapped = next_grant_word(last, 0);
        assert_eq!(grant::epoch(wrapped), 1);
        assert!(!grant::may_submit(wrapped));
        assert_eq!(next_grant_word(w, 0xffff_fff0) & 3, 0, "only flag bits");
    }

    #[test]
    fn a_gate_refuses_another_allocations_state() {
        let f = files(300_000);
        let dir = tempfile::tempdir().unwrap();
        let other = ControlSpec::new("other", f.control.spec().devices);
        let (_, s2) = create_allocation_files(dir.path(), &other).unwrap();
        let state2: &'static State = Box::leak(Box::new(State::open(&s2, "other").unwrap()));
        let m = member(state2, 17);
        let e = Gate::new(
            f.control,
            state2,
            m,
            Arc::new(FakeDrain::default()),
            Arc::new(|_: &GateEvent| {}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("does not belong"), "{e}");
    }
}
