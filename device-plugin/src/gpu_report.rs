//! The node's GPU report for the scheduler extender: the annotation
//! `tessera.dev/gpu-report` on this node (JSON, `tessera_node::scheduling`),
//! with each GPU's slices, the slices its allocations hold (and which pods
//! hold them) and its utilization and health.
//!
//! Writes are bounded per node: at most one every [`MIN_GAP`], and then only
//! when the report changed or the last one is [`HEARTBEAT`] old (the
//! extender treats a node whose report is older than its deadline, 120 s by
//! default, as unknown, so a live node refreshes well inside it).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_contract::labels::NODE_GPU_REPORT;
use tessera_node::manager::ManagerApi;
use tessera_node::scheduling::{FORMAT_VERSION, GpuReport, NodeReport};
use tessera_proto::manager::v1 as mgr;

use crate::node_labels::NodeApiError;
use crate::state::{PluginState, Snapshot};

/// The least time between two writes of the report.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// A report this old is written again even when nothing changed.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// The report of a node in the state `snap` with these allocations, written
/// at `at` (seconds since the epoch). An allocation's slices on a GPU are
/// its `slices` there, or, for one made by size (`tessera run`), the slices
/// its memory limit covers, rounded up.
pub fn report(snap: &Snapshot, allocations: &[mgr::Allocation], at: u64) -> NodeReport {
    let gpus = snap
        .gpus
        .iter()
        .map(|g| {
            let slices = g.layout.slices;
            let mut used = 0u32;
            let mut pods: BTreeMap<String, u32> = BTreeMap::new();
            for a in allocations {
                let held: u32 = a
                    .devices
                    .iter()
                    .filter(|d| d.gpu_uuid == g.gpu.uuid)
                    .map(|d| {
                        if d.slices > 0 {
                            d.slices
                        } else {
                            let per = g.layout.memory_bytes.max(1);
                            u32::try_from(d.memory_limit_bytes.div_ceil(per)).unwrap_or(u32::MAX)
                        }
                    })
                    .fold(0u32, u32::saturating_add);
                if held == 0 {
                    continue;
                }
                used = used.saturating_add(held);
                if !a.namespace.is_empty() && !a.pod.is_empty() {
                    *pods
                        .entry(format!("{}/{}", a.namespace, a.pod))
                        .or_default() += held;
                }
            }
            let used = used.min(slices);
            // The pods' part never exceeds the total (a reader checks it).
            let mut room = used;
            for n in pods.values_mut() {
                *n = (*n).min(room);
                room -= *n;
            }
            pods.retain(|_, n| *n > 0);
            GpuReport {
                uuid: g.gpu.uuid.clone(),
                model: g.gpu.name.clone(),
                // NVIDIA's is left unsaid: see `GpuReport::vendor`.
                vendor: if g.gpu.vendor == tessera_contract::Vendor::Nvidia.as_str() {
                    String::new()
                } else {
                    g.gpu.vendor.clone()
                },
                class: g.class.clone().unwrap_or_default(),
                memory_mib: g.gpu.memory_total_bytes >> 20,
                slices,
                used_slices: used,
                pods,
                utilization: g.utilization.map(|u| u.clamp(0.0, 1.0)),
                healthy: g.healthy,
            }
        })
        .filter(|g| g.slices > 0)
        .collect();
    NodeReport {
        version: FORMAT_VERSION,
        at,
        gpus,
    }
}

/// When to write: the rate bound and the heartbeat, over a clock given in
/// seconds (so it is tested without waiting).
#[derive(Debug, Default)]
pub struct Pacer {
    /// The last report written (its `at` zeroed) and when.
    last: Option<(NodeReport, u64)>,
}

impl Pacer {
    /// Whether `r` is to be written now (`r.at` is now): it differs from
    /// the last one written, or that one is a heartbeat old. The caller
    /// asks at most once per [`MIN_GAP`].
    pub fn due(&self, r: &NodeReport) -> bool {
        match &self.last {
            None => true,
            Some((last, at)) => {
                let same = NodeReport { at: 0, ..r.clone() } == *last;
                !same || r.at.saturating_sub(*at) >= HEARTBEAT.as_secs()
            }
        }
    }

    /// Records `r` as written.
    pub fn written(&mut self, r: &NodeReport) {
        self.last = Some((NodeReport { at: 0, ..r.clone() }, r.at));
    }
}

