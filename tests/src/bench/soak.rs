//! `tessera-bench soak`: a node driven for minutes by a seeded random mix of what happens
//! to a node in production — allocations created and deleted, processes launched that
//! allocate and free, processes SIGKILLed, the manager restarted (SIGTERM or SIGKILL), the
//! device plugin restarted, a tenant's state file corrupted — with the node's promises
//! checked after every step:
//!
//! - no allocation lost or invented: the manager serves exactly the allocations created
//!   and not deleted, across restarts and corruption;
//! - no capacity double-sold: per GPU, the limits and shares the manager has handed out
//!   fit the GPU;
//! - no device above any limit: what the driver (the simulator's ground truth) holds for
//!   the live processes of an allocation is within its limit;
//! - no memory held by a dead process after the reclaim deadline: a SIGKILLed process's
//!   slot is gone from its allocation's state file within [`RECLAIM_DEADLINE`] (the
//!   manager's reaper, or a process that needed the quota), unless the file is damaged;
//! - the kubelet's side recovers: the device plugin (the real one, in-process, talking to
//!   the manager and to a fake kubelet) is registered and the kubelet holds its full device
//!   list after every step, and a restarted plugin registers again within a minute.
//!
//! The manager runs as a child process: this very binary with `__manager` (the manager's
//! library, as `tessera manager` runs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_device_plugin::testing::FakeKubelet;
use tessera_proto::manager::v1 as pb;

use super::Table;
use super::race::Rng;
use crate::probe::{Mode, ProbeChild};
use crate::sim::SimNode;

/// How long a SIGKILLed process's quota may stay in its state file.
pub const RECLAIM_DEADLINE: Duration = Duration::from_secs(5);
/// The longest any single answer may take (a probe command, the manager's start).
const ANSWER: Duration = Duration::from_secs(60);
const MI: u64 = 1 << 20;
const GPUS: u32 = 2;
const MAX_PROCS: usize = 24;
const MAX_ALLOCS: usize = 12;
/// Steps a soak takes at least, whatever its length: many times what it takes the rarest
/// action of the mix (2 in 92) to come up.
pub const MIN_STEPS: u64 = 200;
/// How long past its length a soak may go on to take [`MIN_STEPS`] and every action of the
/// mix: a hang guard for a loaded box, where a step takes many times its usual time.
pub const COVERAGE_LIMIT: Duration = Duration::from_secs(30 * 60);

/// What a soak did and found.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub seed: u64,
    pub elapsed: Duration,
    pub steps: u64,
    /// Steps per action.
    pub actions: BTreeMap<&'static str, u64>,
    /// SIGKILLs, manager restarts and corruptions.
    pub faults: u64,
    /// Invariants evaluated.
    pub checks: u64,
    /// What broke, with the step and the action before it.
    pub violations: Vec<String>,
}

impl SoakReport {
    pub fn table(&self) -> Table {
        let mut rows = vec![
            vec!["seed".into(), self.seed.to_string()],
            vec![
                "minutes".into(),
                format!("{:.1}", self.elapsed.as_secs_f64() / 60.0),
            ],
            vec!["steps".into(), self.steps.to_string()],
            vec!["faults injected".into(), self.faults.to_string()],
            vec!["invariant checks".into(), self.checks.to_string()],
            vec!["violations".into(), self.violations.len().to_string()],
        ];
        for (a, n) in &self.actions {
            rows.push(vec![format!("  {a}"), n.to_string()]);
        }
        Table {
            title: "soak: a seeded random mix of node events, invariants checked after every step"
                .into(),
            columns: vec!["figure".into(), "value".into()],
            rows,
            notes: self.violations.iter().take(20).cloned().collect(),
        }
    }
}

