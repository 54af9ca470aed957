//! One backstop pass over the node (called by the sampler): the allocations
//! served, each GPU process placed in one of them or in none
//! ([`crate::identity`]), judged by [`crate::backstop::judge`], logged once
//! and, with `backstopKill`, stopped (`backstop::stop`); the pass's
//! standings and stops go to the metrics ([`crate::backstop::Tally`]). Kept apart from
//! [`crate::backstop`] so that module stays pure and the module graph
//! acyclic (this one depends on [`crate::core`]).
//!
//! A process the driver lists that has no address space has begun to exit
//! (or is a zombie): it is placed where it was while it ran (remembered from
//! earlier passes, by pid and start time), or by its descent from a run, and
//! left alone for [`EXIT_GRACE`] (docs/security.md, "Processes that exit").

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::backstop::{
    self, Backstop, EXIT_GRACE, Finding, GpuView, Owner, Placed, Reason, Standing, StopKey,
};
use crate::core::Core;
use crate::gpu::GpuProcess;
use crate::identity::{self, Claim, FileId, ProcView, Proof, Runner};

/// The claims of the allocations served, with their owners for log lines:
/// (claim, "namespace/pod/container", limits by GPU UUID).
type Served = Vec<(Claim, String, Vec<(String, u64)>)>;

fn served(core: &Core) -> Served {
    let own_ns = core.resolver.own_pidns();
    let mut out = Vec::new();
    for l in core.live_list() {
        let (Some(control), Some(state)) = (
            FileId::of(&l.dir().join("control")),
            FileId::of(&l.dir().join("state")),
        ) else {
            continue;
        };
        let rec = l.record();
        let n = l.control().n_devices();
        let limits = (0..n)
            .map(|i| (l.control().uuid(i).to_owned(), l.control().memory_limit(i)))
            .collect();
        let who = if rec.pod.is_empty() {
            String::new()
        } else {
            format!("{}/{}/{}", rec.namespace, rec.pod, rec.container)
        };
        // A run the manager bound to its process (in our own pid namespace,
        // where its pid means the same): its descendants are its members.
        let runner = tessera_contract::labels::RunOwner::from_labels(&rec.labels)
            .filter(|r| {
                own_ns != 0
                    && r.pidns == own_ns
                    && rec
                        .labels
                        .get(tessera_contract::labels::CLI_TRACKED)
                        .is_some_and(|v| v == "true")
            })
            .map(|r| Runner {
                pid: r.pid,
                start_time: r.start_time,
            });
        out.push((
            Claim {
                alloc_id: rec.id,
                control,
                state,
                runner,
            },
            who,
            limits,
        ));
    }
    out
}

/// One GPU's processes to judge this pass, with their owners, and those of
/// them that have exited (past the grace).
struct GpuList<'a> {
    uuid: &'a str,
    judged: Vec<GpuProcess>,
    owners: HashMap<u32, Owner>,
    exited: HashSet<u32>,
}

/// What one pass makes of a process the driver lists.
#[derive(Debug, Clone)]
enum Seen {
    /// Not in `/proc` and never seen there: another pid namespace, or gone
    /// before any pass saw it. Judged by no one.
    Invisible,
    /// Running: placed (claim index, governed) or in no allocation.
    Running(Option<(usize, bool)>),
    /// Exited (no address space, or gone from `/proc` after an earlier pass
    /// saw it): where it was placed, and whether the grace is over.
    Exited {
        placed: Option<(usize, bool)>,
        past_grace: bool,
    },
}

/// Looks `pid` up once a pass (its maps, and for one without an address
/// space its placement from earlier passes or its ancestry).
fn look(
    view: &dyn ProcView,
    pid: u32,
    claims: &[Claim],
    memory: &mut Backstop,
    now: Instant,
) -> Seen {
    let index = |alloc_id: &str| claims.iter().position(|c| c.alloc_id == alloc_id);
    let Some(maps) = view.maps(pid) else {
        // Gone from /proc. Listed still, it is a process an earlier pass saw
        // that has exited while the driver frees what it held.
        return match memory.placement(pid, None).cloned() {
            Some(p) => Seen::Exited {
                placed: index(&p.alloc_id).map(|i| (i, p.governed)),
                past_grace: memory.exited_for(pid, now) >= EXIT_GRACE,
            },
            None => Seen::Invisible,
        };
    };
    let mut files: Vec<FileId> = Vec::new();
    for m in &maps {
        if !files.contains(&m.id) {
            files.push(m.id);
        }
    }
    let start = view.stat(pid).map(|s| s.start_time);
    if files.is_empty() && view.exiting(pid) == Some(true) {
        let placed = match memory.placement(pid, start) {
            Some(p) => index(&p.alloc_id).map(|i| (i, p.governed)),
            None => identity::prove_with(view, pid, &[], claims).map(|(i, _)| (i, false)),
        };
        return Seen::Exited {
            placed,
            past_grace: memory.exited_for(pid, now) >= EXIT_GRACE,
        };
    }
    let proof = identity::prove_with(view, pid, &files, claims);
    if let (Some((i, how)), Some(start_time)) = (proof, start) {
        memory.remember(
            pid,
            Placed {
                start_time,
                alloc_id: claims[i].alloc_id.clone(),
                governed: how == Proof::Mapped,
            },
        );
    }
    Seen::Running(proof.map(|(i, how)| (i, how == Proof::Mapped)))
}

