//! The queue bound for HIP: CUDA's pacer (`crate::pace`, the decision, and
//! `gate.rs`, its CUDA side) over HIP events. A marker event is recorded
//! after every governed launch on a stream; before the next one the
//! process waits while more than about one kernel (or the budget's worth of
//! short ones) is queued behind the running one, so that a revoked grant
//! drains in about the running kernel, and the grant's time is the
//! allocation's work rather than a queue another allocation waits behind.
//!
//! Per allocation device, state for the HIP device the markers were
//! recorded on (events belong to a device; another current device starts
//! over).

use std::ptr::null_mut;

use parking_lot::Mutex;
use tessera_shm::gate::Gate;
use tessera_shm::layout::MAX_DEVICES;
use tessera_shm::sys::monotonic_ns;

use super::*;
use crate::pace::{DEFAULT_BUDGET_NS, MAX_IN_FLIGHT, Pace, Step};

/// A launch's marker (see `gate.rs`'s `Marker`, of which this is the HIP
/// twin).
struct Marker {
    ev: hipEvent_t,
    /// Queued while the launch before it was in flight (back to back).
    behind: bool,
    learned: bool,
    /// Recorded just before the launch when nothing was in flight.
    start: Option<hipEvent_t>,
}

struct Paced {
    pace: Pace,
    markers: Vec<Marker>,
    spare: Vec<hipEvent_t>,
    /// The HIP device the events belong to.
    device: c_int,
    pending_start: Option<hipEvent_t>,
}

// SAFETY: HIP event handles are valid from any thread of the process; the
// struct is only used under its mutex.
unsafe impl Send for Paced {}

static PACED: [Mutex<Option<Paced>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];

fn event_done(ev: hipEvent_t) -> bool {
    // Any answer but "not ready" counts as done: a marker the runtime
    // cannot answer for must not hold launches.
    real!(hipEventQuery(ev)) != hipErrorNotReady
}

fn capturing(stream: hipStream_t) -> bool {
    let mut status: c_int = 0;
    let r = real!(hipStreamIsCapturing(stream, &mut status));
    // Unknown (an error): treated as capturing, so nothing is recorded
    // into what may be a capture.
    r != OK || status != 0
}

fn destroy(ev: hipEvent_t) {
    let _ = real!(hipEventDestroy(ev));
}

fn take_event(p: &mut Paced) -> Option<hipEvent_t> {
    if let Some(ev) = p.spare.pop() {
        return Some(ev);
    }
    let mut ev: hipEvent_t = null_mut();
    (real!(hipEventCreate(&mut ev)) == OK).then_some(ev)
}

/// Before a launch on `stream`, on allocation device `dev`, after nothing:
/// holds it while the process has more queued than the budget allows.
/// Whether the launch is paced (its marker is recorded by [`after`]).
pub(super) fn before(gate: &Gate, dev: usize, stream: hipStream_t) -> bool {
    if dev >= MAX_DEVICES || capturing(stream) {
        return false;
    }
    let mut device: c_int = 0;
    if real!(hipGetDevice(&mut device)) != OK {
        return false;
    }
    loop {
        let mut guard = PACED[dev].lock();
        let p = guard.get_or_insert_with(|| Paced {
            pace: Pace::new(DEFAULT_BUDGET_NS),
            markers: Vec::new(),
            spare: Vec::new(),
            device,
            pending_start: None,
        });
        if p.device != device {
            for m in p.markers.drain(..) {
                destroy(m.ev);
                m.start.into_iter().for_each(destroy);
            }
            p.spare
                .drain(..)
                .chain(p.pending_start.take())
                .for_each(destroy);
            p.device = device;
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
                let r = real!(hipEventElapsedTime(&mut ms, from, p.markers[i].ev));
                if r == OK && ms > 0.0 {
                    p.pace.learned((f64::from(ms) * 1e6) as u64);
                }
                p.markers[i].learned = true;
            }
        }
        let in_flight = done.iter().filter(|d| !**d).count();
        match p
            .pace
            .before(monotonic_ns(), in_flight, gate.grant_until(dev))
        {
            Step::Go => return true,
            Step::WaitOlder => {
                // One engine, in order: the first marker not done is the
                // oldest launch in flight.
                let Some(i) = done.iter().position(|d| !*d) else {
                    return true;
                };
                let ev = p.markers[i].ev;
                drop(guard);
                // Waiting on its own work: the holder keeps its grant.
                gate.syncing(Some(dev), || real!(hipEventSynchronize(ev)));
            }
            Step::HoldUntil(t) => {
                drop(guard);
                gate.syncing(Some(dev), || crate::gate::hold_until(t));
            }
        }
    }
}

/// Just before a paced launch, after the gate: when nothing is in flight,
/// the start event the launch's length is measured from.
pub(super) fn start(dev: usize, stream: hipStream_t) {
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
    if real!(hipEventRecord(ev, stream)) == OK {
        p.pending_start = Some(ev);
    } else {
        p.spare.push(ev);
    }
}

/// After the runtime took a paced launch: its marker.
pub(super) fn after(dev: usize, stream: hipStream_t) {
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
    if real!(hipEventRecord(ev, stream)) != OK {
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
    while p.markers.len() > MAX_IN_FLIGHT + 1 {
        let m = p.markers.remove(0);
        p.spare.push(m.ev);
        p.spare.extend(m.start);
    }
}
