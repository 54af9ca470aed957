//! Compute-time slices, manager side: per GPU, a thread that grants the GPU
//! to one allocation at a time for a quantum and charges each what it really
//! held. See `docs/compute-slices.md`.
//!
//! - [`sched`]: the decision, pure logic over a clock it is given.
//! - [`driver`](self): the per-GPU thread that runs it over the allocations'
//!   shared-memory files (grant words, waiters, launch counters, drains).
//!
//! [`Arbiter`] is the API: the manager adds an allocation's devices when it
//! creates (or, after a restart, reloads) the allocation and removes them
//! when it deletes it. It also runs in-process for tests and the bench.

mod driver;
pub mod sched;

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tessera_contract::units::FULL_COMPUTE_PPM;

use tessera_shm::sys::{Linux, Sys};
use tessera_shm::{Control, Policy, ShmError, State};

use driver::{Cmd, Driver, Shared, lock};
use sched::SchedConfig;

/// What can go wrong when configuring or feeding the arbiter.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    #[error("invalid arbiter configuration: {0}")]
    Config(String),
    #[error("{path}: {source}")]
    Files {
        path: String,
        #[source]
        source: ShmError,
    },
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error("allocation {alloc_id:?} has no device {dev} (it has {n})")]
    NoDevice {
        alloc_id: String,
        dev: usize,
        n: usize,
    },
    #[error("allocation {alloc_id:?} device {dev} is already arbitrated")]
    AlreadyAdded { alloc_id: String, dev: usize },
    #[error("allocation {0:?} is not arbitrated")]
    NotFound(String),
    #[error("the arbiter is shut down")]
    ShutDown,
    #[error("cannot start the arbiter thread for {gpu}: {source}")]
    Thread {
        gpu: String,
        #[source]
        source: std::io::Error,
    },
}

/// How the arbiter slices time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArbiterConfig {
    /// One grant's length. 10 ms: a hand-over (drain report, wake-up of the
    /// next holder) costs about 0.1 ms, i.e. 1% of a 10 ms quantum; a
    /// waiting allocation waits at most a few quanta; and a 20 ms kernel,
    /// which cannot be preempted, overruns it by one kernel, which is
    /// charged. See `docs/compute-slices.md`.
    pub quantum: Duration,
    /// A holder that launched nothing for this long gives the GPU back.
    pub idle_release: Duration,
    /// The same while another allocation waits for the GPU (at most
    /// `idle_release`): the holder's idle time is then the waiter's loss.
    /// See `SchedConfig::contested_idle_release_ns`.
    pub contested_idle_release: Duration,
    /// Longest wait for a revoked grant's work to drain.
    pub drain_timeout: Duration,
    /// How far a `guaranteed` allocation kept from its share by others may
    /// catch up afterwards.
    pub catch_up: Duration,
    /// How often the arbiter looks at demand and activity while the GPU is
    /// in use (or was recently).
    pub poll: Duration,
    /// How often it looks for demand on a GPU idle for `idle_after`.
    pub idle_poll: Duration,
    pub idle_after: Duration,
    /// Window of the achieved share in [`AllocationStats`].
    pub stats_window: Duration,
    /// A holder waiting in a synchronisation on its own work is active
    /// (true, the default): it keeps its grant through a training step's
    /// `loss.item()`. False counts only launches, the rule before; the
    /// bench compares the two.
    pub sync_is_activity: bool,
    /// Grant the next holder at a revocation, while the revoked work
    /// drains (true, the default): its first kernel queues behind the
    /// revoked holder's last one instead of waiting for the drain report,
    /// the arbiter's wake-up and its own. Its charge and quantum start
    /// when that drain ends. False grants only after the drain, the rule
    /// before; the bench compares the two.
    pub prearm: bool,
    /// A program's host gaps are part of its steps (true, the default):
    /// back from one it keeps what it was behind, and its learned return
    /// cuts others' grants short so that it waits for at most one kernel.
    /// False treats every return as a newcomer's, the rule before; the
    /// bench compares the two. See `SchedConfig::host_gaps`.
    pub host_gaps: bool,
    /// How long before an allocation is expected back from a host gap it
    /// may be granted, while no one waits and the holder is away in its
    /// own gap: its processes then pass an open gate, without the
    /// arbiter's wake-up and their own. Zero grants only at the gate, the
    /// rule before. See `SchedConfig::grant_ahead_ns`.
    pub grant_ahead: Duration,
    /// A holder's time starts at its first launch of the grant, as its
    /// processes recorded it, while no other allocation waits, and never
    /// after the arbiter saw it active (true, the default): a process
    /// waking late at its gate on a busy host is not charged for it. False
    /// charges from the grant, the rule before; the bench compares the
    /// two. See `SchedConfig::late_start`.
    pub late_start: bool,
    /// A holder cut off at its quantum while its processes yield is away
    /// in its host gap, expected back and granted ahead of its return
    /// (true, the default; false: only after an idle revocation, the rule
    /// before). See `SchedConfig::cut_off_away`.
    pub cut_off_away: bool,
    /// How long before its quantum's end a holder that would be renewed
    /// anyway is renewed (at most half the quantum; zero: at the end, the
    /// rule before): its processes learn the next end before their queue
    /// reaches this one, instead of holding a launch until the renewal.
    /// A client that starts waiting in that time waits for the renewed
    /// quantum too. See `SchedConfig::renew_ahead_ns`.
    pub renew_ahead: Duration,
    /// The nice value each GPU's arbiter thread raises itself to (-20..=0;
    /// 0 leaves it as started). The thread sleeps almost all the time, but
    /// every hand-over waits for it to wake: at nice 0, beside four busy
    /// processes on two cores, about one wake-up in a hundred came 1–8 ms
    /// late, and the 1 ms host-gap burst pair fell 2.5–3.8 pp short of its
    /// targets; at -10, 1.0–1.5 (issue 36). A weight, not a real-time
    /// policy: a thread that spun by mistake would still share its CPU.
    /// Needs `CAP_SYS_NICE`; without it the thread stays as it is, with a
    /// log line.
    pub nice: i32,
}

