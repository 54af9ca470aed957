//! The manager's shared state ([`Core`]) and the allocation operations its
//! API serves: create, delete, list, set the owner, and reload after a
//! restart. The threads that keep it current are [`crate::reaper`] and
//! [`crate::sampler`]; what it reports is [`crate::report`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tessera_contract::labels::{self, PRIORITY_MAX, PRIORITY_MIN};
use tessera_contract::units::FULL_COMPUTE_PPM;

use parking_lot::{Mutex, RwLock};
use tessera_proto::manager::v1 as pb;

use crate::alloc::{self, AllocError, AllocationRecord};
use crate::arbiter::Arbitration;
use crate::backstop::{Finding, Tally};
use crate::config::Config;
use crate::error::ManagerError;
use crate::gpu::{GpuBackend, GpuInfo, GpuSample};
use crate::health::{GpuHealth, HealthPolicy};
use crate::procfs::Resolver;
use crate::store::{LiveAllocation, Recovery, Store};
use crate::wire;

/// How long a `tessera run` refused for capacity waits for the allocations
/// of runs that have ended to go ([`Core::create_for`]).
const RUN_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Everything the threads and servers share.
pub struct Core {
    pub(crate) config: Config,
    pub(crate) gpus: Vec<GpuInfo>,
    pub(crate) driver_version: String,
    pub(crate) backend: Arc<dyn GpuBackend>,
    pub(crate) health_policy: HealthPolicy,
    pub(crate) health: Mutex<Vec<GpuHealth>>,
    pub(crate) samples: RwLock<Vec<Option<GpuSample>>>,
    pub(crate) allocs: RwLock<BTreeMap<String, Arc<LiveAllocation>>>,
    /// Serialises create, delete and owner changes, so capacity checks and
    /// the files on disk agree.
    pub(crate) writes: Mutex<()>,
    pub(crate) store: Store,
    pub(crate) findings: Mutex<Vec<Finding>>,
    /// The backstop's passes, stops and last standings (its metrics).
    pub(crate) backstop: Mutex<Tally>,
    /// Allocations found damaged at start-up and repaired, by id, until
    /// deleted (status `recovered`, `tessera_allocation_recovered`).
    pub(crate) recovered: Mutex<BTreeMap<String, Recovery>>,
    pub(crate) arbitration: Arc<dyn Arbitration>,
    pub(crate) changes: tokio::sync::watch::Sender<u64>,
    pub(crate) stop: AtomicBool,
    pub(crate) resolver: Resolver,
    /// Background passes completed, so that tests (and operators) can wait
    /// for the next one instead of guessing how long it takes.
    pub(crate) passes: Passes,
    /// What a CUDA context holds on each GPU, by UUID, as measured at
    /// start-up ([`GpuBackend::context_sizes`]); written into every control
    /// file, where the shim charges it before the driver makes a context.
    pub(crate) context_sizes: std::collections::HashMap<String, u64>,
}

/// Who made a request, as the kernel says (SO_PEERCRED of its connection);
/// never from the request itself. `None` where unknown (in-process calls,
/// a peer in a pid namespace we cannot see).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub uid: Option<u32>,
    pub pid: Option<u32>,
}

/// Counts of completed background passes (`tessera_manager_passes_total`).
#[derive(Debug, Default)]
pub struct Passes {
    /// Reaper passes: host pids resolved, dead processes reclaimed.
    pub(crate) reaper: AtomicU64,
    /// GPU events (XIDs, lost GPUs) handled.
    pub(crate) gpu_events: AtomicU64,
    /// Completed waits of the GPU event watcher, with an event or without:
    /// above 0 once it is registered (see `sampler::spawn_events`).
    pub(crate) gpu_event_waits: AtomicU64,
}

impl Passes {
    /// Reaper passes completed since start.
    pub fn reaper(&self) -> u64 {
        self.reaper.load(Ordering::Acquire)
    }

    /// GPU events handled since start.
    pub fn gpu_events(&self) -> u64 {
        self.gpu_events.load(Ordering::Acquire)
    }

    /// Waits for GPU events completed since start; above 0 once the event
    /// watcher is registered, so an event from then on is not lost.
    pub fn gpu_event_waits(&self) -> u64 {
        self.gpu_event_waits.load(Ordering::Acquire)
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Release);
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("gpus", &self.gpus).finish()
    }
}

