//! The running manager: its shared state ([`Core`]), the threads that keep
//! it current (reaper, sampler, health events) and the servers in front of
//! it (gRPC on a unix socket, metrics over HTTP).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use tessera_proto::manager::v1 as pb;
use tessera_shm::{Control, Liveness, ProcIdentity, State};

use crate::alloc::{self, AllocError, AllocationRecord, Store};
use crate::arbitration::Arbitration;
use crate::backstop::{self, Backstop, Finding, Owner, Reason};
use crate::config::{self, Config, ConfigError};
use crate::gpu::{GpuBackend, GpuError, GpuEvent, GpuInfo, GpuSample};
use crate::health::{Change, GpuHealth, HealthPolicy};
use crate::metrics::{self, AllocMetrics, GpuMetrics, MetricsSnapshot};
use crate::procfs::{Resolver, Verdict};

/// Why the manager could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the GPU inventory: {0}")]
    Gpu(GpuError),
    #[error(
        "state directory {path}: {error} (the manager must be able to write there, usually as \
         root; choose another with --state-dir)"
    )]
    StateDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("another manager is running on state directory {0} (it holds manager.lock)")]
    Locked(PathBuf),
    #[error("another manager is already serving on {0}; stop it first or choose another --socket")]
    SocketInUse(PathBuf),
    #[error("cannot listen on {path}: {error}{hint}")]
    Socket {
        path: PathBuf,
        error: std::io::Error,
        hint: &'static str,
    },
    #[error("socket group {0:?} does not exist")]
    NoSuchGroup(String),
    #[error("cannot serve metrics on {addr}: {error} (choose another --metrics-addr, or off)")]
    Metrics {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("loading allocations: {0}")]
    Alloc(AllocError),
    #[error("gRPC server: {0}")]
    Serve(String),
    #[error("compute arbiter: {0}")]
    Arbiter(String),
}

impl From<GpuError> for ManagerError {
    fn from(e: GpuError) -> Self {
        ManagerError::Gpu(e)
    }
}

impl From<AllocError> for ManagerError {
    fn from(e: AllocError) -> Self {
        ManagerError::Alloc(e)
    }
}

/// An allocation the manager serves: its record and its open files.
#[derive(Debug)]
pub struct LiveAllocation {
    record: RwLock<AllocationRecord>,
    control: Control,
    state: State,
    dir: PathBuf,
}

impl LiveAllocation {
    pub fn id(&self) -> String {
        self.record.read().id.clone()
    }
    /// A copy of the record.
    pub fn record(&self) -> AllocationRecord {
        self.record.read().clone()
    }
    /// The control file, mapped read-write.
    pub fn control(&self) -> &Control {
        &self.control
    }
    pub fn state(&self) -> &State {
        &self.state
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Everything the threads and servers share.
pub struct Core {
    config: Config,
    gpus: Vec<GpuInfo>,
    driver_version: String,
    backend: Arc<dyn GpuBackend>,
    health_policy: HealthPolicy,
    health: Mutex<Vec<GpuHealth>>,
    samples: RwLock<Vec<Option<GpuSample>>>,
    allocs: RwLock<BTreeMap<String, Arc<LiveAllocation>>>,
    /// Serialises create, delete and owner changes, so capacity checks and
    /// the files on disk agree.
    writes: Mutex<()>,
    store: Store,
    findings: Mutex<Vec<Finding>>,
    arbitration: Arc<dyn Arbitration>,
    changes: tokio::sync::watch::Sender<u64>,
    stop: AtomicBool,
    resolver: Resolver,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("gpus", &self.gpus).finish()
    }
}

/// A liveness answer per identity, decided once per reaper tick.
struct Verdicts(HashMap<ProcIdentity, Verdict>);

impl Liveness for Verdicts {
    fn check(&self, id: &ProcIdentity) -> Option<bool> {
        match self.0.get(id) {
            Some(Verdict::Alive { .. }) => Some(true),
            Some(Verdict::Dead) => Some(false),
            Some(Verdict::Unknown) | None => None,
        }
    }
}

/// How long a slot the manager cannot judge is left before trying again.
const UNKNOWN_RETRY: Duration = Duration::from_secs(2);

impl Core {
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn notify(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// Subscribes to changes of health or allocations.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn allocation(&self, id: &str) -> Option<Arc<LiveAllocation>> {
        self.allocs.read().get(id).cloned()
    }

