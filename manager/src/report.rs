//! What the manager reports: the node status the API returns and the
//! metrics exposition, both from one snapshot of [`Core`].

use std::collections::{BTreeMap, HashMap};

use tessera_contract::units::FULL_COMPUTE_PPM;
use tessera_proto::manager::v1 as pb;

use crate::alloc;
use crate::backstop::Reason;
use crate::core::{Core, now_unix_ms};
use crate::gpu::GpuInfo;
use crate::metrics::{self, AllocMetrics, GpuMetrics, MetricsSnapshot};
use crate::store::LiveAllocation;

impl Core {
    fn slot_status(
        &self,
        live: &LiveAllocation,
        achieved: &HashMap<(String, String), u32>,
    ) -> pb::AllocationStatus {
        let rec = live.record();
        let n = live.control().n_devices();
        let devices = (0..n)
            .map(|i| {
                let uuid = live.control().uuid(i).to_owned();
                pb::AllocationDeviceStatus {
                    memory_limit_bytes: live.control().memory_limit(i),
                    memory_used_bytes: live.state().reserved(i),
                    compute_share_ppm: live.control().compute_share_ppm(i),
                    compute_achieved_ppm: achieved
                        .get(&(rec.id.clone(), uuid.clone()))
                        .copied()
                        .unwrap_or(0),
                    wait_ns_total: live.state().gate_wait_ns(i),
                    oom_refused_total: live.state().oom_refused(i),
                    gpu_uuid: uuid,
                }
            })
            .collect();
        let processes = live
            .state()
            .processes(n)
            .into_iter()
            .map(|p| pb::ProcessStatus {
                host_pid: p.host_pid,
                container_pid: p.identity.pid,
                memory_used_bytes: p.usage,
            })
            .collect();
        let now = tessera_shm::sys::monotonic_ns();
        pb::AllocationStatus {
            allocation: Some(self.allocation_pb(live)),
            devices,
            processes,
            paused: live.control().paused(),
            paused_ns_total: live.control().paused_ns(now),
            recovered: self
                .recovered
                .lock()
                .get(&rec.id)
                .map(|r| r.summary())
                .unwrap_or_default(),
        }
    }

    /// GetNodeStatus.
    pub fn node_status(&self) -> pb::NodeStatus {
        self.node_status_with(&self.arbitration.achieved_all())
    }

