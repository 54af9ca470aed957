//! Quota on the state file: one reservation or release of this process's
//! slot on one device, serialised per device, waiting a little over the
//! limit while dead processes' quota is on its way back, and each
//! admission's refusals counted once. The pool and graph accounting
//! (`pools.rs`) and admission (`admission.rs`) are built on it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tessera_ffi::cuda::CUresult;
use tessera_shm::Refused;

use super::governed::Governed;
use super::join::CUDA_REFUSED;
use crate::log::Level;

/// The refusals of one admission, however many tries it took: the
/// device's `oom_refused` counter goes up by exactly one for an admission
/// finally refused, and not at all for one that got its memory.
#[derive(Debug, Default)]
pub(super) struct Tries {
    over_limit: u64,
    refused_other: bool,
}

impl Tries {
    pub(super) fn done(self, g: &Governed, dev: usize, ok: bool) -> Result<(), CUresult> {
        let counted = self.over_limit;
        let keep = u64::from(!ok && counted > 0);
        if counted > keep
            && let Some(d) = g.files.state.raw().devices.get(dev)
        {
            d.oom_refused.fetch_sub(counted - keep, Ordering::Relaxed);
        }
        if ok {
            Ok(())
        } else if self.refused_other && counted == 0 && g.member().is_none() {
            Err(CUDA_REFUSED)
        } else {
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// How often the waiting admission tries again.
const DEAD_QUOTA_POLL: Duration = Duration::from_millis(5);

impl Governed {
    /// Blocks the calling thread while the allocation is paused (`tessera
    /// pause`): memory requests wait here, as launches do at the gate,
    /// rather than fail.
    #[inline]
    pub fn wait_while_paused(&self) {
        let control = &self.files.control;
        if control.paused() {
            control.wait_while_paused();
        }
    }

    /// One reservation on `dev`. Refused over the limit while processes
    /// that have died still hold quota on `dev`, it waits for the manager to
    /// release theirs (up to [`Governed::dead_quota_wait`], by default
    /// [`DEAD_QUOTA_WAIT`](super::governed::DEAD_QUOTA_WAIT)), trying again as it goes.
    ///
    /// The shim never returns that quota itself: the driver goes on holding
    /// an exited process's memory until it has torn the process down, after
    /// the process is gone from `/proc`, and only the manager can see when
    /// (NVML lists the process until then; a process in a container cannot
    /// name another's host pid). Returning it on `/proc`'s word would let
    /// this allocation take the device past its limit for that moment
    /// (docs/security.md, "The exit window"). Counts the refusals in `tries`.
    pub(super) fn try_quota(
        &self,
        dev: usize,
        bytes: u64,
        tries: &mut Tries,
    ) -> Result<(), Refused> {
        self.wait_while_paused();
        let Some(m) = self.member() else {
            tries.refused_other = true;
            return Err(Refused::NoDevice(dev));
        };
        let state = &self.files.state;
        let mut deadline = None;
        // Whether the last look found no dead process holding quota: the
        // manager may have released theirs between the refused try and that
        // look, so the first such look earns one more try, not a refusal.
        let mut none_dead_once = false;
        loop {
            let r = {
                let _op = self.op_locks[dev].lock();
                state.reserve(m, dev, bytes, self.files.control.memory_limit(dev))
            };
            let e = match r {
                Ok(()) => return Ok(()),
                Err(e @ Refused::OverLimit { .. }) => {
                    tries.over_limit += 1;
                    e
                }
                Err(e) => {
                    tries.refused_other = true;
                    crate::log!(Level::Info, "device {dev}: refused: {e}");
                    return Err(e);
                }
            };
            // Slots of dead processes holding nothing only cost slots; a
            // process of the allocation may free those on its own.
            let _ = state.reclaim_dead_empty(&self.files.live, m);
            let dead = state.dead_holding(&self.files.live, dev);
            let now = Instant::now();
            let until = *deadline.get_or_insert(now + self.dead_quota_wait);
            if dead == 0 && !none_dead_once {
                none_dead_once = true;
                continue;
            }
            if dead == 0 || now >= until {
                crate::log!(
                    Level::Info,
                    "device {dev}: refused: {e} ({dead} bytes of dead processes not yet released)"
                );
                return Err(e);
            }
            // Polled, not woken: the manager's release is one pass of its
            // reaper after the driver lets go, and this path runs only over
            // the limit, with a dead process's quota outstanding.
            std::thread::sleep(DEAD_QUOTA_POLL);
        }
    }

    /// Charges `bytes` the device already holds for this process (memory a
    /// pool or a graph launch took beyond what was reserved for it, which
    /// cannot be undone), whatever the limit: the books say what the device
    /// holds. Logged: it means a route took more than it was admitted for.
    pub(super) fn force(&self, dev: usize, bytes: u64) {
        let Some(m) = self.member() else { return };
        let _op = self.op_locks[dev].lock();
        match self.files.state.reserve(m, dev, bytes, u64::MAX) {
            Ok(()) => crate::log!(
                Level::Warn,
                "device {dev}: the driver took {bytes} bytes more than admitted; charged"
            ),
            Err(e) => crate::log!(Level::Error, "device {dev}: charge failed: {e}"),
        }
    }

    /// Moves a pool's or graph memory's charge to `target` bytes (what the
    /// driver says it holds): a surplus is returned, a shortfall charged
    /// whatever the limit.
    pub(super) fn settle_charge(&self, dev: Option<usize>, charged: &mut u64, target: u64) {
        if *charged > target {
            self.release(dev, *charged - target);
            *charged = target;
        } else if target > *charged {
            if let Some(d) = dev {
                self.force(d, target - *charged);
            }
            *charged = target;
        }
    }

    /// Returns `bytes` on device `index` reserved earlier by this process.
    pub fn release(&self, index: Option<usize>, bytes: u64) {
        let (Some(dev), Some(m)) = (index, self.member()) else {
            return;
        };
        if bytes == 0 {
            return;
        }
        let _op = self.op_locks[dev].lock();
        if let Err(e) = self.files.state.release(m, dev, bytes) {
            crate::log!(Level::Error, "device {dev}: release failed: {e}");
        }
    }
}