    fn live_list(&self) -> Vec<Arc<LiveAllocation>> {
        self.allocs.read().values().cloned().collect()
    }

    fn open_live(
        &self,
        rec: AllocationRecord,
        dir: PathBuf,
    ) -> Result<Arc<LiveAllocation>, AllocError> {
        let control = Control::open_rw(&dir.join("control"))?;
        let state = State::open(&dir.join("state"), &rec.id)?;
        if control.alloc_id() != rec.id {
            return Err(AllocError::Invalid(format!(
                "{}: control file is for {:?}",
                dir.display(),
                control.alloc_id()
            )));
        }
        Ok(Arc::new(LiveAllocation {
            record: RwLock::new(rec),
            control,
            state,
            dir,
        }))
    }

    /// The wire form of an allocation: paths, mounts and environment.
    pub fn allocation_pb(&self, live: &LiveAllocation) -> pb::Allocation {
        let rec = live.record();
        let control = live.dir.join("control");
        let state = live.dir.join("state");
        let mount = |host: &Path, container: &str, read_only| pb::Mount {
            host_path: host.display().to_string(),
            container_path: container.to_owned(),
            read_only,
        };
        let mut env = std::collections::HashMap::new();
        env.insert(
            "TESSERA_CONTROL".to_owned(),
            config::CONTAINER_CONTROL.to_owned(),
        );
        env.insert(
            "TESSERA_STATE".to_owned(),
            config::CONTAINER_STATE.to_owned(),
        );
        env.insert("TESSERA_ALLOCATION".to_owned(), rec.id.clone());
        env.insert(
            "NVIDIA_VISIBLE_DEVICES".to_owned(),
            rec.devices
                .iter()
                .map(|d| d.gpu_uuid.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
        pb::Allocation {
            id: rec.id.clone(),
            devices: rec
                .devices
                .iter()
                .map(|d| pb::DeviceRequest {
                    gpu_uuid: d.gpu_uuid.clone(),
                    memory_limit_bytes: d.memory_limit_bytes,
                    compute_share_ppm: d.compute_share_ppm,
                    slices: d.slices,
                })
                .collect(),
            policy: alloc::policy_to_pb(rec.policy) as i32,
            device_ids: rec.device_ids.clone(),
            labels: rec.labels.clone().into_iter().collect(),
            control_path: control.display().to_string(),
            state_path: state.display().to_string(),
            mounts: vec![
                mount(&control, config::CONTAINER_CONTROL, true),
                mount(&state, config::CONTAINER_STATE, false),
                mount(
                    &self.config.hook_library,
                    config::CONTAINER_HOOK_LIBRARY,
                    true,
                ),
            ],
            env,
            namespace: rec.namespace.clone(),
            pod: rec.pod.clone(),
            container: rec.container.clone(),
            created_unix_ms: rec.created_unix_ms,
        }
    }

    /// CreateAllocation: idempotent for the same id and request.
    pub fn create(&self, req: &pb::CreateAllocationRequest) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        let id = if req.id.is_empty() {
            alloc::generate_id()
        } else {
            req.id.clone()
        };
        let rec = alloc::normalize(
            req,
            id,
            &self.gpus,
            self.config.default_policy,
            now_unix_ms(),
        )?;
        if let Some(existing) = self.allocation(&rec.id) {
            if existing.record().same_request(&rec) {
                return Ok(self.allocation_pb(&existing));
            }
            return Err(AllocError::Conflict(format!(
                "allocation {} already exists with a different request; delete it first or \
                 choose another id",
                rec.id
            )));
        }
        {
            let health = self.health.lock();
            for d in &rec.devices {
                if let Some(i) = self.gpus.iter().position(|g| g.uuid == d.gpu_uuid)
                    && !health[i].healthy()
                {
                    return Err(AllocError::Precondition(format!(
                        "GPU {} (index {i}) is unhealthy: {}",
                        d.gpu_uuid,
                        health[i].reason()
                    )));
                }
            }
        }
        let existing: Vec<AllocationRecord> = self.live_list().iter().map(|l| l.record()).collect();
        alloc::check_capacity(&rec, &self.gpus, existing.iter())?;
        let spec = rec.control_spec(self.config.context_overhead_bytes);
        self.store.create(&rec, &spec)?;
        let dir = self.store.alloc_dir(&rec.id);
        let live = match self.open_live(rec.clone(), dir) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.store.remove(&rec.id);
                return Err(e);
            }
        };
        self.allocs.write().insert(rec.id.clone(), live.clone());
        self.arbitration.add(&live);
        tracing::info!(
            id = %rec.id,
            devices = rec.devices.len(),
            policy = config::policy_name(rec.policy),
            "allocation created"
        );
        self.notify();
        Ok(self.allocation_pb(&live))
    }

