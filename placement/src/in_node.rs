//! The choice among one node's GPUs for a request of slices: how many
//! slices each GPU gives. The device plugin's GetPreferredAllocation asks
//! this (the kubelet has already chosen the node); it only turns the
//! kubelet's slice IDs into [`SliceGpu`]s and the counts back into IDs.
//!
//! 1. GPUs marked [`SliceGpu::keep_with`] (they hold slices the request
//!    must include) get the request first, to keep it together: one of them
//!    that holds all of it, chosen as in rule 2; if none does, each of them
//!    in turn, the most free first, until the request is met.
//! 2. What is left goes to one GPU whenever one GPU can hold it: the engine
//!    ranks the GPUs that can, as one node's, under the policy. GPUs are
//!    given to it through the one slice adapter ([`crate::slices`]), per
//!    cut (GPUs cut into the same number of slices), the smallest cut
//!    first, as the scheduler extender tries them. Remaining ties: the
//!    engine's order, GPU index order.
//! 3. A request no single GPU can hold is spread over the fewest GPUs: the
//!    ones with the most free slices (GPU index order among equals) are
//!    taken whole until the rest fits on one, which is then chosen as in
//!    rule 2.

use crate::cluster::Node;
use crate::engine::Engine;
use crate::frag::TaskMix;
use crate::policy::Policy;
use crate::slices::{cuts, slice_gpu, slice_request};

/// One GPU of the node, as the request sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceGpu {
    /// The GPU's index on the node: the last tie-break.
    pub index: u32,
    /// Slices the GPU is cut into under the config in force.
    pub slices: u32,
    /// Its slices free for this request.
    pub free: u32,
    /// Mean utilization (0..=1); None if unmeasured (counts as idle).
    pub utilization: Option<f64>,
    /// It holds slices the request must include: rule 1.
    pub keep_with: bool,
}

/// How many of `n` slices each of `gpus` gives (same order as `gpus`):
/// rules 1 to 3 of the module docs. The counts add up to `n`, or to all the
/// free slices when there are fewer than `n`.
pub fn split(gpus: &[SliceGpu], n: u32, policy: Policy) -> Vec<u32> {
    let mut s = Split {
        gpus,
        free: gpus.iter().map(|g| g.free).collect(),
        taken: vec![0; gpus.len()],
        remaining: n,
    };

    // Rule 1: the GPUs of the must-include slices first, the most free
    // first (a stable sort: input order among equals).
    let mut keep: Vec<usize> = (0..gpus.len()).filter(|&i| gpus[i].keep_with).collect();
    if !keep.is_empty() {
        keep.sort_by(|&a, &b| s.free[b].cmp(&s.free[a]));
        let fitting = s.fitting(&keep);
        if let Some(i) = s.select(&fitting, policy) {
            s.take(i);
        } else {
            for i in keep {
                s.take(i);
            }
        }
    }

    if s.remaining > 0 {
        // Rule 2: one GPU that holds it all.
        let all: Vec<usize> = (0..gpus.len()).collect();
        let fitting = s.fitting(&all);
        if let Some(i) = s.select(&fitting, policy) {
            s.take(i);
        } else {
            // Rule 3: fewest GPUs. The most free first (GPU index order
            // among equals); whole GPUs are taken until the rest fits on
            // one, which is then chosen as in rule 2.
            let mut order: Vec<usize> = all.into_iter().filter(|&i| s.free[i] > 0).collect();
            order.sort_by(|&a, &b| {
                s.free[b]
                    .cmp(&s.free[a])
                    .then(gpus[a].index.cmp(&gpus[b].index))
            });
            let mut k = 0;
            while s.remaining > 0 && k < order.len() {
                let rest = s.fitting(&order[k..]);
                if let Some(i) = s.select(&rest, policy) {
                    s.take(i);
                    break;
                }
                s.take(order[k]);
                k += 1;
            }
        }
    }
    s.taken
}

/// The split in progress.
struct Split<'a> {
    gpus: &'a [SliceGpu],
    /// Free slices per GPU, less those taken.
    free: Vec<u32>,
    taken: Vec<u32>,
    remaining: u32,
}

