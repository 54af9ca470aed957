//! GetPreferredAllocation as a pure function: which of the kubelet's
//! available slices a request should get. How many slices each GPU gives
//! is the placement engine's choice ([`tessera_placement::in_node`], rules
//! there: must-include GPUs first, one GPU whenever one holds the request,
//! else the fewest GPUs; the node's policy ranks them). This module only
//! turns the kubelet's lists into the engine's view and the engine's counts
//! back into IDs, and ranks nothing itself:
//!
//! - `must_include` IDs are always in the answer; their GPUs are the ones
//!   the engine fills first.
//! - The node's policy is given to the engine as the node config names it
//!   (`shared-threshold` with the node's `sharedThreshold`).
//! - Within a GPU the lowest free slice indexes are taken; the answer lists
//!   the must-include IDs, then the rest in GPU order, slice order.
//! - IDs the plugin does not know (a stale list) are a last resort.

use std::collections::{BTreeMap, BTreeSet};

use crate::device_id::DeviceId;
use tessera_node::config::Placement;
use tessera_placement::in_node::{SliceGpu, split};

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
    let remaining = req.size - chosen.len();

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
    // The GPUs with free slices, in `gpus` order, each with its free
    // slices lowest first.
    let candidates: Vec<(&GpuLoad, Vec<u32>)> = gpus
        .iter()
        .filter_map(|g| Some((g, free.remove(g.uuid.as_str())?.into_iter().collect())))
        .collect();
    let must_gpus: Vec<String> = req
        .must_include
        .iter()
        .filter_map(|id| DeviceId::parse(id).ok().map(|d| d.gpu_uuid))
        .collect();
    let view: Vec<SliceGpu> = candidates
        .iter()
        .map(|(g, f)| SliceGpu {
            index: g.index,
            slices: g.slices,
            free: u32::try_from(f.len()).unwrap_or(u32::MAX),
            utilization: g.utilization,
            keep_with: must_gpus.contains(&g.uuid),
        })
        .collect();
    let counts = split(
        &view,
        u32::try_from(remaining).unwrap_or(u32::MAX),
        engine_policy(policy),
    );

    // `candidates` is in `gpus` order and each GPU's slices are lowest
    // first: the IDs come out in GPU order, slice order.
    let mut given = 0;
    for ((g, f), n) in candidates.iter().zip(counts) {
        for s in f.iter().take(n as usize) {
            chosen.push(DeviceId::new(g.uuid.clone(), *s).to_string());
            given += 1;
        }
    }
    // Last resort: IDs this plugin does not know (a stale list). The kubelet
    // decides; it is not ours to drop them silently.
    chosen.extend(unknown.into_iter().take(remaining - given).cloned());
    chosen
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