impl Default for ArbiterConfig {
    fn default() -> Self {
        let s = SchedConfig::default();
        ArbiterConfig {
            quantum: Duration::from_nanos(s.quantum_ns),
            idle_release: Duration::from_nanos(s.idle_release_ns),
            contested_idle_release: Duration::from_nanos(s.contested_idle_release_ns),
            drain_timeout: Duration::from_nanos(s.drain_timeout_ns),
            catch_up: Duration::from_nanos(s.catch_up_ns),
            poll: Duration::from_micros(250),
            idle_poll: Duration::from_millis(2),
            idle_after: Duration::from_millis(200),
            stats_window: Duration::from_secs(10),
            sync_is_activity: s.sync_is_activity,
            prearm: s.prearm,
            host_gaps: s.host_gaps,
            grant_ahead: Duration::from_nanos(s.grant_ahead_ns),
            late_start: s.late_start,
            cut_off_away: s.cut_off_away,
            renew_ahead: Duration::from_nanos(s.renew_ahead_ns),
            nice: -10,
        }
    }
}

impl ArbiterConfig {
    /// Refuses settings the arbiter cannot work with.
    pub fn validate(&self) -> Result<(), ArbiterError> {
        let bad = |m: String| Err(ArbiterError::Config(m));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if self.quantum < Duration::from_micros(100) || self.quantum > Duration::from_secs(10) {
            return bad(format!(
                "quantum {:.3} ms is outside 0.1 ms ..= 10 s",
                ms(self.quantum)
            ));
        }
        if self.idle_release.is_zero() || self.idle_release > self.quantum {
            return bad(format!(
                "idle release {:.3} ms must be positive and at most the quantum ({:.3} ms)",
                ms(self.idle_release),
                ms(self.quantum)
            ));
        }
        if self.contested_idle_release.is_zero() || self.contested_idle_release > self.idle_release
        {
            return bad(format!(
                "contested idle release {:.3} ms must be positive and at most the idle release ({:.3} ms)",
                ms(self.contested_idle_release),
                ms(self.idle_release)
            ));
        }
        if self.drain_timeout < self.poll || self.drain_timeout > Duration::from_secs(60) {
            return bad(format!(
                "drain timeout {:.3} ms must be at least the poll period and at most 60 s",
                ms(self.drain_timeout)
            ));
        }
        if self.poll < Duration::from_micros(10) || self.poll > self.idle_release {
            return bad(format!(
                "poll period {:.3} ms must be 0.01 ms ..= the idle release",
                ms(self.poll)
            ));
        }
        if self.idle_poll < self.poll || self.idle_poll > Duration::from_millis(100) {
            return bad(format!(
                "idle poll period {:.3} ms must be between the poll period and 100 ms",
                ms(self.idle_poll)
            ));
        }
        if self.grant_ahead > self.contested_idle_release {
            return bad(format!(
                "grant ahead {:.3} ms must be at most the contested idle release ({:.3} ms)",
                ms(self.grant_ahead),
                ms(self.contested_idle_release)
            ));
        }
        if !(-20..=0).contains(&self.nice) {
            return bad(format!(
                "arbiter nice value {} is outside -20..=0 (0: the thread's own)",
                self.nice
            ));
        }
        if self.stats_window < Duration::from_millis(100) {
            return bad("stats window must be at least 100 ms".into());
        }
        Ok(())
    }

