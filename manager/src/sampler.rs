//! The sampler: per GPU, health from queries and events, the samples
//! behind status and metrics, and the backstop (NVML's view of GPU
//! processes held against the allocations, [`crate::backstop`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backstop::{self, Backstop, Owner};
use crate::core::Core;
use crate::gpu::GpuEvent;
use crate::health::Change;

/// One sampling pass: health from queries, samples for metrics, and
/// the backstop.
pub(crate) fn sample_once(core: &Core, backstop: &mut Backstop) {
    let now = Instant::now();
    let mut samples = Vec::with_capacity(core.gpus.len());
    let mut changed = false;
    let mut driver_procs = Vec::with_capacity(core.gpus.len());
    for (i, g) in core.gpus.iter().enumerate() {
        let result = core.backend.sample(&g.uuid);
        let change = {
            let mut health = core.health.lock();
            match &result {
                Ok(_) => health[i].on_answer(now),
                Err(e) => health[i].on_lost(&e.to_string()),
            }
        };
        if change != Change::None {
            changed = true;
            log_health(core, i, change);
        }
        samples.push(result.ok());
        driver_procs.push(core.backend.processes(&g.uuid).ok());
    }
    *core.samples.write() = samples;

    // Backstop: host pid → allocation, then each GPU's processes.
    let allocs = core.live_list();
    // (host pid, allocation, (GPU UUID, limit) per device)
    type Member = (u32, String, Vec<(String, u64)>);
    let mut members: Vec<Member> = Vec::new();
    for l in &allocs {
        let n = l.control().n_devices();
        let limits: Vec<(String, u64)> = (0..n)
            .map(|i| (l.control().uuid(i).to_owned(), l.control().memory_limit(i)))
            .collect();
        for p in l.state().processes(n) {
            if p.host_pid != 0 {
                members.push((p.host_pid, l.id(), limits.clone()));
            }
        }
    }
    let mut findings = Vec::new();
    for (g, procs) in core.gpus.iter().zip(&driver_procs) {
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
            core.config.backstop_slack_bytes,
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
            kill = core.config.backstop_kill,
            "process escapes its GPU allocation"
        );
    }
    if core.config.backstop_kill {
        for f in &confirmed {
            kill_process(f.pid);
        }
    }
    *core.findings.lock() = confirmed;
    if changed {
        core.notify();
    }
}

fn log_health(core: &Core, i: usize, change: Change) {
    let reason = core.health.lock()[i].reason();
    let uuid = &core.gpus[i].uuid;
    match change {
        Change::Failed | Change::Reason => {
            tracing::warn!(gpu = i, uuid = %uuid, %reason, "GPU unhealthy")
        }
        Change::Recovered => tracing::info!(gpu = i, uuid = %uuid, "GPU healthy again"),
        Change::None => {}
    }
}

fn on_event(core: &Core, ev: GpuEvent) {
    let now = Instant::now();
    let (uuid, change) = match &ev {
        GpuEvent::Xid { uuid, xid } => {
            let Some(i) = core.gpus.iter().position(|g| g.uuid == *uuid) else {
                return;
            };
            if core.health_policy.ignored_xids.contains(xid) {
                tracing::info!(gpu = i, uuid = %uuid, xid, "application XID; GPU stays healthy");
            }
            (
                uuid,
                core.health.lock()[i].on_xid(&core.health_policy, *xid, now),
            )
        }
        GpuEvent::Lost { uuid } => {
            let Some(i) = core.gpus.iter().position(|g| g.uuid == *uuid) else {
                return;
            };
            (uuid, core.health.lock()[i].on_lost("GPU lost"))
        }
    };
    if change != Change::None {
        if let Some(i) = core.gpus.iter().position(|g| g.uuid == *uuid) {
            log_health(core, i, change);
        }
        core.notify();
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

/// Starts the sampling thread.
pub(crate) fn spawn_sampler(core: Arc<Core>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tessera-sampler".into())
        .spawn(move || {
            let mut backstop = Backstop::default();
            let mut next = Instant::now();
            while !core.stop.load(Ordering::Acquire) {
                if Instant::now() >= next {
                    sample_once(&core, &mut backstop);
                    next = Instant::now() + core.config.sample_interval;
                }
                // Short naps so shutdown is prompt.
                std::thread::sleep(core.config.sample_interval.min(Duration::from_millis(50)));
            }
        })
}

/// Starts the thread that waits for GPU events (XIDs, lost GPUs).
pub(crate) fn spawn_events(core: Arc<Core>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tessera-events".into())
        .spawn(move || {
            let mut complained = false;
            while !core.stop.load(Ordering::Acquire) {
                match core.backend.wait_event(Duration::from_millis(200)) {
                    Ok(Some(ev)) => on_event(&core, ev),
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
        })
}
