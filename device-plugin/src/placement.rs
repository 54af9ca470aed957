//! GetPreferredAllocation as a pure function: which of the kubelet's
//! available slices a request should get.
//!
//! Rules, in order:
//! 1. `must_include` IDs are always in the answer, and the rest of the
//!    request goes to their GPUs first, to keep it together.
//! 2. All slices of a request go to one GPU whenever one GPU can hold them.
//! 3. Among GPUs that fit, a GPU whose idle fraction over the last minute is
//!    below `sharedThreshold` is not chosen while a less busy one fits.
//! 4. Then the placement engine (`tessera-placement`, the one that places
//!    across the cluster) ranks the GPUs that remain, as one node's: `binpack`
//!    takes the GPU left with the least free share (the fewest free slices
//!    among GPUs cut alike: whole GPUs stay free for big requests), `spread`
//!    the one with the lowest measured utilization (ties: most free slices),
//!    `defrag` (the default) and `fgd` the one whose placing leaves the least
//!    free share stranded on GPUs too small for another request like this
//!    one (`defrag` then best fit), `shared-threshold` binpack after rule 3
//!    with the node's `sharedThreshold`. Remaining ties: the less utilized
//!    GPU, then the lowest GPU index.
//! 5. A request no single GPU can hold is spread over the fewest GPUs: the
//!    ones with the most free slices, the last chosen by rules 3 and 4.
//!
//! Within a GPU the lowest free slice indexes are taken.

use std::collections::{BTreeMap, BTreeSet};

use crate::device_id::DeviceId;
use tessera_node::config::Placement;
use tessera_placement::cluster::MILLI;
use tessera_placement::{Engine, Gpu, GpuNeed, MemoryNeed, Node, TaskMix};

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

