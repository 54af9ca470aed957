//! The extender's decisions as pure functions: the cluster as the nodes
//! reported it and the pods' assignments say, turned into the placement
//! engine's state; a pod's slices turned into engine requests; and filter,
//! prioritize and the choice of GPUs at bind over that. No I/O here.
//!
//! Slices as the engine sees them: a GPU cut into `S` slices with `f` free
//! has `⌊1000·f/S⌋` thousandths of compute free and `1000·f` units of
//! memory out of `1000·S` (memory counted in thousandths of a slice, so
//! that `f ≥ k` is exactly "k slices fit"); a container asking `k < S`
//! slices is a share of one GPU, `k = m·S` is `m` whole GPUs, anything
//! else fits no GPU of that cut. Nodes whose GPUs are cut differently are
//! ranked by separate engines (one per cut), since `k` slices are a
//! different share of each.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use tessera_contract::gpu_filter::{self, GpuFilter};
use tessera_contract::labels::{
    ANNOTATION_GPU_ASSIGNMENT, ANNOTATION_GPU_CLASS, NODE_GPU_REPORT, RESOURCE, parse_slices,
};
use tessera_node::scheduling::{
    Assignment, ContainerAssignment, FORMAT_VERSION, GpuReport, GpuTake, NodeReport,
};
use tessera_placement::{Engine, Gpu, Node, Policy, Request, TaskMix};

use crate::wire::{HostPriority, MAX_SCORE};

/// Why a pod cannot be placed by the extender at all (not a node's fault).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PodError {
    #[error("pod {0} requests no {RESOURCE}; the Tessera extender places only pods with slices")]
    NoRequest(String),
    #[error(
        "pod {pod}: container {container:?}: {RESOURCE}={value:?} is not a whole number of slices"
    )]
    BadCount {
        pod: String,
        container: String,
        value: String,
    },
    #[error("pod {0} has no name or namespace")]
    Unnamed(String),
    #[error("pod {pod}: {reason}")]
    BadGpuList { pod: String, reason: String },
}

/// One container's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerNeed {
    pub name: String,
    pub slices: u32,
}

/// What a pod asks of the GPUs: its containers with slices, and the GPU
/// class it must run on (if any).
#[derive(Debug, Clone, PartialEq)]
pub struct PodNeed {
    /// `namespace/name`, for messages.
    pub pod: String,
    pub containers: Vec<ContainerNeed>,
    pub class: Option<String>,
    /// The vendor whose GPUs it must be on (`tessera.dev/gpu-vendor`, lower
    /// case); a name no GPU reports matches none.
    pub vendor: Option<String>,
    /// Its model and UUID lists (`tessera.dev/gpu-models` and kin): the GPUs it may
    /// have, by the rule the device plugin holds it to at Allocate.
    pub gpus: GpuFilter,
}

impl PodNeed {
    /// Reads a pod's slice requests (limits, else requests) and class.
    pub fn of(pod: &Pod) -> Result<PodNeed, PodError> {
        let meta = &pod.metadata;
        let id = pod_key(pod);
        let mut containers = Vec::new();
        for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let r = c.resources.as_ref();
            let q = r
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(RESOURCE))
                .or_else(|| {
                    r.and_then(|r| r.requests.as_ref())
                        .and_then(|l| l.get(RESOURCE))
                });
            let Some(q) = q else { continue };
            let slices = parse_slices(&q.0).ok_or_else(|| PodError::BadCount {
                pod: id.clone(),
                container: c.name.clone(),
                value: q.0.clone(),
            })?;
            containers.push(ContainerNeed {
                name: c.name.clone(),
                slices,
            });
        }
        if containers.is_empty() {
            return Err(PodError::NoRequest(id));
        }
        let class = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_GPU_CLASS))
            .filter(|c| !c.is_empty())
            .cloned();
        let vendor = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(tessera_contract::labels::ANNOTATION_GPU_VENDOR))
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty());
        // The lists only: the vendor is read above, where a name no GPU reports
        // matches none rather than failing the pod.
        let lists: BTreeMap<String, String> = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| gpu_filter::LIST_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let gpus = GpuFilter::from_annotations(&lists).map_err(|reason| PodError::BadGpuList {
            pod: id.clone(),
            reason,
        })?;
        Ok(PodNeed {
            pod: id,
            containers,
            class,
            vendor,
            gpus,
        })
    }

    fn total(&self) -> u32 {
        self.containers.iter().map(|c| c.slices).sum()
    }
}