impl Core {
    /// The shared state of a manager over `backend`'s GPUs.
    pub(crate) fn new(
        config: Config,
        gpus: Vec<GpuInfo>,
        driver_version: String,
        backend: Arc<dyn GpuBackend>,
        store: Store,
        arbitration: Arc<dyn Arbitration>,
    ) -> Core {
        let (changes, _) = tokio::sync::watch::channel(0u64);
        let n = gpus.len();
        Core {
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
            backstop: Mutex::new(Tally::default()),
            recovered: Mutex::new(BTreeMap::new()),
            arbitration,
            changes,
            stop: AtomicBool::new(false),
            resolver: Resolver::host(),
            passes: Passes::default(),
            context_sizes: std::collections::HashMap::new(),
        }
    }

    /// The control file's content for `rec`: its limits, the configured
    /// estimate per context, and what a context holds on each of its GPUs
    /// where this manager measured it.
    pub(crate) fn control_spec(&self, rec: &AllocationRecord) -> tessera_shm::ControlSpec {
        let mut spec = rec.control_spec(self.config.context_overhead_bytes);
        spec.context_bytes = rec
            .devices
            .iter()
            .map(|d| self.context_sizes.get(&d.gpu_uuid).copied())
            .collect();
        spec
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Background passes completed so far.
    pub fn passes(&self) -> &Passes {
        &self.passes
    }

    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    pub(crate) fn notify(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// Subscribes to changes of health or allocations.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn allocation(&self, id: &str) -> Option<Arc<LiveAllocation>> {
        self.allocs.read().get(id).cloned()
    }

    pub(crate) fn live_list(&self) -> Vec<Arc<LiveAllocation>> {
        self.allocs.read().values().cloned().collect()
    }

    /// The wire form of an allocation: paths, mounts and environment.
    pub fn allocation_pb(&self, live: &LiveAllocation) -> pb::Allocation {
        wire::allocation(live, &self.config.hook_library)
    }

    /// CreateAllocation: idempotent for the same id and request.
    pub fn create(&self, req: wire::Create) -> Result<pb::Allocation, AllocError> {
        self.create_for(req, Peer::default())
    }

    /// CreateAllocation for a caller: a non-root `tessera run` user gets
    /// the state file as its own (see [`Store::create_owned`]); a `tessera
    /// run` request (`source=cli`) is bound to the peer process (see
    /// [`Core::bind_run`]) and may name its GPUs by index or UUID prefix.
    pub fn create_for(&self, req: wire::Create, peer: Peer) -> Result<pb::Allocation, AllocError> {
        let owner_uid = peer.uid.filter(|&u| u != 0);
        let req = self.bind_run(req, peer)?;
        // Named once: a retry below asks for the same allocation.
        let id = req.id.clone().unwrap_or_else(alloc::generate_id);
        let rec = req.into_record(id, self.config.default_policy, now_unix_ms());
        // A run that has just ended is deleted by the reaper, not by itself
        // (it exec'd its command): a loop of runs asking for the whole GPU
        // would find the last one's allocation still there. So a refusal for
        // capacity is tried once more, after deleting the runs that are gone
        // or, when none is yet (its command's slot is the reaper's to free),
        // after two reaper passes. The retry is unconditional: the reaper may
        // have deleted the last run's allocation since the first attempt.
        // A run whose command has ended keeps its allocation while the driver
        // still holds what the command held at exit (the reaper returns a dead
        // process's quota only once NVML no longer lists it): so while such a
        // run is pending, the refusal is tried again, up to RUN_RETRY.
        let t0 = std::time::Instant::now();
        let mut retried = false;
        loop {
            match self.create_bound(&rec, owner_uid) {
                Err(AllocError::Exhausted(_))
                    if !retried || (t0.elapsed() < RUN_RETRY && self.ended_runs_pending()) =>
                {
                    retried = true;
                    if self.collect_gone_runs() == 0 && self.holds_runs() {
                        self.wait_reaper_passes(2);
                    }
                }
                r => return r,
            }
        }
    }

    /// Whether an allocation of a `tessera run` whose command has ended is
    /// still held (its processes' memory not yet released by the driver).
    fn ended_runs_pending(&self) -> bool {
        let own_ns = self.resolver.own_pidns();
        let fs = crate::procfs::ProcFs::host();
        self.live_list().iter().any(|live| {
            let rec = live.record();
            labels::RunOwner::from_labels(&rec.labels).is_some_and(|run| {
                own_ns != 0 && run.pidns == own_ns && !Self::runner_alive(&fs, &run)
            })
        })
    }

    /// Whether the process a `tessera run` exec'd still runs.
    fn runner_alive(fs: &crate::procfs::ProcFs, run: &labels::RunOwner) -> bool {
        fs.entry(run.pid).is_some_and(|e| {
            e.start_time == run.start_time && (!e.zombie || fs.has_live_thread(run.pid))
        })
    }

    /// Deletes the allocations of `tessera run`s whose runner is gone and
    /// that hold no process (see the reaper); how many it deleted.
    pub(crate) fn collect_gone_runs(&self) -> usize {
        let own_ns = self.resolver.own_pidns();
        let fs = crate::procfs::ProcFs::host();
        let mut gone = 0;
        for live in self.live_list() {
            if !live
                .state()
                .processes(live.control().n_devices())
                .is_empty()
            {
                continue;
            }
            let rec = live.record();
            let Some(run) = labels::RunOwner::from_labels(&rec.labels) else {
                continue;
            };
            if own_ns == 0 || run.pidns != own_ns {
                continue;
            }
            if Self::runner_alive(&fs, &run)
                || !live
                    .state()
                    .processes(live.control().n_devices())
                    .is_empty()
            {
                continue;
            }
            match self.delete(&rec.id) {
                Ok(()) => {
                    gone += 1;
                    tracing::info!(
                        allocation = %rec.id,
                        pid = run.pid,
                        "deleted the allocation of a `tessera run` that ended"
                    );
                }
                Err(AllocError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(allocation = %rec.id, error = %e, "cannot delete orphaned allocation")
                }
            }
        }
        gone
    }

    /// Whether an allocation of a `tessera run` the reaper may delete is held.
    fn holds_runs(&self) -> bool {
        self.live_list()
            .iter()
            .any(|l| labels::RunOwner::from_labels(&l.record().labels).is_some())
    }

    /// Waits until `n` reaper passes have completed after this call (false
    /// if they do not within five seconds: no reaper runs, or the node is
    /// too loaded for it to matter).
    fn wait_reaper_passes(&self, n: u64) -> bool {
        let start = self.passes.reaper();
        let t0 = std::time::Instant::now();
        while self.passes.reaper() < start + n + 1 {
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    /// [`Core::create_for`] once its request is bound.
    fn create_bound(
        &self,
        rec: &AllocationRecord,
        owner_uid: Option<u32>,
    ) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        alloc::validate(rec, &self.gpus)?;
        if let Some(existing) = self.allocation(&rec.id) {
            if existing.record().same_request(rec) {
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
        alloc::check_capacity(rec, &self.gpus, existing.iter())?;
        let spec = self.control_spec(rec);
        self.store.create_owned(rec, &spec, owner_uid)?;
        let dir = self.store.alloc_dir(&rec.id);
        let live = match LiveAllocation::open(rec.clone(), dir) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                let _ = self.store.remove(&rec.id);
                return Err(e);
            }
        };
        self.allocs.write().insert(rec.id.clone(), live.clone());
        self.arbitration.add(&rec.id, live.clone());
        tracing::info!(
            id = %rec.id,
            devices = rec.devices.len(),
            policy = rec.policy.name(),
            "allocation created"
        );
        self.notify();
        Ok(self.allocation_pb(&live))
    }

    /// A `tessera run` request as the manager records it: its GPU names
    /// resolved to UUIDs (an index or a unique UUID prefix, so the run needs
    /// no status call first), and its `cli-*` labels replaced by the
    /// kernel's word: the peer's pid (SO_PEERCRED, in our pid namespace)
    /// and that process's start time from `/proc`, read while it waits for
    /// this answer (so the pid cannot have been reused). What the request
    /// said about its owner is never used: a tenant could name another
    /// process. With no peer pid the labels go and the run is not tracked
    /// (the run then deletes the allocation itself). Other requests pass
    /// unchanged.
    pub fn bind_run(&self, mut req: wire::Create, peer: Peer) -> Result<wire::Create, AllocError> {
        if req.labels.get(labels::SOURCE).map(String::as_str) != Some(labels::SOURCE_CLI) {
            return Ok(req);
        }
        let names: Vec<(u32, &str)> = self
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_str()))
            .collect();
        for (i, d) in req.devices.iter_mut().enumerate() {
            match tessera_contract::uuid::resolve_gpu_name(&names, &d.gpu_uuid) {
                Ok(k) => d.gpu_uuid = self.gpus[k].uuid.clone(),
                // An unknown name is refused by normalize with the others.
                Err(tessera_contract::uuid::GpuNameError::NotFound { .. }) => {}
                Err(e) => return Err(AllocError::Invalid(format!("device {i}: {e}"))),
            }
        }
        for k in [
            labels::CLI_PID,
            labels::CLI_PIDNS,
            labels::CLI_START,
            labels::CLI_TRACKED,
        ] {
            req.labels.remove(k);
        }
        let own_ns = self.resolver.own_pidns();
        let runner = peer
            .pid
            .filter(|&p| p != 0 && own_ns != 0)
            .and_then(|p| crate::procfs::ProcFs::host().entry(p))
            .filter(|e| !e.zombie);
        if let Some(e) = runner {
            let owner = labels::RunOwner {
                pid: e.host_pid,
                pidns: own_ns,
                start_time: e.start_time,
            };
            req.labels.extend(owner.labels());
            req.labels.insert(labels::CLI_TRACKED.into(), "true".into());
        }
        Ok(req)
    }

