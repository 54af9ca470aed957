//! Synchronisations: `hipDeviceSynchronize`, `hipStreamSynchronize`,
//! `hipEventSynchronize`. Each wait is marked for the compute arbiter as
//! CUDA's are (`Gate::syncing`): a holder waiting on its own work is busy,
//! not idle, so it keeps its grant through a step's `.item()` instead of
//! being revoked after the idle release and losing the rest of its quantum.
//! The device waited on is the current one (a stream's or an event's own
//! device is not asked of the runtime: the mark is a hint to the arbiter,
//! and the current device is where a program's work almost always is).

use super::*;

/// Runs `wait` (a real synchronisation) marked as syncing on the calling
/// thread's current allocation device, when the process is governed.
fn syncing(wait: impl FnOnce() -> hipError_t) -> hipError_t {
    let g = match entry() {
        Ok(Some(g)) => g,
        // Ungoverned, or refused: the runtime answers as it would.
        Ok(None) | Err(_) => return wait(),
    };
    gate::while_syncing(g, sync_device(g), wait)
}

/// The allocation index of the current device, without making its context
/// (a synchronisation with nothing submitted creates none).
fn sync_device(g: &Governed) -> Option<usize> {
    if g.devices.single() {
        return g.devices.only();
    }
    let mut dev: c_int = 0;
    (real!(hipGetDevice(&mut dev)) == OK)
        .then(|| g.index_of(dev))
        .flatten()
}

pub unsafe fn hipDeviceSynchronize() -> hipError_t {
    if inside() {
        return call_real!(hipDeviceSynchronize());
    }
    syncing(|| real!(hipDeviceSynchronize()))
}

pub unsafe fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t {
    if inside() {
        return call_real!(hipStreamSynchronize(stream));
    }
    syncing(|| real!(hipStreamSynchronize(stream)))
}

pub unsafe fn hipEventSynchronize(event: hipEvent_t) -> hipError_t {
    if inside() {
        return call_real!(hipEventSynchronize(event));
    }
    syncing(|| real!(hipEventSynchronize(event)))
}
