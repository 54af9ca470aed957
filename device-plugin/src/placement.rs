//! GetPreferredAllocation as a pure function: which of the kubelet's
//! available slices a request should get. Which GPU is the placement
//! engine's choice (`tessera-placement`, the one that places across the
//! cluster); this module only turns the kubelet's lists into the engine's
//! view and back, and applies nothing of its own to rank GPUs.
//!
//! 1. `must_include` IDs are always in the answer, and the rest of the
//!    request goes to their GPUs first, to keep it together.
//! 2. All slices of a request go to one GPU whenever one GPU can hold them:
//!    the engine ranks the GPUs that can, as one node's, under the node's
//!    policy (`binpack`, `spread`, `defrag`, `fgd`, `shared-threshold` with
//!    the node's `sharedThreshold`: see docs/placement.md). GPUs are given
//!    to it as the scheduler extender gives them
//!    ([`tessera_placement::slices`]), per cut (GPUs cut into the same
//!    number of slices), the smallest cut first, as the extender tries
//!    them. Remaining ties: the engine's order, GPU index order.
//! 3. A request no single GPU can hold is spread over the fewest GPUs: the
//!    ones with the most free slices (GPU index order among equals), the
//!    last chosen as in rule 2.
//!
//! Within a GPU the lowest free slice indexes are taken.

use std::collections::{BTreeMap, BTreeSet};

use crate::device_id::DeviceId;
use tessera_node::config::Placement;
use tessera_placement::slices::{cuts, slice_gpu, slice_request};
use tessera_placement::{Engine, Node, TaskMix};

/// What placement needs to know about one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuLoad {
    pub uuid: String,
    pub index: u32,
    /// Slices the GPU is cut into under the config in force.
    pub slices: u32,
    /// Mean utilization (0..=1) over the last minute; None if unmeasured.
    pub utilization: Option<f64>,
}

/// The node-level policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub placement: Placement,
    pub shared_threshold: f64,
}

/// One container's request, as the kubelet sends it.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub available: &'a [String],
    pub must_include: &'a [String],
    pub size: usize,
}

struct Candidate<'a> {
    load: &'a GpuLoad,
    free: Vec<u32>,
}

