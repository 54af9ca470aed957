//! The reaper: resolves the host pids of the allocations' processes from
//! `/proc`, reclaims what dead processes held, and deletes the allocations
//! of `tessera run` commands that died without cleaning up.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tessera_shm::{Liveness, ProcIdentity};

use crate::core::Core;
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
