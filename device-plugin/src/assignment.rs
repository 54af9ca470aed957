//! Serving the scheduler extender's choice: which pending pod of this node a
//! GetPreferredAllocation or Allocate is for, which slices to prefer for it,
//! and whether the kubelet's device IDs are the GPUs bind chose. Pure
//! decisions; the Kubernetes reads and writes are behind [`PodsOnNode`]
//! (`edge` implements it) and the service calls them (docs/placement.md,
//! "Allocate").
//!
//! The kubelet does not say which pod a request is for. As schedulers that
//! record their choice on the pod do it, the plugin looks at the pods bound
//! to its node that carry an assignment (`tessera.dev/gpu-assignment`) and
//! are still Pending, takes each one's next container not yet served, and
//! matches the request to them by slice count, the oldest bind first; a
//! candidate whose GPUs the kubelet's device IDs are exactly is preferred
//! over an older one they are not. A served container is written on its pod
//! (`tessera.dev/gpu-allocated`, the container names), so the next request
//! goes to the next pod.
//!
//! What is served is always the kubelet's device IDs: the kubelet never gives
//! them to another container, which keeps the node's accounting one. The
//! assignment decides which IDs GetPreferredAllocation offers, and whether
//! Allocate accepts the ones the kubelet then sends.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use tessera_node::exact::ExactLimit;
use tessera_node::scheduling::{Assignment, GpuTake};

use crate::device_id::DeviceId;
use crate::node_labels::NodeApiError;
use crate::refusal::AssignmentError;
use crate::state::Snapshot;

/// The pod annotation the plugin writes: the containers (comma-separated
/// names) whose assignment it has served.
pub use tessera_contract::labels::ANNOTATION_GPU_ALLOCATED;
/// The pod annotation the extender writes at bind.
pub use tessera_contract::labels::ANNOTATION_GPU_ASSIGNMENT;

/// A pod bound to this node, as far as serving its assignment goes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.phase`; empty when the API server has not set one yet.
    pub phase: String,
    /// When it was bound (its `PodScheduled` condition turned true), in ms
    /// since the Unix epoch, if known.
    pub bound_at_ms: Option<i64>,
    pub created_at_ms: Option<i64>,
    /// Its containers in spec order, with their `tessera.dev/vgpu` limit
    /// (0 when none).
    pub containers: Vec<(String, u64)>,
    pub annotations: BTreeMap<String, String>,
    /// Its labels (KAI-Scheduler's GPU group, `kai`).
    pub labels: BTreeMap<String, String>,
    /// Its `nvidia.com/gpu`, summed over its containers (KAI's reservation pods, `kai`).
    pub nvidia_gpus: u64,
}

impl PodInfo {
    /// Its containers already served, by name: the value of
    /// [`ANNOTATION_GPU_ALLOCATED`] the plugin writes after each Allocate
    /// (for the extender's pods and KAI's alike).
    pub fn served(&self) -> Vec<String> {
        self.annotations
            .get(ANNOTATION_GPU_ALLOCATED)
            .map(|v| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The pods of a node through the Kubernetes API.
pub trait PodsOnNode: Send + Sync + 'static {
    /// Every pod bound to `node`.
    fn pods_on_node(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<PodInfo>, NodeApiError>> + Send;
    /// Sets the pod's [`ANNOTATION_GPU_ALLOCATED`] to `containers`.
    fn mark_allocated(
        &self,
        namespace: &str,
        pod: &str,
        containers: &str,
    ) -> impl Future<Output = Result<(), NodeApiError>> + Send;
}

/// The next container of a pod whose assignment is still to be served.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub namespace: String,
    pub name: String,
    pub container: String,
    pub gpus: Vec<GpuTake>,
    /// The pod's containers served before this one.
    served: Vec<String>,
}

impl Pending {
    /// Another chooser's pending container (KAI-Scheduler's, `kai`).
    pub fn new(
        namespace: &str,
        name: &str,
        container: &str,
        gpus: Vec<GpuTake>,
        served: Vec<String>,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            container: container.to_owned(),
            gpus,
            served,
        }
    }

    /// `namespace/name`.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn slices(&self) -> u64 {
        self.gpus.iter().map(|g| u64::from(g.slices)).sum()
    }