impl GpuLoad {
    fn idle(&self) -> f64 {
        1.0 - self.utilization.unwrap_or(0.0)
    }
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
            // Rule 5: fewest GPUs. Order by free slices (desc), least busy and
            // then policy order among equals; take whole GPUs until the rest
            // fits on one, which is then chosen like a single-GPU request.
            let mut order: Vec<usize> = (0..candidates.len())
                .filter(|&i| !candidates[i].free.is_empty())
                .collect();
            order.sort_by(|&a, &b| {
                let (ca, cb) = (&candidates[a], &candidates[b]);
                cb.free
                    .len()
                    .cmp(&ca.free.len())
                    .then_with(|| busy(ca, policy).cmp(&busy(cb, policy)))
                    .then_with(|| policy_order(ca, cb, policy))
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

fn busy(c: &Candidate<'_>, policy: Policy) -> bool {
    c.load.idle() < policy.shared_threshold
}

/// `Less` when `a` is preferred by the placement policy alone (the order of
/// rule 5's spill-over).
fn policy_order(a: &Candidate<'_>, b: &Candidate<'_>, policy: Policy) -> std::cmp::Ordering {
    let by_index = a.load.index.cmp(&b.load.index);
    match policy.placement {
        Placement::Spread => {
            let ua = a.load.utilization.unwrap_or(0.0);
            let ub = b.load.utilization.unwrap_or(0.0);
            ua.total_cmp(&ub)
                .then_with(|| b.free.len().cmp(&a.free.len()))
                .then(by_index)
        }
        // The others all end in best fit: the fullest GPU first.
        Placement::Binpack
        | Placement::SharedThreshold(_)
        | Placement::Fgd
        | Placement::Defrag
        | Placement::DefragWithout(_) => a.free.len().cmp(&b.free.len()).then(by_index),
    }
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

/// A candidate as the engine sees a GPU: cut into `S` slices with `f` free,
/// `⌊1000·f/F⌋` of compute and `f` slices of memory (counted in thousandths
/// of a slice, so that `f ≥ n` is exactly "n slices fit") are free, where
/// `F` is the finest cut among the candidates: a slice weighs the same on
/// every GPU, so that what a placement leaves free compares across GPUs cut
/// differently. GPUs cut alike (the usual node) get `⌊1000·f/S⌋`, as the
/// scheduler extender models them.
fn engine_gpu(c: &Candidate<'_>, finest: u32) -> Gpu {
    let free = u32::try_from(c.free.len()).unwrap_or(u32::MAX);
    let cut = c.load.slices.max(free).max(1);
    Gpu {
        model: String::new(),
        class: String::new(),
        memory_mib: u64::from(cut) * u64::from(MILLI),
        memory_free_mib: u64::from(free) * u64::from(MILLI),
        compute_free: free.saturating_mul(MILLI) / finest.max(cut),
        slices: cut,
        slices_free: free,
        utilization: c.load.utilization.map(|u| u.clamp(0.0, 1.0) as f32),
    }
}

/// Rules 3 and 4 among `fitting` candidates for `n` slices: the busy ones
/// are set aside while a quiet one fits, then the engine ranks the rest.
fn select(cands: &[Candidate<'_>], fitting: &[usize], policy: Policy, n: usize) -> Option<usize> {
    let any_quiet = fitting.iter().any(|&i| !busy(&cands[i], policy));
    let mut pool: Vec<usize> = fitting
        .iter()
        .copied()
        .filter(|&i| !any_quiet || !busy(&cands[i], policy))
        .collect();
    // The engine breaks its remaining ties by GPU order: GPU index order.
    pool.sort_by_key(|&i| cands[i].load.index);
    let first = *pool.first()?;
    let n = u32::try_from(n).ok()?;
    let finest = pool
        .iter()
        .map(|&i| {
            cands[i]
                .load
                .slices
                .max(u32::try_from(cands[i].free.len()).unwrap_or(u32::MAX))
        })
        .max()
        .unwrap_or(1)
        .max(1);
    let gpus: Vec<Gpu> = pool
        .iter()
        .map(|&i| engine_gpu(&cands[i], finest))
        .collect();
    // Slices are what must fit (memory, counted as above). The compute
    // asked is n slices of the finest cut: it fits on every GPU with n free
    // slices, and placing it takes share off the GPU, which fragmentation
    // (fgd, defrag) and best fit are measured on.
    let node = Node::new("this-node", 0, 0, gpus);
    let req = tessera_placement::Request {
        cpu_milli: 0,
        memory_mib: 0,
        gpu: GpuNeed::Share {
            compute: n.saturating_mul(MILLI) / finest,
            memory: MemoryNeed::Mib(u64::from(n) * u64::from(MILLI)),
            slices: n,
        },
        models: Vec::new(),
    };
    // The task mix a node knows of is the request in hand: fragmentation
    // is then the free share left on GPUs too small for another like it.
    let mix = TaskMix::from_requests([&req], 1.0);
    let choice =
        Engine::new(vec![node], engine_policy(policy), &mix).and_then(|mut e| e.decide(&req));
    match choice {
        Ok(c) => c.gpus.first().map(|&g| pool[g]),
        Err(e) => {
            // Every candidate fits by construction; fall back to the first.
            tracing::warn!(error = %e, "placement engine refused a fitting GPU");
            Some(first)
        }
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
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["A::0", "A::1"]);
        // Raising nothing: with threshold 0 the busy GPU is fine.
        let loose = Policy {
            shared_threshold: 0.0,
            ..BINPACK
        };
        assert_eq!(run(&avail, &[], 2, &gpus, loose), ["B::0", "B::1"]);
        // When only the busy GPU fits, it is chosen.
        assert_eq!(run(&avail, &[], 4, &gpus, BINPACK).len(), 4);
        let avail = ids(&[("A", &[0]), ("B", &[0, 1])]);
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["B::0", "B::1"]);
        // With a threshold above both idle fractions, both count as busy
        // and plain binpack decides.
        let strict = Policy {
            shared_threshold: 0.95,
            ..BINPACK
        };
        let avail = ids(&[("A", &[0, 1, 2]), ("B", &[0, 1])]);
        assert_eq!(
            run(&avail, &[], 2, &gpus, strict),
            ["B::0", "B::1"],
            "both busy: plain binpack"
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
        assert_eq!(run(&avail, &[], 2, &gpus, BINPACK), ["A::0", "A::1"]);
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
