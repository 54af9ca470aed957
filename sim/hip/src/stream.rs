//! Streams and events over the device's one engine.
//!
//! The engine is a timeline in the node state file ([`tessera_sim::Node::schedule`]):
//! a kernel is queued after everything already queued on the device by any process, and
//! after the earlier work of its own stream. A stream remembers when its last work ends;
//! synchronising sleeps until then. The null stream is one stream per device. Handles are
//! never freed (a destroyed stream or event is only marked gone), so a stale handle is
//! reported, never dereferenced after it is freed.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_float, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tessera_sim::clock::now_ns;
use tessera_sim::layout::MAX_DEVICES;

use crate::registry::after_sync;
use crate::*;

/// A stream: its device and the end of its last queued work (CLOCK_MONOTONIC ns).
#[derive(Debug)]
pub struct Stream {
    pub ordinal: usize,
    pub done: AtomicU64,
}

/// An event: when the work before it ends, once recorded (0: never recorded).
#[derive(Debug)]
pub struct Event {
    pub at: AtomicU64,
}

static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static NULL_STREAMS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static EVENTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// The end of the last work this process queued on each physical device.
static PROCESS_DONE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stream a handle names: null is the current device's null stream.
pub fn resolve(s: *mut c_void) -> HipResult<&'static Stream> {
    let addr = if s.is_null() {
        let (o, _) = rt()?.current()?;
        *lock(&NULL_STREAMS).entry(o).or_insert_with(|| {
            Box::into_raw(Box::new(Stream {
                ordinal: o,
                done: AtomicU64::new(0),
            })) as usize
        })
    } else if lock(&STREAMS)
        .as_ref()
        .is_some_and(|set| set.contains(&(s as usize)))
    {
        s as usize
    } else {
        return Err(hipErrorInvalidHandle);
    };
    // SAFETY: `addr` is a `Stream` box of this module, and boxes are never freed.
    Ok(unsafe { &*(addr as *const Stream) })
}

/// The device ordinal of a stream handle.
pub fn ordinal_of(s: *mut c_void) -> HipResult<usize> {
    resolve(s).map(|st| st.ordinal)
}

fn event(e: *mut c_void) -> HipResult<&'static Event> {
    if !lock(&EVENTS)
        .as_ref()
        .is_some_and(|set| set.contains(&(e as usize)))
    {
        return Err(hipErrorInvalidHandle);
    }
    // SAFETY: a live `Event` box of this module; boxes are never freed.
    Ok(unsafe { &*(e as *const Event) })
}

impl Stream {
    /// Queues `duration_ns` of work on the stream's device, after its earlier work.
    /// Returns when the work ends.
    pub fn queue(&self, duration_ns: u64) -> HipResult<u64> {
        let rt = rt()?;
        let physical = rt.touch(self.ordinal)?;
        let now = now_ns().max(self.done.load(Ordering::Acquire));
        // The device's idle gap between kernels, as the simulated CUDA driver leaves it.
        let gap = costs().kernel_gap_ns;
        let (_, end) = rt
            .node
            .schedule_after_gap(rt.slot, physical, now, duration_ns, gap);
        self.done.fetch_max(end, Ordering::AcqRel);
        PROCESS_DONE[physical].fetch_max(end, Ordering::AcqRel);
        Ok(end)
    }

    /// Waits for the stream's queued work.
    pub fn synchronize(&self) {
        wait_until(self.done.load(Ordering::Acquire));
    }

    /// What a synchronous copy or set waits for first: everything this process queued
    /// on the current device (HIP's blocking calls order after the null stream, which
    /// waits for the device's other streams). Asynchronous ones (`blocking` false) wait
    /// for nothing: the simulated kernels write no memory, so there is nothing to order.
    pub fn before_host_access(blocking: bool) -> HipResult<()> {
        if blocking {
            let (_, physical) = rt()?.current()?;
            wait_until(PROCESS_DONE[physical].load(Ordering::Acquire));
        }
        Ok(())
    }
}