/// A node the extender knows: its GPUs and what is free on each.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub name: String,
    pub gpus: Vec<GpuState>,
}

/// One GPU and its free slices (0 when unhealthy).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub report: GpuReport,
    pub free: u32,
}

/// What the extender reads from the API server about one node.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts<'a> {
    /// The node's annotations.
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The assignments of the live pods bound to it, by `namespace/name`.
    pub assigned: Vec<(&'a str, &'a Assignment)>,
}

/// The node's state, or why it is unknown: no report, an unreadable one,
/// or one older than `deadline_s` at `now` (seconds since the epoch). A
/// GPU's used slices: what the report counts for no known pod, plus, for
/// every pod the report or an assignment names, the larger of the two
/// (the report misses pods bound since it was written, or not started
/// yet; the assignments miss pods placed without the extender, and pods
/// gone whose slices the node has not freed yet).
pub fn node_state(
    name: &str,
    facts: &NodeFacts<'_>,
    now: u64,
    deadline_s: u64,
) -> Result<NodeState, String> {
    let raw = facts
        .annotations
        .and_then(|a| a.get(NODE_GPU_REPORT))
        .ok_or_else(|| format!("no {NODE_GPU_REPORT} annotation: the node's GPUs are unknown"))?;
    let report =
        NodeReport::parse(raw).map_err(|e| format!("{NODE_GPU_REPORT} is unreadable: {e}"))?;
    let age = now.saturating_sub(report.at);
    if age > deadline_s {
        return Err(format!(
            "the node last reported its GPUs {age} s ago (deadline {deadline_s} s): unknown, not empty"
        ));
    }
    // GPU → pod → slices the assignments give it.
    let mut held: BTreeMap<&str, BTreeMap<&str, u32>> = BTreeMap::new();
    for (pod, a) in &facts.assigned {
        for c in &a.containers {
            for g in &c.gpus {
                *held
                    .entry(g.uuid.as_str())
                    .or_default()
                    .entry(pod)
                    .or_default() += g.slices;
            }
        }
    }
    let gpus = report
        .gpus
        .into_iter()
        .map(|g| {
            let known: u32 = g.pods.values().sum();
            let mut used = g.used_slices - known;
            let none = BTreeMap::new();
            let assigned = held.get(g.uuid.as_str()).unwrap_or(&none);
            for (pod, &n) in &g.pods {
                used += n.max(assigned.get(pod.as_str()).copied().unwrap_or(0));
            }
            for (pod, &n) in assigned {
                if !g.pods.contains_key(*pod) {
                    used += n;
                }
            }
            let used = used.min(g.slices);
            let free = if g.healthy {
                g.slices.saturating_sub(used)
            } else {
                0
            };
            GpuState { report: g, free }
        })
        .collect();
    Ok(NodeState {
        name: name.to_owned(),
        gpus,
    })
}

/// An engine over the GPUs cut into `cut` slices of some nodes, and the
/// way back from its indexes to the nodes' GPUs.
struct CutEngine {
    engine: Engine,
    /// Engine node index → (index into the given nodes, engine GPU index →
    /// index into that node's `gpus`).
    back: Vec<(usize, Vec<usize>)>,
    cut: u32,
}

/// The engine request for `k` slices of a GPU cut into `cut`, if any GPU
/// of that cut can hold it ([`tessera_placement::slices::slice_request`]).
pub(crate) fn slice_request(k: u32, cut: u32, class: &Option<String>) -> Option<Request> {
    tessera_placement::slices::slice_request(k, cut, class.iter().cloned().collect())
}

/// Host CPU and memory are the scheduler's to check: the engine gets
/// plenty of both.
pub(crate) const UNCOUNTED: u64 = 1 << 40;

/// A reported GPU as the engine sees it: the one slice adapter
/// ([`tessera_placement::slices::slice_gpu`]).
fn engine_gpu(g: &GpuState) -> Gpu {
    tessera_placement::slices::slice_gpu(
        &g.report.model,
        &g.report.class,
        g.report.slices,
        g.free,
        g.report.utilization,
    )
}

