//! The reaper: resolves the host pids of the allocations' processes from
//! `/proc`, reclaims what dead processes held once the driver has let go of
//! it, and deletes the allocations of `tessera run` commands that died
//! without cleaning up.
//!
//! A process gone from `/proc` may still hold GPU memory: the driver tears
//! an exited process down after the kernel has let it go, and NVML lists it
//! with its memory until it is done. Quota returned before then could be
//! allocated again while the driver still holds it, taking the device past
//! the allocation's limit (docs/security.md, "The exit window"). So a dead
//! process's slot that holds memory is reclaimed only once NVML no longer
//! lists the process on the GPUs it held memory on (`DriverLists`); the
//! shim reclaims no such slot itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tessera_shm::{Liveness, ProcIdentity, ProcessInfo};

use crate::core::Core;
use crate::gpu::GpuProcess;
use crate::procfs::Verdict;
use crate::store::LiveAllocation;

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

/// The driver's process list of each GPU, asked once per pass and GPU, and
/// only when a dead process's slot still holds memory there.
struct DriverLists<'a> {
    core: &'a Core,
    /// By GPU UUID; `None` when the query failed.
    lists: HashMap<String, Option<Vec<GpuProcess>>>,
}

impl<'a> DriverLists<'a> {
    fn new(core: &'a Core) -> Self {
        DriverLists {
            core,
            lists: HashMap::new(),
        }
    }

    fn list(&mut self, uuid: &str) -> Option<&[GpuProcess]> {
        let core = self.core;
        self.lists
            .entry(uuid.to_owned())
            .or_insert_with(|| core.backend.processes(uuid).ok())
            .as_deref()
    }

    /// Whether the driver may still hold memory for dead process `p` of
    /// `live`, on a GPU where its slot holds some. `host_pid` is its pid in
    /// the manager's namespace where known: then the question is whether
    /// NVML lists that pid there. Where unknown (it died before a pass
    /// resolved it, in a namespace not ours), whether NVML lists there any
    /// process that is gone from `/proc` or exiting: one of those may be
    /// it. A GPU whose list cannot be read holds it (asked again next pass).
    fn may_hold(&mut self, live: &LiveAllocation, p: &ProcessInfo, host_pid: Option<u32>) -> bool {
        for (dev, &bytes) in p.usage.iter().enumerate() {
            if bytes == 0 {
                continue;
            }
            let uuid = live.control().uuid(dev).to_owned();
            let Some(list) = self.list(&uuid) else {
                return true;
            };
            let held = match host_pid {
                Some(pid) => list.iter().any(|q| q.pid == pid),
                None => list.iter().any(|q| departing(q.pid)),
            };
            if held {
                return true;
            }
        }
        false
    }
}

/// Whether process `pid` (the manager's namespace) is gone from `/proc` or
/// has begun to exit.
fn departing(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| tessera_shm::process::parse_stat_fields(&t))
        .is_none_or(|s| s.exiting())
}

/// How long a slot the manager cannot judge is left before trying again.
const UNKNOWN_RETRY: Duration = Duration::from_secs(2);

/// The reaper's memory between passes: slots it could not judge, and since when.
#[derive(Debug, Default)]
pub struct Reaper {
    unknown: HashMap<(String, usize), (ProcIdentity, Instant)>,
}

impl Reaper {
    /// One reaper pass: resolves host pids and reclaims dead processes.
    pub fn tick(&mut self, core: &Core) {
        let unknown = &mut self.unknown;
        let now = Instant::now();
        // Every slot is read before /proc is scanned, so a process that
        // joined just now is in the scan (see Resolver::judge).
        let snapshot: Vec<_> = core
            .live_list()
            .into_iter()
            .map(|l| {
                let procs = l.state().processes(l.control().n_devices());
                (l, procs)
            })
            .collect();
        let mut scan = None;
        let mut seen = Vec::new();
        let mut driver = DriverLists::new(core);
        let own_ns = core.resolver.own_pidns();
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
                let v = core.resolver.judge(&p.identity, p.host_pid, &mut scan);
                match v {
                    Verdict::Unknown => {
                        unknown.insert(key, (p.identity, now));
                    }
                    Verdict::Alive { host_pid } => {
                        unknown.remove(&key);
                        if host_pid != p.host_pid {
                            live.state().set_host_pid(p.slot, host_pid);
                            // The slot may have changed hands meanwhile:
                            // never leave our pid on someone else's slot.
                            let still = live
                                .state()
                                .processes(live.control().n_devices())
                                .into_iter()
                                .any(|q| q.slot == p.slot && q.identity == p.identity);
                            if !still {
                                live.state().set_host_pid(p.slot, 0);
                            }
                        }
                    }
                    Verdict::Dead => {
                        unknown.remove(&key);
                        let host_pid = match p.host_pid {
                            0 if own_ns != 0 && p.identity.pidns == own_ns => Some(p.identity.pid),
                            0 => None,
                            pid => Some(pid),
                        };
                        if driver.may_hold(live, p, host_pid) {
                            // Not yet: its quota stays charged while the
                            // driver holds its memory (next pass asks again).
                            tracing::debug!(
                                allocation = %id,
                                pid = p.identity.pid,
                                host_pid = host_pid.unwrap_or(0),
                                "a dead process's memory is still held by the driver; its quota stays charged"
                            );
                            verdicts.insert(p.identity, Verdict::Unknown);
                            continue;
                        }
                    }
                }
                verdicts.insert(p.identity, v);
            }
            for r in live.state().reclaim_dead(&Verdicts(verdicts), None) {
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
        Self::collect_orphaned_runs(core, &snapshot);
    }

    /// Deletes the allocations of `tessera run` commands whose runner is
    /// gone (the command `tessera run` exec'd ended, or an old-style run
    /// died without cleaning up), once none of their processes is left.
    /// Only for runs in our own pid namespace, where their pid means the
    /// same; the manager binds a run to its peer's pid at create time
    /// ([`Core::bind_run`]).
    fn collect_orphaned_runs(
        core: &Core,
        _snapshot: &[(Arc<LiveAllocation>, Vec<tessera_shm::ProcessInfo>)],
    ) {
        core.collect_gone_runs();
    }
}

/// Starts the reaper thread; it stops when `core` is told to.
pub(crate) fn spawn(core: Arc<Core>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tessera-reaper".into())
        .spawn(move || {
            let mut reaper = Reaper::default();
            while !core.stop.load(Ordering::Acquire) {
                reaper.tick(&core);
                crate::core::Passes::count(&core.passes.reaper);
                std::thread::sleep(core.config.reap_interval);
            }
        })
}