    /// The value of [`ANNOTATION_GPU_ALLOCATED`] once this container is served.
    pub fn allocated_value(&self) -> String {
        let mut all = self.served.clone();
        all.push(self.container.clone());
        all.join(",")
    }

    /// `GPU-a×2, GPU-b×1`, for messages.
    fn describe(&self) -> String {
        self.gpus
            .iter()
            .map(|g| format!("{}×{}", g.uuid, g.slices))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub(crate) fn is_pending(phase: &str) -> bool {
    // A pod is admitted (and its devices allocated) while Pending; a phase
    // not set yet is a pod the kubelet has not reported on.
    phase.is_empty() || phase == "Pending"
}

/// Why a pod's assignment cannot be served at all: it is ignored (logged),
/// and its containers are served what the kubelet chose.
fn usable(p: &PodInfo, node: &str) -> Result<Option<Assignment>, String> {
    let Some(raw) = p.annotations.get(ANNOTATION_GPU_ASSIGNMENT) else {
        return Ok(None);
    };
    if p.node != node || !is_pending(&p.phase) {
        return Ok(None);
    }
    let a = Assignment::parse(raw).map_err(|e| format!("unreadable assignment: {e}"))?;
    if a.node != node {
        return Err(format!(
            "assignment is for node {:?}, the pod is bound to {node:?}",
            a.node
        ));
    }
    let mut names = BTreeSet::new();
    for c in &a.containers {
        if !names.insert(c.name.as_str()) {
            return Err(format!("container {:?} is assigned twice", c.name));
        }
        match p.containers.iter().find(|(n, _)| *n == c.name) {
            Some((_, limit)) if *limit == u64::from(c.slices()) => {}
            Some((_, limit)) => {
                return Err(format!(
                    "container {:?} is assigned {} slices but asks for {limit}",
                    c.name,
                    c.slices()
                ));
            }
            None => return Err(format!("the pod has no container {:?}", c.name)),
        }
    }
    Ok(Some(a))
}

/// The containers waiting for their assignment on `node`: per pod, its next
/// assigned container (spec order, as the kubelet allocates) not yet served;
/// the oldest bind first (then the oldest pod, then by name).
pub fn pending(pods: &[PodInfo], node: &str) -> Vec<Pending> {
    let mut pods: Vec<&PodInfo> = pods.iter().collect();
    pods.sort_by(|a, b| {
        let key = |p: &PodInfo| (p.bound_at_ms.or(p.created_at_ms), p.created_at_ms);
        key(a)
            .cmp(&key(b))
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    let mut out = Vec::new();
    for p in pods {
        let a = match usable(p, node) {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(why) => {
                tracing::warn!(pod = %format!("{}/{}", p.namespace, p.name), %why, "GPU assignment ignored");
                continue;
            }
        };
        let served = p.served();
        let next = p
            .containers
            .iter()
            .filter_map(|(n, _)| a.container(n))
            .find(|c| !served.contains(&c.name));
        if let Some(c) = next {
            out.push(Pending {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                container: c.name.clone(),
                gpus: c.gpus.clone(),
                served,
            });
        }
    }
    out
}

/// Which pending container a request of these device IDs is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The IDs are on exactly the GPUs, in the numbers, it was assigned.
    Exact(usize),
    /// The oldest with as many slices, on other GPUs.
    Other(usize),
    /// No pending container asks for as many slices: a pod placed without
    /// the extender.
    None,
}

/// Matches a request to `pending` (see [`Match`]).
pub fn find(pending: &[Pending], ids: &[DeviceId]) -> Match {
    let mut got: BTreeMap<&str, u32> = BTreeMap::new();
    for d in ids {
        *got.entry(d.gpu_uuid.as_str()).or_default() += 1;
    }
    let n = ids.len() as u64;
    let mut other = None;
    for (i, p) in pending.iter().enumerate() {
        if p.slices() != n {
            continue;
        }
        let want: BTreeMap<&str, u32> =
            p.gpus.iter().map(|g| (g.uuid.as_str(), g.slices)).collect();
        if want == got {
            return Match::Exact(i);
        }
        other.get_or_insert(i);
    }
    other.map_or(Match::None, Match::Other)
}

/// Checks the assignment against the node as it is: every GPU known,
/// healthy, and cut into at least as many slices.
pub fn check(p: &Pending, snap: &Snapshot) -> Result<(), AssignmentError> {
    for g in &p.gpus {
        let Some(have) = snap.gpu(&g.uuid) else {
            return Err(AssignmentError::UnknownGpu {
                pod: p.pod(),
                gpu: g.uuid.clone(),
            });
        };
        if !have.healthy {
            return Err(AssignmentError::Unhealthy {
                pod: p.pod(),
                gpu: g.uuid.clone(),
            });
        }
        if g.slices > have.layout.slices {
            return Err(AssignmentError::TooManySlices {
                pod: p.pod(),
                gpu: g.uuid.clone(),
                slices: g.slices,
                has: have.layout.slices,
            });
        }
    }
    Ok(())
}

/// The error for a request matched to `p` whose IDs are not its GPUs:
/// what is wrong with the assignment itself first.
pub fn disagreement(p: &Pending, ids: &[DeviceId], snap: &Snapshot) -> AssignmentError {
    if let Err(e) = check(p, snap) {
        return e;
    }
    AssignmentError::Disagree {
        pod: p.pod(),
        container: p.container.clone(),
        assigned: p.describe(),
        got: ids
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The slices to prefer for a request of `size` from `available`: those of
/// the oldest pending container of that size whose assigned GPUs all have
/// enough of them available (must-include IDs first, then the lowest
/// slices); None when no pending container is for it.
pub fn prefer(
    pending: &[Pending],
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Option<(usize, Vec<String>)> {
    let mut free: BTreeMap<String, Vec<(bool, u32, &String)>> = BTreeMap::new();
    for id in available {
        if let Ok(d) = DeviceId::parse(id) {
            let must = must_include.contains(id);
            free.entry(d.gpu_uuid)
                .or_default()
                .push((!must, d.slice, id));
        }
    }
    for v in free.values_mut() {
        v.sort();
    }
    'pods: for (i, p) in pending.iter().enumerate() {
        if p.slices() != size as u64 {
            continue;
        }
        let mut chosen = Vec::with_capacity(size);
        for g in &p.gpus {
            let Some(ids) = free.get(&g.uuid) else {
                continue 'pods;
            };
            let k = usize::try_from(g.slices).unwrap_or(usize::MAX);
            if ids.len() < k {
                continue 'pods;
            }
            chosen.extend(ids[..k].iter().map(|(_, _, id)| (*id).clone()));
        }
        if must_include.iter().all(|m| chosen.contains(m)) {
            return Some((i, chosen));
        }
    }
    None
}

/// The exact limits (`tessera.dev/dropin-limits`) to lay over an Allocate of `n`
/// slices: those of `known` (namespace, pod, container) when the request's pod is known
/// (the extender's assignment), else those every pending container of `n` slices on
/// `node` agrees on. None when any candidate has none, or two differ: the kubelet names
/// devices, not pods, and a guess could hold another pod below its ask; the owner's
/// limits then come at the PodResources pass (`pod_resources::plan_exact`).
pub fn exact_for_request(
    pods: &[PodInfo],
    node: &str,
    n: u64,
    known: Option<(&str, &str, &str)>,
) -> Option<ExactLimit> {
    let exact_of = |p: &PodInfo, container: &str| {
        tessera_node::exact::from_annotations(&p.annotations)
            .ok()?
            .remove(container)
            .filter(|e| u64::from(e.slices) == n)
    };
    if let Some((ns, name, container)) = known {
        let p = pods.iter().find(|p| p.namespace == ns && p.name == name)?;
        return exact_of(p, container);
    }
    let mut agreed: Option<Option<ExactLimit>> = None;
    for p in pods
        .iter()
        .filter(|p| p.node == node && is_pending(&p.phase))
    {
        for (c, _) in p.containers.iter().filter(|(_, limit)| *limit == n) {
            let e = exact_of(p, c);
            match &agreed {
                None => agreed = Some(e),
                Some(a) if *a == e => {}
                Some(_) => return None,
            }
        }
    }
    agreed.flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_node::scheduling::{ContainerAssignment, FORMAT_VERSION};

    #[test]
    fn exact_limits_at_allocate_are_the_known_pods_or_all_candidates() {
        let exact = |mib: u64| format!(r#"{{"cuda":{{"slices":1,"memoryMiB":{mib}}}}}"#);
        let p = |name: &str, phase: &str, limits: Option<String>| PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            node: "n".into(),
            phase: phase.into(),
            containers: vec![("cuda".into(), 1)],
            annotations: limits
                .map(|v| [(tessera_node::exact::ANNOTATION_EXACT_LIMITS.to_owned(), v)].into())
                .unwrap_or_default(),
            ..Default::default()
        };
        let mib = |e: Option<ExactLimit>| e.and_then(|e| e.memory_mib);
        // One candidate: its words.
        let one = [
            p("a", "Pending", Some(exact(3000))),
            p("old", "Running", None),
        ];
        assert_eq!(mib(exact_for_request(&one, "n", 1, None)), Some(3000));
        // Not for another slice count.
        assert_eq!(exact_for_request(&one, "n", 2, None), None);
        // Two that differ, or one without: none (the pass applies the owner's).
        let two = [
            p("a", "Pending", Some(exact(3000))),
            p("b", "", Some(exact(2000))),
        ];
        assert_eq!(exact_for_request(&two, "n", 1, None), None);
        let plain = [
            p("a", "Pending", Some(exact(3000))),
            p("b", "Pending", None),
        ];
        assert_eq!(exact_for_request(&plain, "n", 1, None), None);
        // Two that agree: theirs.
        let same = [
            p("a", "Pending", Some(exact(3000))),
            p("b", "", Some(exact(3000))),
        ];
        assert_eq!(mib(exact_for_request(&same, "n", 1, None)), Some(3000));
        // The pod known: its own, whatever the others.
        assert_eq!(
            mib(exact_for_request(&two, "n", 1, Some(("ns", "b", "cuda")))),
            Some(2000)
        );
        assert_eq!(
            exact_for_request(&two, "n", 1, Some(("ns", "b", "other"))),
            None
        );
    }

    fn assignment(node: &str, containers: &[(&str, &[(&str, u32)])]) -> String {
        Assignment {
            version: FORMAT_VERSION,
            node: node.into(),
            containers: containers
                .iter()
                .map(|(name, gpus)| ContainerAssignment {
                    name: (*name).into(),
                    gpus: gpus
                        .iter()
                        .map(|(u, s)| GpuTake {
                            uuid: (*u).into(),
                            slices: *s,
                        })
                        .collect(),
                })
                .collect(),
        }
        .to_json()
    }

    fn pod(name: &str, bound: i64, assigned: &[(&str, u32)]) -> PodInfo {
        let slices: u32 = assigned.iter().map(|g| g.1).sum();
        PodInfo {
            namespace: "team-a".into(),
            name: name.into(),
            node: "n1".into(),
            phase: "Pending".into(),
            bound_at_ms: Some(bound),
            created_at_ms: Some(0),
            containers: vec![("main".into(), u64::from(slices))],
            annotations: [(
                ANNOTATION_GPU_ASSIGNMENT.to_owned(),
                assignment("n1", &[("main", assigned)]),
            )]
            .into(),
            ..Default::default()
        }
    }

    fn ids(v: &[&str]) -> Vec<DeviceId> {
        v.iter().map(|s| DeviceId::parse(s).expect("id")).collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_oldest_bind_goes_first_and_exact_gpus_win_over_age() {
        let pods = [
            pod("late", 2_000, &[("GPU-b", 2)]),
            pod("early", 1_000, &[("GPU-a", 2)]),
            pod("big", 500, &[("GPU-a", 3)]),
        ];
        let p = pending(&pods, "n1");
        let names: Vec<&str> = p.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["big", "early", "late"]);
        // Two slices on GPU-b are late's, though early is older.
        assert_eq!(find(&p, &ids(&["GPU-b::0", "GPU-b::5"])), Match::Exact(2));
        assert_eq!(find(&p, &ids(&["GPU-a::0", "GPU-a::1"])), Match::Exact(1));
        // Two slices elsewhere: the oldest of that size, and they disagree.
        assert_eq!(find(&p, &ids(&["GPU-c::0", "GPU-a::1"])), Match::Other(1));
        // No pending pod asks for one slice: a pod placed without the extender.
        assert_eq!(find(&p, &ids(&["GPU-a::0"])), Match::None);
        // Preferred: the oldest pod of the size, on its GPU.
        let avail = strings(&["GPU-a::0", "GPU-a::3", "GPU-a::1", "GPU-b::0", "GPU-b::1"]);
        assert_eq!(
            prefer(&p, &avail, &[], 2),
            Some((1, strings(&["GPU-a::0", "GPU-a::1"])))
        );
        // Its GPU without room: the next pod of that size.
        let avail = strings(&["GPU-a::0", "GPU-b::0", "GPU-b::1"]);
        assert_eq!(
            prefer(&p, &avail, &[], 2),
            Some((2, strings(&["GPU-b::0", "GPU-b::1"])))
        );
        assert_eq!(prefer(&p, &avail, &[], 1), None);
        // A must-include ID is kept, and must be on the assigned GPU.
        let avail = strings(&["GPU-a::0", "GPU-a::4", "GPU-a::1", "GPU-b::0", "GPU-b::1"]);
        assert_eq!(
            prefer(&p, &avail, &strings(&["GPU-a::4"]), 2),
            Some((1, strings(&["GPU-a::4", "GPU-a::0"])))
        );
        assert_eq!(
            prefer(&p, &avail, &strings(&["GPU-b::1"]), 2),
            Some((2, strings(&["GPU-b::1", "GPU-b::0"])))
        );
    }

    #[test]
    fn served_containers_and_pods_not_pending_are_skipped() {
        let mut two = pod("two", 1, &[("GPU-a", 1)]);
        two.containers = vec![
            ("init-free".into(), 0),
            ("main".into(), 1),
            ("side".into(), 2),
        ];
        two.annotations.insert(
            ANNOTATION_GPU_ASSIGNMENT.into(),
            assignment(
                "n1",
                &[("side", &[("GPU-b", 2)]), ("main", &[("GPU-a", 1)])],
            ),
        );
        // Spec order: main first.
        let p = pending(std::slice::from_ref(&two), "n1");
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].container.as_str(), p[0].slices()), ("main", 1));
        assert_eq!(p[0].allocated_value(), "main");
        two.annotations
            .insert(ANNOTATION_GPU_ALLOCATED.into(), "main".into());
        let p = pending(std::slice::from_ref(&two), "n1");
        assert_eq!((p[0].container.as_str(), p[0].slices()), ("side", 2));
        assert_eq!(p[0].allocated_value(), "main,side");
        two.annotations
            .insert(ANNOTATION_GPU_ALLOCATED.into(), "main,side".into());
        assert!(pending(std::slice::from_ref(&two), "n1").is_empty());

        let mut running = pod("running", 1, &[("GPU-a", 1)]);
        running.phase = "Running".into();
        let mut elsewhere = pod("elsewhere", 1, &[("GPU-a", 1)]);
        elsewhere.node = "n2".into();
        let mut plain = pod("plain", 1, &[("GPU-a", 1)]);
        plain.annotations.clear();
        assert!(pending(&[running, elsewhere, plain], "n1").is_empty());
    }

    #[test]
    fn assignments_that_do_not_fit_the_pod_are_ignored() {
        let bad = |f: &dyn Fn(&mut PodInfo)| {
            let mut p = pod("p", 1, &[("GPU-a", 2)]);
            f(&mut p);
            pending(&[p], "n1").is_empty()
        };
        assert!(!bad(&|_| {}));
        // For another node.
        assert!(bad(&|p| {
            p.annotations.insert(
                ANNOTATION_GPU_ASSIGNMENT.into(),
                assignment("n2", &[("main", &[("GPU-a", 2)])]),
            );
        }));
        // More slices than the container asks for.
        assert!(bad(&|p| p.containers[0].1 = 1));
        // A container the pod does not have.
        assert!(bad(&|p| p.containers[0].0 = "other".into()));
        // Not JSON, another version, a zero take.
        for raw in [
            "nonsense",
            r#"{"version":2,"node":"n1","containers":[]}"#,
            r#"{"version":1,"node":"n1","containers":[{"name":"main","gpus":[{"uuid":"GPU-a","slices":0}]}]}"#,
        ] {
            assert!(bad(&|p| {
                p.annotations
                    .insert(ANNOTATION_GPU_ASSIGNMENT.into(), raw.into());
            }));
        }
        // The same container twice.
        assert!(bad(&|p| {
            p.annotations.insert(
                ANNOTATION_GPU_ASSIGNMENT.into(),
                assignment(
                    "n1",
                    &[("main", &[("GPU-a", 1)]), ("main", &[("GPU-b", 1)])],
                ),
            );
            p.containers[0].1 = 1;
        }));
    }

    #[test]
    fn assignments_are_checked_against_the_node() {
        let snap = crate::allocate::tests::snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let one =
            |gpu: &str, slices: u32| pending(&[pod("p", 1, &[(gpu, slices)])], "n1").remove(0);
        assert_eq!(check(&one("GPU-a", 4), &snap), Ok(()));
        assert_eq!(
            check(&one("GPU-zz", 1), &snap)
                .expect_err("unknown")
                .to_string(),
            "pod team-a/p was assigned GPU GPU-zz, which this node does not have"
        );
        assert_eq!(
            check(&one("GPU-sick", 1), &snap).expect_err("sick"),
            AssignmentError::Unhealthy {
                pod: "team-a/p".into(),
                gpu: "GPU-sick".into()
            }
        );
        assert!(matches!(
            check(&one("GPU-a", 5), &snap),
            Err(AssignmentError::TooManySlices { has: 4, .. })
        ));
        let e = disagreement(&one("GPU-a", 2), &ids(&["GPU-b::0", "GPU-b::1"]), &snap);
        assert_eq!(
            e.to_string(),
            "pod team-a/p container \"main\" was assigned GPU-a×2 by the scheduler extender, \
             but the kubelet allocated GPU-b::0,GPU-b::1"
        );
        assert_eq!(
            tonic::Status::from(e).code(),
            tonic::Code::FailedPrecondition
        );
        let e = disagreement(&one("GPU-zz", 2), &ids(&["GPU-a::0", "GPU-a::1"]), &snap);
        assert!(matches!(e, AssignmentError::UnknownGpu { .. }));
    }
}