fn cut_engine(
    nodes: &[&NodeState],
    cut: u32,
    policy: Policy,
    mix_slices: &[u32],
    class: &Option<String>,
    vendor: Option<&str>,
    lists: &GpuFilter,
) -> Option<CutEngine> {
    let mut back = Vec::new();
    let mut enodes = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let idx: Vec<usize> = (0..n.gpus.len())
            .filter(|&g| n.gpus[g].report.slices == cut)
            .filter(|&g| {
                let r = &n.gpus[g].report;
                let theirs = r.vendor().map(|x| x.as_str());
                vendor.is_none_or(|v| theirs == Some(v))
                    && lists.passes(theirs.unwrap_or(&r.vendor), &r.model, &r.uuid)
            })
            .collect();
        if idx.is_empty() {
            continue;
        }
        let gpus = idx.iter().map(|&g| engine_gpu(&n.gpus[g])).collect();
        enodes.push(Node::new(n.name.clone(), UNCOUNTED, UNCOUNTED, gpus));
        back.push((i, idx));
    }
    if enodes.is_empty() {
        return None;
    }
    let reqs: Vec<Request> = mix_slices
        .iter()
        .filter_map(|&k| slice_request(k, cut, class))
        .collect();
    let mix = TaskMix::from_requests(&reqs, 1.0);
    match Engine::new(enodes, policy, &mix) {
        Ok(engine) => Some(CutEngine { engine, back, cut }),
        Err(e) => {
            // Reports are checked when parsed; this would be a bug here.
            tracing::error!(error = %e, "placement engine refused the cluster view");
            None
        }
    }
}

/// The distinct slice cuts of these nodes' GPUs.
fn cuts(nodes: &[&NodeState]) -> Vec<u32> {
    let mut c: Vec<u32> = nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.report.slices))
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// Places every container of `need` on `node` in turn, by `policy`: the
/// GPUs each gets, or why the node cannot hold the pod.
pub fn choose(
    node: &NodeState,
    need: &PodNeed,
    policy: Policy,
) -> Result<Vec<ContainerAssignment>, String> {
    let all = [node];
    let mut last_why = String::new();
    'cut: for cut in cuts(&all) {
        let mix: Vec<u32> = need.containers.iter().map(|c| c.slices).collect();
        let Some(mut ce) = cut_engine(
            &all,
            cut,
            policy,
            &mix,
            &need.class,
            need.vendor.as_deref(),
            &need.gpus,
        ) else {
            continue;
        };
        let mut out = Vec::new();
        for c in &need.containers {
            let Some(req) = slice_request(c.slices, ce.cut, &need.class) else {
                last_why = format!(
                    "container {:?} asks {} slices: not a share of one GPU nor whole GPUs of {} slices",
                    c.name, c.slices, ce.cut
                );
                continue 'cut;
            };
            match ce.engine.place(&req) {
                Ok(choice) => {
                    let (_, idx) = &ce.back[choice.node];
                    let gpus = choice
                        .gpus
                        .iter()
                        .map(|&g| {
                            let gs = &node.gpus[idx[g]];
                            GpuTake {
                                uuid: gs.report.uuid.clone(),
                                slices: if choice.gpus.len() == 1 {
                                    c.slices
                                } else {
                                    ce.cut
                                },
                            }
                        })
                        .collect();
                    out.push(ContainerAssignment {
                        name: c.name.clone(),
                        gpus,
                    });
                }
                Err(_) => {
                    last_why = format!(
                        "no GPU{} holds {} more slices for container {:?}",
                        class_note(&need.class),
                        c.slices,
                        c.name
                    );
                    continue 'cut;
                }
            }
        }
        return Ok(out);
    }
    if last_why.is_empty() {
        last_why = format!("no GPU holds the pod's {} slices", need.total());
    }
    Err(last_why)
}

fn class_note(class: &Option<String>) -> String {
    class
        .as_ref()
        .map(|c| format!(" of class {c:?}"))
        .unwrap_or_default()
}