/// The manager's flags for the soak's node.
fn manager_args(dir: &Path) -> Vec<String> {
    let hook = crate::hook_library().unwrap_or_default();
    [
        "--state-dir",
        &dir.display().to_string(),
        "--socket",
        &dir.join("manager.sock").display().to_string(),
        "--nvml-library",
        &crate::sim_nvml_library().display().to_string(),
        "--hook-library",
        &hook.display().to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--hostname",
        "soak",
        "--sample-interval",
        "100ms",
        "--reap-interval",
        "50ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The manager in a child process (also the DRA bench's).
pub(crate) struct Manager {
    child: Child,
    dir: PathBuf,
}

impl Manager {
    pub(crate) fn start(node: &SimNode, dir: &Path) -> Result<Manager, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.with_extension("log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .arg("__manager")
            .args(manager_args(dir))
            .envs(node.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the manager: {e}"))?;
        let mut m = Manager {
            child,
            dir: dir.to_owned(),
        };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = m.child.try_wait() {
                return Err(format!(
                    "the manager exited ({status}) before serving; see {}.log",
                    dir.display()
                ));
            }
            if std::os::unix::net::UnixStream::connect(m.socket()).is_ok() && m.status().is_ok() {
                return Ok(m);
            }
            if t0.elapsed() > ANSWER {
                return Err("the manager did not serve within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("manager.sock")
    }

    fn call<T>(
        &self,
        f: impl AsyncFnOnce(
            &mut pb::manager_client::ManagerClient<tonic::transport::Channel>,
        ) -> Result<T, String>,
    ) -> Result<T, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let socket = self.socket();
        rt.block_on(async {
            let mut c = tessera_client::connect(&socket)
                .await
                .map_err(|e| e.to_string())?;
            f(&mut c).await
        })
    }

    pub(crate) fn status(&self) -> Result<pb::NodeStatus, String> {
        self.call(async |c| {
            c.get_node_status(pb::NodeStatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.to_string())
        })
    }

    /// SIGTERM (and a clean exit) or SIGKILL.
    fn stop(mut self, kill: bool) -> Result<(), String> {
        if kill {
            let _ = self.child.kill();
            let _ = self.child.wait();
            return Ok(());
        }
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("the manager exited with {status} on SIGTERM"))
                };
            }
            if t0.elapsed() > ANSWER {
                let _ = self.child.kill();
                return Err("the manager ignored SIGTERM for 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Alloc {
    gpu: u32,
    limit: u64,
    control: String,
    state: String,
    /// Its state file's header was overwritten (until the manager repairs it at start).
    corrupted: bool,
}

struct Proc {
    child: ProbeChild,
    alloc: String,
    handles: Vec<u32>,
}

/// The device plugin of the chart's DaemonSet, in-process, with the kubelet it registers
/// with.
struct Plugin {
    rt: tokio::runtime::Runtime,
    kubelet: FakeKubelet,
    opts: tessera_device_plugin::Options,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tessera_device_plugin::Error>>>,
    /// Registrations the kubelet should have seen: one per start.
    starts: usize,
    /// The device list's length once the first plugin listed the GPUs.
    devices: usize,
}

impl Plugin {
    fn start(node: &SimNode, manager_socket: &Path) -> Result<Plugin, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let dp_dir = node.dir.path().join("dp");
        std::fs::create_dir_all(&dp_dir).map_err(|e| e.to_string())?;
        let kubelet = {
            let _in_rt = rt.enter();
            FakeKubelet::start(&dp_dir).map_err(|e| format!("the kubelet: {e}"))?
        };
        let config = node.dir.path().join("slices.yaml");
        std::fs::write(&config, "default:\n  slice: {memory: 2Gi}\n").map_err(|e| e.to_string())?;
        let mut opts = tessera_device_plugin::Options::new("soak-node");
        opts.device_plugin_dir = dp_dir;
        opts.manager_socket = manager_socket.to_owned();
        opts.pod_resources_socket = None;
        opts.config_path = Some(config);
        opts.kubelet_poll = Duration::from_millis(100);
        opts.status_interval = Duration::from_millis(500);
        opts.host.hook_library = crate::hook_library().unwrap_or_default();
        opts.host.preload_file = node.dir.path().join("ld.so.preload");
        let mut p = Plugin {
            rt,
            kubelet,
            opts,
            stop: None,
            task: None,
            starts: 0,
            devices: 0,
        };
        p.run()?;
        let listed =
            p.rt.block_on(p.kubelet.wait_devices(ANSWER, |d| !d.is_empty()))
                .ok_or("the first plugin listed no devices")?;
        p.devices = listed.len();
        Ok(p)
    }

    /// Starts a plugin process's worth of plugin, and waits for its registration.
    fn run(&mut self) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(
            self.rt
                .spawn(tessera_device_plugin::run(self.opts.clone(), async {
                    let _ = rx.await;
                })),
        );
        self.starts += 1;
        self.rt
            .block_on(self.kubelet.wait_registrations(self.starts, ANSWER))
            .map(|_| ())
            .ok_or_else(|| format!("plugin start {} did not register", self.starts))
    }

    /// Stops it as SIGTERM does: it must stop cleanly.
    fn halt(&mut self) -> Result<(), String> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(ANSWER, task).await })
        {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("the device plugin failed: {e}")),
            Ok(Err(e)) => Err(format!("the device plugin panicked: {e}")),
            Err(_) => Err("the device plugin did not stop".into()),
        }
    }
}