    /// DeleteAllocation.
    pub fn delete(&self, id: &str) -> Result<(), AllocError> {
        let _w = self.writes.lock();
        let Some(live) = self.allocs.write().remove(id) else {
            return Err(AllocError::NotFound(format!("no allocation {id:?}")));
        };
        self.arbitration.remove(id);
        let procs = live.state.processes(live.control.n_devices()).len();
        drop(live);
        self.store.remove(id)?;
        tracing::info!(id, processes_left = procs, "allocation deleted");
        self.notify();
        Ok(())
    }

    pub fn list(&self) -> Vec<pb::Allocation> {
        self.live_list()
            .iter()
            .map(|l| self.allocation_pb(l))
            .collect()
    }

    /// SetAllocationOwner: records the owner; a policy may only tighten.
    pub fn set_owner(
        &self,
        req: &pb::SetAllocationOwnerRequest,
    ) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        let live = self
            .allocation(&req.id)
            .ok_or_else(|| AllocError::NotFound(format!("no allocation {:?}", req.id)))?;
        let mut rec = live.record();
        if let Some(p) = alloc::policy_from_pb(req.policy)? {
            if !alloc::is_stricter_or_same(rec.policy, p) {
                return Err(AllocError::Precondition(format!(
                    "allocation {} is {}; a policy may only become stricter, not {}",
                    rec.id,
                    config::policy_name(rec.policy),
                    config::policy_name(p)
                )));
            }
            rec.policy = p;
        }
        rec.namespace = req.namespace.clone();
        rec.pod = req.pod.clone();
        rec.container = req.container.clone();
        self.store.save(&rec)?;
        for i in 0..live.control.n_devices() {
            live.control.set_policy(i, rec.policy)?;
        }
        *live.record.write() = rec;
        self.notify();
        Ok(self.allocation_pb(&live))
    }

    fn slot_status(
        &self,
        live: &LiveAllocation,
        achieved: &HashMap<(String, String), u32>,
    ) -> pb::AllocationStatus {
        let rec = live.record();
        let n = live.control.n_devices();
        let devices = (0..n)
            .map(|i| {
                let uuid = live.control.uuid(i).to_owned();
                pb::AllocationDeviceStatus {
                    memory_limit_bytes: live.control.memory_limit(i),
                    memory_used_bytes: live.state.reserved(i),
                    compute_share_ppm: live.control.compute_share_ppm(i),
                    compute_achieved_ppm: achieved
                        .get(&(rec.id.clone(), uuid.clone()))
                        .copied()
                        .unwrap_or(0),
                    wait_ns_total: live.state.gate_wait_ns(i),
                    oom_refused_total: live.state.oom_refused(i),
                    gpu_uuid: uuid,
                }
            })
            .collect();
        let processes = live
            .state
            .processes(n)
            .into_iter()
            .map(|p| pb::ProcessStatus {
                host_pid: p.host_pid,
                container_pid: p.identity.pid,
                memory_used_bytes: p.usage,
            })
            .collect();
        pb::AllocationStatus {
            allocation: Some(self.allocation_pb(live)),
            devices,
            processes,
        }
    }

    /// GetNodeStatus.
    pub fn node_status(&self) -> pb::NodeStatus {
        self.node_status_with(&self.arbitration.achieved_all())
    }

    /// The status, with the arbiter's achieved shares asked for once.
    fn node_status_with(&self, achieved: &HashMap<(String, String), u32>) -> pb::NodeStatus {
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

    /// Slices an allocation's device stands for: what the device plugin
    /// said, or else what its memory and compute amount to in this node's
    /// slice size (the larger of the two, rounded up).
    fn slices_of(&self, d: &alloc::DeviceRecord, gpu: &GpuInfo) -> u32 {
        if d.slices > 0 {
            return d.slices;
        }
        let s = u64::from(self.config.slices_per_gpu);
        let by_mem = (d.memory_limit_bytes * s).div_ceil(gpu.memory_total_bytes.max(1));
        let by_compute = (u64::from(d.compute_share_ppm) * s).div_ceil(1_000_000);
        by_mem.max(by_compute).min(s) as u32
    }

    /// The metrics exposition.
    pub fn metrics_text(&self) -> String {
        let achieved = self.arbitration.achieved_all();
        let status = self.node_status_with(&achieved);
        let findings = self.findings.lock().clone();
        let allocs = self.live_list();
        let gpus = self
            .gpus
            .iter()
            .zip(&status.gpus)
            .map(|(g, s)| {
                let mut ungoverned = BTreeMap::new();
                for r in [Reason::NoShim, Reason::OtherGpu, Reason::OverLimit] {
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
                    memory_used_bytes: s.memory_used_bytes,
                    memory_total_bytes: g.memory_total_bytes,
                    utilization_ratio: f64::from(s.utilization_percent) / 100.0,
                    temperature_celsius: s.temperature_c,
                    power_watts: f64::from(s.power_mw) / 1000.0,
                    slices_allocated: allocs
                        .iter()
                        .flat_map(|a| a.record().devices)
                        .filter(|d| d.gpu_uuid == g.uuid)
                        .map(|d| self.slices_of(&d, g))
                        .sum(),
                    slices_total: self.config.slices_per_gpu,
                    healthy: s.healthy,
                    ungoverned,
                }
            })
            .collect();
        let mut alloc_rows = Vec::new();
        for a in &status.allocations {
            let Some(rec) = &a.allocation else { continue };
            for d in &a.devices {
                let Some(g) = self.gpus.iter().find(|g| g.uuid == d.gpu_uuid) else {
                    continue;
                };
                alloc_rows.push(AllocMetrics {
                    gpu_index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.name.clone(),
                    allocation: rec.id.clone(),
                    namespace: rec.namespace.clone(),
                    pod: rec.pod.clone(),
                    container: rec.container.clone(),
                    memory_limit_bytes: d.memory_limit_bytes,
                    memory_used_bytes: d.memory_used_bytes,
                    compute_share_ratio: f64::from(d.compute_share_ppm) / 1e6,
                    compute_achieved_ratio: achieved
                        .get(&(rec.id.clone(), g.uuid.clone()))
                        .map(|p| f64::from(*p) / 1e6),
                    processes: a.processes.len() as u64,
                    wait_seconds_total: d.wait_ns_total as f64 / 1e9,
                    oom_refused_total: d.oom_refused_total,
                });
            }
        }
        metrics::render(&MetricsSnapshot {
            hostname: status.hostname,
            gpus,
            allocations: alloc_rows,
        })
    }

    /// One reaper pass: resolves host pids and reclaims dead processes.
    fn reap_once(&self, unknown: &mut HashMap<(String, usize), (ProcIdentity, Instant)>) {
        let now = Instant::now();
        // Every slot is read before /proc is scanned, so a process that
        // joined just now is in the scan (see Resolver::judge).
        let snapshot: Vec<_> = self
            .live_list()
            .into_iter()
            .map(|l| {
                let procs = l.state.processes(l.control.n_devices());
                (l, procs)
            })
            .collect();
        let mut scan = None;
        let mut seen = Vec::new();
        for (live, procs) in &snapshot {
            let id = live.id();
            let mut verdicts = HashMap::new();
            for p in procs {
                let key = (id.clone(), p.slot);
                seen.push(key.clone());
                if let Some((ident, since)) = unknown.get(&key)
                    && *ident == p.identity
                    && now.duration_since(*since) < UNKNOWN_RETRY
                {
                    continue;
                }
                let v = self.resolver.judge(&p.identity, p.host_pid, &mut scan);
                match v {
                    Verdict::Unknown => {
                        unknown.insert(key, (p.identity, now));
                    }
                    Verdict::Alive { host_pid } => {
                        unknown.remove(&key);
                        if host_pid != p.host_pid {
                            live.state.set_host_pid(p.slot, host_pid);
                            // The slot may have changed hands meanwhile:
                            // never leave our pid on someone else's slot.
                            let still = live
                                .state
                                .processes(live.control.n_devices())
                                .into_iter()
                                .any(|q| q.slot == p.slot && q.identity == p.identity);
                            if !still {
                                live.state.set_host_pid(p.slot, 0);
                            }
                        }
                    }
                    Verdict::Dead => {
                        unknown.remove(&key);
                    }
                }
                verdicts.insert(p.identity, v);
            }
            for r in live.state.reclaim_dead(&Verdicts(verdicts), None) {
                let freed: u64 = r.freed.iter().sum();
                tracing::info!(
                    allocation = %id,
                    pid = r.identity.pid,
                    freed_bytes = freed,
                    "reclaimed a dead process's memory"
                );
            }
        }
        unknown.retain(|k, _| seen.contains(k));
        self.collect_orphaned_runs(&snapshot);
    }

    /// Deletes the allocations of `tessera run` commands that died without
    /// cleaning up (SIGKILL), once none of their processes is left. Only
    /// for runs in our own pid namespace, where their pid means the same.
    fn collect_orphaned_runs(
        &self,
        snapshot: &[(Arc<LiveAllocation>, Vec<tessera_shm::ProcessInfo>)],
    ) {
        let own_ns = self.resolver.own_pidns();
        for (live, procs) in snapshot {
            if !procs.is_empty() {
                continue;
            }
            let rec = live.record();
            let Some(run) = crate::cli::run::RunOwner::from_labels(&rec.labels) else {
                continue;
            };
            if own_ns == 0 || run.pidns != own_ns {
                continue;
            }
            let alive = crate::procfs::ProcFs::host()
                .entry(run.pid)
                .is_some_and(|e| !e.zombie && e.start_time == run.start_time);
            if alive || !live.state.processes(live.control.n_devices()).is_empty() {
                continue;
            }
            match self.delete(&rec.id) {
                Ok(()) => tracing::info!(
                    allocation = %rec.id,
                    pid = run.pid,
                    "deleted the allocation of a `tessera run` that died"
                ),
                Err(AllocError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(allocation = %rec.id, error = %e, "cannot delete orphaned allocation")
                }
            }
        }
    }

    /// One sampling pass: health from queries, samples for metrics, and
    /// the backstop.
    fn sample_once(&self, backstop: &mut Backstop) {
        let now = Instant::now();
        let mut samples = Vec::with_capacity(self.gpus.len());
        let mut changed = false;
        let mut driver_procs = Vec::with_capacity(self.gpus.len());
        for (i, g) in self.gpus.iter().enumerate() {
            let result = self.backend.sample(&g.uuid);
            let change = {
                let mut health = self.health.lock();
                match &result {
                    Ok(_) => health[i].on_answer(now),
                    Err(e) => health[i].on_lost(&e.to_string()),
                }
            };
            if change != Change::None {
                changed = true;
                self.log_health(i, change);
            }
            samples.push(result.ok());
            driver_procs.push(self.backend.processes(&g.uuid).ok());
        }
        *self.samples.write() = samples;

        // Backstop: host pid → allocation, then each GPU's processes.
        let allocs = self.live_list();
        // (host pid, allocation, (GPU UUID, limit) per device)
        type Member = (u32, String, Vec<(String, u64)>);
        let mut members: Vec<Member> = Vec::new();
        for l in &allocs {
            let n = l.control.n_devices();
            let limits: Vec<(String, u64)> = (0..n)
                .map(|i| (l.control.uuid(i).to_owned(), l.control.memory_limit(i)))
                .collect();
            for p in l.state.processes(n) {
                if p.host_pid != 0 {
                    members.push((p.host_pid, l.id(), limits.clone()));
                }
            }
        }
        let mut findings = Vec::new();
        for (g, procs) in self.gpus.iter().zip(&driver_procs) {
            let Some(procs) = procs else { continue };
            let owners: HashMap<u32, Owner> = members
                .iter()
                .map(|(pid, id, limits)| {
                    let limit = limits.iter().find(|(u, _)| *u == g.uuid).map(|(_, l)| *l);
                    (
                        *pid,
                        Owner {
                            alloc_id: id.clone(),
                            limit_on_gpu: limit,
                        },
                    )
                })
                .collect();
            findings.extend(backstop::check(
                &g.uuid,
                procs,
                &owners,
                self.config.backstop_slack_bytes,
            ));
        }
        let (confirmed, new) = backstop.round(findings);
        for f in &new {
            tracing::warn!(
                gpu = %f.gpu_uuid,
                pid = f.pid,
                used_bytes = f.used_bytes,
                reason = f.reason.label(),
                allocation = f.alloc_id.as_deref().unwrap_or(""),
                kill = self.config.backstop_kill,
                "process escapes its GPU allocation"
            );
        }
        if self.config.backstop_kill {
            for f in &confirmed {
                kill_process(f.pid);
            }
        }
        *self.findings.lock() = confirmed;
        if changed {
            self.notify();
        }
    }

    fn log_health(&self, i: usize, change: Change) {
        let reason = self.health.lock()[i].reason();
        let uuid = &self.gpus[i].uuid;
        match change {
            Change::Failed | Change::Reason => {
                tracing::warn!(gpu = i, uuid = %uuid, %reason, "GPU unhealthy")
            }
            Change::Recovered => tracing::info!(gpu = i, uuid = %uuid, "GPU healthy again"),
            Change::None => {}
        }
    }

    fn on_event(&self, ev: GpuEvent) {
        let now = Instant::now();
        let (uuid, change) = match &ev {
            GpuEvent::Xid { uuid, xid } => {
                let Some(i) = self.gpus.iter().position(|g| g.uuid == *uuid) else {
                    return;
                };
                if self.health_policy.ignored_xids.contains(xid) {
                    tracing::info!(gpu = i, uuid = %uuid, xid, "application XID; GPU stays healthy");
                }
                (
                    uuid,
                    self.health.lock()[i].on_xid(&self.health_policy, *xid, now),
                )
            }
            GpuEvent::Lost { uuid } => {
                let Some(i) = self.gpus.iter().position(|g| g.uuid == *uuid) else {
                    return;
                };
                (uuid, self.health.lock()[i].on_lost("GPU lost"))
            }
        };
        if change != Change::None {
            if let Some(i) = self.gpus.iter().position(|g| g.uuid == *uuid) {
                self.log_health(i, change);
            }
            self.notify();
        }
    }
}

