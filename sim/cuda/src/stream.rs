//! Streams and events. A stream is a completion time: work queued on it ends no earlier
//! than the last work queued before it (the device engine is FIFO), so synchronising a
//! stream is sleeping until its last queued work ends, and an event is the completion time
//! of its stream's work when it was recorded.
//!
//! Also here: stream callbacks (`cuStreamAddCallback`) and the thread's stream-capture
//! mode (`cuThreadExchangeStreamCaptureMode`).

use std::cell::{Cell, RefCell};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_ffi::cuda::*;
use tessera_sim::clock::now_ns;

use crate::context::Context;
use crate::registry::{Registry, handle_of};
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, guard, put, put_opt};

pub static STREAMS: Registry<Stream> = Registry::new();
pub static EVENTS: Registry<Event> = Registry::new();
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// What every stream (legacy, per-thread, created) tracks.
#[derive(Debug)]
pub struct StreamState {
    pub id: u64,
    /// Completion time (CLOCK_MONOTONIC ns) of the last work queued on the stream.
    pub last_end: AtomicU64,
    /// The capture in progress on the stream, if any.
    pub capture: Mutex<Option<Capture>>,
    /// Whether `capture` holds one: read without the lock on every launch.
    pub capturing: AtomicBool,
}

/// A stream capture: the graph being built and the node later work depends on.
#[derive(Debug)]
pub struct Capture {
    pub graph: usize,
    pub id: u64,
    /// The last captured node (captured work is a chain), as a one-element array so
    /// `cuStreamGetCaptureInfo` can hand out a pointer to it.
    pub deps: Vec<usize>,
}

static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

impl StreamState {
    fn capture(&self) -> MutexGuard<'_, Option<Capture>> {
        self.capture.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for StreamState {
    fn default() -> Self {
        StreamState {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            last_end: AtomicU64::new(0),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        }
    }
}

/// A stream made by `cuStreamCreate*` (or a thread's per-thread default stream).
#[derive(Debug)]
pub struct Stream {
    pub ctx: Arc<Context>,
    pub flags: u32,
    pub priority: i32,
    pub state: StreamState,
}

/// The stream a call names, resolved.
#[derive(Debug)]
pub enum Target {
    /// A context's legacy default stream.
    Legacy(Arc<Context>),
    Stream(Arc<Stream>),
}

impl Target {
    #[inline]
    pub fn ctx(&self) -> &Arc<Context> {
        match self {
            Target::Legacy(c) => c,
            Target::Stream(s) => &s.ctx,
        }
    }

    #[inline]
    pub fn state(&self) -> &StreamState {
        match self {
            Target::Legacy(c) => &c.legacy,
            Target::Stream(s) => &s.state,
        }
    }

    /// Queues work of `duration_ns` on the stream's device and returns its completion time.
    /// On a capturing stream the work becomes a node of the captured graph instead (it
    /// runs when the graph is launched).
    #[inline]
    pub fn submit(&self, rt: &Runtime, duration_ns: u64) -> CuResult<u64> {
        let ctx = self.ctx();
        ctx.check()?;
        if let Some(graph) = self.capturing() {
            let node = crate::graph::add_work_node(graph, &self.capture_deps(), duration_ns)?;
            self.captured(node);
            return Ok(self.last_end());
        }
        rt.check_device(ctx.device)?;
        let (_, end) = rt.node.schedule_after_gap(
            rt.slot,
            ctx.device,
            now_ns(),
            duration_ns,
            rt.costs.kernel_gap_ns,
        );
        self.state().last_end.fetch_max(end, Ordering::AcqRel);
        ctx.note_end(end);
        Ok(end)
    }

    /// Completion time of everything queued on the stream so far.
    pub fn last_end(&self) -> u64 {
        self.state().last_end.load(Ordering::Acquire)
    }

    /// The graph being captured on this stream, if any.
    #[inline]
    pub fn capturing(&self) -> Option<usize> {
        if !self.state().capturing.load(Ordering::Acquire) {
            return None;
        }
        self.state().capture().as_ref().map(|c| c.graph)
    }