/// Chooses `size` device IDs (fewer if fewer are available).
pub fn preferred(req: &Request<'_>, gpus: &[GpuLoad], policy: Policy) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for id in req.must_include {
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    if chosen.len() >= req.size {
        return chosen;
    }
    let mut remaining = req.size - chosen.len();

    // Free slices per known GPU, minus what is already chosen.
    let mut free: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut unknown: Vec<&String> = Vec::new();
    for id in req.available {
        if chosen.contains(id) {
            continue;
        }
        match DeviceId::parse(id) {
            Ok(d) => match gpus.iter().find(|g| g.uuid == d.gpu_uuid) {
                Some(g) => {
                    free.entry(g.uuid.as_str()).or_default().insert(d.slice);
                }
                None => unknown.push(id),
            },
            Err(_) => unknown.push(id),
        }
    }
    let mut candidates: Vec<Candidate<'_>> = gpus
        .iter()
        .filter_map(|g| {
            let f = free.remove(g.uuid.as_str())?;
            Some(Candidate {
                load: g,
                free: f.into_iter().collect(),
            })
        })
        .collect();

    let mut picked: Vec<DeviceId> = Vec::new();

    // Rule 1: fill from the GPUs of must_include first (most free first).
    let must_gpus: Vec<String> = req
        .must_include
        .iter()
        .filter_map(|id| DeviceId::parse(id).ok().map(|d| d.gpu_uuid))
        .collect();
    if !must_gpus.is_empty() {
        let mut idx: Vec<usize> = (0..candidates.len())
            .filter(|&i| must_gpus.contains(&candidates[i].load.uuid))
            .collect();
        idx.sort_by(|&a, &b| candidates[b].free.len().cmp(&candidates[a].free.len()));
        // If one of them holds the rest, prefer it by the policy.
        let fitting: Vec<usize> = idx
            .iter()
            .copied()
            .filter(|&i| candidates[i].free.len() >= remaining)
            .collect();
        if let Some(i) = select(&candidates, &fitting, policy, remaining) {
            remaining -= take(&mut candidates[i], remaining, &mut picked);
        } else {
            for i in idx {
                remaining -= take(&mut candidates[i], remaining, &mut picked);
            }
        }
    }

    if remaining > 0 {
        // Rule 2: one GPU that holds it all.
        let fitting: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].free.len() >= remaining)
            .collect();
        if let Some(i) = select(&candidates, &fitting, policy, remaining) {
            remaining -= take(&mut candidates[i], remaining, &mut picked);
        } else {
            // Rule 3: fewest GPUs. The most free slices first (GPU index
            // order among equals); whole GPUs are taken until the rest
            // fits on one, which is then chosen as in rule 2.
            let mut order: Vec<usize> = (0..candidates.len())
                .filter(|&i| !candidates[i].free.is_empty())
                .collect();
            order.sort_by(|&a, &b| {
                let (ca, cb) = (&candidates[a], &candidates[b]);
                cb.free
                    .len()
                    .cmp(&ca.free.len())
                    .then(ca.load.index.cmp(&cb.load.index))
            });
            let mut k = 0;
            while remaining > 0 && k < order.len() {
                let rest: Vec<usize> = order[k..]
                    .iter()
                    .copied()
                    .filter(|&i| candidates[i].free.len() >= remaining)
                    .collect();
                if let Some(i) = select(&candidates, &rest, policy, remaining) {
                    remaining -= take(&mut candidates[i], remaining, &mut picked);
                    break;
                }
                let i = order[k];
                remaining -= take(&mut candidates[i], remaining, &mut picked);
                k += 1;
            }
        }
    }

    picked.sort_by_key(|d| {
        (
            gpus.iter()
                .position(|g| g.uuid == d.gpu_uuid)
                .unwrap_or(usize::MAX),
            d.slice,
        )
    });
    chosen.extend(picked.into_iter().map(|d| d.to_string()));
    // Last resort: IDs this plugin does not know (a stale list). The kubelet
    // decides; it is not ours to drop them silently.
    chosen.extend(unknown.into_iter().take(remaining).cloned());
    chosen
}

/// Moves up to `n` of the lowest free slices of `c` into `picked`.
fn take(c: &mut Candidate<'_>, n: usize, picked: &mut Vec<DeviceId>) -> usize {
    let n = n.min(c.free.len());
    for s in c.free.drain(..n) {
        picked.push(DeviceId::new(c.load.uuid.clone(), s));
    }
    n
}

/// The engine's policy for a node's: `shared-threshold` with the node's
/// `sharedThreshold`, the others as named.
fn engine_policy(policy: Policy) -> tessera_placement::Policy {
    match policy.placement {
        Placement::SharedThreshold(_) => {
            tessera_placement::Policy::SharedThreshold(policy.shared_threshold)
        }
        other => other,
    }
}

/// A candidate's cut: the slices it is cut into under the config in force
/// (or more, when the kubelet lists more free ones: an older config's).
fn cut_of(c: &Candidate<'_>) -> u32 {
    c.load
        .slices
        .max(u32::try_from(c.free.len()).unwrap_or(u32::MAX))
        .max(1)
}

