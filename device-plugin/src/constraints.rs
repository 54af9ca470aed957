//! A pod's own constraint on its GPUs at the device plugin: its vendor
//! (`tessera.dev/gpu-vendor`) and its model and UUID lists
//! (`tessera.dev/gpu-models` and kin, HAMi's `nvidia.com/use-gputype` and kin
//! as the webhook translated them), matched by the contract's one rule
//! (`tessera_contract::gpu_filter`), which the scheduler extender applies
//! when it assigns.
//!
//! The kubelet does not say which pod a request is for, so, as for exact
//! limits (`assignment::exact_for_request`), the candidates are the pods
//! bound to this node, still Pending, with a container of the request's
//! size; the extender's assignment, where there is one, names the pod for
//! certain. GetPreferredAllocation offers only slices every candidate's
//! constraint lets through (else those of the oldest constrained candidate);
//! Allocate refuses devices no candidate's constraint lets through, naming
//! the annotation. A candidate may be a pod already served and still
//! starting, so a request is refused only when it can be for none of them.

use tessera_contract::gpu_filter::GpuFilter;

use crate::assignment::{PodInfo, is_pending};
use crate::device_id::DeviceId;
use crate::state::Snapshot;

/// A pod a request may be for, and its constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `namespace/name`, for messages.
    pub pod: String,
    pub filter: GpuFilter,
}

/// The candidates for a request of `n` slices on `node`, the oldest bind
/// first; only the pod `known` (namespace, name) names, when it does. A pod
/// whose annotations do not parse (the webhook refuses those) counts as
/// unconstrained: it loosens only its own choice.
pub fn candidates(
    pods: &[PodInfo],
    node: &str,
    n: u64,
    known: Option<(&str, &str)>,
) -> Vec<Candidate> {
    let mut pods: Vec<&PodInfo> = pods
        .iter()
        .filter(|p| match known {
            Some((ns, name)) => p.namespace == ns && p.name == name,
            None => {
                p.node == node
                    && is_pending(&p.phase)
                    && p.containers.iter().any(|(_, limit)| *limit == n)
            }
        })
        .collect();
    pods.sort_by_key(|p| (p.bound_at_ms.or(p.created_at_ms), p.created_at_ms));
    pods.into_iter()
        .map(|p| {
            let pod = format!("{}/{}", p.namespace, p.name);
            let filter = GpuFilter::from_annotations(&p.annotations).unwrap_or_else(|e| {
                tracing::warn!(%pod, error = %e, "GPU constraint ignored");
                GpuFilter::default()
            });
            Candidate { pod, filter }
        })
        .collect()
}

/// Whether the GPU of device `id` passes `f` (a device of a GPU this node no
/// longer lists passes nothing).
fn passes(f: &GpuFilter, id: &str, snap: &Snapshot) -> bool {
    refusal(f, id, snap).is_none()
}

fn refusal(f: &GpuFilter, id: &str, snap: &Snapshot) -> Option<String> {
    let Ok(d) = DeviceId::parse(id) else {
        return Some(format!("device {id:?} is not one of this plugin's"));
    };
    match snap.gpu(&d.gpu_uuid) {
        Some(g) => f.refusal(&g.gpu.vendor, &g.gpu.name, &g.gpu.uuid),
        None => Some(format!("GPU {} is not on this node", d.gpu_uuid)),
    }
}

/// The slices of `available` to choose from for a request of `size`: those
/// every constrained candidate lets through, else those the oldest
/// constrained candidate that has enough lets through; `None` to leave the
/// choice as it is (no candidate is constrained, or none has enough).
/// `must_include` must pass too, else that candidate is skipped.
pub fn narrow(
    candidates: &[Candidate],
    available: &[String],
    must_include: &[String],
    size: usize,
    snap: &Snapshot,
) -> Option<Vec<String>> {
    let constrained: Vec<&Candidate> = candidates.iter().filter(|c| !c.filter.is_empty()).collect();
    if constrained.is_empty() {
        return None;
    }
    let fits = |ok: &dyn Fn(&str) -> bool| {
        let ids: Vec<String> = available.iter().filter(|id| ok(id)).cloned().collect();
        (ids.len() >= size && must_include.iter().all(|m| ok(m))).then_some(ids)
    };
    fits(&|id| constrained.iter().all(|c| passes(&c.filter, id, snap))).or_else(|| {
        constrained
            .iter()
            .find_map(|c| fits(&|id| passes(&c.filter, id, snap)))
    })
}