    /// DeleteAllocation.
    pub fn delete(&self, id: &str) -> Result<(), AllocError> {
        let _w = self.writes.lock();
        let Some(live) = self.allocation(id) else {
            return Err(AllocError::NotFound(format!(
                "no allocation {}",
                alloc::clip(id)
            )));
        };
        // The rename on disk decides: if it fails, the allocation stays
        // served, in arbitration and on disk, as if never asked.
        let doomed = self.store.retire(id)?;
        self.allocs.write().remove(id);
        self.arbitration.remove(id);
        self.recovered.lock().remove(id);
        let procs = live.state().processes(live.control().n_devices()).len();
        drop(live);
        match doomed.map(|d| self.store.purge(&d)) {
            Some(Err(e)) => {
                tracing::warn!(id, error = %e, "deleted allocation's files not removed; start-up removes them")
            }
            Some(Ok(())) => {}
            None => tracing::warn!(id, "the allocation's directory was already gone"),
        }
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
    pub fn set_owner(&self, req: wire::Owner) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        let live = self.allocation(&req.id).ok_or_else(|| {
            AllocError::NotFound(format!("no allocation {}", alloc::clip(&req.id)))
        })?;
        alloc::check_owner(&req.namespace, &req.pod, &req.container)?;
        let mut rec = live.record();
        if let Some(p) = req.policy {
            if !alloc::is_stricter_or_same(rec.policy, p) {
                return Err(AllocError::Precondition(format!(
                    "allocation {} is {}; a policy may only become stricter, not {}",
                    rec.id,
                    rec.policy.name(),
                    p.name()
                )));
            }
            rec.policy = p;
        }
        rec.namespace = req.namespace;
        rec.pod = req.pod;
        rec.container = req.container;
        self.store.save(&rec)?;
        for i in 0..live.control().n_devices() {
            live.control().set_policy(i, rec.policy)?;
        }
        live.set_record(rec);
        self.notify();
        Ok(self.allocation_pb(&live))
    }