/// Counts a stop in `tessera_backstop_stops_total`, under the owner the
/// manager's record names (not the tenant's files).
fn count_stop(core: &Core, f: &Finding) {
    let alloc_id = f.alloc_id.clone().unwrap_or_default();
    let rec = core.allocs.read().get(&alloc_id).map(|l| l.record());
    let (namespace, pod, container) = rec
        .map(|r| (r.namespace, r.pod, r.container))
        .unwrap_or_default();
    let key = StopKey {
        gpu_uuid: f.gpu_uuid.clone(),
        reason: f.reason,
        alloc_id,
        namespace,
        pod,
        container,
    };
    let mut tally = core.backstop.lock();
    let n = tally.stops.entry(key).or_default();
    n.stops += 1;
    n.bytes += f.used_bytes;
}

/// One backstop pass over the processes the driver reported on each GPU
/// (`driver_procs[i]` for `core.gpus[i]`, `None` when the query failed),
/// taken at `sampled`. Returns the findings for status and metrics.
pub(crate) fn run(
    core: &Core,
    view: &dyn ProcView,
    driver_procs: &[Option<Vec<GpuProcess>>],
    sampled: Instant,
    state: &mut Backstop,
) -> Vec<Finding> {
    let served = served(core);
    let claims: Vec<Claim> = served.iter().map(|(c, _, _)| c.clone()).collect();
    let mut seen: HashMap<u32, Seen> = HashMap::new();
    let mut lists: Vec<GpuList<'_>> = Vec::new();
    let mut listed: HashSet<u32> = HashSet::new();
    // Processes that have exited within the grace: (GPU, pid, bytes,
    // allocation), reported at debug level only.
    let mut leaving: Vec<(&str, u32, u64, Option<&str>)> = Vec::new();
    for (g, procs) in core.gpus.iter().zip(driver_procs) {
        let Some(procs) = procs else { continue };
        let mut owners = HashMap::new();
        let mut exited = HashSet::new();
        let mut judged = Vec::new();
        for p in procs {
            listed.insert(p.pid);
            // Each process is looked up once a pass, whatever GPUs it is on.
            let s = seen
                .entry(p.pid)
                .or_insert_with(|| look(view, p.pid, &claims, state, sampled))
                .clone();
            let placed = match s {
                Seen::Invisible => continue,
                Seen::Running(placed) => placed,
                Seen::Exited {
                    placed,
                    past_grace: false,
                } => {
                    let alloc = placed.map(|(i, _)| claims[i].alloc_id.as_str());
                    leaving.push((g.uuid.as_str(), p.pid, p.used_bytes, alloc));
                    continue;
                }
                Seen::Exited {
                    placed,
                    past_grace: true,
                } => {
                    exited.insert(p.pid);
                    placed
                }
            };
            judged.push(*p);
            if let Some((i, governed)) = placed {
                let limit = served[i]
                    .2
                    .iter()
                    .find(|(u, _)| *u == g.uuid)
                    .map(|(_, l)| *l);
                owners.insert(
                    p.pid,
                    Owner {
                        alloc_id: served[i].0.alloc_id.clone(),
                        limit_on_gpu: limit,
                        governed,
                    },
                );
            }
        }
        lists.push(GpuList {
            uuid: g.uuid.as_str(),
            judged,
            owners,
            exited,
        });
    }
    state.keep_only(&listed);
    for (gpu, pid, bytes, alloc) in &leaving {
        tracing::debug!(
            gpu = %gpu,
            pid,
            used_bytes = bytes,
            allocation = alloc.unwrap_or(""),
            "process has exited; the driver still holds its memory (not judged for {} s)",
            EXIT_GRACE.as_secs()
        );
    }
    let views: Vec<GpuView<'_>> = lists
        .iter()
        .map(|l| GpuView {
            uuid: l.uuid,
            procs: l.judged.as_slice(),
            owners: &l.owners,
            exited: &l.exited,
        })
        .collect();
    let tolerance = core.config.backstop_tolerance_bytes;
    let judgement = backstop::judge(&views, tolerance);
    let standings = judgement.standings;
    let (confirmed, new) = state.round(judgement.findings);
    let who = |alloc_id: Option<&str>| {
        alloc_id
            .and_then(|id| served.iter().find(|(c, _, _)| c.alloc_id == id))
            .map(|(_, w, _)| w.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let standing_of = |f: &Finding| -> Option<&Standing> {
        let id = f.alloc_id.as_deref()?;
        standings
            .iter()
            .find(|s| s.gpu_uuid == f.gpu_uuid && s.alloc_id == id)
    };
    // One line per allocation over its limit + tolerance with something new
    // to report: how far over, and what goes.
    for s in &standings {
        if !s.stopping.is_empty()
            && new
                .iter()
                .any(|f| f.gpu_uuid == s.gpu_uuid && s.stopping.contains(&f.pid))
        {
            tracing::warn!(
                gpu = %s.gpu_uuid,
                allocation = %s.alloc_id,
                pod = %who(Some(s.alloc_id.as_str())),
                held_bytes = s.held,
                limit_bytes = s.limit,
                over_by_bytes = s.over_by(),
                tolerance_bytes = tolerance,
                processes = s.processes,
                without_shim = s.ungoverned,
                exited_bytes = s.exited_bytes,
                stopping = ?s.stopping,
                left_bytes = s.after,
                kill = core.config.backstop_kill,
                "allocation over its memory limit by the driver's count"
            );
        }
    }
    for f in &new {
        // One line per finding, with the same fields whatever it is. An
        // exited process is only reported (its grace is named; nothing is
        // stopped); one in no allocation says why it could not be placed, so
        // that a surprise on a real node is diagnosable from this line alone.
        let (what, grace_s, kill, why) = if f.exited {
            (
                "a process that has exited still holds GPU memory past the grace (its device \
                 files held open elsewhere, or the driver stuck); counted against its \
                 allocation, nothing to stop",
                Some(EXIT_GRACE.as_secs()),
                None,
                None,
            )
        } else {
            let why =
                (f.reason == Reason::NoShim).then(|| identity::diagnose(view, f.pid, &claims));
            (
                "process escapes its GPU allocation",
                None,
                Some(core.config.backstop_kill),
                why,
            )
        };
        tracing::warn!(
            gpu = %f.gpu_uuid,
            pid = f.pid,
            used_bytes = f.used_bytes,
            reason = f.reason.label(),
            allocation = f.alloc_id.as_deref().unwrap_or(""),
            pod = %who(f.alloc_id.as_deref()),
            grace_s,
            kill,
            why = why.as_ref().map(tracing::field::display),
            "{what}"
        );
    }
    if core.config.backstop_kill {
        let own = std::process::id();
        // GPUs Tessera shares: only there does a process outside every
        // allocation take from tenants. On a GPU no allocation uses (a whole
        // GPU handed out by another device plugin) it is reported, not stopped.
        let shared: std::collections::HashSet<&str> = served
            .iter()
            .flat_map(|(_, _, limits)| limits.iter().map(|(u, _)| u.as_str()))
            .collect();
        for f in &confirmed {
            // An exited process runs nothing a signal could stop.
            if f.pid <= 1 || f.pid == own || f.exited {
                continue;
            }
            if f.reason == Reason::NoShim && !shared.contains(f.gpu_uuid.as_str()) {
                continue;
            }
            let expect = f.alloc_id.clone();
            let still_there = || {
                core.gpus
                    .iter()
                    .find(|g| g.uuid == f.gpu_uuid)
                    .and_then(|g| core.backend.processes(&g.uuid).ok())
                    .is_some_and(|ps| ps.iter().any(|p| p.pid == f.pid))
            };
            // Still running (one that has begun to exit since the sample is
            // the driver's now) and placed the same.
            let same = || {
                view.exiting(f.pid) == Some(false)
                    && identity::prove(view, f.pid, &claims)
                        .map(|(i, _)| claims[i].alloc_id.clone())
                        == expect
            };
            match backstop::stop(f.pid, || still_there() && same()) {
                Ok(true) => {
                    let s = standing_of(f);
                    tracing::warn!(
                        gpu = %f.gpu_uuid,
                        pid = f.pid,
                        reason = f.reason.label(),
                        used_bytes = f.used_bytes,
                        allocation = f.alloc_id.as_deref().unwrap_or(""),
                        pod = %who(f.alloc_id.as_deref()),
                        allocation_held_bytes = s.map_or(0, |s| s.held),
                        over_by_bytes = s.map_or(0, Standing::over_by),
                        after_sample_ms = sampled.elapsed().as_secs_f64() * 1e3,
                        "backstop stopped the process (SIGKILL)"
                    );
                    count_stop(core, f);
                }
                Ok(false) => tracing::info!(
                    pid = f.pid,
                    "backstop left a process that changed since the sample"
                ),
                Err(e) => {
                    tracing::warn!(pid = f.pid, error = %e, "backstop could not stop process")
                }
            }
        }
    }
    let mut tally = core.backstop.lock();
    tally.passes += 1;
    tally.standings = standings;
    drop(tally);
    confirmed
}