fn kill_process(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    match kill(Pid::from_raw(raw), Signal::SIGKILL) {
        Ok(()) => tracing::warn!(pid, "backstop killed process"),
        Err(e) => tracing::warn!(pid, error = %e, "backstop could not kill process"),
    }
}

/// A started manager: threads running, sockets bound, not yet serving.
pub struct Manager {
    core: Arc<Core>,
    threads: Vec<JoinHandle<()>>,
    grpc: tokio::net::UnixListener,
    socket: PathBuf,
    socket_ino: u64,
    metrics: Option<tokio::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("socket", &self.socket)
            .field("metrics_addr", &self.metrics_addr)
            .finish()
    }
}

fn state_dir_err(path: &Path) -> impl Fn(std::io::Error) -> ManagerError + '_ {
    move |error| ManagerError::StateDir {
        path: path.to_owned(),
        error,
    }
}

fn lock_state_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, ManagerError> {
    use nix::fcntl::{Flock, FlockArg};
    std::fs::create_dir_all(dir).map_err(state_dir_err(dir))?;
    let path = dir.join("manager.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(state_dir_err(dir))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            ManagerError::Locked(dir.to_owned())
        } else {
            ManagerError::StateDir {
                path: path.clone(),
                error: std::io::Error::from(errno),
            }
        }
    })
}