    /// ResizeAllocation: new memory limits and compute shares for some of
    /// an allocation's GPUs, while its processes run. Checked as a create
    /// would be (limits within the GPU, shares in 1..=100%, the GPU's
    /// capacity beside every other allocation). A memory limit below what
    /// the allocation holds on that GPU is refused with the figure: the
    /// lowered limit is stored first and the holding read after (twice, 1 ms
    /// apart), so a reservation racing the resize fits the new limit or
    /// makes the resize fail (the old limit is put back), unless it read
    /// the old limit and stalls for longer than that before landing.
    pub fn resize(&self, req: wire::Resize) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        let live = self.allocation(&req.id).ok_or_else(|| {
            AllocError::NotFound(format!("no allocation {}", alloc::clip(&req.id)))
        })?;
        let old = live.record();
        if req.devices.is_empty() && req.priority.is_none() {
            return Err(AllocError::Invalid(
                "nothing to resize: name at least one GPU of the allocation, or a priority".into(),
            ));
        }
        if let Some(p) = req.priority
            && !(PRIORITY_MIN..=PRIORITY_MAX).contains(&p)
        {
            return Err(AllocError::Invalid(format!(
                "priority {p} is not in {PRIORITY_MIN}..={PRIORITY_MAX}"
            )));
        }
        let mut rec = old.clone();
        for (i, d) in req.devices.iter().enumerate() {
            let Some(k) = rec.devices.iter().position(|o| o.gpu_uuid == d.gpu_uuid) else {
                return Err(AllocError::Invalid(format!(
                    "device {i}: allocation {} has no GPU {}",
                    rec.id,
                    alloc::clip(&d.gpu_uuid)
                )));
            };
            if req.devices[..i].iter().any(|o| o.gpu_uuid == d.gpu_uuid) {
                return Err(AllocError::Invalid(format!(
                    "device {i}: GPU {} listed twice",
                    d.gpu_uuid
                )));
            }
            if let Some(m) = d.memory_limit_bytes {
                rec.devices[k].memory_limit_bytes = m;
            }
            if let Some(c) = d.compute_share_ppm {
                rec.devices[k].compute_share_ppm = c;
            }
        }
        if rec.devices == old.devices {
            if let Some(p) = req.priority
                && p != live.control().priority()
            {
                live.control().set_priority(p)?;
                tracing::info!(id = %rec.id, priority = p, "allocation priority changed");
                self.notify();
            }
            return Ok(self.allocation_pb(&live));
        }
        // The same checks as a create of the resized allocation, on the
        // record as it is.
        alloc::validate(&rec, &self.gpus)?;
        let others: Vec<AllocationRecord> = self
            .live_list()
            .iter()
            .map(|l| l.record())
            .filter(|r| r.id != rec.id)
            .collect();
        alloc::check_capacity(&rec, &self.gpus, others.iter())?;