    /// What a node captured now depends on.
    pub fn capture_deps(&self) -> Vec<CUgraphNode> {
        self.state()
            .capture()
            .as_ref()
            .map(|c| c.deps.iter().map(|&d| d as CUgraphNode).collect())
            .unwrap_or_default()
    }

    /// A node was added to the capture: later captured work depends on it.
    pub fn captured(&self, node: CUgraphNode) {
        if let Some(c) = self.state().capture().as_mut() {
            c.deps = vec![node as usize];
        }
    }

    /// Waits for the stream's work; a synchronisation point for memory pools.
    pub fn synchronize(&self, rt: &Runtime) -> CuResult<()> {
        self.ctx().check()?;
        if self.capturing().is_some() {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        rt.costs.wait_for(self.last_end());
        crate::memory::trim_pools_after_sync(rt, self.ctx().device);
        Ok(())
    }

    /// The handle a program would use for this stream.
    pub fn handle(&self) -> CUstream {
        match self {
            Target::Legacy(_) => std::ptr::null_mut(),
            Target::Stream(s) => handle_of(s) as CUstream,
        }
    }
}

thread_local! {
    /// This thread's per-thread default stream of each context it used one in.
    static PER_THREAD: RefCell<Vec<Arc<Stream>>> = const { RefCell::new(Vec::new()) };
}

fn per_thread(ctx: Arc<Context>) -> CuResult<Target> {
    PER_THREAD
        .try_with(|v| {
            let mut v = v.borrow_mut();
            if let Some(s) = v.iter().find(|s| Arc::ptr_eq(&s.ctx, &ctx)) {
                return Target::Stream(s.clone());
            }
            v.retain(|s| s.ctx.check().is_ok());
            let s = Arc::new(Stream {
                ctx,
                flags: 0,
                priority: 0,
                state: StreamState::default(),
            });
            v.push(s.clone());
            Target::Stream(s)
        })
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// Resolves a stream argument. `NULL` is the legacy default stream, or the per-thread one
/// for the `_ptsz`/`_ptds` entry points (`per_thread_default`); `CU_STREAM_LEGACY` and
/// `CU_STREAM_PER_THREAD` name those explicitly; anything else must be a live stream.
#[inline]
pub fn resolve(h: CUstream, per_thread_default: bool) -> CuResult<Target> {
    match h as usize {
        0 if per_thread_default => per_thread(current()?),
        0 | 1 => Ok(Target::Legacy(current()?)),
        2 => per_thread(current()?),
        other => {
            let s = STREAMS.lookup(other)?;
            s.ctx.check()?;
            Ok(Target::Stream(s))
        }
    }
}

/// Drops the streams and events of a destroyed context.
pub fn destroy_context_objects(ctx_id: u64) {
    STREAMS.remove_where(|s| s.ctx.id == ctx_id);
    EVENTS.remove_where(|e| e.ctx.id == ctx_id);
}

fn stream_create(ph: *mut CUstream, flags: c_uint, priority: i32) -> CuResult<()> {
    rt()?;
    let ctx = current()?;
    if flags & !CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0 || ph.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let s = Arc::new(Stream {
        ctx,
        flags,
        // Out-of-range priorities are clamped, as the driver does.
        priority: priority.clamp(-5, 0),
        state: StreamState::default(),
    });
    let h = STREAMS.insert(s);
    // SAFETY: checked non-null; the caller passes a writable CUstream.
    unsafe { ph.write(h as CUstream) };
    Ok(())
}

/// `cuStreamCreate`.
///
/// # Safety
/// `phStream` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(phStream: *mut CUstream, Flags: c_uint) -> CUresult {
    guard(|| stream_create(phStream, Flags, 0))
}

/// `cuStreamCreateWithPriority`.
///
/// # Safety
/// `phStream` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    phStream: *mut CUstream,
    flags: c_uint,
    priority: i32,
) -> CUresult {
    guard(|| stream_create(phStream, flags, priority))
}

/// Drops a stream's or event's handle (`cuStreamDestroy`, `cuEventDestroy`): only the
/// handle goes (a stream's pending work still completes on the device).
fn destroy<T>(registry: &Registry<T>, h: usize) -> CuResult<()> {
    rt()?;
    registry.take(h).map(|_| ())
}

tessera_sim::exports! {
    /// `cuStreamDestroy`, `cuStreamDestroy_v2`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    fn [cuStreamDestroy, cuStreamDestroy_v2](hStream: CUstream) -> CUresult {
        guard(|| destroy(&STREAMS, hStream as usize))
    }
}

