//! GPUs cut into slices, as the engine sees them: the one adapter from a
//! GPU's slice count and free slices to an engine [`Gpu`], and from a
//! request for `k` slices to a [`Request`]. The scheduler extender (its view
//! of the nodes' GPU reports) and the device plugin (its choice among one
//! node's GPUs) both place slices through it.
//!
//! Memory is counted in thousandths of a slice (`slices × 1000`), so that
//! "`k` slices fit" is exactly `memory_free_mib ≥ k × 1000` whatever the
//! GPU's real memory. Compute is the GPU's own: `free × 1000 / slices`. A
//! slice of a GPU cut into `S` is `1/S` of its compute (the node config
//! gives it `1/S` of the time, and the manager enforces that), so this is
//! the share of the GPU really left, which is what best fit and the
//! fragmentation measure compare. (The device plugin once scaled every
//! GPU by the finest cut among its candidates instead, which made a GPU cut
//! into 4 with 2 free look 25% free beside one cut into 8: not what it
//! holds.) GPUs cut differently are therefore never ranked in one engine:
//! a request for `k` slices is a different share of each, so callers
//! place per cut ([`cuts`]).

use crate::cluster::{Gpu, GpuNeed, MILLI, MemoryNeed, Request};

/// An engine GPU cut into `slices` (at least 1) with `free` of them free.
pub fn slice_gpu(
    model: &str,
    class: &str,
    slices: u32,
    free: u32,
    utilization: Option<f64>,
) -> Gpu {
    let slices = slices.max(free).max(1);
    Gpu {
        model: model.to_owned(),
        class: class.to_owned(),
        memory_mib: u64::from(slices) * u64::from(MILLI),
        memory_free_mib: u64::from(free) * u64::from(MILLI),
        compute_free: free.saturating_mul(MILLI) / slices,
        slices,
        slices_free: free,
        utilization: utilization.map(|u| u.clamp(0.0, 1.0) as f32),
    }
}

/// The request for `k` slices of a GPU cut into `cut`: a share of one GPU
/// below a whole one, whole GPUs for a multiple of `cut`; None for a count
/// that is neither (no GPU of that cut can hold it). `models`: the GPU
/// models or classes allowed (empty: any).
pub fn slice_request(k: u32, cut: u32, models: Vec<String>) -> Option<Request> {
    let cut = cut.max(1);
    let gpu = if k < cut {
        GpuNeed::Share {
            compute: k * MILLI / cut,
            memory: MemoryNeed::Mib(u64::from(k) * u64::from(MILLI)),
            slices: k,
        }
    } else if k.is_multiple_of(cut) {
        GpuNeed::Whole(k / cut)
    } else {
        return None;
    };
    Some(Request {
        cpu_milli: 0,
        memory_mib: 0,
        gpu,
        models,
    })
}

/// The distinct cuts of these slice counts, smallest first: the order in
/// which callers try them.
pub fn cuts(slices: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut c: Vec<u32> = slices.into_iter().map(|s| s.max(1)).collect();
    c.sort_unstable();
    c.dedup();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_compute_is_the_gpus_own_share() {
        let a = slice_gpu("T4", "", 4, 2, None);
        let b = slice_gpu("A100", "", 8, 2, Some(2.0));
        assert_eq!(a.compute_free, 500, "2 of 4 slices: half the GPU");
        assert_eq!(b.compute_free, 250, "2 of 8: a quarter");
        assert_eq!((a.memory_mib, a.memory_free_mib), (4000, 2000));
        assert_eq!(b.utilization, Some(1.0), "clamped");
        assert_eq!(a.free_share(), 500);
        assert!(slice_gpu("x", "", 4, 4, None).is_unused());
    }

    #[test]
    fn slices_become_shares_or_whole_gpus() {
        let share = slice_request(3, 8, Vec::new()).expect("share");
        assert_eq!(
            share.gpu,
            GpuNeed::Share {
                compute: 375,
                memory: MemoryNeed::Mib(3000),
                slices: 3
            }
        );
        assert!(share.gpu_milli() <= u64::from(slice_gpu("", "", 8, 3, None).compute_free));
        assert_eq!(
            slice_request(16, 8, Vec::new()).map(|r| r.gpu),
            Some(GpuNeed::Whole(2))
        );
        assert!(slice_request(12, 8, Vec::new()).is_none());
        assert_eq!(cuts([8, 4, 8, 0]), [1, 4, 8]);
    }
}