        let control = live.control();
        let put_back = |upto: usize| {
            for k in 0..upto {
                let _ = control.set_memory_limit(k, old.devices[k].memory_limit_bytes);
            }
        };
        // Lowered limits first, each checked against what is held after it
        // is in force.
        for (k, d) in rec.devices.iter().enumerate() {
            if d.memory_limit_bytes >= old.devices[k].memory_limit_bytes {
                continue;
            }
            control.set_memory_limit(k, d.memory_limit_bytes)?;
            // A reservation that read the old limit just before the store
            // can still land; read again after a moment to catch those.
            let mut held = live.state().reserved(k);
            if held <= d.memory_limit_bytes {
                std::thread::sleep(std::time::Duration::from_millis(1));
                held = live.state().reserved(k);
            }
            if held > d.memory_limit_bytes {
                put_back(k + 1);
                return Err(AllocError::Precondition(format!(
                    "allocation {} holds {} ({held} bytes) on GPU {} (its device {k}); its \
                     memory limit cannot go below that ({} asked): free memory first",
                    rec.id,
                    tessera_contract::units::format_bytes(held),
                    d.gpu_uuid,
                    tessera_contract::units::format_bytes(d.memory_limit_bytes)
                )));
            }
        }
        if let Err(e) = self.store.save(&rec) {
            put_back(rec.devices.len());
            return Err(e);
        }
        let mut crossed = false;
        for (k, d) in rec.devices.iter().enumerate() {
            control.set_memory_limit(k, d.memory_limit_bytes)?;
            control.set_compute_share(k, d.compute_share_ppm)?;
            crossed |= (d.compute_share_ppm >= FULL_COMPUTE_PPM)
                != (old.devices[k].compute_share_ppm >= FULL_COMPUTE_PPM);
        }
        live.set_record(rec.clone());
        if let Some(p) = req.priority {
            control.set_priority(p)?;
        }
        // The arbiter follows share changes through the control file; a GPU
        // that gains or loses its whole share enters or leaves arbitration.
        if crossed {
            self.arbitration.remove(&rec.id);
            self.arbitration.add(&rec.id, live.clone());
        }
        tracing::info!(id = %rec.id, "allocation resized");
        self.notify();
        Ok(self.allocation_pb(&live))
    }

    /// PauseAllocation (`pause` true) or ResumeAllocation: the pause word in
    /// the control file, which the shim blocks on and the arbiter reads
    /// (no grants while paused). Repeating either changes nothing.
    pub fn set_paused(&self, id: &str, pause: bool) -> Result<pb::Allocation, AllocError> {
        let _w = self.writes.lock();
        let live = self
            .allocation(id)
            .ok_or_else(|| AllocError::NotFound(format!("no allocation {}", alloc::clip(id))))?;
        let now = tessera_shm::sys::monotonic_ns();
        let changed = if pause {
            live.control().pause(now)?
        } else {
            live.control().resume(now)?
        };
        if changed {
            tracing::info!(
                id,
                "allocation {}",
                if pause { "paused" } else { "resumed" }
            );
            self.notify();
        }
        Ok(self.allocation_pb(&live))
    }

    /// Loads every allocation on disk (manager restart).
    pub(crate) fn reload(&self) -> Result<(), ManagerError> {
        let loaded = self.store.load_all()?;
        for q in loaded.broken {
            tracing::error!(
                from = %q.from.display(),
                kept_at = %q.to.display(),
                reason = %q.reason,
                "allocation directory unreadable and nothing to rebuild it from; moved aside"
            );
        }
        for (id, how, source) in &loaded.recovered {
            tracing::error!(allocation = %id, %how, "allocation record damaged; recovered");
            self.recovered
                .lock()
                .entry(id.clone())
                .or_default()
                .add("record", format!("record recovered from {source}"));
        }
        for rec in loaded.records {
            let id = rec.id.clone();
            for d in &rec.devices {
                if !self.gpus.iter().any(|g| g.uuid == d.gpu_uuid) {
                    tracing::warn!(allocation = %id, gpu = %d.gpu_uuid, "allocation names a GPU not on this node");
                }
            }
            let dir = self.store.alloc_dir(&id);
            let opened = LiveAllocation::open(rec.clone(), dir.clone()).or_else(|first| {
                // Damaged files (a tenant can write its state file): repaired
                // in place from the record, so the allocation keeps its
                // capacity and its place in arbitration.
                let spec = self.control_spec(&rec);
                let repaired = self.store.repair(&rec, &spec)?;
                tracing::error!(
                    allocation = %id,
                    error = %first,
                    repaired = %repaired.join(", "),
                    "allocation files damaged; repaired in place"
                );
                {
                    let mut recovered = self.recovered.lock();
                    let r = recovered.entry(id.clone()).or_default();
                    for what in repaired {
                        // The store names each file first ("control ...", "state ...").
                        let part = if what.starts_with("control") {
                            "control"
                        } else {
                            "state"
                        };
                        r.add(part, what);
                    }
                }
                LiveAllocation::open(rec.clone(), dir.clone())
            });
            match opened.map(Arc::new) {
                Ok(live) => {
                    // Files written by an earlier manager (or release) get this
                    // start's measurements, in place: their processes charge
                    // them from their next context on.
                    let control = live.control();
                    for i in 0..control.n_devices() {
                        if let Some(&bytes) = self.context_sizes.get(control.uuid(i))
                            && let Err(e) = control.set_context_bytes(i, Some(bytes))
                        {
                            tracing::warn!(allocation = %id, error = %e, "cannot record the context size");
                        }
                    }
                    let procs = live.state().processes(live.control().n_devices()).len();
                    tracing::info!(allocation = %id, processes = procs, "allocation reloaded");
                    self.arbitration.add(&id, live.clone());
                    self.allocs.write().insert(id, live);
                }
                Err(e) => {
                    // Serving it is impossible, forgetting it would re-sell
                    // capacity a live process may hold: refuse to start.
                    return Err(ManagerError::Alloc(AllocError::Io {
                        path: dir.clone(),
                        error: std::io::Error::other(format!(
                            "allocation {id} cannot be served or repaired ({e}); fix or delete \
                             the directory, then start again"
                        )),
                    }));
                }
            }
        }
        Ok(())
    }
}