/// Filter: the names that can hold the pod, and why each other one cannot.
pub fn filter(
    names: &[String],
    states: &BTreeMap<String, Result<NodeState, String>>,
    need: &PodNeed,
) -> (Vec<String>, BTreeMap<String, String>) {
    // Fit does not depend on the policy; binpack is the cheapest.
    verdicts(names, states, |n| {
        choose(n, need, Policy::Binpack).map(|_| ())
    })
}

/// The filter verb's answer for slice pods and DRA pods alike: the names
/// whose state `fits`, and for each other one why not (a node the extender
/// has not seen, one whose state it could not read, one that cannot hold
/// the pod), in kube-scheduler's `tessera: <why>` form.
pub(crate) fn verdicts<S>(
    names: &[String],
    states: &BTreeMap<String, Result<S, String>>,
    fits: impl Fn(&S) -> Result<(), String>,
) -> (Vec<String>, BTreeMap<String, String>) {
    let mut pass = Vec::new();
    let mut failed = BTreeMap::new();
    for name in names {
        let verdict = match states.get(name) {
            None => Err("the extender has not seen this node".to_owned()),
            Some(Err(why)) => Err(why.clone()),
            Some(Ok(n)) => fits(n),
        };
        match verdict {
            Ok(()) => pass.push(name.clone()),
            Err(why) => {
                failed.insert(name.clone(), format!("tessera: {why}"));
            }
        }
    }
    (pass, failed)
}

/// Prioritize: every candidate scored 0..=10 by the engine's order for the
/// pod's largest container (the one hardest to place; the rest follow it
/// on the node bind picks). The best node gets 10; a node that cannot hold
/// it, or that the extender does not know, gets 0.
pub fn prioritize(
    names: &[String],
    states: &BTreeMap<String, Result<NodeState, String>>,
    need: &PodNeed,
    policy: Policy,
    live_slices: &[u32],
) -> Vec<HostPriority> {
    let known: Vec<&NodeState> = names
        .iter()
        .filter_map(|n| states.get(n).and_then(|s| s.as_ref().ok()))
        .collect();
    let biggest = need.containers.iter().map(|c| c.slices).max().unwrap_or(0);
    let mut mix: Vec<u32> = live_slices.to_vec();
    mix.extend(need.containers.iter().map(|c| c.slices));
    // (rank, node name) over every cut, best first.
    let mut ranked: Vec<(tessera_placement::Rank, &str)> = Vec::new();
    for cut in cuts(&known) {
        let Some(req) = slice_request(biggest, cut, &need.class) else {
            continue;
        };
        let Some(mut ce) = cut_engine(
            &known,
            cut,
            policy,
            &mix,
            &need.class,
            need.vendor.as_deref(),
            &need.gpus,
        ) else {
            continue;
        };
        let all: Vec<usize> = (0..ce.engine.len()).collect();
        let Ok(order) = ce.engine.ranked(&req, &all) else {
            continue;
        };
        for (i, r) in order {
            ranked.push((r, known[ce.back[i].0].name.as_str()));
        }
    }
    scores(names, ranked)
}

/// The scores of `names` from the engine's ranks of those that can hold
/// the pod (over any number of engines): linear in the position, 10 for
/// the best, 1 for the worst; 0 for a name not ranked.
pub(crate) fn scores(
    names: &[String],
    mut ranked: Vec<(tessera_placement::Rank, &str)>,
) -> Vec<HostPriority> {
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    let mut scores: BTreeMap<&str, i64> = BTreeMap::new();
    let n = ranked.len() as i64;
    for (pos, (_, name)) in ranked.iter().enumerate() {
        // Linear in the position: 10 for the best, 1 for the worst that fits.
        let s = if n <= 1 {
            MAX_SCORE
        } else {
            1 + (MAX_SCORE - 1) * (n - 1 - pos as i64) / (n - 1)
        };
        scores.entry(name).or_insert(s);
    }
    names
        .iter()
        .map(|h| HostPriority {
            host: h.clone(),
            score: scores.get(h.as_str()).copied().unwrap_or(0),
        })
        .collect()
}

/// A pod's `namespace/name`, the key reports and assignments share.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The assignment annotation's value for a choice on `node`.
pub fn assignment(node: &str, containers: Vec<ContainerAssignment>) -> Assignment {
    Assignment {
        version: FORMAT_VERSION,
        node: node.to_owned(),
        containers,
    }
}