fn socket_err(path: &Path, error: std::io::Error) -> ManagerError {
    let hint = if error.kind() == std::io::ErrorKind::PermissionDenied {
        " (run the manager as root, or choose a --socket in a directory you can write)"
    } else {
        ""
    };
    ManagerError::Socket {
        path: path.to_owned(),
        error,
        hint,
    }
}

/// Binds the gRPC socket, refusing to steal one a live manager serves.
fn bind_socket(
    path: &Path,
    group: Option<&str>,
) -> Result<(tokio::net::UnixListener, u64), ManagerError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(socket_err(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket",
                ),
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ManagerError::SocketInUse(path.to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                // Left by a manager that died: nobody listens.
                std::fs::remove_file(path).map_err(|e| socket_err(path, e))?;
            }
            Err(e) => return Err(socket_err(path, e)),
        }
    }
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).map_err(|e| socket_err(path, e))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| socket_err(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| socket_err(path, e))?;
    if let Some(name) = group {
        let g = nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .ok_or_else(|| ManagerError::NoSuchGroup(name.to_owned()))?;
        nix::unistd::chown(path, None, Some(g.gid))
            .map_err(|e| socket_err(path, std::io::Error::from(e)))?;
    }
    let ino = std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0);
    Ok((listener, ino))
}

