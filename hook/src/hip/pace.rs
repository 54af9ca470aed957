//! The queue bound for HIP: the pacer's HIP side. The pacer itself
//! (`crate::pacer`, over the decision in `crate::pace`) is CUDA's; this
//! supplies HIP's events, which belong to a device (another current device
//! starts over). Every call into the runtime is marked as the shim's own
//! (`real!`), so the runtime's re-entry into its public entry points passes
//! through.

use std::ptr::null_mut;

use crate::pacer::{Events, Pacer};

use super::*;

/// The pacer's HIP side.
pub(super) struct HipEvents;

// SAFETY: HIP event handles are valid from any thread of the process.
unsafe impl Events for HipEvents {
    type Event = hipEvent_t;
    type Stream = hipStream_t;
    type Owner = c_int;

    fn owner() -> Option<c_int> {
        let mut device: c_int = 0;
        (real!(hipGetDevice(&mut device)) == OK).then_some(device)
    }

    fn capturing(stream: hipStream_t) -> bool {
        let mut status: c_int = 0;
        let r = real!(hipStreamIsCapturing(stream, &mut status));
        // Unknown (an error) counts as capturing.
        r != OK || status != 0
    }

    fn create() -> Option<hipEvent_t> {
        let mut ev: hipEvent_t = null_mut();
        (real!(hipEventCreate(&mut ev)) == OK).then_some(ev)
    }

    fn destroy(ev: hipEvent_t) {
        let _ = real!(hipEventDestroy(ev));
    }

    fn record(ev: hipEvent_t, stream: hipStream_t) -> bool {
        real!(hipEventRecord(ev, stream)) == OK
    }

    fn done(ev: hipEvent_t) -> bool {
        real!(hipEventQuery(ev)) != hipErrorNotReady
    }

    fn elapsed_ns(from: hipEvent_t, to: hipEvent_t) -> Option<u64> {
        let mut ms = 0f32;
        let r = real!(hipEventElapsedTime(&mut ms, from, to));
        (r == OK && ms > 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn synchronize(ev: hipEvent_t) {
        let _ = real!(hipEventSynchronize(ev));
    }

    fn probe(device: c_int, ev: hipEvent_t) -> bool {
        // On the gate's drainer thread, whose current device is its own.
        real!(hipSetDevice(device)) == OK
            && real!(hipEventRecord(ev, null_mut())) == OK
            && real!(hipEventSynchronize(ev)) == OK
    }
}

/// The process's HIP pacer.
pub(super) static PACER: Pacer<HipEvents> = Pacer::new();
