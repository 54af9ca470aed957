//! The compute gate's HIP side: the same `tessera_shm::gate` protocol and
//! arbiter as CUDA; what HIP supplies is the device a launch goes to (the
//! current one) and how to wait for this process's work on a device
//! (`hipDeviceSynchronize` there); the queue bound is `crate::pacer` over
//! HIP's events (`pace.rs`).

use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use tessera_shm::gate::{Drain, Gate, GateEvent};

use super::pace::PACER;
use super::*;

/// The process's HIP gate: a leaked `Box<Gate>`, never freed.
static GATE: AtomicPtr<Gate> = AtomicPtr::new(null_mut());

/// Set up once the process has joined (the governor's `on_join` hook).
pub(super) fn on_join(g: &Governed) {
    let Some(member) = g.member() else {
        return;
    };
    let files: &'static Files = g.files;
    let drain = HipDrain {
        devices: g
            .devices
            .visible()
            .iter()
            .filter_map(|v| v.index.map(|i| (i, v.device)))
            .collect(),
    };
    let log = Arc::new(|e: &GateEvent| crate::log!(Level::Warn, "compute gate (HIP): {e}"));
    match Gate::new(&files.control, &files.state, member, Arc::new(drain), log) {
        Ok(gate) => {
            crate::pacer::read_settings();
            let old = GATE.swap(Box::into_raw(Box::new(gate)), Ordering::AcqRel);
            // An earlier gate (of a slot this process left) stays leaked:
            // another thread may still be reading it.
            let _ = old;
        }
        Err(e) => crate::log!(Level::Error, "HIP compute gate not set up: {e}"),
    }
}

/// Waits for this process's work on one allocation device: each HIP device
/// of that index, synchronised from the gate's own drainer thread (whose
/// current device is its own to change).
struct HipDrain {
    devices: Vec<(usize, hipDevice_t)>,
}

impl Drain for HipDrain {
    fn drain(&self, dev: usize) {
        for &(_, d) in self.devices.iter().filter(|(i, _)| *i == dev) {
            nested(|| {
                if call_real!(hipSetDevice(d)) == OK {
                    let _ = call_real!(hipDeviceSynchronize());
                }
            });
        }
    }

    fn ended_at(&self, dev: usize) -> Option<u64> {
        nested(|| super::pace::PACER.ended_at(dev))
    }
}

/// The process's gate, when `g` is the member it was set up for (a forked
/// child sees its parent's until it joins itself).
#[inline]
fn gate_of(g: &Governed) -> Option<&'static Gate> {
    let p = GATE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: GATE only ever holds a pointer from Box::into_raw, never freed.
    let gate = unsafe { &*p };
    (g.member() == Some(gate.member())).then_some(gate)
}

/// Runs `wait`, a synchronisation of this process's work, marked as such
/// for the arbiter on the current device (see `Gate::syncing`): a holder
/// waiting on its own work keeps its grant instead of being revoked as idle
/// after the idle release. The current device, not a stream's or an
/// event's own: the mark is a hint, and the current device is where a
/// program's work almost always is; its context is not made for it.
pub(super) fn while_syncing<R>(
    g: &Governed,
    awaits: crate::gate::Awaits,
    wait: impl FnOnce() -> R,
) -> R {
    let Some(gate) = gate_of(g) else {
        return wait();
    };
    let dev = if g.devices.single() {
        g.devices.only()
    } else {
        let mut d: c_int = 0;
        (real!(hipGetDevice(&mut d)) == OK)
            .then(|| g.index_of(d))
            .flatten()
    };
    let settle = |d| nested(|| PACER.settle(gate, d));
    let r = if crate::gate::leave_as_sync_begins(gate, dev, awaits, settle) {
        // Not marked as a synchronisation: the grant is given back.
        wait()
    } else {
        gate.syncing(dev, wait)
    };
    // Back on the host: a program whose host part is long gives its grant
    // back now rather than after the arbiter's idle release.
    if let Some(d) = dev {
        gate.synced(d, nested(|| PACER.idle(d)));
    }
    r
}

/// Before a launch on the current device (on `stream`, `None` for a launch
/// that names none): paces it (see `crate::pacer`), then waits for the
/// allocation's grant there. The hot path once joined: the governor's two
/// loads, the pause word, the grant word, and the pacer's marker query.
/// `Ok(Some(dev))`: the launch is paced on `dev`; pass it to [`after_submit`].
#[inline]
pub(super) fn before_submit(stream: Option<hipStream_t>) -> Result<Option<usize>, hipError_t> {
    let g = match entry() {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(gate) = gate_of(g) else {
        return Ok(None);
    };
    let control = &g.files.control;
    if control.paused() {
        control.wait_while_paused();
    }
    // The launch makes the device's context if it has none: a context that
    // does not fit fails the launch, as it would on the GPU.
    let Some(dev) = current(g)? else {
        return Ok(None);
    };
    // Pace first, the gate after: a launch held by the pacer is still
    // stopped at the gate if the grant was revoked meanwhile.
    // After the gate, the launch takes its number among the allocation's;
    // if another process's launch took one since the pacer decided, the
    // decision is made again with it counted (see `Pacer::start`).
    let paced = loop {
        let paced = stream.is_some_and(|s| PACER.before(gate, dev, s));
        gate.before_submit(dev);
        match (paced, stream) {
            (true, Some(s)) if !PACER.start(gate, dev, s) => continue,
            _ => break paced,
        }
    };
    Ok(paced.then_some(dev))
}

/// After the runtime accepted a launch [`before_submit`] paced on `dev`:
/// its marker.
#[inline]
pub(super) fn after_submit(paced: Option<usize>, stream: Option<hipStream_t>) {
    if let (Some(dev), Some(s)) = (paced, stream) {
        PACER.after(dev, s);
    }
}

/// Before a launch that spans devices: the gate of every allocation device
/// this process sees.
pub(super) fn before_submit_all() -> Result<(), hipError_t> {
    let g = match entry() {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e),
    };
    let Some(gate) = gate_of(g) else {
        return Ok(());
    };
    for v in g.devices.visible() {
        if let Some(i) = v.index {
            gate.before_submit(i);
        }
    }
    Ok(())
}