impl Manager {
    /// Starts a manager over `backend`: takes the state directory, reads
    /// the inventory, reloads allocations, starts the background threads
    /// and binds the sockets. Must run inside a tokio runtime.
    pub async fn start(
        config: Config,
        backend: Arc<dyn GpuBackend>,
        arbitration: Arc<dyn Arbitration>,
    ) -> Result<Manager, ManagerError> {
        let lock = lock_state_dir(&config.state_dir)?;
        let gpus = backend.devices()?;
        let driver_version = backend.driver_version().unwrap_or_default();
        tracing::info!(gpus = gpus.len(), driver = %driver_version, "GPU inventory read");
        for g in &gpus {
            tracing::info!(
                index = g.index,
                uuid = %g.uuid,
                name = %g.name,
                memory = g.memory_total_bytes,
                pci = %g.pci_bus_id,
                "GPU"
            );
        }
        let store = Store::open(&config.allocations_dir()).map_err(|e| match e {
            AllocError::Io { path, error } => ManagerError::StateDir { path, error },
            e => ManagerError::Alloc(e),
        })?;
        let (metrics, metrics_addr) = match config.metrics_addr {
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|error| ManagerError::Metrics { addr, error })?;
                let bound = l.local_addr().ok();
                (Some(l), bound)
            }
            None => (None, None),
        };
        let (grpc, socket_ino) = bind_socket(&config.socket, config.socket_group.as_deref())?;
        let (changes, _) = tokio::sync::watch::channel(0u64);
        let n = gpus.len();
        let core = Arc::new(Core {
            health_policy: HealthPolicy {
                ignored_xids: config.ignored_xids.clone(),
                xid_recovery: config.xid_recovery,
            },
            config,
            gpus,
            driver_version,
            backend,
            health: Mutex::new(vec![GpuHealth::default(); n]),
            samples: RwLock::new(vec![None; n]),
            allocs: RwLock::new(BTreeMap::new()),
            writes: Mutex::new(()),
            store,
            findings: Mutex::new(Vec::new()),
            arbitration,
            changes,
            stop: AtomicBool::new(false),
            resolver: Resolver::host(),
        });
        let socket = core.config.socket.clone();
        let cleanup = |e: ManagerError| {
            let _ = std::fs::remove_file(&socket);
            e
        };
        core.reload().map_err(cleanup)?;
        // A first sample before serving, so status and metrics start full.
        core.sample_once(&mut Backstop::default());
        let threads = core
            .spawn_threads()
            .map_err(|e| cleanup(ManagerError::Serve(format!("cannot start threads: {e}"))))?;
        Ok(Manager {
            core,
            threads,
            grpc,
            socket,
            socket_ino,
            metrics,
            metrics_addr,
            _lock: lock,
        })
    }

    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Where metrics are served (the bound port when 0 was asked for).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serves until `shutdown` completes, then stops every thread and
    /// removes the socket. Allocation files stay: containers keep running.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ManagerError> {
        let Manager {
            core,
            threads,
            grpc,
            socket,
            socket_ino,
            metrics,
            _lock,
            ..
        } = self;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let metrics_task = metrics.map(|l| {
            let core = core.clone();
            let stop = stop_rx.clone();
            tokio::spawn(metrics::serve(l, move || core.metrics_text(), stop))
        });
        let service = crate::service::ManagerService::new(core.clone(), stop_rx.clone());
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(grpc);
        let mut stop_for_grpc = stop_rx.clone();
        let grpc_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::manager_server::ManagerServer::new(service))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop_for_grpc.wait_for(|s| *s).await;
                }),
        );
        shutdown.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
        let grpc_result = grpc_task.await;
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        core.stop.store(true, Ordering::Release);
        core.arbitration.shutdown();
        for t in threads {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        // Only our own socket: a successor may already have bound a new one.
        if std::fs::metadata(&socket).is_ok_and(|m| m.ino() == socket_ino) {
            let _ = std::fs::remove_file(&socket);
        }
        match grpc_result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ManagerError::Serve(e.to_string())),
            Err(e) => Err(ManagerError::Serve(e.to_string())),
        }
    }
}

