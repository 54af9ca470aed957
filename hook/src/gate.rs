//! The compute gate's call site: every work-submission wrapper
//! (`cuLaunchKernel*`, `cuLaunchCooperativeKernel*`, `cuGraphLaunch*`,
//! the legacy `cuLaunch*`) calls [`before_submit`] before the driver sees
//! the work, in a governed process that has joined its allocation.
//!
//! The protocol lives in `tessera_shm::gate`; this file supplies what it
//! needs from CUDA: which allocation device the work goes to, and how to
//! wait for the work this process submitted (`CudaDrain`: every context
//! it made on that device, pushed and synchronised with the real driver).
//! The hot path stays two atomic loads (the pause word, then the grant
//! word) when the grant is held: no locks, no system calls, no logging.
//! [`on_join`] is one of the hooks the governor is handed (see
//! `governor::Hooks`): the governor never calls up into this module.

use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use parking_lot::Mutex;
use tessera_ffi::cuda::{
    CUcontext, CUevent, CUgraph, CUgraphNode, CUresult, CUstream, CUstreamCaptureStatus, cuuint64_t,
};
use tessera_shm::gate::{Drain, Gate, GateEvent};
use tessera_shm::layout::MAX_DEVICES;
use tessera_shm::sys::monotonic_ns;

use crate::governor::Governed;
use crate::log::Level;
use crate::pace::{DEFAULT_BUDGET_NS, Pace, Step};
use crate::table::call_real;

/// The process's gate: a leaked `Box<Gate>`, replaced (and the old one
/// leaked) when a forked child joins in a slot of its own.
static GATE: AtomicPtr<Gate> = AtomicPtr::new(null_mut());

/// Decides whether work for `stream` may be submitted now, waiting for the
/// allocation's grant if need be. The gate never refuses: it admits once
/// the grant is held, or once the arbiter is found silent. `gov.member()`
/// is `None` in a forked child that has not called `cuInit` (its driver
/// refuses the work anyway), which passes ungated. `Ok(Some(dev))`: the
/// launch is paced on allocation device `dev`; pass it to [`after_submit`].
#[inline(always)]
pub fn before_submit(gov: &Governed, stream: CUstream) -> Result<Option<usize>, CUresult> {
    let p = GATE.load(Ordering::Acquire);
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: GATE only ever holds a pointer from Box::leak, never freed.
    let gate = unsafe { &*p };
    // A forked child still sees its parent's gate until it joins itself.
    if gov.member() != Some(gate.member()) {
        return Ok(None);
    }
    // A paused allocation (`tessera pause`): the launch waits, it does not
    // fail, until the manager resumes it. One more load of a word that
    // changes only at pause and resume.
    let control = &gov.files.control;
    if control.paused() {
        control.wait_while_paused();
    }
    let Some(dev) = gov.device_of_stream(stream) else {
        return Ok(None);
    };
    // Pace first, the gate after: a launch held by the pacer is still
    // stopped at the gate if the grant was revoked meanwhile.
    let paced = pace_before(gate, dev, stream);
    gate.before_submit(dev);
    if paced {
        pace_start(dev, stream);
    }
    Ok(paced.then_some(dev))
}

/// Called after the driver accepted work that [`before_submit`] let
/// through with `Some(dev)`: records the launch's marker for the pacer.
#[inline]
pub fn after_submit(dev: Option<usize>, stream: CUstream) {
    if let Some(dev) = dev {
        pace_after(dev, stream);
    }
}

/// Runs `wait`, a synchronisation of this process's work on allocation
/// device `dev`, marked as such for the arbiter (see
/// `tessera_shm::gate::Gate::syncing`): a holder waiting on its own work
/// keeps its grant. Ungated processes (no gate, a forked child not yet
/// joined) just wait.
pub fn while_syncing<R>(gov: &Governed, dev: Option<usize>, wait: impl FnOnce() -> R) -> R {
    let p = GATE.load(Ordering::Acquire);
    if p.is_null() {
        return wait();
    }
    // SAFETY: GATE only ever holds a pointer from Box::leak, never freed.
    let gate = unsafe { &*p };
    if gov.member() != Some(gate.member()) {
        return wait();
    }
    gate.syncing(dev, wait)
}