/// The soak's whole world: the node, the manager, and the model of what should be.
struct World<'a> {
    node: &'a SimNode,
    dir: PathBuf,
    manager: Option<Manager>,
    plugin: Plugin,
    allocs: BTreeMap<String, Alloc>,
    procs: Vec<Proc>,
    /// SIGKILLed processes whose reclaim is awaited: (pid, allocation, when).
    killed: Vec<(u32, String, Instant)>,
    next_id: u64,
    report: SoakReport,
}

impl World<'_> {
    fn manager(&self) -> &Manager {
        self.manager
            .as_ref()
            .expect("the manager runs between steps")
    }

    fn violation(&mut self, what: String) {
        let step = self.report.steps;
        self.report.violations.push(format!("step {step}: {what}"));
    }

    fn governed(&self, a: &Alloc) -> Command {
        let mut c = self.node.probe(Mode::Dlopen, &[]);
        c.env("LD_PRELOAD", crate::hook_library().unwrap_or_default())
            .env("TESSERA_CONTROL", &a.control)
            .env("TESSERA_STATE", &a.state)
            .env_remove("TESSERA_LOG");
        c
    }

    fn create(&mut self, rng: &mut Rng) -> Result<(), String> {
        if self.allocs.len() >= MAX_ALLOCS {
            return Ok(());
        }
        let gpu = rng.range(0, u64::from(GPUS)) as u32;
        let limit = rng.range(2, 17) * 256 * MI;
        let ppm = rng.range(2, 21) as u32 * 10_000;
        self.next_id += 1;
        let id = format!("soak-{}", self.next_id);
        let uuid = self
            .node
            .node()
            .device_info(gpu)
            .map_err(|e| e.to_string())?
            .uuid;
        let req = pb::CreateAllocationRequest::one_device(&id, uuid, limit, ppm);
        let got = self
            .manager()
            .call(async |c| Ok(c.create_allocation(req).await.map(|r| r.into_inner())))?;
        // A refusal (the GPU is full) is the manager's right; the capacity check says
        // whether what it accepted fits.
        if let Ok(a) = got {
            self.allocs.insert(
                id,
                Alloc {
                    gpu,
                    limit,

                    control: a.control_path,
                    state: a.state_path,
                    corrupted: false,
                },
            );
        }
        Ok(())
    }

    fn delete(&mut self, rng: &mut Rng) -> Result<(), String> {
        let Some(id) = pick(rng, self.allocs.keys()).cloned() else {
            return Ok(());
        };
        // Its pod is gone first: its processes die with it.
        let (gone, kept): (Vec<Proc>, Vec<Proc>) = std::mem::take(&mut self.procs)
            .into_iter()
            .partition(|p| p.alloc == id);
        self.procs = kept;
        for mut p in gone {
            p.child.kill();
        }
        self.killed.retain(|k| k.1 != id);
        let req = pb::DeleteAllocationRequest { id: id.clone() };
        let r = self
            .manager()
            .call(async |c| Ok(c.delete_allocation(req).await.map(|_| ())))?;
        match r {
            Ok(()) => {
                self.allocs.remove(&id);
            }
            Err(e) => self.violation(format!("deleting {id}: {e}")),
        }
        Ok(())
    }

    fn launch(&mut self, rng: &mut Rng) -> Result<(), String> {
        if self.procs.len() >= MAX_PROCS {
            return Ok(());
        }
        let Some(id) = pick(rng, self.allocs.keys()).cloned() else {
            return Ok(());
        };
        let a = &self.allocs[&id];
        let corrupted = a.corrupted;
        // Its one fail-closed line (a corrupted allocation) is expected: not printed.
        let mut child = ProbeChild::start_with_stderr(self.governed(a), Stdio::null());
        let init = child.cmd_within("init", ANSWER);
        let ctx = child.cmd_within("ctx", ANSWER);
        match (init, ctx) {
            (Some(i), Some(c)) if i.ok && c.ok => {
                if corrupted {
                    self.violation(format!(
                        "{id}: a process joined a state file with a broken header"
                    ));
                }
                self.procs.push(Proc {
                    child,
                    alloc: id,
                    handles: Vec::new(),
                });
            }
            (Some(i), Some(_)) => {
                // Failing closed is right for a damaged allocation only; a context the
                // limit cannot hold (its overhead) is refused as out of memory.
                let oom = i.ok;
                if !corrupted && !oom {
                    self.violation(format!("{id}: a process could not start: {}", i.raw));
                }
                let _ = child.finish();
            }
            _ => {
                self.violation(format!("{id}: a starting process hung"));
                child.kill();
            }
        }
        Ok(())
    }

    fn allocate(&mut self, rng: &mut Rng) -> Result<(), String> {
        let n = self.procs.len();
        if n == 0 {
            return Ok(());
        }
        let i = rng.range(0, n as u64) as usize;
        let bytes = rng.range(1, 17) * 64 * MI;
        let p = &mut self.procs[i];
        match p.child.cmd_within(&format!("alloc {bytes}"), ANSWER) {
            Some(l) if l.ok => {
                let h = l.u64("h") as u32;
                p.handles.push(h);
            }
            Some(_) => {} // Out of memory: the limit at work.
            None => {
                let a = p.alloc.clone();
                self.violation(format!("{a}: a process hung allocating"));
            }
        }
        Ok(())
    }

    fn free(&mut self, rng: &mut Rng) -> Result<(), String> {
        let with: Vec<usize> = (0..self.procs.len())
            .filter(|&i| !self.procs[i].handles.is_empty())
            .collect();
        let Some(&i) = pick(rng, with.iter()) else {
            return Ok(());
        };
        let p = &mut self.procs[i];
        let k = rng.range(0, p.handles.len() as u64) as usize;
        let h = p.handles.swap_remove(k);
        match p.child.cmd_within(&format!("free {h}"), ANSWER) {
            Some(l) if l.ok => {}
            other => {
                let a = p.alloc.clone();
                self.violation(format!("{a}: free failed: {other:?}"));
            }
        }
        Ok(())
    }

    fn kill(&mut self, rng: &mut Rng) -> Result<(), String> {
        if self.procs.is_empty() {
            return Ok(());
        }
        let i = rng.range(0, self.procs.len() as u64) as usize;
        let mut p = self.procs.swap_remove(i);
        let pid = p.child.pid();
        p.child.kill();
        self.killed.push((pid, p.alloc, Instant::now()));
        self.report.faults += 1;
        Ok(())
    }

    fn restart_manager(&mut self, rng: &mut Rng) -> Result<(), String> {
        let kill = rng.range(0, 2) == 0;
        if let Some(m) = self.manager.take()
            && let Err(e) = m.stop(kill)
        {
            self.violation(e);
        }
        self.manager = Some(Manager::start(self.node, &self.dir)?);
        // The manager repairs damaged files at its start.
        for a in self.allocs.values_mut() {
            a.corrupted = false;
        }
        // Reclaiming is the manager's job (or a process's that needs the quota): the
        // deadline of a process that died while none ran, or in a file that was damaged
        // until now, starts with this manager.
        let now = Instant::now();
        for k in &mut self.killed {
            k.2 = now;
        }
        self.report.faults += 1;
        Ok(())
    }

    /// The device plugin's pod replaced: the old one stopped, a new one started; it
    /// must register again and list every device again.
    fn restart_plugin(&mut self) -> Result<(), String> {
        if let Err(e) = self.plugin.halt() {
            self.violation(e);
        }
        if let Err(e) = self.plugin.run() {
            self.violation(e);
        }
        self.report.faults += 1;
        Ok(())
    }

    fn corrupt(&mut self, rng: &mut Rng) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let Some(id) = pick(rng, self.allocs.keys()).cloned() else {
            return Ok(());
        };
        let a = self.allocs.get_mut(&id).expect("picked");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&a.state)
            .map_err(|e| format!("{}: {e}", a.state))?;
        f.write_all_at(b"HOSTILE!", 0).map_err(|e| e.to_string())?;
        a.corrupted = true;
        self.report.faults += 1;
        Ok(())
    }

    /// Every invariant, once.
    fn check(&mut self) -> Result<(), String> {
        // The kubelet's side: the plugin registered (once per start) and the full
        // device list with the kubelet (the plugin lists its slices again after a start,
        // and the manager's restarts are shorter than its grace).
        self.report.checks += 1;
        let p = &mut self.plugin;
        let want = p.devices;
        let registered = p.kubelet.registrations().len();
        let listed =
            p.rt.block_on(p.kubelet.wait_devices(ANSWER, |d| d.len() == want))
                .map(|d| d.len());
        if registered != p.starts || listed.is_none() {
            let (starts, now) = (p.starts, p.kubelet.devices().len());
            self.violation(format!(
                "device plugin: {registered} registrations after {starts} starts; the kubelet lists {now} devices, not {want}"
            ));
        }
        let status = self.manager().status()?;
        // No allocation lost or invented.
        self.report.checks += 1;
        let served: BTreeSet<String> = status
            .allocations
            .iter()
            .filter_map(|a| a.allocation.as_ref().map(|x| x.id.clone()))
            .collect();
        let model: BTreeSet<String> = self.allocs.keys().cloned().collect();
        if served != model {
            self.violation(format!(
                "the manager serves {served:?}, created and not deleted: {model:?}"
            ));
        }
        // No capacity double-sold, per GPU.
        for gpu in 0..GPUS {
            self.report.checks += 1;
            let info = self
                .node
                .node()
                .device_info(gpu)
                .map_err(|e| e.to_string())?;
            let (mut mem, mut ppm) = (0u64, 0u64);
            for a in status
                .allocations
                .iter()
                .filter_map(|a| a.allocation.as_ref())
            {
                for d in a.devices.iter().filter(|d| d.gpu_uuid == info.uuid) {
                    mem += d.memory_limit_bytes;
                    ppm += u64::from(d.compute_share_ppm);
                }
            }
            if mem > info.memory_total || ppm > 1_000_000 {
                self.violation(format!(
                    "GPU {gpu} sold {mem} bytes of {} and {ppm} ppm",
                    info.memory_total
                ));
            }
        }
        // No device above any limit: the driver's count for each allocation's live
        // processes.
        let truth: BTreeMap<u32, Vec<u64>> = self
            .node
            .node()
            .processes()
            .into_iter()
            .map(|p| (p.pid, p.memory))
            .collect();
        for (id, a) in &self.allocs {
            let held: u64 = self
                .procs
                .iter()
                .filter(|p| &p.alloc == id)
                .filter_map(|p| truth.get(&p.child.pid()))
                .map(|m| m.get(a.gpu as usize).copied().unwrap_or(0))
                .sum();
            self.report.checks += 1;
            if held > a.limit {
                let what = format!(
                    "{id}: the driver holds {held} bytes for it, limit {}",
                    a.limit
                );
                self.report
                    .violations
                    .push(format!("step {}: {what}", self.report.steps));
            }
        }
        // No memory held by a dead process after the deadline.
        let now = Instant::now();
        let mut awaited = Vec::new();
        for (pid, id, at) in std::mem::take(&mut self.killed) {
            let Some(a) = self.allocs.get(&id) else {
                continue;
            };
            let Ok(state) = tessera_shm::State::open(Path::new(&a.state), &id) else {
                // Damaged (corrupted by its tenant): the manager repairs it at its start.
                awaited.push((pid, id, at));
                continue;
            };
            let still = state.processes(1).iter().any(|p| p.identity.pid == pid);
            if !still {
                self.report.checks += 1;
                continue;
            }
            if now.duration_since(at) > RECLAIM_DEADLINE {
                self.report.checks += 1;
                self.violation(format!(
                    "{id}: dead pid {pid} still holds its slot {:?} after its death",
                    now.duration_since(at)
                ));
            } else {
                awaited.push((pid, id, at));
            }
        }
        self.killed = awaited;
        Ok(())
    }
}