macro_rules! stream_fn {
    ($(#[$doc:meta])* fn $name:ident / $ptsz:ident ($($arg:ident : $ty:ty),*) => $body:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Pointer arguments must be null or valid for the access the driver API defines.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(hStream: CUstream $(, $arg: $ty)*) -> CUresult {
            guard(|| {
                let rt = rt()?;
                let t = resolve(hStream, false)?;
                #[allow(clippy::redundant_closure_call)]
                ($body)(rt, t)
            })
        }

        /// The per-thread-default-stream variant.
        ///
        /// # Safety
        /// As the legacy-stream variant.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $ptsz(hStream: CUstream $(, $arg: $ty)*) -> CUresult {
            guard(|| {
                let rt = rt()?;
                let t = resolve(hStream, true)?;
                #[allow(clippy::redundant_closure_call)]
                ($body)(rt, t)
            })
        }
    };
}

stream_fn! {
    /// `cuStreamSynchronize`: sleeps until the stream's queued work has ended.
    fn cuStreamSynchronize / cuStreamSynchronize_ptsz () => |rt: &Runtime, t: Target| t.synchronize(rt)
}

stream_fn! {
    /// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while queued work has not ended.
    fn cuStreamQuery / cuStreamQuery_ptsz () => |rt: &Runtime, t: Target| {
        rt.check_device(t.ctx().device)?;
        if now_ns() >= t.last_end() { Ok(()) } else { Err(CUresult::CUDA_ERROR_NOT_READY) }
    }
}

stream_fn! {
    /// `cuStreamWaitEvent`: later work on the stream waits for the event.
    fn cuStreamWaitEvent / cuStreamWaitEvent_ptsz (hEvent: CUevent, Flags: c_uint) => |_rt: &Runtime, t: Target| {
        if Flags & !1 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let e = EVENTS.lookup(hEvent as usize)?;
        let time = e.time();
        t.state().last_end.fetch_max(time, Ordering::AcqRel);
        t.ctx().note_end(time);
        Ok(())
    }
}

stream_fn! {
    /// `cuStreamGetCtx`.
    fn cuStreamGetCtx / cuStreamGetCtx_ptsz (pctx: *mut CUcontext) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pctx, handle_of(t.ctx()) as CUcontext) }
    }
}

stream_fn! {
    /// `cuStreamGetCtx_v2`: no green contexts here, so `*pGreenCtx` is always NULL.
    fn cuStreamGetCtx_v2 / cuStreamGetCtx_v2_ptsz (pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(pCtx, handle_of(t.ctx()) as CUcontext)?;
            put(pGreenCtx, std::ptr::null_mut())
        }
    }
}

stream_fn! {
    /// `cuStreamGetDevice`.
    fn cuStreamGetDevice / cuStreamGetDevice_ptsz (device: *mut CUdevice) => |rt: &Runtime, t: Target| {
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(device, rt.ordinal(t.ctx().device)) }
    }
}

stream_fn! {
    /// `cuStreamGetFlags`.
    fn cuStreamGetFlags / cuStreamGetFlags_ptsz (flags: *mut c_uint) => |_rt: &Runtime, t: Target| {
        let f = match &t { Target::Legacy(_) => 0, Target::Stream(s) => s.flags };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(flags, f) }
    }
}

stream_fn! {
    /// `cuStreamGetPriority`.
    fn cuStreamGetPriority / cuStreamGetPriority_ptsz (priority: *mut i32) => |_rt: &Runtime, t: Target| {
        let p = match &t { Target::Legacy(_) => 0, Target::Stream(s) => s.priority };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(priority, p) }
    }
}

stream_fn! {
    /// `cuStreamGetId`.
    fn cuStreamGetId / cuStreamGetId_ptsz (streamId: *mut u64) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(streamId, t.state().id) }
    }
}