/// A pod's assignment if it holds: the pod is not finished and is bound to
/// the node the assignment names, or not bound yet (the extender's bind
/// wrote the assignment and its Binding is on the way, or failed and the
/// scheduler will bind the pod again, writing a new one). Unreadable ones
/// are ignored (and logged): only the extender writes them, through the
/// webhook's guard.
pub fn live_assignment(pod: &Pod) -> Option<(String, Assignment)> {
    let bound = pod.spec.as_ref()?.node_name.clone();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let raw = pod
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_GPU_ASSIGNMENT)?;
    match Assignment::parse(raw) {
        Ok(a) if bound.as_ref().is_none_or(|n| *n == a.node) => Some((a.node.clone(), a)),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(pod = ?pod.metadata.name, error = %e, "unreadable GPU assignment ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_placement::GpuNeed;

    fn report_with(pods: &[(&str, u32)], used: u32) -> BTreeMap<String, String> {
        let g = GpuReport {
            uuid: "GPU-a".into(),
            model: "T4".into(),
            vendor: String::new(),
            class: String::new(),
            memory_mib: 15360,
            slices: 8,
            used_slices: used,
            pods: pods.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            utilization: None,
            healthy: true,
        };
        let r = NodeReport {
            version: FORMAT_VERSION,
            at: 1000,
            gpus: vec![g],
        };
        [(NODE_GPU_REPORT.to_owned(), r.to_json())].into()
    }

    fn on_a(slices: u32) -> Assignment {
        assignment(
            "n",
            vec![ContainerAssignment {
                name: "c".into(),
                gpus: vec![GpuTake {
                    uuid: "GPU-a".into(),
                    slices,
                }],
            }],
        )
    }

    /// A healthy 32 GiB GPU of 8 slices with `used` of them taken.
    fn eight_slice_gpu(uuid: &str, model: &str, vendor: &str, used: u32) -> GpuState {
        GpuState {
            report: GpuReport {
                uuid: uuid.into(),
                model: model.into(),
                vendor: vendor.into(),
                class: String::new(),
                memory_mib: 32768,
                slices: 8,
                used_slices: used,
                pods: BTreeMap::new(),
                utilization: None,
                healthy: true,
            },
            free: 8 - used,
        }
    }

    #[test]
    fn a_pod_asking_for_a_vendor_gets_only_that_vendors_gpus() {
        let gpu = |uuid: &str, vendor: &str, used: u32| {
            let model = if vendor.is_empty() {
                "T4"
            } else {
                "AMD Instinct MI210"
            };
            eight_slice_gpu(uuid, model, vendor, used)
        };
        // Binpack would pick the fuller NVIDIA GPU; the AMD pod must not.
        let node = NodeState {
            name: "n".into(),
            gpus: vec![gpu("GPU-nv", "", 4), gpu("GPU-amd", "amd", 0)],
        };
        let need = |vendor: Option<&str>| PodNeed {
            pod: "ns/p".into(),
            containers: vec![ContainerNeed {
                name: "c".into(),
                slices: 2,
            }],
            class: None,
            vendor: vendor.map(str::to_owned),
            gpus: GpuFilter::default(),
        };
        let on = |v: Option<&str>| {
            choose(&node, &need(v), Policy::Binpack).map(|c| c[0].gpus[0].uuid.clone())
        };
        assert_eq!(on(Some("amd")).as_deref(), Ok("GPU-amd"));
        assert_eq!(on(Some("nvidia")).as_deref(), Ok("GPU-nv"));
        assert_eq!(
            on(None).as_deref(),
            Ok("GPU-nv"),
            "no vendor: any GPU, by policy"
        );
        assert!(on(Some("hygon")).is_err(), "no Hygon GPU here");
    }

    #[test]
    fn a_pod_with_model_or_uuid_lists_gets_only_gpus_that_pass_them() {
        let gpu = |uuid: &str, model: &str, used: u32| eight_slice_gpu(uuid, model, "nvidia", used);
        // Binpack prefers the fuller A100; the lists must overrule it.
        let node = NodeState {
            name: "n".into(),
            gpus: vec![
                gpu("GPU-a100", "NVIDIA A100-SXM4-80GB", 4),
                gpu("GPU-l4", "NVIDIA L4", 0),
            ],
        };
        let pod = |ann: &[(&str, &str)]| -> Pod {
            let ann: BTreeMap<String, String> = ann
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "annotations": ann},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: "2"}}}]}
            }))
            .expect("pod")
        };
        let on = |ann: &[(&str, &str)]| {
            let need = PodNeed::of(&pod(ann)).expect("need");
            choose(&node, &need, Policy::Binpack).map(|c| c[0].gpus[0].uuid.clone())
        };
        assert_eq!(on(&[]).as_deref(), Ok("GPU-a100"), "no lists: by policy");
        assert_eq!(
            on(&[(gpu_filter::ANNOTATION_GPU_MODELS, "l4")]).as_deref(),
            Ok("GPU-l4")
        );
        assert_eq!(
            on(&[(gpu_filter::ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-a100")]).as_deref(),
            Ok("GPU-l4")
        );
        assert_eq!(
            on(&[(gpu_filter::ANNOTATION_GPU_MODELS_EXCLUDE, "L4")]).as_deref(),
            Ok("GPU-a100")
        );
        assert!(on(&[(gpu_filter::ANNOTATION_GPU_MODELS, "H100")]).is_err());
        let e =
            PodNeed::of(&pod(&[(gpu_filter::ANNOTATION_GPU_UUIDS, ",")])).expect_err("bad list");
        assert!(
            e.to_string().contains(gpu_filter::ANNOTATION_GPU_UUIDS),
            "{e}"
        );
    }

    #[test]
    fn used_slices_count_each_pod_once_and_foreign_ones_too() {
        // The report: 3 used, 2 of them by ns/a; ns/b was bound since.
        let ann = report_with(&[("ns/a", 2)], 3);
        let (a, b) = (on_a(2), on_a(1));
        let facts = NodeFacts {
            annotations: Some(&ann),
            assigned: vec![("ns/a", &a), ("ns/b", &b)],
        };
        let s = node_state("n", &facts, 1010, 60).unwrap();
        // 1 foreign + ns/a's 2 (counted once) + ns/b's 1.
        assert_eq!(s.gpus[0].free, 8 - 4);
        // Stale: unknown, whatever it says.
        let e = node_state("n", &facts, 2000, 60).unwrap_err();
        assert!(e.contains("unknown"), "{e}");
        // A report of a pod the assignments no longer name (gone, not yet
        // freed on the node) still counts.
        let facts = NodeFacts {
            annotations: Some(&ann),
            assigned: vec![],
        };
        assert_eq!(node_state("n", &facts, 1010, 60).unwrap().gpus[0].free, 5);
    }

    #[test]
    fn an_assignment_holds_until_the_pod_ends_or_is_bound_elsewhere() {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.annotations =
            Some([(ANNOTATION_GPU_ASSIGNMENT.to_owned(), on_a(2).to_json())].into());
        p.spec = Some(Default::default());
        // Written by bind, the Binding not back yet: held on its node.
        assert_eq!(live_assignment(&p).map(|(n, _)| n).as_deref(), Some("n"));
        p.spec.as_mut().unwrap().node_name = Some("n".into());
        assert!(live_assignment(&p).is_some());
        p.spec.as_mut().unwrap().node_name = Some("other".into());
        assert!(live_assignment(&p).is_none(), "bound elsewhere");
        p.spec.as_mut().unwrap().node_name = Some("n".into());
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert!(live_assignment(&p).is_none(), "finished");
    }

    #[test]
    fn slices_become_shares_or_whole_gpus() {
        let none = None;
        let share = slice_request(3, 8, &none).unwrap();
        assert!(matches!(
            share.gpu,
            GpuNeed::Share {
                compute: 375,
                slices: 3,
                ..
            }
        ));
        assert_eq!(slice_request(16, 8, &none).unwrap().gpu, GpuNeed::Whole(2));
        assert_eq!(slice_request(8, 8, &none).unwrap().gpu, GpuNeed::Whole(1));
        assert!(slice_request(12, 8, &none).is_none());
    }
}
