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
use std::sync::atomic::{AtomicPtr, Ordering};

use tessera_ffi::cuda::{
    CUcontext, CUevent, CUgraph, CUgraphNode, CUresult, CUstream, CUstreamCaptureStatus, cuuint64_t,
};
use tessera_shm::gate::{Drain, Gate, GateEvent};

use crate::governor::Governed;
use crate::log::Level;
use crate::pacer::{Events, Pacer};
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
    // After the gate, the launch takes its number among the allocation's;
    // if another process's launch took one since the pacer decided, the
    // decision is made again with it counted (see `Pacer::start`).
    let paced = loop {
        let paced = PACER.before(gate, dev, stream);
        gate.before_submit(dev);
        if !paced || PACER.start(gate, dev, stream) {
            break paced;
        }
    };
    Ok(paced.then_some(dev))
}

/// Called after the driver accepted work that [`before_submit`] let
/// through with `Some(dev)`: records the launch's marker for the pacer.
#[inline]
pub fn after_submit(dev: Option<usize>, stream: CUstream) {
    if let Some(dev) = dev {
        PACER.after(dev, stream);
    }
}

/// Runs `wait`, a synchronisation of this process's work on allocation
/// device `dev`, marked as such for the arbiter (see
/// `tessera_shm::gate::Gate::syncing`): a holder waiting on its own work
/// keeps its grant. Ungated processes (no gate, a forked child not yet
/// joined) just wait.
pub fn while_syncing<R>(
    gov: &Governed,
    dev: Option<usize>,
    awaits: Awaits,
    wait: impl FnOnce() -> R,
) -> R {
    let p = GATE.load(Ordering::Acquire);
    if p.is_null() {
        return wait();
    }
    // SAFETY: GATE only ever holds a pointer from Box::leak, never freed.
    let gate = unsafe { &*p };
    if gov.member() != Some(gate.member()) {
        return wait();
    }
    let r = if leave_as_sync_begins(gate, dev, awaits, |d| PACER.settle(gate, d)) {
        // Not marked as a synchronisation: the grant is given back.
        wait()
    } else {
        gate.syncing(dev, wait)
    };
    // Back on the host: a program whose host part is long gives its grant
    // back now rather than after the arbiter's idle release.
    if let Some(d) = dev {
        gate.synced(d, PACER.idle(d));
    }
    r
}

/// What a synchronisation waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaits {
    /// All the work of a stream, a context or a device: a step's
    /// `loss.item()`, after which its host part begins.
    Work,
    /// One event, which may be long done: a program bounding how far it
    /// runs ahead waits on the event of a launch some launches back, before
    /// its next launch. Never a reason to leave.
    Event,
}

/// Before a synchronisation on `dev` followed by a host part the process
/// learned is long: once at most its last kernel is in flight (`settle`,
/// the pacer's), it gives its grant back as the wait begins
/// (`Gate::leave`), so that the arbiter's wake-up and the next holder's
/// overlap that kernel. Returns whether it left; either vendor's gate.
pub(crate) fn leave_as_sync_begins(
    gate: &Gate,
    dev: Option<usize>,
    awaits: Awaits,
    settle: impl FnOnce(usize) -> bool,
) -> bool {
    match dev {
        Some(d) if awaits == Awaits::Work && gate.would_leave(d) && settle(d) => {
            gate.leave(d);
            true
        }
        _ => false,
    }
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
            crate::pacer::read_settings();
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

    fn ended_at(&self, dev: usize) -> Option<u64> {
        PACER.ended_at(dev)
    }
}

/// The pacer's CUDA side: events belong to a context (the current one).
pub(crate) struct CudaEvents;

// SAFETY: CUDA event handles are valid from any thread of the process.
unsafe impl Events for CudaEvents {
    type Event = CUevent;
    type Stream = CUstream;
    type Owner = CUcontext;

    fn owner() -> Option<CUcontext> {
        let mut ctx: CUcontext = null_mut();
        let r = call_real!(cuCtxGetCurrent(&mut ctx));
        (r == CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
    }

    fn capturing(stream: CUstream) -> bool {
        // Unknown (an error) counts as capturing, as does an invalidated
        // capture: nothing is recorded into what may be one.
        capture_status(stream)
            .is_none_or(|(s, _)| s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn create() -> Option<CUevent> {
        let mut ev: CUevent = null_mut();
        (call_real!(cuEventCreate(&mut ev, 0)) == CUresult::CUDA_SUCCESS).then_some(ev)
    }

    fn destroy(ev: CUevent) {
        let _ = call_real!(cuEventDestroy_v2(ev));
    }

    fn record(ev: CUevent, stream: CUstream) -> bool {
        call_real!(cuEventRecord(ev, stream)) == CUresult::CUDA_SUCCESS
    }

    fn done(ev: CUevent) -> bool {
        call_real!(cuEventQuery(ev)) != CUresult::CUDA_ERROR_NOT_READY
    }

    fn elapsed_ns(from: CUevent, to: CUevent) -> Option<u64> {
        let mut ms = 0f32;
        let r = call_real!(cuEventElapsedTime(&mut ms, from, to));
        (r == CUresult::CUDA_SUCCESS && ms > 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn synchronize(ev: CUevent) {
        let _ = call_real!(cuEventSynchronize(ev));
    }

    fn probe(ctx: CUcontext, ev: CUevent) -> bool {
        if call_real!(cuCtxPushCurrent_v2(ctx)) != CUresult::CUDA_SUCCESS {
            return false;
        }
        // The legacy default stream: the drain left nothing in flight.
        let done = call_real!(cuEventRecord(ev, null_mut())) == CUresult::CUDA_SUCCESS
            && call_real!(cuEventSynchronize(ev)) == CUresult::CUDA_SUCCESS;
        let mut popped: CUcontext = null_mut();
        let _ = call_real!(cuCtxPopCurrent_v2(&mut popped));
        done
    }
}

static PACER: Pacer<CudaEvents> = Pacer::new();

/// `stream`'s capture status and graph, `None` when the driver cannot say
/// (the pool admission and the pacer read it differently). Here, below the
/// CUDA wrappers, so the gate never calls up into them.
pub(crate) fn capture_status(stream: CUstream) -> Option<(CUstreamCaptureStatus, CUgraph)> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cuuint64_t = 0;
    let mut graph: CUgraph = std::ptr::null_mut();
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
    (r == CUresult::CUDA_SUCCESS).then_some((status, graph))
}