/// Writes one annotation on the node.
pub(crate) trait ReportApi: Send + Sync + 'static {
    fn annotate(
        &self,
        node: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), NodeApiError>> + Send;
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Keeps the node's report current, one write per [`MIN_GAP`] at most.
/// Runs until the task is dropped.
pub(crate) async fn publish_loop<N: ReportApi, M: ManagerApi>(
    api: Arc<N>,
    manager: Arc<M>,
    state: Arc<PluginState>,
    node: String,
) {
    let mut pacer = Pacer::default();
    let mut tick = tokio::time::interval(MIN_GAP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let snap = state.snapshot();
        if !snap.manager_up {
            // Not known now: say nothing, and the report ages into unknown.
            continue;
        }
        let allocations = match manager.list_allocations().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e.message(), "cannot list allocations for the GPU report");
                continue;
            }
        };
        let r = report(&snap, &allocations, now_s());
        if !pacer.due(&r) {
            continue;
        }
        match api.annotate(&node, NODE_GPU_REPORT, &r.to_json()).await {
            Ok(()) => {
                tracing::debug!(gpus = r.gpus.len(), "GPU report written");
                pacer.written(&r);
            }
            Err(e) => tracing::warn!(error = %e, "cannot write the node's GPU report"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_node::config::Config;
    use tessera_proto::manager::v1::{GpuStatus, NodeStatus};
    use tokio::time::Instant;

    fn snapshot() -> Arc<Snapshot> {
        let cfg = Config::parse("default: {slice: {slicesPerGpu: 4}}").expect("cfg");
        let state = PluginState::new("n1", cfg, BTreeMap::new());
        let gpu = |i: u32, uuid: &str, healthy: bool| GpuStatus {
            index: i,
            uuid: uuid.into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total_bytes: 80 << 30,
            healthy,
            utilization_percent: 50,
            ..Default::default()
        };
        state.update_status(
            &NodeStatus {
                gpus: vec![gpu(0, "GPU-a", true), gpu(1, "GPU-b", false)],
                ..Default::default()
            },
            Instant::now(),
        );
        state.snapshot()
    }

    fn alloc(ns: &str, pod: &str, devices: &[(&str, u32, u64)]) -> mgr::Allocation {
        mgr::Allocation {
            namespace: ns.into(),
            pod: pod.into(),
            devices: devices
                .iter()
                .map(|&(uuid, slices, memory)| mgr::DeviceRequest {
                    gpu_uuid: uuid.into(),
                    slices,
                    memory_limit_bytes: memory,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_report_counts_slices_by_gpu_and_pod() {
        let snap = snapshot();
        let allocs = [
            alloc("team", "a", &[("GPU-a", 2, 40 << 30)]),
            // Not yet owned by a pod: counted, but for no pod.
            alloc("", "", &[("GPU-a", 1, 20 << 30)]),
            // Made by size (tessera run): 25 GiB of 20 GiB slices is 2.
            alloc("", "", &[("GPU-b", 0, 25 << 30)]),
        ];
        let r = report(&snap, &allocs, 1234);
        assert_eq!(r.at, 1234);
        let a = &r.gpus[0];
        assert_eq!((a.uuid.as_str(), a.slices, a.used_slices), ("GPU-a", 4, 3));
        assert_eq!(a.pods, BTreeMap::from([("team/a".to_owned(), 2)]));
        assert_eq!(a.memory_mib, 80 << 10);
        assert!(a.healthy);
        let b = &r.gpus[1];
        assert_eq!(b.used_slices, 2);
        assert!(!b.healthy);
        // What the extender reads back is what was written.
        assert_eq!(NodeReport::parse(&r.to_json()), Ok(r));
    }

    #[test]
    fn writes_are_paced_by_change_and_heartbeat() {
        let snap = snapshot();
        let mut p = Pacer::default();
        let r0 = report(&snap, &[], 1000);
        assert!(p.due(&r0), "the first report is written");
        p.written(&r0);
        let same_later = report(&snap, &[], 1000 + HEARTBEAT.as_secs() - 1);
        assert!(!p.due(&same_later), "unchanged and fresh: not written");
        let changed = report(&snap, &[alloc("t", "p", &[("GPU-a", 1, 0)])], 1001);
        assert!(p.due(&changed), "a change is written");
        let heartbeat = report(&snap, &[], 1000 + HEARTBEAT.as_secs());
        assert!(p.due(&heartbeat), "a heartbeat old: written again");
    }
}