    fn sched(&self) -> SchedConfig {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        SchedConfig {
            quantum_ns: ns(self.quantum),
            idle_release_ns: ns(self.idle_release),
            contested_idle_release_ns: ns(self.contested_idle_release),
            drain_timeout_ns: ns(self.drain_timeout),
            catch_up_ns: ns(self.catch_up),
            sync_is_activity: self.sync_is_activity,
            prearm: self.prearm,
            host_gaps: self.host_gaps,
            grant_ahead_ns: ns(self.grant_ahead),
            late_start: self.late_start,
            cut_off_away: self.cut_off_away,
            renew_ahead_ns: ns(self.renew_ahead),
        }
    }
}

/// An allocation's two files, opened read-write, as the arbiter needs them.
pub trait AllocationFiles: Send + Sync + std::fmt::Debug + 'static {
    fn control(&self) -> &Control;
    fn state(&self) -> &State;
}

/// The files of an allocation, opened by path (tests, bench, tools).
#[derive(Debug)]
pub struct OpenFiles {
    control: Control,
    state: State,
}

impl OpenFiles {
    pub fn open(control: &Path, state: &Path) -> Result<Self, ArbiterError> {
        let c = Control::open_rw(control).map_err(|source| ArbiterError::Files {
            path: control.display().to_string(),
            source,
        })?;
        let s = State::open(state, c.alloc_id()).map_err(|source| ArbiterError::Files {
            path: state.display().to_string(),
            source,
        })?;
        Ok(OpenFiles {
            control: c,
            state: s,
        })
    }
}

impl AllocationFiles for OpenFiles {
    fn control(&self) -> &Control {
        &self.control
    }
    fn state(&self) -> &State {
        &self.state
    }
}

/// One allocation on one GPU, as the arbiter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationStats {
    pub alloc_id: String,
    /// Index of the device in the allocation's control file.
    pub device: usize,
    pub gpu_uuid: String,
    pub policy: Policy,
    pub target_ppm: u32,
    /// Time held over the last `stats_window` (or since added, if less).
    pub achieved_ppm: u32,
    /// Time held since added, drains included.
    pub held_ns: u64,
    /// The longest single hold since added (grant to drained): how far a
    /// measurement over a window can be off at each of its ends.
    pub longest_hold_ns: u64,
    pub grants: u64,
    /// Time its processes spent blocked at the gate (from its state file).
    pub wait_ns: u64,
    /// Grant hand-over latencies into this allocation (revocation of the
    /// previous holder → this grant), most recent last.
    pub handover_ns: Vec<u64>,
    pub drain_timeouts: u64,
}