impl Split<'_> {
    /// Moves as much of the rest of the request as GPU `i` holds onto it.
    fn take(&mut self, i: usize) {
        let n = self.remaining.min(self.free[i]);
        self.free[i] -= n;
        self.taken[i] += n;
        self.remaining -= n;
    }

    /// Those of `among` that hold the rest of the request, in `among`'s order.
    fn fitting(&self, among: &[usize]) -> Vec<usize> {
        among
            .iter()
            .copied()
            .filter(|&i| self.free[i] >= self.remaining)
            .collect()
    }

    /// A GPU's cut: the slices it is cut into under the config in force
    /// (or more, when more are free: an older config's).
    fn cut_of(&self, i: usize) -> u32 {
        self.gpus[i].slices.max(self.free[i]).max(1)
    }

    /// Rule 2 among `fitting` for the rest of the request: the engine's
    /// choice, per cut, the smallest cut first; None when `fitting` is
    /// empty.
    fn select(&self, fitting: &[usize], policy: Policy) -> Option<usize> {
        let n = self.remaining;
        let mut pool: Vec<usize> = fitting.to_vec();
        // The engine breaks its remaining ties by GPU order: GPU index order.
        pool.sort_by_key(|&i| self.gpus[i].index);
        for cut in cuts(pool.iter().map(|&i| self.cut_of(i))) {
            let same: Vec<usize> = pool
                .iter()
                .copied()
                .filter(|&i| self.cut_of(i) == cut)
                .collect();
            let Some(req) = slice_request(n, cut, Vec::new()) else {
                continue;
            };
            let gpus = same
                .iter()
                .map(|&i| slice_gpu("", "", cut, self.free[i], self.gpus[i].utilization))
                .collect();
            let node = Node::new("this-node", 0, 0, gpus);
            // The task mix a node knows of is the request in hand:
            // fragmentation is then the free share left on GPUs too small
            // for another like it.
            let mix = TaskMix::from_requests([&req], 1.0);
            // Under shared-threshold a cut may hold only busy GPUs while
            // another holds a quiet one; any refusal moves to the next cut.
            if let Ok(c) = Engine::new(vec![node], policy, &mix).and_then(|mut e| e.decide(&req))
                && let Some(&g) = c.gpus.first()
            {
                return Some(same[g]);
            }
        }
        // Every candidate fits by construction: an engine that takes none
        // of them still leaves the request one GPU (the lowest index).
        pool.first().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINPACK: Policy = Policy::Binpack;

    fn gpu(index: u32, free: u32) -> SliceGpu {
        SliceGpu {
            index,
            slices: 8,
            free,
            utilization: Some(0.0),
            keep_with: false,
        }
    }

    fn keep(g: SliceGpu) -> SliceGpu {
        SliceGpu {
            keep_with: true,
            ..g
        }
    }

    #[test]
    fn one_gpu_that_holds_it_all_is_the_policys_choice() {
        let gpus = [gpu(0, 8), gpu(1, 3), gpu(2, 2)];
        assert_eq!(split(&gpus, 3, BINPACK), [0, 3, 0], "fullest that fits");
        assert_eq!(split(&gpus, 2, BINPACK), [0, 0, 2]);
        assert_eq!(split(&gpus, 2, Policy::Spread), [2, 0, 0], "emptiest");
        assert_eq!(split(&gpus, 0, BINPACK), [0, 0, 0]);
    }

    #[test]
    fn cuts_are_ranked_apart_the_smallest_first() {
        // GPU 0 cut into 4 with 2 free (half of it), GPU 1 into 8 with 4
        // free (half of it): the smaller cut is tried first.
        let gpus = [
            SliceGpu {
                slices: 4,
                ..gpu(0, 2)
            },
            gpu(1, 4),
        ];
        assert_eq!(split(&gpus, 2, BINPACK), [2, 0]);
        assert_eq!(split(&gpus, 3, BINPACK), [0, 3]);
        // Each cut is ranked on its own: under shared-threshold a busy GPU
        // is passed over only for a quiet one of its own cut.
        let mut busy = gpus.to_vec();
        busy[0].utilization = Some(0.95);
        assert_eq!(split(&busy, 2, Policy::SharedThreshold(0.2)), [2, 0]);
        busy.push(SliceGpu {
            slices: 4,
            ..gpu(2, 3)
        });
        assert_eq!(split(&busy, 2, Policy::SharedThreshold(0.2)), [0, 0, 2]);
        assert_eq!(split(&busy, 2, BINPACK), [2, 0, 0]);
    }

    #[test]
    fn a_request_no_gpu_holds_goes_to_the_fewest_most_free_gpus() {
        let gpus = [gpu(0, 2), gpu(1, 5), gpu(2, 3), gpu(3, 4)];
        // 8: GPU 1 (5, the most free) whole, then the rest of 3 on the
        // binpack choice among those that hold it: GPU 2 (3), not 3 (4).
        assert_eq!(split(&gpus, 8, BINPACK), [0, 5, 3, 0]);
        // 11: GPUs 1 and 3 whole, the rest of 2 on GPU 0 (fullest fit).
        assert_eq!(split(&gpus, 11, BINPACK), [2, 5, 0, 4]);
        // More than everything: all of it.
        assert_eq!(split(&gpus, 20, BINPACK), [2, 5, 3, 4]);
        // Equal free: the lower index is taken whole first.
        let gpus = [gpu(1, 4), gpu(0, 4), gpu(2, 1)];
        assert_eq!(split(&gpus, 6, Policy::Spread), [2, 4, 0]);
    }

    #[test]
    fn the_must_include_gpus_are_filled_first_the_most_free_first() {
        // GPU 0 holds all 3: it, though binpack alone would take GPU 1.
        let gpus = [keep(gpu(0, 6)), gpu(1, 3)];
        assert_eq!(split(&gpus, 3, BINPACK), [3, 0]);
        // Two must GPUs, neither holds 5: the most free (GPU 2) first, then
        // GPU 0; GPU 1, free as it is, gets nothing.
        let gpus = [keep(gpu(0, 2)), gpu(1, 8), keep(gpu(2, 4))];
        assert_eq!(split(&gpus, 5, BINPACK), [1, 0, 4]);
        // Both must GPUs hold 2: the policy chooses among them (binpack:
        // the fuller), not the free GPU 1.
        assert_eq!(split(&gpus, 2, BINPACK), [2, 0, 0]);
        // The must GPUs cannot hold it all: the rest as rules 2 and 3.
        let gpus = [keep(gpu(0, 1)), gpu(1, 3)];
        assert_eq!(split(&gpus, 3, BINPACK), [1, 2]);
    }
}