fn capture_status(t: &Target) -> CUstreamCaptureStatus {
    if t.capturing().is_some() {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    } else {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    }
}

stream_fn! {
    /// `cuStreamIsCapturing`.
    fn cuStreamIsCapturing / cuStreamIsCapturing_ptsz (captureStatus: *mut CUstreamCaptureStatus) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(captureStatus, capture_status(&t)) }
    }
}

fn begin_capture(t: &Target, mode: CUstreamCaptureMode) -> CuResult<()> {
    if mode.0 > 2 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // As the driver: the legacy default stream cannot be captured.
    if matches!(t, Target::Legacy(_)) {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut c = t.state().capture();
    if c.is_some() {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    let graph = crate::graph::GRAPHS.insert(Arc::new(crate::graph::Graph::default()));
    *c = Some(Capture {
        graph,
        id: NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed),
        deps: Vec::new(),
    });
    t.state().capturing.store(true, Ordering::Release);
    Ok(())
}

stream_fn! {
    /// `cuStreamBeginCapture_v2`: stream-ordered allocations and frees on the stream
    /// become graph memory nodes until `cuStreamEndCapture` (kernels launched meanwhile
    /// still run at once: see docs/simulator.md).
    fn cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz (mode: CUstreamCaptureMode) => |_rt: &Runtime, t: Target| {
        begin_capture(&t, mode)
    }
}

stream_fn! {
    /// `cuStreamBeginCapture` (CUDA 10.0: global mode).
    fn cuStreamBeginCapture / cuStreamBeginCapture_ptsz () => |_rt: &Runtime, t: Target| {
        begin_capture(&t, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
    }
}

stream_fn! {
    /// `cuStreamEndCapture`: the captured graph.
    fn cuStreamEndCapture / cuStreamEndCapture_ptsz (phGraph: *mut CUgraph) => |_rt: &Runtime, t: Target| {
        if phGraph.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let c = t.state().capture().take().ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
        t.state().capturing.store(false, Ordering::Release);
        // SAFETY: checked non-null above.
        unsafe { phGraph.write(c.graph as CUgraph) };
        Ok(())
    }
}

stream_fn! {
    /// `cuStreamGetCaptureInfo` (CUDA 10.1).
    fn cuStreamGetCaptureInfo / cuStreamGetCaptureInfo_ptsz (status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t) => |_rt: &Runtime, t: Target| {
        let cid = t.state().capture().as_ref().map_or(0, |c| c.id);
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(status, capture_status(&t))? };
        if !id.is_null() && cid != 0 {
            // SAFETY: non-null, writable by the caller's contract.
            unsafe { id.write(cid) };
        }
        Ok(())
    }
}

/// The outputs `cuStreamGetCaptureInfo_v2` and `_v3` share: the capture status and, while
/// the stream captures, its id, graph and dependencies, each where its pointer is non-null.
///
/// # Safety
/// `status` must be null (rejected) or writable; the others null or writable.
unsafe fn put_capture_info(
    t: &Target,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    ndeps: *mut usize,
) -> CuResult<()> {
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(status, capture_status(t))? };
    let c = t.state().capture();
    if let Some(c) = c.as_ref() {
        // SAFETY: each optional output is written only when non-null (writable by contract).
        unsafe {
            put_opt(id, c.id);
            put_opt(graph, c.graph as CUgraph);
            // A CUgraphNode is a pointer-sized handle, as the usize the array holds.
            put_opt(deps, c.deps.as_ptr().cast());
            put_opt(ndeps, c.deps.len());
        }
    }
    Ok(())
}

stream_fn! {
    /// `cuStreamGetCaptureInfo_v2`: the dependency array stays valid until the next
    /// capture operation on the stream, as the driver's.
    fn cuStreamGetCaptureInfo_v2 / cuStreamGetCaptureInfo_v2_ptsz (status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t, graph: *mut CUgraph, deps: *mut *const CUgraphNode, ndeps: *mut usize) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller's pointers, null or writable (a null status is rejected).
        unsafe { put_capture_info(&t, status, id, graph, deps, ndeps) }
    }
}

