//! One backstop pass over the node (called by the sampler): the allocations
//! served, each GPU process proven in one of them or in none
//! ([`crate::identity`]), judged by [`crate::backstop::judge`], logged once
//! and, with `backstopKill`, stopped (`backstop::stop`); the pass's
//! standings and stops go to the metrics ([`crate::backstop::Tally`]). Kept apart from
//! [`crate::backstop`] so that module stays pure and the module graph
//! acyclic (this one depends on [`crate::core`]).

use std::collections::HashMap;
use std::time::Instant;

use crate::backstop::{self, Backstop, Finding, GpuView, Owner, Reason, Standing, StopKey};
use crate::core::Core;
use crate::gpu::GpuProcess;
use crate::identity::{self, Claim, FileId, ProcView, Proof};

/// The claims of the allocations served, with their owners for log lines:
/// (claim, "namespace/pod/container", limits by GPU UUID).
type Served = Vec<(Claim, String, Vec<(String, u64)>)>;

fn served(core: &Core) -> Served {
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
        out.push((
            Claim {
                alloc_id: rec.id,
                control,
                state,
            },
            who,
            limits,
        ));
    }
    out
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
    let mut proofs: HashMap<u32, Option<(usize, Proof)>> = HashMap::new();
    let mut lists: Vec<(&str, Vec<GpuProcess>, HashMap<u32, Owner>)> = Vec::new();
    for (g, procs) in core.gpus.iter().zip(driver_procs) {
        let Some(procs) = procs else { continue };
        let mut owners = HashMap::new();
        let mut judged = Vec::new();
        for p in procs {
            // A process /proc cannot show (gone since the sample, or not
            // visible from here) is judged by no one. Each process's maps
            // are read once a pass, whatever GPUs it is on.
            let proof = match proofs.get(&p.pid) {
                Some(known) => *known,
                None => {
                    let Some(files) = view.mapped(p.pid) else {
                        continue;
                    };
                    let proof = identity::prove_with(view, p.pid, &files, &claims);
                    proofs.insert(p.pid, proof);
                    proof
                }
            };
            judged.push(*p);
            if let Some((i, how)) = proof {
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
                        governed: how == Proof::Mapped,
                    },
                );
            }
        }
        lists.push((g.uuid.as_str(), judged, owners));
    }
    let views: Vec<GpuView<'_>> = lists
        .iter()
        .map(|(uuid, procs, owners)| GpuView {
            uuid,
            procs: procs.as_slice(),
            owners,
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
                stopping = ?s.stopping,
                left_bytes = s.after,
                kill = core.config.backstop_kill,
                "allocation over its memory limit by the driver's count"
            );
        }
    }
    for f in &new {
        tracing::warn!(
            gpu = %f.gpu_uuid,
            pid = f.pid,
            used_bytes = f.used_bytes,
            reason = f.reason.label(),
            allocation = f.alloc_id.as_deref().unwrap_or(""),
            pod = %who(f.alloc_id.as_deref()),
            kill = core.config.backstop_kill,
            "process escapes its GPU allocation"
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
            if f.pid <= 1 || f.pid == own {
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
            let same = || {
                identity::prove(view, f.pid, &claims).map(|(i, _)| claims[i].alloc_id.clone())
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