impl Core {
    /// Loads every allocation on disk (manager restart).
    fn reload(&self) -> Result<(), ManagerError> {
        let (records, broken) = self.store.load_all()?;
        for q in broken {
            tracing::error!(
                from = %q.from.display(),
                kept_at = %q.to.display(),
                reason = %q.reason,
                "allocation directory unreadable; moved aside"
            );
        }
        for rec in records {
            let id = rec.id.clone();
            for d in &rec.devices {
                if !self.gpus.iter().any(|g| g.uuid == d.gpu_uuid) {
                    tracing::warn!(allocation = %id, gpu = %d.gpu_uuid, "allocation names a GPU not on this node");
                }
            }
            let dir = self.store.alloc_dir(&id);
            match self.open_live(rec, dir.clone()) {
                Ok(live) => {
                    let procs = live.state.processes(live.control.n_devices()).len();
                    tracing::info!(allocation = %id, processes = procs, "allocation reloaded");
                    self.allocs.write().insert(id, live.clone());
                    self.arbitration.add(&live);
                }
                Err(e) => {
                    tracing::error!(allocation = %id, error = %e, "allocation files unusable; left in place, not served");
                }
            }
        }
        Ok(())
    }

    fn spawn_threads(self: &Arc<Self>) -> std::io::Result<Vec<JoinHandle<()>>> {
        let mut threads = Vec::new();
        let core = self.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tessera-reaper".into())
                .spawn(move || {
                    let mut unknown = HashMap::new();
                    while !core.stop.load(Ordering::Acquire) {
                        core.reap_once(&mut unknown);
                        std::thread::sleep(core.config.reap_interval);
                    }
                })?,
        );
        let core = self.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tessera-sampler".into())
                .spawn(move || {
                    let mut backstop = Backstop::default();
                    let mut next = Instant::now();
                    while !core.stop.load(Ordering::Acquire) {
                        if Instant::now() >= next {
                            core.sample_once(&mut backstop);
                            next = Instant::now() + core.config.sample_interval;
                        }
                        // Short naps so shutdown is prompt.
                        std::thread::sleep(
                            core.config.sample_interval.min(Duration::from_millis(50)),
                        );
                    }
                })?,
        );
        let core = self.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tessera-events".into())
                .spawn(move || {
                    let mut complained = false;
                    while !core.stop.load(Ordering::Acquire) {
                        match core.backend.wait_event(Duration::from_millis(200)) {
                            Ok(Some(ev)) => core.on_event(ev),
                            Ok(None) => {}
                            Err(e) => {
                                if !complained {
                                    tracing::warn!(error = %e, "GPU health events unavailable; relying on sampling");
                                    complained = true;
                                }
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                    }
                })?,
        );
        Ok(threads)
    }
}

/// Runs `tessera manager`: NVML, the arbiter, and serving until SIGTERM or
/// SIGINT.
pub async fn run(config: Config) -> Result<(), ManagerError> {
    run_with(config, |_| {}).await
}

/// [`run`], calling `ready` once the manager is started and before it
/// serves (embedders and tests learn the bound metrics port this way).
pub async fn run_with(config: Config, ready: impl FnOnce(&Manager)) -> Result<(), ManagerError> {
    let backend = Arc::new(crate::nvml::NvmlGpu::open(config.nvml_library.as_deref())?);
    if !config.hook_library.exists() {
        tracing::warn!(
            path = %config.hook_library.display(),
            "hook library not found; containers and `tessera run` need it there"
        );
    }
    let arbiter = crate::arbiter::Arbiter::new(config.arbiter)
        .map_err(|e| ManagerError::Arbiter(e.to_string()))?;
    let arbitration: Arc<dyn Arbitration> = Arc::new(arbiter);
    let manager = Manager::start(config, backend, arbitration).await?;
    tracing::info!(
        socket = %manager.socket().display(),
        metrics = ?manager.metrics_addr(),
        "manager serving"
    );
    ready(&manager);
    manager.serve(shutdown_signal()).await
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the default action (exit) still applies.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