    /// The status, with the arbiter's achieved shares asked for once.
    pub(crate) fn node_status_with(
        &self,
        achieved: &HashMap<(String, String), u32>,
    ) -> pb::NodeStatus {
        let allocs = self.live_list();
        let health = self.health.lock().clone();
        let samples = self.samples.read().clone();
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let s = samples.get(i).copied().flatten().unwrap_or_default();
                let (mem, ppm) = allocs
                    .iter()
                    .flat_map(|a| a.record().devices)
                    .filter(|d| d.gpu_uuid == g.uuid)
                    .fold((0u64, 0u64), |(m, p), d| {
                        (m + d.memory_limit_bytes, p + u64::from(d.compute_share_ppm))
                    });
                pb::GpuStatus {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    vendor: g.vendor.as_str().to_owned(),
                    memory_total_bytes: g.memory_total_bytes,
                    memory_used_bytes: s.memory_used_bytes,
                    sm_count: g.sm_count,
                    pci_bus_id: g.pci_bus_id.clone(),
                    numa_node: g.numa_node,
                    compute_capability_major: g.compute_capability.0,
                    compute_capability_minor: g.compute_capability.1,
                    healthy: health[i].healthy(),
                    unhealthy_reason: health[i].reason(),
                    utilization_percent: s.utilization_percent,
                    temperature_c: s.temperature_c,
                    power_mw: s.power_mw,
                    compute_allocated_ppm: u32::try_from(ppm).unwrap_or(u32::MAX),
                    memory_allocated_bytes: mem,
                }
            })
            .collect();
        pb::NodeStatus {
            hostname: self.config.hostname.clone(),
            driver_version: self.driver_version.clone(),
            gpus,
            allocations: allocs
                .iter()
                .map(|l| self.slot_status(l, achieved))
                .collect(),
            unix_ms: now_unix_ms(),
        }
    }

    /// Slices each GPU is cut into, by UUID: what the device plugin resolved
    /// from the node's config and published next to the socket
    /// ([`tessera_contract::paths::SLICES_FILE`]); a GPU it does not name (no
    /// plugin on this node, as under `tessera run`) counts the default.
    fn slice_counts(&self) -> impl Fn(&str) -> u32 {
        let path = self
            .config
            .socket
            .with_file_name(tessera_contract::paths::SLICES_FILE);
        let published: BTreeMap<String, u32> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| serde_json::from_value(v.get("gpus")?.clone()).ok())
            .unwrap_or_default();
        let default = self.config.slices_per_gpu;
        move |uuid| {
            published
                .get(uuid)
                .copied()
                .filter(|&n| n > 0)
                .unwrap_or(default)
        }
    }

    /// Slices an allocation's device stands for: what the device plugin
    /// said, or else what its memory and compute amount to in this node's
    /// slice size (the larger of the two, rounded up).
    fn slices_of(d: &alloc::DeviceRecord, gpu: &GpuInfo, slices_per_gpu: u32) -> u32 {
        if d.slices > 0 {
            return d.slices;
        }
        let s = u64::from(slices_per_gpu);
        let by_mem = (d.memory_limit_bytes * s).div_ceil(gpu.memory_total_bytes.max(1));
        let by_compute = (u64::from(d.compute_share_ppm) * s).div_ceil(u64::from(FULL_COMPUTE_PPM));
        by_mem.max(by_compute).min(s) as u32
    }

    /// The metrics exposition.
    pub fn metrics_text(&self) -> String {
        let achieved = self.arbitration.achieved_all();
        let status = self.node_status_with(&achieved);
        let findings = self.findings.lock().clone();
        let allocs = self.live_list();
        let slices_per_gpu = self.slice_counts();
        let gpus = self
            .gpus
            .iter()
            .zip(&status.gpus)
            .map(|(g, s)| {
                let mut ungoverned = BTreeMap::new();
                for r in Reason::ALL {
                    let n = findings
                        .iter()
                        .filter(|f| f.gpu_uuid == g.uuid && f.reason == r)
                        .count();
                    ungoverned.insert(r.label(), n as u64);
                }
                GpuMetrics {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.name.clone(),
                    vendor: g.vendor.as_str().to_owned(),
                    memory_used_bytes: s.memory_used_bytes,
                    memory_total_bytes: g.memory_total_bytes,
                    utilization_ratio: f64::from(s.utilization_percent) / 100.0,
                    temperature_celsius: s.temperature_c,
                    power_watts: f64::from(s.power_mw) / 1000.0,
                    slices_allocated: allocs
                        .iter()
                        .flat_map(|a| a.record().devices)
                        .filter(|d| d.gpu_uuid == g.uuid)
                        .map(|d| Self::slices_of(&d, g, slices_per_gpu(&g.uuid)))
                        .sum(),
                    slices_total: slices_per_gpu(&g.uuid),
                    healthy: s.healthy,
                    ungoverned,
                }
            })
            .collect();
        let subject = |uuid: &str| {
            self.gpus
                .iter()
                .find(|g| g.uuid == uuid)
                .map(|g| metrics::Subject {
                    gpu_index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.name.clone(),
                    ..Default::default()
                })
        };
        // The GPU `uuid` with the allocation `rec` and its owner.
        let owned = |uuid: &str, rec: &pb::Allocation| {
            Some(metrics::Subject {
                allocation: rec.id.clone(),
                namespace: rec.namespace.clone(),
                pod: rec.pod.clone(),
                container: rec.container.clone(),
                ..subject(uuid)?
            })
        };
        let mut alloc_rows = Vec::new();
        for a in &status.allocations {
            let Some(rec) = &a.allocation else { continue };
            for d in &a.devices {
                let Some(subject) = owned(&d.gpu_uuid, rec) else {
                    continue;
                };
                let achieved = achieved
                    .get(&(rec.id.clone(), subject.uuid.clone()))
                    .map(|p| f64::from(*p) / 1e6);
                alloc_rows.push(AllocMetrics {
                    subject,
                    memory_limit_bytes: d.memory_limit_bytes,
                    memory_used_bytes: d.memory_used_bytes,
                    compute_share_ratio: f64::from(d.compute_share_ppm) / 1e6,
                    compute_achieved_ratio: achieved,
                    processes: a.processes.len() as u64,
                    wait_seconds_total: d.wait_ns_total as f64 / 1e9,
                    oom_refused_total: d.oom_refused_total,
                    priority: rec.priority,
                    paused: a.paused,
                    paused_seconds_total: a.paused_ns_total as f64 / 1e9,
                });
            }
        }
        let recovered_parts = self.recovered.lock().clone();
        let mut recovered = Vec::new();
        for a in &status.allocations {
            let Some(rec) = &a.allocation else { continue };
            let Some(r) = recovered_parts.get(&rec.id) else {
                continue;
            };
            for d in &a.devices {
                let Some(subject) = owned(&d.gpu_uuid, rec) else {
                    continue;
                };
                recovered.push(metrics::RecoveredMetrics {
                    subject,
                    repaired: r.label(),
                });
            }
        }
        let tally = self.backstop.lock().clone();
        let backstop_stops = tally
            .stops
            .iter()
            .filter_map(|(k, n)| {
                Some(metrics::StopMetrics {
                    subject: metrics::Subject {
                        allocation: k.alloc_id.clone(),
                        namespace: k.namespace.clone(),
                        pod: k.pod.clone(),
                        container: k.container.clone(),
                        ..subject(&k.gpu_uuid)?
                    },
                    reason: k.reason.label(),
                    stops: n.stops,
                    bytes: n.bytes,
                })
            })
            .collect();
        // The last pass's standings, under the owner the record names now.
        let backstop_standings = tally
            .standings
            .iter()
            .filter_map(|st| {
                let rec = status
                    .allocations
                    .iter()
                    .filter_map(|a| a.allocation.as_ref())
                    .find(|r| r.id == st.alloc_id)?;
                Some(metrics::StandingMetrics {
                    subject: owned(&st.gpu_uuid, rec)?,
                    held_bytes: st.held,
                    over_limit_bytes: st.over_by(),
                })
            })
            .collect();
        metrics::render(&MetricsSnapshot {
            hostname: status.hostname,
            gpus,
            allocations: alloc_rows,
            recovered,
            backstop_stops,
            backstop_passes: tally.passes,
            backstop_standings,
            reaper_passes: self.passes.reaper(),
            gpu_events: self.passes.gpu_events(),
            gpu_event_waits: self.passes.gpu_event_waits(),
        })
    }
}