hip_api! {
    /// `hipStreamCreate`.
    ///
    /// # Safety
    /// `stream` must be null or writable.
    "hip_4.2" fn hipStreamCreate(stream: *mut *mut c_void) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { create(stream) })
    }

    /// `hipStreamCreateWithFlags`: the flags (non-blocking) change nothing modelled.
    ///
    /// # Safety
    /// `stream` must be null or writable.
    "hip_4.2" fn hipStreamCreateWithFlags(stream: *mut *mut c_void, _flags: c_uint) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { create(stream) })
    }

    /// `hipStreamCreateWithPriority`.
    ///
    /// # Safety
    /// `stream` must be null or writable.
    "hip_4.2" fn hipStreamCreateWithPriority(stream: *mut *mut c_void, _flags: c_uint, _priority: c_int) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { create(stream) })
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipStreamDestroy(stream: *mut c_void) -> hipError_t {
        guard(|| {
            if lock(&STREAMS).as_mut().is_some_and(|set| set.remove(&(stream as usize))) {
                Ok(())
            } else {
                Err(hipErrorInvalidHandle)
            }
        })
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipStreamSynchronize(stream: *mut c_void) -> hipError_t {
        guard(|| {
            resolve(stream)?.synchronize();
            after_sync(Some(ordinal_of(stream)?));
            Ok(())
        })
    }

    /// `hipStreamQuery`: `hipErrorNotReady` while queued work has not ended.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipStreamQuery(stream: *mut c_void) -> hipError_t {
        guard(|| {
            if resolve(stream)?.done.load(Ordering::Acquire) > now_ns() {
                Err(hipErrorNotReady)
            } else {
                Ok(())
            }
        })
    }

    /// `hipStreamWaitEvent`: the stream's next work starts after the event.
    ///
    /// # Safety
    /// Any handle values are accepted; unknown ones are reported.
    "hip_4.2" fn hipStreamWaitEvent(stream: *mut c_void, e: *mut c_void, _flags: c_uint) -> hipError_t {
        guard(|| {
            let at = event(e)?.at.load(Ordering::Acquire);
            resolve(stream)?.done.fetch_max(at, Ordering::AcqRel);
            Ok(())
        })
    }

    /// `hipStreamAddCallback`: called once the stream's queued work has ended, on the
    /// caller's thread.
    ///
    /// # Safety
    /// `callback` must be a function of HIP's callback type.
    "hip_4.2" fn hipStreamAddCallback(
        stream: *mut c_void,
        callback: Option<unsafe extern "C" fn(*mut c_void, hipError_t, *mut c_void)>,
        user: *mut c_void,
        _flags: c_uint,
    ) -> hipError_t {
        guard(|| {
            let cb = callback.ok_or(hipErrorInvalidValue)?;
            resolve(stream)?.synchronize();
            // SAFETY: the caller passes a callback of this type and its own argument.
            unsafe { cb(stream, hipSuccess, user) };
            Ok(())
        })
    }

    /// `hipStreamIsCapturing`: the simulator never captures.
    ///
    /// # Safety
    /// `status` must be null or writable.
    "hip_4.3" fn hipStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> hipError_t {
        guard(|| {
            resolve(stream)?;
            // SAFETY: the caller's contract; 0 is hipStreamCaptureStatusNone.
            unsafe { put(status, 0) }
        })
    }

    /// `hipDeviceSynchronize`: waits for this process's work on the current device.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipDeviceSynchronize() -> hipError_t {
        guard(|| {
            Stream::before_host_access(true)?;
            after_sync(Some(rt()?.current()?.0));
            Ok(())
        })
    }

    /// `hipEventCreate`.
    ///
    /// # Safety
    /// `e` must be null or writable.
    "hip_4.2" fn hipEventCreate(e: *mut *mut c_void) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { create_event(e) })
    }

    /// `hipEventCreateWithFlags`: timing is always recorded.
    ///
    /// # Safety
    /// `e` must be null or writable.
    "hip_4.2" fn hipEventCreateWithFlags(e: *mut *mut c_void, _flags: c_uint) -> hipError_t {
        // SAFETY: the caller's contract.
        guard(|| unsafe { create_event(e) })
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipEventDestroy(e: *mut c_void) -> hipError_t {
        guard(|| {
            if lock(&EVENTS).as_mut().is_some_and(|set| set.remove(&(e as usize))) {
                Ok(())
            } else {
                Err(hipErrorInvalidHandle)
            }
        })
    }

    /// `hipEventRecord`: the event happens when the stream's queued work ends.
    ///
    /// # Safety
    /// Any handle values are accepted; unknown ones are reported.
    "hip_4.2" fn hipEventRecord(e: *mut c_void, stream: *mut c_void) -> hipError_t {
        guard(|| {
            let ev = event(e)?;
            let at = resolve(stream)?.done.load(Ordering::Acquire).max(now_ns());
            ev.at.store(at, Ordering::Release);
            Ok(())
        })
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipEventSynchronize(e: *mut c_void) -> hipError_t {
        guard(|| {
            wait_until(event(e)?.at.load(Ordering::Acquire));
            // An event does not say its device here: every pool is looked at.
            after_sync(None);
            Ok(())
        })
    }

    /// `hipEventQuery`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipEventQuery(e: *mut c_void) -> hipError_t {
        guard(|| {
            if event(e)?.at.load(Ordering::Acquire) > now_ns() {
                Err(hipErrorNotReady)
            } else {
                Ok(())
            }
        })
    }

    /// `hipEventElapsedTime`: milliseconds between two recorded events.
    ///
    /// # Safety
    /// `ms` must be null or writable.
    "hip_4.2" fn hipEventElapsedTime(ms: *mut c_float, start: *mut c_void, stop: *mut c_void) -> hipError_t {
        guard(|| {
            let a = event(start)?.at.load(Ordering::Acquire);
            let b = event(stop)?.at.load(Ordering::Acquire);
            if a == 0 || b == 0 {
                return Err(hipErrorInvalidHandle);
            }
            if a.max(b) > now_ns() {
                return Err(hipErrorNotReady);
            }
            // SAFETY: the caller's contract.
            unsafe { put(ms, (b as f64 - a as f64) as f32 / 1e6) }
        })
    }
}

/// # Safety
/// `stream` must be null or writable.
unsafe fn create(stream: *mut *mut c_void) -> HipResult<()> {
    if stream.is_null() {
        return Err(hipErrorInvalidValue);
    }
    let (o, _) = rt()?.current()?;
    let s = Box::into_raw(Box::new(Stream {
        ordinal: o,
        done: AtomicU64::new(0),
    }));
    lock(&STREAMS)
        .get_or_insert_with(HashSet::new)
        .insert(s as usize);
    // SAFETY: checked non-null; the caller passes a writable pointer.
    unsafe { put(stream, s.cast()) }
}

/// # Safety
/// `e` must be null or writable.
unsafe fn create_event(e: *mut *mut c_void) -> HipResult<()> {
    if e.is_null() {
        return Err(hipErrorInvalidValue);
    }
    rt()?;
    let ev = Box::into_raw(Box::new(Event {
        at: AtomicU64::new(0),
    }));
    lock(&EVENTS)
        .get_or_insert_with(HashSet::new)
        .insert(ev as usize);
    // SAFETY: checked non-null; the caller passes a writable pointer.
    unsafe { put(e, ev.cast()) }
}