/// Called once a process has joined its allocation (at `cuInit`, and again
/// in a forked child), before its first submission.
pub fn on_join(gov: &Governed) {
    let Some(member) = gov.member() else {
        return;
    };
    let files = gov.files;
    let log = Arc::new(|e: &GateEvent| match e {
        GateEvent::Rejoined { .. } => crate::log!(Level::Info, "compute gate: {e}"),
        _ => crate::log!(Level::Warn, "compute gate: {e}"),
    });
    match Gate::new(
        &files.control,
        &files.state,
        member,
        Arc::new(CudaDrain),
        log,
    ) {
        Ok(g) => {
            // Read once per process, here, never on a launch.
            let budget = std::env::var(ENV_QUEUE_BUDGET)
                .ok()
                .map(|v| parse_budget(&v));
            match budget {
                Some(Err(e)) => crate::log!(Level::Error, "{e}; the queue stays bounded"),
                Some(Ok(ns)) => BUDGET_NS.store(ns, Ordering::Relaxed),
                None => {}
            }
            GATE.store(Box::into_raw(Box::new(g)), Ordering::Release);
        }
        Err(e) => crate::log!(Level::Error, "compute gate not set up: {e}"),
    }
}

/// Waits for this process's work on one device: pushes each of its
/// contexts on that device (those it created and the primary ones it holds)
/// and synchronises it with the real driver.
struct CudaDrain;

impl Drain for CudaDrain {
    fn drain(&self, dev: usize) {
        let Some(g) = crate::governor::governed() else {
            return;
        };
        // Held while synchronising, so no context is destroyed under us.
        let contexts = g.contexts.lock();
        let created = contexts
            .created
            .iter()
            .filter(|(_, (index, _))| *index == Some(dev))
            .map(|(&h, _)| h);
        let primary = contexts
            .primary
            .values()
            .filter(|p| p.refs > 0 && p.index == Some(dev))
            .map(|p| p.ctx);
        for ctx in created.chain(primary) {
            let ctx = ctx as CUcontext;
            if call_real!(cuCtxPushCurrent_v2(ctx)) != CUresult::CUDA_SUCCESS {
                continue;
            }
            let _ = call_real!(cuCtxSynchronize());
            let mut popped: CUcontext = null_mut();
            let _ = call_real!(cuCtxPopCurrent_v2(&mut popped));
        }
    }

    /// When the last paced launch on `dev` ended, on CLOCK_MONOTONIC: the
    /// device's own timestamps, anchored to the host clock by an event
    /// recorded now, on an idle device (the drain just returned), whose
    /// timestamp is no earlier than the clock read before it. So the
    /// answer is the marker's end or up to a few µs before it, never
    /// after: a pre-armed next holder is charged from here, and an early
    /// answer only charges it a little more. Work launched unpaced after
    /// the last marker makes the answer earlier still, the same way.
    fn ended_at(&self, dev: usize) -> Option<u64> {
        if dev >= MAX_DEVICES {
            return None;
        }
        let mut guard = PACED[dev].lock();
        let p = guard.as_mut()?;
        let last = p.markers.last()?.ev;
        let probe = take_event(p)?;
        let ctx = p.ctx;
        let mut ended = None;
        if call_real!(cuCtxPushCurrent_v2(ctx)) == CUresult::CUDA_SUCCESS {
            let before = monotonic_ns();
            // The legacy default stream: the drain left nothing in flight,
            // so the probe completes at once.
            if call_real!(cuEventRecord(probe, null_mut())) == CUresult::CUDA_SUCCESS
                && call_real!(cuEventSynchronize(probe)) == CUresult::CUDA_SUCCESS
            {
                let mut ms = 0f32;
                if call_real!(cuEventElapsedTime(&mut ms, last, probe)) == CUresult::CUDA_SUCCESS
                    && ms >= 0.0
                {
                    ended = Some(before.saturating_sub((f64::from(ms) * 1e6) as u64));
                }
            }
            let mut popped: CUcontext = null_mut();
            let _ = call_real!(cuCtxPopCurrent_v2(&mut popped));
        }
        p.spare.push(probe);
        ended
    }
}

