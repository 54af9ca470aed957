//! The arbiter's side of the gate: publishing grants, the heartbeat, and what
//! it reads of the processes (demand, activity, undrained work).

use std::sync::atomic::{AtomicU32, Ordering};

use super::handshake;
use super::saturating_dec;
use crate::layout::{FirstLaunch, MAX_DEVICES, MAX_SLOTS, Owner, StateFile};
use crate::sys::futex_wake_all;
use crate::{Control, ShmError, State};

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
        let d = self.device(dev);
        // Its fence pairs with the one in a gate's first submission of an
        // epoch (`handshake::pass`): after it, reading `launch_epoch` sees
        // every process that saw the old word (see the module docs).
        Ok(handshake::publish(&d.grant, &d.revocations, flags, |w| {
            futex_wake_all(w)
        }))
    }

    /// Publishes when device `dev`'s current quantum ends (see
    /// [`crate::layout::DeviceControl::grant_until_ns`]). Only the arbiter
    /// calls this: before [`Control::publish_grant`] grants, and when it
    /// renews a grant without a hand-over.
    pub fn set_grant_until(&self, dev: usize, ns: u64) -> Result<(), ShmError> {
        self.require_writable()?;
        self.check_dev(dev)?;
        self.device(dev).grant_until_ns.store(ns, Ordering::Release);
        Ok(())
    }

    /// Publishes when device `dev`'s current grant's time started (see
    /// [`crate::layout::DeviceControl::grant_start_ns`]): only the arbiter
    /// calls this, before it publishes a grant and when a pre-armed grant's
    /// drain ends.
    pub fn set_grant_start(&self, dev: usize, ns: u64) -> Result<(), ShmError> {
        self.require_writable()?;
        self.check_dev(dev)?;
        self.device(dev).grant_start_ns.store(ns, Ordering::Release);
        Ok(())
    }

    /// When device `dev`'s current grant's time started, as the arbiter
    /// last published it (0: never).
    pub fn grant_start(&self, dev: usize) -> u64 {
        if dev >= self.n_devices() {
            return 0;
        }
        self.device(dev).grant_start_ns.load(Ordering::Acquire)
    }

    /// When device `dev`'s current quantum ends, as the arbiter last
    /// published it (0: never).
    pub fn grant_until(&self, dev: usize) -> u64 {
        if dev >= self.n_devices() {
            return 0;
        }
        self.device(dev).grant_until_ns.load(Ordering::Acquire)
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

    /// The gate slots of live processes: what the three readings of demand
    /// below look at (a dead process's bits are not demand, nor activity).
    fn live_slots(&self) -> impl Iterator<Item = &crate::layout::Slot> {
        self.gate_slot_range().iter().filter(|s| {
            matches!(
                Owner::unpack(s.owner.load(Ordering::Acquire)),
                Owner::Alive { .. }
            )
        })
    }

    /// Processes with a thread blocked at device `dev`'s gate. The shared
    /// counter is only a filter: what counts are the live slots' own bits,
    /// so a count left behind by a killed process is not demand.
    pub fn gate_waiters(&self, dev: usize) -> u32 {
        if dev >= MAX_DEVICES || self.device(dev).waiters.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let bit = 1u32 << dev;
        self.live_slots()
            .filter(|s| s.gate_waiting.load(Ordering::Acquire) & bit != 0)
            .count() as u32
    }

    /// Live processes with a thread waiting in a synchronisation on device
    /// `dev` (their work in flight; see [`crate::layout::Slot::syncing`]).
    pub fn syncing(&self, dev: usize) -> bool {
        if dev >= MAX_DEVICES {
            return false;
        }
        let bit = 1u32 << dev;
        self.live_slots()
            .any(|s| s.syncing.load(Ordering::Acquire) & bit != 0)
    }

    /// Whether the allocation's processes on device `dev` are idle by
    /// their own word ([`crate::layout::Slot::yielding`]): at least one
    /// live process yields, none is in a synchronisation, and every other
    /// live process that ever launched on `dev` yields too or waits at the
    /// gate (one that streams, or just went quiet, keeps the holder busy
    /// by the idle release as before).
    pub fn yielding(&self, dev: usize) -> bool {
        if dev >= MAX_DEVICES {
            return false;
        }
        let bit = 1u32 << dev;
        let mut any = false;
        for s in self.live_slots() {
            if s.syncing.load(Ordering::Acquire) & bit != 0 {
                return false;
            }
            if s.yielding.load(Ordering::Acquire) & bit != 0 {
                any = true;
            } else if s.devices[dev].launches.load(Ordering::Acquire) != 0
                && s.gate_waiting.load(Ordering::Acquire) & bit == 0
            {
                return false;
            }
        }
        any
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

    /// The earliest first submission of a grant epoch to device `dev` that
    /// a process recorded at or after `since` (its own clock, see
    /// [`crate::layout::Slot::first_launch`]); `None` if none did. A
    /// process that died since counts: its work ran. Records from before
    /// `since` belong to earlier epochs and are passed over. A hint: the
    /// caller clamps it to what it observed itself.
    pub fn first_launch_since(&self, dev: usize, since: u64) -> Option<u64> {
        self.gate_slot_range()
            .iter()
            .filter_map(|s| FirstLaunch::unpack(s.first_launch.load(Ordering::Acquire)))
            .filter(|f| f.dev == dev && f.at_ns >= since)
            .map(|f| f.at_ns)
            .min()
    }

    /// The latest end of work queued on device `dev` that a live process
    /// says it predicts ([`crate::layout::Slot::queued_until`]); `None` if
    /// none says. A hint: the caller bounds it.
    pub fn queued_until(&self, dev: usize) -> Option<u64> {
        self.live_slots()
            .filter_map(|s| FirstLaunch::unpack(s.queued_until.load(Ordering::Acquire)))
            .filter(|f| f.dev == dev)
            .map(|f| f.at_ns)
            .max()
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
            if let Some(le) =
                handshake::undrained_epoch(&sd.launch_epoch, &sd.drained_epoch, current_epoch)
            {
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

/// Clears a reclaimed slot's gate and synchronisation bits and its queue's
/// predicted end, and takes the bits out of the waiter counts, so a process
/// killed at the gate (or in a synchronisation, or with work queued) leaves
/// no phantom demand or activity.
pub(crate) fn forget_waiting(file: &StateFile, slot: usize) {
    file.slots[slot].syncing.store(0, Ordering::Release);
    file.slots[slot].yielding.store(0, Ordering::Release);
    file.slots[slot].queued_until.store(0, Ordering::Release);
    let bits = file.slots[slot].gate_waiting.swap(0, Ordering::AcqRel);
    for dev in 0..MAX_DEVICES {
        if bits & (1 << dev) != 0 {
            saturating_dec(&file.devices[dev].waiters);
        }
    }
}