/// Rule 2 among `fitting` candidates for `n` slices: the engine's choice,
/// per cut, the smallest cut first (see the module docs).
fn select(cands: &[Candidate<'_>], fitting: &[usize], policy: Policy, n: usize) -> Option<usize> {
    let n = u32::try_from(n).ok()?;
    let mut pool: Vec<usize> = fitting.to_vec();
    // The engine breaks its remaining ties by GPU order: GPU index order.
    pool.sort_by_key(|&i| cands[i].load.index);
    for cut in cuts(pool.iter().map(|&i| cut_of(&cands[i]))) {
        let same: Vec<usize> = pool
            .iter()
            .copied()
            .filter(|&i| cut_of(&cands[i]) == cut)
            .collect();
        let Some(req) = slice_request(n, cut, Vec::new()) else {
            continue;
        };
        let gpus = same
            .iter()
            .map(|&i| {
                let c = &cands[i];
                let free = u32::try_from(c.free.len()).unwrap_or(u32::MAX);
                slice_gpu("", "", cut, free, c.load.utilization)
            })
            .collect();
        let node = Node::new("this-node", 0, 0, gpus);
        // The task mix a node knows of is the request in hand: fragmentation
        // is then the free share left on GPUs too small for another like it.
        let mix = TaskMix::from_requests([&req], 1.0);
        match Engine::new(vec![node], engine_policy(policy), &mix).and_then(|mut e| e.decide(&req))
        {
            Ok(c) => {
                if let Some(&g) = c.gpus.first() {
                    return Some(same[g]);
                }
            }
            // Under shared-threshold a cut may hold only busy GPUs while
            // another holds a quiet one; any refusal moves to the next cut.
            Err(e) => tracing::debug!(error = %e, cut, "no GPU of this cut chosen"),
        }
    }
    // Every candidate fits by construction: an engine that takes none of
    // them still leaves the request one GPU (the lowest index).
    pool.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINPACK: Policy = Policy {
        placement: Placement::Binpack,
        shared_threshold: 0.2,
    };
    const SPREAD: Policy = Policy {
        placement: Placement::Spread,
        shared_threshold: 0.2,
    };

    fn gpu(uuid: &str, index: u32, util: f64) -> GpuLoad {
        GpuLoad {
            uuid: uuid.into(),
            index,
            slices: 8,
            utilization: Some(util),
        }
    }

    fn ids(spec: &[(&str, &[u32])]) -> Vec<String> {
        spec.iter()
            .flat_map(|(u, s)| s.iter().map(move |n| format!("{u}::{n}")))
            .collect()
    }

    fn gpus_of(result: &[String]) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for id in result {
            let d = DeviceId::parse(id).expect("id");
            *m.entry(d.gpu_uuid).or_default() += 1;
        }
        m
    }

    fn run(
        avail: &[String],
        must: &[String],
        size: usize,
        gpus: &[GpuLoad],
        p: Policy,
    ) -> Vec<String> {
        preferred(
            &Request {
                available: avail,
                must_include: must,
                size,
            },
            gpus,
            p,
        )
    }

    #[test]
    fn binpack_takes_the_fullest_gpu_that_fits() {
        let gpus = [gpu("A", 0, 0.0), gpu("B", 1, 0.0), gpu("C", 2, 0.0)];
        // A has 8 free, B 3, C 2.
        let avail = ids(&[
            ("A", &[0, 1, 2, 3, 4, 5, 6, 7]),
            ("B", &[1, 4, 6]),
            ("C", &[0, 1]),
        ]);
        assert_eq!(
            run(&avail, &[], 3, &gpus, BINPACK),
            ["B::1", "B::4", "B::6"]
        );
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["C::0", "C::1"]);
        assert_eq!(
            run(&avail, &[], 4, &gpus, BINPACK),
            ["A::0", "A::1", "A::2", "A::3"]
        );
    }

    fn with(placement: Placement) -> Policy {
        Policy {
            placement,
            shared_threshold: 0.2,
        }
    }

    #[test]
    fn defrag_and_fgd_leave_no_stranded_slices_where_binpack_would() {
        let gpus = [gpu("A", 0, 0.0), gpu("B", 1, 0.0)];
        // A has 4 free, B 3. Two slices on B leave one there that no other
        // request of two can use; on A they leave two that one can.
        let avail = ids(&[("A", &[0, 1, 2, 3]), ("B", &[0, 1, 2])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["B::0", "B::1"]);
        for p in [Placement::Defrag, Placement::Fgd] {
            assert_eq!(run(&avail, &[], 2, &gpus, with(p)), ["A::0", "A::1"], "{p}");
        }
        // Where nothing is stranded either way, defrag is best fit: three
        // slices fill B exactly.
        assert_eq!(
            run(&avail, &[], 3, &gpus, with(Placement::Defrag)),
            ["B::0", "B::1", "B::2"]
        );
        // The default policy of a node config is defrag.
        assert_eq!(Placement::default(), Placement::Defrag);
    }

    #[test]
    fn shared_threshold_policy_takes_the_nodes_threshold() {
        // B is the best fit but busy for a threshold of 0.5 (idle 0.4),
        // not for 0.2.
        let gpus = [gpu("A", 0, 0.0), gpu("B", 1, 0.6)];
        let avail = ids(&[("A", &[0, 1, 2, 3]), ("B", &[0, 1])]);
        let policy = |t: f64| Policy {
            placement: Placement::SharedThreshold(0.2),
            shared_threshold: t,
        };
        assert_eq!(run(&avail, &[], 2, &gpus, policy(0.2)), ["B::0", "B::1"]);
        assert_eq!(run(&avail, &[], 2, &gpus, policy(0.5)), ["A::0", "A::1"]);
        assert_eq!(
            engine_policy(policy(0.5)),
            tessera_placement::Policy::SharedThreshold(0.5)
        );
    }

    #[test]
    fn spread_takes_the_least_utilized_gpu_that_fits() {
        let gpus = [gpu("A", 0, 0.5), gpu("B", 1, 0.3), gpu("C", 2, 0.6)];
        let avail = ids(&[("A", &[0, 1, 2, 3]), ("B", &[0, 1]), ("C", &[0, 1, 2, 3])]);
        assert_eq!(run(&avail, &[], 2, &gpus, SPREAD), ["B::0", "B::1"]);
        // B cannot hold 3: the next least utilized, A.
        assert_eq!(run(&avail, &[], 3, &gpus, SPREAD), ["A::0", "A::1", "A::2"]);
        // Binpack on the same input picks the fullest fitting GPU.
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["B::0", "B::1"]);
        assert_eq!(
            run(&avail, &[], 3, &gpus, BINPACK),
            ["A::0", "A::1", "A::2"]
        );
    }

    #[test]
    fn shared_threshold_avoids_busy_gpus_while_another_fits() {
        // B is the binpack choice but is 90% busy (idle 0.1 < 0.2).
        let gpus = [gpu("A", 0, 0.1), gpu("B", 1, 0.9)];
        let avail = ids(&[("A", &[0, 1, 2, 3]), ("B", &[0, 1])]);
        let shared = with(Placement::SharedThreshold(0.2));
        assert_eq!(run(&avail, &[], 2, &gpus, shared), ["A::0", "A::1"]);
        // Only shared-threshold looks at the threshold: binpack takes B.
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["B::0", "B::1"]);
        // Raising nothing: with threshold 0 the busy GPU is fine.
        let loose = Policy {
            shared_threshold: 0.0,
            ..shared
        };
        assert_eq!(run(&avail, &[], 2, &gpus, loose), ["B::0", "B::1"]);
        // When only the busy GPU fits, it is chosen.
        assert_eq!(run(&avail, &[], 4, &gpus, shared).len(), 4);
        let avail = ids(&[("A", &[0]), ("B", &[0, 1])]);
        assert_eq!(run(&avail, &[], 2, &gpus, shared), ["B::0", "B::1"]);
        // With a threshold above both idle fractions, both count as busy
        // and plain binpack decides.
        let strict = Policy {
            shared_threshold: 0.95,
            ..shared
        };
        let avail = ids(&[("A", &[0, 1, 2]), ("B", &[0, 1])]);
        assert_eq!(
            run(&avail, &[], 2, &gpus, strict),
            ["B::0", "B::1"],
            "both busy: plain binpack"
        );
    }

    #[test]
    fn gpus_cut_differently_are_ranked_per_cut_on_their_own_share() {
        // A is cut into 4 with 2 free (half of it), B into 8 with 4 free
        // (half of it). Scaled by the finest cut, A would have looked a
        // quarter free, B half; each is placed on its own share, the
        // smaller cut first, as the scheduler extender does.
        let a = GpuLoad {
            slices: 4,
            ..gpu("A", 0, 0.0)
        };
        let gpus = [a, gpu("B", 1, 0.0)];
        let avail = ids(&[("A", &[0, 1]), ("B", &[0, 1, 2, 3])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["A::0", "A::1"]);
        // A cannot hold 3: the next cut's GPU.
        assert_eq!(
            run(&avail, &[], 3, &gpus, BINPACK),
            ["B::0", "B::1", "B::2"]
        );
    }

    #[test]
    fn binpack_ties_go_to_the_quieter_gpu_then_the_lowest_index() {
        // Equal free slices: the engine's order takes the less utilized GPU.
        let gpus = [gpu("A", 0, 0.5), gpu("B", 1, 0.1), gpu("C", 2, 0.1)];
        let avail = ids(&[("A", &[0, 1]), ("B", &[0, 1]), ("C", &[0, 1])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["B::0", "B::1"]);
        // Equally quiet: the lower index.
        let gpus = [gpu("A", 0, 0.1), gpu("B", 1, 0.1)];
        let avail = ids(&[("A", &[0, 1]), ("B", &[0, 1])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["A::0", "A::1"]);
        let avail = ids(&[("B", &[0, 1]), ("A", &[0, 1])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["A::0", "A::1"]);
    }

    #[test]
    fn unmeasured_gpus_count_as_idle() {
        let gpus = [
            GpuLoad {
                uuid: "A".into(),
                index: 0,
                slices: 8,
                utilization: None,
            },
            gpu("B", 1, 0.95),
        ];
        let avail = ids(&[("A", &[0, 1, 2]), ("B", &[0, 1])]);
        assert_eq!(
            run(&avail, &[], 2, &gpus, with(Placement::SharedThreshold(0.2))),
            ["A::0", "A::1"]
        );
    }

    #[test]
    fn request_no_gpu_can_hold_uses_the_fewest_gpus() {
        let gpus = [
            gpu("A", 0, 0.0),
            gpu("B", 1, 0.0),
            gpu("C", 2, 0.0),
            gpu("D", 3, 0.0),
        ];
        let avail = ids(&[
            ("A", &[0, 1]),
            ("B", &[0, 1, 2, 3, 4]),
            ("C", &[0, 1, 2]),
            ("D", &[0, 1, 2, 3]),
        ]);
        // 8 slices: B (5) + C (3) is two GPUs; binpack picks C for the rest
        // of 3 (fewest free that fits), not D.
        let r = run(&avail, &[], 8, &gpus, BINPACK);
        assert_eq!(r.len(), 8);
        let g = gpus_of(&r);
        assert_eq!(g.len(), 2, "{r:?}");
        assert_eq!(g.get("B"), Some(&5));
        assert_eq!(g.get("C"), Some(&3));
        // 11 slices need three GPUs.
        let r = run(&avail, &[], 11, &gpus, BINPACK);
        assert_eq!(gpus_of(&r).len(), 3, "{r:?}");
        // More than everything: all of it.
        assert_eq!(run(&avail, &[], 20, &gpus, BINPACK).len(), 14);
    }

    #[test]
    fn must_include_is_kept_and_its_gpu_filled_first() {
        let gpus = [gpu("A", 0, 0.0), gpu("B", 1, 0.0)];
        let avail = ids(&[("A", &[0, 1, 2, 3, 4, 5]), ("B", &[0, 1, 2])]);
        let must = ids(&[("A", &[4])]);
        let r = run(&avail, &must, 3, &gpus, BINPACK);
        assert_eq!(r, ["A::4", "A::0", "A::1"]);
        // must_include larger than the request is returned as is.
        let must = ids(&[("A", &[0, 1])]);
        assert_eq!(run(&avail, &must, 1, &gpus, BINPACK), ["A::0", "A::1"]);
        // Must GPU too small: the rest goes elsewhere, fewest GPUs.
        let avail = ids(&[("A", &[0, 1]), ("B", &[0, 1, 2])]);
        let must = ids(&[("A", &[0])]);
        let r = run(&avail, &must, 4, &gpus, BINPACK);
        assert_eq!(r[0], "A::0");
        assert_eq!(
            gpus_of(&r),
            BTreeMap::from([("A".into(), 2), ("B".into(), 2)])
        );
    }

    #[test]
    fn unknown_ids_are_only_a_last_resort() {
        let gpus = [gpu("A", 0, 0.0)];
        let avail = vec!["A::0".to_owned(), "X::0".to_owned(), "junk".to_owned()];
        assert_eq!(run(&avail, &[], 1, &gpus, BINPACK), ["A::0"]);
        assert_eq!(
            run(&avail, &[], 3, &gpus, BINPACK),
            ["A::0", "X::0", "junk"]
        );
        assert!(run(&avail, &[], 0, &gpus, BINPACK).is_empty());
    }
}