/// The pacer's budget, in the process's environment (`250us`, or `0` to
/// turn the queue bound off): a tenant's setting, so it only changes how
/// long the tenant's own drains take, which the arbiter charges to it.
pub const ENV_QUEUE_BUDGET: &str = "TESSERA_QUEUE_BUDGET";

/// The budget in force (ns); 0: launches are not paced.
static BUDGET_NS: AtomicU64 = AtomicU64::new(DEFAULT_BUDGET_NS);

fn parse_budget(v: &str) -> Result<u64, String> {
    let t = v.trim();
    if t == "0" {
        return Ok(0);
    }
    tessera_contract::units::parse_duration(t)
        .ok()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .filter(|&ns| ns <= 1_000_000_000)
        .ok_or_else(|| format!("{ENV_QUEUE_BUDGET}={v:?}: a duration up to 1s, or 0"))
}

/// A launch's marker: an event recorded after it on its stream.
#[derive(Debug)]
struct Marker {
    ev: CUevent,
    /// Queued while the launch before it was in flight (back to back).
    behind: bool,
    /// Its length was learned already.
    learned: bool,
    /// An event recorded just before the launch when nothing of the
    /// process's was in flight: the launch's length is then the time
    /// between the two (a holder whose kernels outlast its quantum never
    /// queues one behind another within a grant, so this is how it learns).
    start: Option<CUevent>,
}

/// One device's pacing in this process: the decision, the markers of the
/// latest launches (at most `MAX_IN_FLIGHT + 1`), spare events, and the context they
/// belong to (events are per context; a new current context starts over).
#[derive(Debug)]
struct Paced {
    pace: Pace,
    markers: Vec<Marker>,
    spare: Vec<CUevent>,
    ctx: CUcontext,
    /// The start event of the launch being submitted (see [`Marker::start`]).
    pending_start: Option<CUevent>,
}

// SAFETY: the raw handles are driver handles, valid from any thread of the
// process; the struct is only used under its mutex.
unsafe impl Send for Paced {}

static PACED: [Mutex<Option<Paced>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];

fn event_done(ev: CUevent) -> bool {
    // Any answer but "not ready" (an error included) counts as done: a
    // marker the driver cannot answer for must not hold launches.
    call_real!(cuEventQuery(ev)) != CUresult::CUDA_ERROR_NOT_READY
}

