//! The seam between the manager and the compute arbiter: the manager tells
//! it which allocations exist and asks it what share each achieved. The
//! arbiter itself (per-GPU time slices) plugs in behind [`Arbitration`].

use std::collections::HashMap;
use std::sync::Arc;

use crate::daemon::LiveAllocation;

/// What the manager needs from the compute arbiter.
pub trait Arbitration: Send + Sync + 'static {
    /// Starts arbitrating an allocation (on each of its GPUs).
    fn add(&self, alloc: &Arc<LiveAllocation>);
    /// Stops arbitrating an allocation that is being deleted.
    fn remove(&self, id: &str);
    /// Share of `gpu_uuid`'s time the allocation held over the recent
    /// window, in ppm; `None` when no arbiter measures it.
    fn achieved_ppm(&self, id: &str, gpu_uuid: &str) -> Option<u32>;
    /// [`Self::achieved_ppm`] of every arbitrated (allocation id, GPU UUID)
    /// at once: a status or a scrape asks once, however many allocations
    /// there are. The default asks nothing and knows nothing.
    fn achieved_all(&self) -> HashMap<(String, String), u32> {
        HashMap::new()
    }
    /// Stops every arbiter thread (manager shutdown).
    fn shutdown(&self) {}
}

/// No arbitration: allocations with a whole GPU need none (their grant is
/// created open); others run free once their gate times out.
#[derive(Debug, Default)]
pub struct NoArbiter;

impl Arbitration for NoArbiter {
    fn add(&self, _alloc: &Arc<LiveAllocation>) {}
    fn remove(&self, _id: &str) {}
    fn achieved_ppm(&self, _id: &str, _gpu_uuid: &str) -> Option<u32> {
        None
    }
}