/// One hand-over of a GPU, on CLOCK_MONOTONIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoverSpan {
    /// The allocation the GPU went to.
    pub to: std::sync::Arc<str>,
    /// When the previous holder's grant was revoked.
    pub revoked_at: u64,
    /// When the next holder's time started (its grant, or the revoked
    /// work's drain if that ended later); for one granted ahead of its
    /// return, the drain's end.
    pub over_at: u64,
    /// Whether the next holder was waiting for the GPU; false for one
    /// granted ahead, whose idle until it is back is its own host gap's.
    pub waiting: bool,
}

/// One GPU, as the arbiter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStats {
    pub gpu_uuid: String,
    pub allocations: usize,
    /// Recent hand-over latencies on this GPU, most recent last.
    pub handover_ns: Vec<u64>,
    /// The same hand-overs on the node's clock (CLOCK_MONOTONIC), most
    /// recent last: what a measurement joins with the GPU's own timeline.
    pub handovers: Vec<HandoverSpan>,
    /// Times the GPU's thread has woken to decide: its clock's polls and
    /// deadlines, commands, and doorbells (a drain's report, a yield).
    pub wakeups: u64,
}

/// The `p`-th percentile (0..=100) of `samples`, nearest rank.
pub fn percentile(samples: &[u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

struct GpuThread {
    tx: Sender<Cmd>,
    shared: Arc<Mutex<Shared>>,
    handle: Option<JoinHandle<()>>,
}

impl GpuThread {
    /// A copy of this GPU's statistics, under its lock.
    fn stats(&self, uuid: &str) -> GpuStats {
        let s = lock(&self.shared);
        GpuStats {
            gpu_uuid: uuid.to_owned(),
            allocations: s.members.len(),
            handover_ns: s.handovers.iter().copied().collect(),
            handovers: s.handover_spans.iter().cloned().collect(),
            wakeups: s.wakeups.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// The compute arbiter: one thread per GPU, started with its first
/// allocation.
pub struct Arbiter {
    cfg: ArbiterConfig,
    /// The clock and futex of every GPU thread and of the statistics.
    sys: Arc<dyn Sys>,
    gpus: Mutex<Option<HashMap<String, GpuThread>>>,
}

impl std::fmt::Debug for Arbiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arbiter").field("cfg", &self.cfg).finish()
    }
}

impl Arbiter {
    pub fn new(cfg: ArbiterConfig) -> Result<Self, ArbiterError> {
        Self::with_sys(cfg, Arc::new(Linux))
    }

    /// [`Arbiter::new`] over the system calls `sys` (a test's clock).
    pub fn with_sys(cfg: ArbiterConfig, sys: Arc<dyn Sys>) -> Result<Self, ArbiterError> {
        cfg.validate()?;
        Ok(Arbiter {
            cfg,
            sys,
            gpus: Mutex::new(Some(HashMap::new())),
        })
    }

    pub fn config(&self) -> ArbiterConfig {
        self.cfg
    }

    /// Starts arbitrating device `dev` of an allocation on its GPU. A whole
    /// GPU (share 100%) needs no arbitration: its gate is left open.
    pub fn add_allocation(
        &self,
        files: Arc<dyn AllocationFiles>,
        dev: usize,
    ) -> Result<(), ArbiterError> {
        let control = files.control();
        let n = control.n_devices();
        if dev >= n {
            return Err(ArbiterError::NoDevice {
                alloc_id: control.alloc_id().to_owned(),
                dev,
                n,
            });
        }
        if control.compute_share_ppm(dev) >= FULL_COMPUTE_PPM {
            if !tessera_shm::layout::grant::may_submit(control.grant_word(dev)) {
                control.publish_grant(dev, tessera_shm::layout::grant::OPEN)?;
            }
            control.beat(self.sys.monotonic_ns())?;
            return Ok(());
        }
        let uuid = control.uuid(dev).to_owned();
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let mut gpus = lock(&self.gpus);
            let gpus = gpus.as_mut().ok_or(ArbiterError::ShutDown)?;
            if !gpus.contains_key(&uuid) {
                gpus.insert(uuid.clone(), self.spawn(&uuid)?);
            }
            let t = &gpus[&uuid];
            t.tx.send(Cmd::Add { files, dev, reply })
                .map_err(|_| ArbiterError::ShutDown)?;
        }
        answer.recv().map_err(|_| ArbiterError::ShutDown)?
    }

    fn spawn(&self, uuid: &str) -> Result<GpuThread, ArbiterError> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let driver = Driver::new(self.cfg, Arc::clone(&shared), Arc::clone(&self.sys));
        let short: String = uuid.chars().skip(4).take(8).collect();
        let handle = std::thread::Builder::new()
            .name(format!("arbiter-{short}"))
            .spawn(move || driver.run(rx))
            .map_err(|source| ArbiterError::Thread {
                gpu: uuid.to_owned(),
                source,
            })?;
        Ok(GpuThread {
            tx,
            shared,
            handle: Some(handle),
        })
    }

    /// Stops arbitrating every device of an allocation; its gates are left
    /// open. When this returns, the arbiter no longer touches its files.
    pub fn remove_allocation(&self, alloc_id: &str) -> Result<(), ArbiterError> {
        let mut answers = Vec::new();
        {
            let gpus = lock(&self.gpus);
            let gpus = gpus.as_ref().ok_or(ArbiterError::ShutDown)?;
            for t in gpus.values() {
                let (reply, answer) = mpsc::sync_channel(1);
                if t.tx
                    .send(Cmd::Remove {
                        alloc_id: alloc_id.to_owned(),
                        reply,
                    })
                    .is_ok()
                {
                    answers.push(answer);
                }
            }
        }
        let mut found = false;
        for a in answers {
            found |= a.recv().unwrap_or(false);
        }
        if found {
            Ok(())
        } else {
            Err(ArbiterError::NotFound(alloc_id.to_owned()))
        }
    }

    /// Per allocation and GPU: target and achieved share, waits, hand-overs.
    pub fn stats(&self) -> Vec<AllocationStats> {
        let now = self.sys.monotonic_ns();
        let window = u64::try_from(self.cfg.stats_window.as_nanos()).unwrap_or(u64::MAX);
        let gpus = lock(&self.gpus);
        let Some(gpus) = gpus.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (uuid, t) in gpus {
            let shared = lock(&t.shared);
            for (&id, m) in &shared.members {
                let from = now.saturating_sub(window).max(m.added_at);
                let span = now.saturating_sub(from).max(1);
                let mut held: u64 = m
                    .charges
                    .iter()
                    .map(|&(s, e)| e.min(now).saturating_sub(s.max(from)))
                    .sum();
                if let Some((h, since)) = shared.holding
                    && h == id
                {
                    held += now.saturating_sub(since.max(from));
                }
                let achieved = (u128::from(held.min(span)) * u128::from(FULL_COMPUTE_PPM)
                    / u128::from(span)) as u32;
                out.push(AllocationStats {
                    alloc_id: m.alloc_id.clone(),
                    device: m.dev,
                    gpu_uuid: uuid.clone(),
                    policy: m.policy,
                    target_ppm: m.target_ppm,
                    achieved_ppm: achieved,
                    held_ns: m.held_ns,
                    longest_hold_ns: m.longest_hold_ns,
                    grants: m.grants,
                    wait_ns: m.files.state().gate_wait_ns(m.dev),
                    handover_ns: m.handovers.iter().copied().collect(),
                    drain_timeouts: m.drain_timeouts,
                });
            }
        }
        out.sort_by(|a, b| (&a.gpu_uuid, &a.alloc_id).cmp(&(&b.gpu_uuid, &b.alloc_id)));
        out
    }

    /// Per GPU: hand-over latencies and how many allocations share it.
    pub fn gpu_stats(&self) -> Vec<GpuStats> {
        let gpus = lock(&self.gpus);
        let Some(gpus) = gpus.as_ref() else {
            return Vec::new();
        };
        let mut out: Vec<GpuStats> = gpus.iter().map(|(uuid, t)| t.stats(uuid)).collect();
        out.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
        out
    }

    /// One GPU's [`GpuStats`], or `None` when the arbiter governs no GPU
    /// of that UUID. It copies that GPU's records only: a reader polling
    /// one GPU does not copy every other's under their locks.
    pub fn gpu_stats_of(&self, uuid: &str) -> Option<GpuStats> {
        let gpus = lock(&self.gpus);
        gpus.as_ref()?.get(uuid).map(|t| t.stats(uuid))
    }

    /// Stops every GPU thread and opens every gate it governed. Idempotent.
    pub fn shutdown(&self) {
        let Some(gpus) = lock(&self.gpus).take() else {
            return;
        };
        for (_, mut t) in gpus {
            let _ = t.tx.send(Cmd::Shutdown);
            if let Some(h) = t.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Arbiter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What the manager needs from the compute arbiter: it says which
/// allocations exist (as their files, [`AllocationFiles`]) and asks what
/// share each achieved. The arbiter owns this seam; the manager's types
/// reach it only through the traits.
pub trait Arbitration: Send + Sync + 'static {
    /// Starts arbitrating allocation `id` (on each of its GPUs).
    fn add(&self, id: &str, files: Arc<dyn AllocationFiles>);
    /// Stops arbitrating an allocation that is being deleted.
    fn remove(&self, id: &str);
    /// Share of `gpu_uuid`'s time the allocation held over the recent
    /// window, in ppm; `None` when no arbiter measures it.
    fn achieved_ppm(&self, id: &str, gpu_uuid: &str) -> Option<u32>;
    /// [`Self::achieved_ppm`] of every arbitrated (allocation id, GPU UUID)
    /// at once: a status or a scrape asks once, however many allocations
    /// there are. The default asks nothing and knows nothing.
    fn achieved_all(&self) -> HashMap<(String, String), u32> {
        HashMap::new()
    }
    /// Stops every arbiter thread (manager shutdown).
    fn shutdown(&self) {}
}

/// No arbitration: allocations with a whole GPU need none (their grant is
/// created open); others run free once their gate times out.
#[derive(Debug, Default)]
pub struct NoArbiter;

impl Arbitration for NoArbiter {
    fn add(&self, _id: &str, _files: Arc<dyn AllocationFiles>) {}
    fn remove(&self, _id: &str) {}
    fn achieved_ppm(&self, _id: &str, _gpu_uuid: &str) -> Option<u32> {
        None
    }
}

/// The manager's seam: every device of an allocation is arbitrated on its
/// GPU; failures are logged (the allocation's gates then open after their
/// timeout rather than stall).
impl Arbitration for Arbiter {
    fn add(&self, id: &str, files: Arc<dyn AllocationFiles>) {
        for dev in 0..files.control().n_devices() {
            if let Err(e) = self.add_allocation(Arc::clone(&files), dev) {
                tracing::error!(alloc = %id, dev, "cannot arbitrate: {e}");
            }
        }
    }
    fn remove(&self, id: &str) {
        match self.remove_allocation(id) {
            Ok(()) | Err(ArbiterError::NotFound(_)) => {}
            Err(e) => tracing::warn!(alloc = %id, "arbiter: {e}"),
        }
    }
    fn achieved_ppm(&self, id: &str, gpu_uuid: &str) -> Option<u32> {
        self.stats()
            .into_iter()
            .find(|s| s.alloc_id == id && s.gpu_uuid == gpu_uuid)
            .map(|s| s.achieved_ppm)
    }
    fn achieved_all(&self) -> HashMap<(String, String), u32> {
        self.stats()
            .into_iter()
            .map(|s| ((s.alloc_id, s.gpu_uuid), s.achieved_ppm))
            .collect()
    }
    fn shutdown(&self) {
        Arbiter::shutdown(self);
    }
}

/// The files of a test allocation with one device on `uuid`, in `dir`.
#[cfg(test)]
fn test_files(
    dir: &Path,
    id: &str,
    uuid: &str,
    share_ppm: u32,
    policy: Policy,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let spec = tessera_shm::ControlSpec::new(
        id,
        vec![tessera_shm::DeviceSpec {
            uuid: uuid.into(),
            memory_limit_bytes: 1 << 30,
            compute_share_ppm: share_ppm,
            policy,
        }],
    );
    tessera_shm::create_allocation_files(dir, &spec).unwrap()
}

#[cfg(test)]
mod tests;