fn capturing(stream: CUstream) -> bool {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cuuint64_t = 0;
    let mut graph: CUgraph = null_mut();
    let mut deps: *const CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    let r = call_real!(cuStreamGetCaptureInfo_v2(
        stream,
        &mut status,
        &mut id,
        &mut graph,
        &mut deps,
        &mut n
    ));
    r != CUresult::CUDA_SUCCESS || status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// Before a launch on allocation device `dev`: holds it while the process
/// has more queued than the budget allows (see `pace.rs`). Returns whether
/// the launch is paced (its marker is to be recorded after it).
fn pace_before(gate: &Gate, dev: usize, stream: CUstream) -> bool {
    let budget = BUDGET_NS.load(Ordering::Relaxed);
    if budget == 0 || dev >= MAX_DEVICES || capturing(stream) {
        // Work captured into a graph runs when the graph is launched, and
        // querying an event recorded in a capture would break the capture.
        return false;
    }
    let mut ctx: CUcontext = null_mut();
    if call_real!(cuCtxGetCurrent(&mut ctx)) != CUresult::CUDA_SUCCESS || ctx.is_null() {
        return false;
    }
    loop {
        let mut guard = PACED[dev].lock();
        let p = guard.get_or_insert_with(|| Paced {
            pace: Pace::new(budget),
            markers: Vec::new(),
            spare: Vec::new(),
            ctx,
            pending_start: None,
        });
        if p.ctx != ctx {
            // Another context: its events cannot mark this one's streams.
            for m in p.markers.drain(..) {
                let _ = call_real!(cuEventDestroy_v2(m.ev));
                if let Some(s) = m.start {
                    let _ = call_real!(cuEventDestroy_v2(s));
                }
            }
            for ev in p.spare.drain(..).chain(p.pending_start.take()) {
                let _ = call_real!(cuEventDestroy_v2(ev));
            }
            p.ctx = ctx;
        }
        let done: Vec<bool> = p.markers.iter().map(|m| event_done(m.ev)).collect();
        for (i, &finished) in done.iter().enumerate() {
            let m = &p.markers[i];
            if !finished || m.learned {
                continue;
            }
            let from = match (m.start, i.checked_sub(1)) {
                (Some(s), _) => Some(s),
                (None, Some(j)) if m.behind => Some(p.markers[j].ev),
                _ => None,
            };
            if let Some(from) = from {
                let mut ms = 0f32;
                let r = call_real!(cuEventElapsedTime(&mut ms, from, p.markers[i].ev));
                if r == CUresult::CUDA_SUCCESS && ms > 0.0 {
                    p.pace.learned((f64::from(ms) * 1e6) as u64);
                }
                p.markers[i].learned = true;
            }
        }
        let in_flight = done.iter().filter(|d| !**d).count();
        let now = monotonic_ns();
        match p.pace.before(now, in_flight, gate.grant_until(dev)) {
            Step::Go => return true,
            Step::WaitOlder => {
                // Completion is in order (one engine, FIFO): the first
                // marker not done is the oldest launch in flight.
                let Some(i) = done.iter().position(|d| !*d) else {
                    return true;
                };
                let ev = p.markers[i].ev;
                drop(guard);
                // Waiting on its own work: the holder keeps its grant.
                gate.syncing(Some(dev), || call_real!(cuEventSynchronize(ev)));
            }
            Step::HoldUntil(t) => {
                drop(guard);
                gate.syncing(Some(dev), || hold_until(t));
            }
        }
    }
}

/// Sleeps until CLOCK_MONOTONIC `t` with a 1 µs timer slack (the default
/// 50 µs would eat a fifth of the budget), put back after. HIP's pacer
/// holds with it too.
pub(crate) fn hold_until(t: u64) {
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

/// Just before a paced launch on `dev`, after the gate: when nothing of the
/// process's is in flight there, records the start event the launch's
/// length will be measured from.
fn pace_start(dev: usize, stream: CUstream) {
    let mut guard = PACED[dev].lock();
    let Some(p) = guard.as_mut() else {
        return;
    };
    if let Some(old) = p.pending_start.take() {
        p.spare.push(old);
    }
    if p.markers.last().is_some_and(|m| !event_done(m.ev)) {
        return;
    }
    let Some(ev) = take_event(p) else {
        return;
    };
    if call_real!(cuEventRecord(ev, stream)) == CUresult::CUDA_SUCCESS {
        p.pending_start = Some(ev);
    } else {
        p.spare.push(ev);
    }
}

/// A spare event of the pacer's context, or a new one (timing on: the
/// elapsed time between markers is how launch lengths are learned).
fn take_event(p: &mut Paced) -> Option<CUevent> {
    if let Some(ev) = p.spare.pop() {
        return Some(ev);
    }
    let mut ev: CUevent = null_mut();
    (call_real!(cuEventCreate(&mut ev, 0)) == CUresult::CUDA_SUCCESS).then_some(ev)
}

/// After a paced launch on `dev`: records its marker on `stream`, and
/// whether the launch was queued behind the last one (judged now, after
/// the gate: a launch that waited there for a grant did not follow its
/// predecessor, and must not teach the pacer a length of that wait).
fn pace_after(dev: usize, stream: CUstream) {
    let mut guard = PACED[dev].lock();
    let Some(p) = guard.as_mut() else {
        return;
    };
    let behind = p.markers.last().is_some_and(|m| !event_done(m.ev));
    p.pace.launched(monotonic_ns(), behind);
    let start = p.pending_start.take();
    let Some(ev) = take_event(p) else {
        p.spare.extend(start);
        return;
    };
    if call_real!(cuEventRecord(ev, stream)) != CUresult::CUDA_SUCCESS {
        // A stream of another context, say: this launch goes unmarked.
        p.spare.push(ev);
        p.spare.extend(start);
        return;
    }
    p.markers.push(Marker {
        ev,
        behind,
        learned: false,
        start,
    });
    while p.markers.len() > crate::pace::MAX_IN_FLIGHT + 1 {
        let m = p.markers.remove(0);
        p.spare.push(m.ev);
        p.spare.extend(m.start);
    }
}