/// Why the kubelet's devices `ids` are refused: no candidate's constraint
/// lets all of them through (the oldest constrained candidate's reason,
/// naming the annotation). `Ok` when there is no candidate, or one whose
/// constraint they meet.
pub fn check(candidates: &[Candidate], ids: &[String], snap: &Snapshot) -> Result<(), String> {
    let mut first = None;
    for c in candidates {
        match ids.iter().find_map(|id| refusal(&c.filter, id, snap)) {
            None => return Ok(()),
            Some(why) => {
                first.get_or_insert_with(|| format!("pod {}: {why}", c.pod));
            }
        }
    }
    match first {
        None => Ok(()),
        Some(why) => Err(format!(
            "devices {} break the GPU constraint of every pod they could be for: {why}",
            ids.join(",")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tessera_contract::gpu_filter::{ANNOTATION_GPU_MODELS, ANNOTATION_GPU_UUIDS_EXCLUDE};
    use tessera_contract::labels::ANNOTATION_GPU_VENDOR;

    fn pod(name: &str, bound: i64, slices: u64, ann: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            node: "n".into(),
            phase: "Pending".into(),
            bound_at_ms: Some(bound),
            created_at_ms: Some(bound),
            containers: vec![("c".into(), slices)],
            annotations: ann
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect::<BTreeMap<_, _>>(),
            ..PodInfo::default()
        }
    }

    /// Two NVIDIA GPUs of two models and one AMD GPU, two slices each.
    fn snap() -> Snapshot {
        use tessera_proto::manager::v1::{GpuStatus, NodeStatus};
        let g = |i: u32, uuid: &str, vendor: &str, name: &str| GpuStatus {
            index: i,
            uuid: uuid.into(),
            vendor: vendor.into(),
            name: name.into(),
            memory_total_bytes: 8 << 30,
            healthy: true,
            ..Default::default()
        };
        let cfg = tessera_node::config::Config::parse("default: {slice: {slicesPerGpu: 2}}")
            .expect("cfg");
        let state = crate::state::PluginState::new("n", cfg, BTreeMap::new());
        state.update_status(
            &NodeStatus {
                gpus: vec![
                    g(0, "GPU-a", "nvidia", "NVIDIA A100-SXM4-80GB"),
                    g(1, "GPU-b", "nvidia", "NVIDIA L4"),
                    g(2, "GPU-c", "amd", "AMD Instinct MI210"),
                ],
                ..Default::default()
            },
            tokio::time::Instant::now(),
        );
        (*state.snapshot()).clone()
    }

    fn ids(gpu: &str, n: u32) -> Vec<String> {
        (0..n).map(|s| format!("{gpu}::{s}")).collect()
    }

    #[test]
    fn requests_keep_to_the_constraint_of_the_pods_they_may_be_be_for() {
        let s = snap();
        let all: Vec<String> = ["GPU-a", "GPU-b", "GPU-c"]
            .iter()
            .flat_map(|g| ids(g, 2))
            .collect();
        let pods = [
            pod("old-free", 1, 1, &[]),
            pod("l4", 2, 1, &[(ANNOTATION_GPU_MODELS, "L4")]),
            pod("amd", 3, 2, &[(ANNOTATION_GPU_VENDOR, "amd")]),
            pod("gone", 4, 1, &[(ANNOTATION_GPU_MODELS, "A100")]),
        ];
        let mut gone = pods[3].clone();
        gone.phase = "Running".into();
        let pods = [pods[0].clone(), pods[1].clone(), pods[2].clone(), gone];
        let one = candidates(&pods, "n", 1, None);
        assert_eq!(
            one.iter().map(|c| c.pod.as_str()).collect::<Vec<_>>(),
            ["ns/old-free", "ns/l4"],
            "Pending pods of that size, oldest first"
        );
        assert_eq!(narrow(&one, &all, &[], 1, &s), Some(ids("GPU-b", 2)));
        assert_eq!(check(&one, &ids("GPU-b", 1), &s), Ok(()));
        // The unconstrained candidate may be the one: not refused.
        assert_eq!(check(&one, &ids("GPU-a", 1), &s), Ok(()));
        // Only the constrained one: refused, naming the annotation.
        let e = check(&one[1..], &ids("GPU-a", 1), &s).expect_err("not an L4");
        assert!(
            e.contains("ns/l4") && e.contains(ANNOTATION_GPU_MODELS),
            "{e}"
        );
        // The vendor alone: AMD slices on a mixed node.
        let two = candidates(&pods, "n", 2, None);
        assert_eq!(narrow(&two, &all, &[], 2, &s), Some(ids("GPU-c", 2)));
        let e = check(&two, &ids("GPU-a", 2), &s).expect_err("NVIDIA for an AMD pod");
        assert!(e.contains(ANNOTATION_GPU_VENDOR), "{e}");
        // The extender's pod, for certain.
        let known = candidates(&pods, "n", 1, Some(("ns", "l4")));
        assert_eq!(known.len(), 1);
        assert!(check(&known, &ids("GPU-c", 1), &s).is_err());
        // No constraint: nothing narrowed or refused.
        assert_eq!(narrow(&one[..1], &all, &[], 1, &s), None);
        assert_eq!(check(&[], &ids("GPU-a", 1), &s), Ok(()));
    }

    #[test]
    fn narrowing_falls_back_to_the_oldest_constrained_candidate_that_fits() {
        let s = snap();
        let all: Vec<String> = ["GPU-a", "GPU-b"].iter().flat_map(|g| ids(g, 2)).collect();
        let pods = [
            pod("no-a", 1, 1, &[(ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-a")]),
            pod("a-only", 2, 1, &[(ANNOTATION_GPU_MODELS, "A100")]),
        ];
        let c = candidates(&pods, "n", 1, None);
        // No slice passes both: the oldest's.
        assert_eq!(narrow(&c, &all, &[], 1, &s), Some(ids("GPU-b", 2)));
        // A must-include it breaks skips it.
        assert_eq!(
            narrow(&c, &all, &ids("GPU-a", 1), 1, &s),
            Some(ids("GPU-a", 2))
        );
        // Too few slices left for any: the choice is left as it was.
        assert_eq!(narrow(&c, &ids("GPU-b", 1), &[], 2, &s), None);
    }
}