stream_fn! {
    /// `cuStreamGetCaptureInfo_v3`: as `_v2`; captured dependencies carry no edge data.
    fn cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz (status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t, graph: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const CUgraphEdgeData, ndeps: *mut usize) => |_rt: &Runtime, t: Target| {
        // SAFETY: the caller's pointers, null or writable (a null status is rejected).
        unsafe { put_capture_info(&t, status, id, graph, deps, ndeps)? };
        if !edges.is_null() {
            // SAFETY: non-null, writable by the caller's contract.
            unsafe { edges.write(std::ptr::null()) };
        }
        Ok(())
    }
}

// ---- events ----

/// An event: the completion time of its stream's work when last recorded.
#[derive(Debug)]
pub struct Event {
    pub ctx: Arc<Context>,
    pub flags: u32,
    /// CLOCK_MONOTONIC ns at which the recorded work completes; 0 before the first record.
    /// Unused by interprocess events, whose time lives in `shared`.
    pub time: AtomicU64,
    /// An interprocess event's time, in a page other processes map (`cuIpcOpenEventHandle`).
    pub shared: Option<crate::ipc::SharedTime>,
}

impl Event {
    /// The completion time of the last recorded work (0: never recorded).
    pub fn time(&self) -> u64 {
        match &self.shared {
            Some(s) => s.word().load(Ordering::Acquire),
            None => self.time.load(Ordering::Acquire),
        }
    }

    pub fn set_time(&self, t: u64) {
        match &self.shared {
            Some(s) => s.word().store(t, Ordering::Release),
            None => self.time.store(t, Ordering::Release),
        }
    }
}

const EVENT_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// `cuEventCreate`.
///
/// # Safety
/// `phEvent` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult {
    guard(|| {
        rt()?;
        let ctx = current()?;
        let interprocess = CUevent_flags::CU_EVENT_INTERPROCESS.0;
        let disable_timing = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        if Flags & !EVENT_FLAGS != 0
            || (Flags & interprocess != 0 && Flags & disable_timing == 0)
            || phEvent.is_null()
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let shared = if Flags & interprocess != 0 {
            Some(crate::ipc::SharedTime::create()?)
        } else {
            None
        };
        let h = EVENTS.insert(Arc::new(Event {
            ctx,
            flags: Flags,
            time: AtomicU64::new(0),
            shared,
        }));
        // SAFETY: checked non-null above.
        unsafe { phEvent.write(h as CUevent) };
        Ok(())
    })
}

tessera_sim::exports! {
    /// `cuEventDestroy`, `cuEventDestroy_v2`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    fn [cuEventDestroy, cuEventDestroy_v2](hEvent: CUevent) -> CUresult {
        guard(|| destroy(&EVENTS, hEvent as usize))
    }
}

fn record(h: CUevent, stream: CUstream, per_thread: bool, flags: c_uint) -> CuResult<()> {
    let rt = rt()?;
    if flags & !1 != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let e = EVENTS.lookup(h as usize)?;
    let t = resolve(stream, per_thread)?;
    if t.ctx().device != e.ctx.device {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    rt.check_device(t.ctx().device)?;
    e.set_time(t.last_end().max(now_ns()).max(1));
    Ok(())
}

/// `cuEventRecord`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult {
    guard(|| record(hEvent, hStream, false, 0))
}

/// `cuEventRecord_ptsz`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(hEvent: CUevent, hStream: CUstream) -> CUresult {
    guard(|| record(hEvent, hStream, true, 0))
}

/// `cuEventRecordWithFlags`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    hEvent: CUevent,
    hStream: CUstream,
    flags: c_uint,
) -> CUresult {
    guard(|| record(hEvent, hStream, false, flags))
}

/// `cuEventRecordWithFlags_ptsz`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    hEvent: CUevent,
    hStream: CUstream,
    flags: c_uint,
) -> CUresult {
    guard(|| record(hEvent, hStream, true, flags))
}

/// `cuEventQuery`: an event never recorded counts as complete.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(hEvent: CUevent) -> CUresult {
    guard(|| {
        rt()?;
        let e = EVENTS.lookup(hEvent as usize)?;
        if now_ns() >= e.time() {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    })
}