fn pick<'a, T>(rng: &mut Rng, items: impl ExactSizeIterator<Item = &'a T>) -> Option<&'a T> {
    let n = items.len();
    if n == 0 {
        return None;
    }
    let k = rng.range(0, n as u64) as usize;
    items.into_iter().nth(k)
}

/// Runs the soak for `length`, from `seed`, and on until it has taken [`MIN_STEPS`] and
/// every action of the mix at least once (or [`COVERAGE_LIMIT`] more has passed): how much
/// a soak covers does not depend on how fast the machine is. On a usual box a soak of a
/// few minutes covers that well within its length; a loaded one takes longer.
pub fn soak(length: Duration, seed: u64) -> Result<SoakReport, String> {
    let node = SimNode::e2e(GPUS, seed);
    let dir = node.dir.path().join("manager");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let manager = Manager::start(&node, &dir)?;
    let plugin = Plugin::start(&node, &manager.socket())?;
    let mut w = World {
        node: &node,
        dir: dir.clone(),
        manager: Some(manager),
        plugin,
        allocs: BTreeMap::new(),
        procs: Vec::new(),
        killed: Vec::new(),
        next_id: 0,
        report: SoakReport {
            seed,
            ..Default::default()
        },
    };
    let mut rng = Rng(seed | 1);
    // (weight, action)
    let mix: [(u64, &'static str); 9] = [
        (10, "create allocation"),
        (4, "delete allocation"),
        (14, "launch process"),
        (30, "allocate"),
        (20, "free"),
        (8, "SIGKILL a process"),
        (2, "restart the manager"),
        (2, "restart the device plugin"),
        (2, "corrupt a state file"),
    ];
    let total: u64 = mix.iter().map(|m| m.0).sum();
    let t0 = Instant::now();
    let covered = |r: &SoakReport| {
        r.steps >= MIN_STEPS
            && mix
                .iter()
                .all(|(_, name)| r.actions.get(name).is_some_and(|&n| n > 0))
    };
    while t0.elapsed() < length || (!covered(&w.report) && t0.elapsed() < length + COVERAGE_LIMIT) {
        let mut r = rng.range(0, total);
        let (_, name) = mix
            .iter()
            .find(|(weight, _)| {
                if r < *weight {
                    true
                } else {
                    r -= weight;
                    false
                }
            })
            .copied()
            .expect("a weight");
        let done = match name {
            "create allocation" => w.create(&mut rng),
            "delete allocation" => w.delete(&mut rng),
            "launch process" => w.launch(&mut rng),
            "allocate" => w.allocate(&mut rng),
            "free" => w.free(&mut rng),
            "SIGKILL a process" => w.kill(&mut rng),
            "restart the manager" => w.restart_manager(&mut rng),
            "restart the device plugin" => w.restart_plugin(),
            _ => w.corrupt(&mut rng),
        };
        done.map_err(|e| format!("step {} ({name}): {e}", w.report.steps))?;
        w.report.steps += 1;
        *w.report.actions.entry(name).or_default() += 1;
        w.check()
            .map_err(|e| format!("step {} (after {name}): {e}", w.report.steps))?;
        if w.report.violations.len() > 100 {
            break;
        }
    }
    // Wait out the last deadlines, then check once more.
    std::thread::sleep(RECLAIM_DEADLINE);
    w.check()?;
    for p in std::mem::take(&mut w.procs) {
        let mut c = p.child;
        c.kill();
    }
    w.plugin.halt()?;
    if let Some(m) = w.manager.take() {
        m.stop(false)?;
    }
    w.report.elapsed = t0.elapsed();
    Ok(w.report.clone())
}