/// `cuEventSynchronize`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(hEvent: CUevent) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let e = EVENTS.lookup(hEvent as usize)?;
        rt.check_device(e.ctx.device)?;
        rt.costs.wait_for(e.time());
        // A synchronisation point for memory pools, as stream and context syncs are.
        crate::memory::trim_pools_after_sync(rt, e.ctx.device);
        Ok(())
    })
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> CuResult<()> {
    rt()?;
    if ms.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let a = EVENTS.lookup(start as usize)?;
    let b = EVENTS.lookup(end as usize)?;
    let no_timing = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    if (a.flags | b.flags) & no_timing != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let (ta, tb) = (a.time(), b.time());
    if ta == 0 || tb == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    if now_ns() < ta.max(tb) {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    let v = (tb as i128 - ta as i128) as f64 / 1e6;
    // SAFETY: checked non-null above.
    unsafe { ms.write(v as f32) };
    Ok(())
}

tessera_sim::exports! {
    /// `cuEventElapsedTime`, `cuEventElapsedTime_v2`: ms between two recorded, completed events.
    ///
    /// # Safety
    /// `pMilliseconds` must be null or writable.
    fn [cuEventElapsedTime, cuEventElapsedTime_v2](
        pMilliseconds: *mut f32,
        hStart: CUevent,
        hEnd: CUevent,
    ) -> CUresult {
        guard(|| elapsed(pMilliseconds, hStart, hEnd))
    }
}

crate::ptsz_exports! {
    /// `cuStreamAddCallback`: runs `callback(stream, CUDA_SUCCESS, userData)` once the stream's
    /// earlier work has ended, on the calling thread (as `cuLaunchHostFunc` does here).
    /// `flags` must be 0.
    ///
    /// # Safety
    /// `callback` must be a valid stream callback for `userData`.
    fn cuStreamAddCallback / cuStreamAddCallback_ptsz [per_thread](
        hStream: CUstream,
        callback: CUstreamCallback,
        userData: *mut c_void,
        flags: c_uint,
    ) -> CUresult {
        guard(|| stream_callback(hStream, callback, userData, flags, per_thread))
    }
}

fn stream_callback(
    stream: CUstream,
    callback: CUstreamCallback,
    user: *mut c_void,
    flags: c_uint,
    per_thread: bool,
) -> CuResult<()> {
    let rt = rt()?;
    let f = callback.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let t = crate::stream::resolve(stream, per_thread)?;
    rt.check_device(t.ctx().device)?;
    tessera_sim::clock::sleep_until(t.last_end());
    // SAFETY: the program's callback with its own data and the stream it named, as the
    // driver calls it; its contract is the program's.
    unsafe { f(stream, CUresult::CUDA_SUCCESS, user) };
    Ok(())
}

thread_local! {
    /// This thread's stream-capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: Cell<u32> = const { Cell::new(0) };
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode to `*mode` and
/// returns the previous one in `*mode`. The simulator records it; it does not restrict
/// what a thread may call during another thread's capture.
///
/// # Safety
/// `mode` must be null or valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(
    mode: *mut CUstreamCaptureMode,
) -> CUresult {
    guard(|| {
        if mode.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, readable by the caller's contract.
        let want = unsafe { mode.read() }.0;
        if want > CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(want));
        // SAFETY: as above, writable.
        unsafe { mode.write(CUstreamCaptureMode(old)) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_mode_is_exchanged_per_thread() {
        let mut m = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a local.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(&mut m) };
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(m, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        let mut back = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a local.
        unsafe { cuThreadExchangeStreamCaptureMode(&mut back) };
        assert_eq!(back, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        // Another thread has its own mode.
        std::thread::spawn(|| {
            let mut m = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            // SAFETY: a local.
            unsafe { cuThreadExchangeStreamCaptureMode(&mut m) };
            assert_eq!(m, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        })
        .join()
        .expect("thread");
        let mut bad = CUstreamCaptureMode(7);
        // SAFETY: a local.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(&mut bad) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
        // SAFETY: null is rejected.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(std::ptr::null_mut()) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}
