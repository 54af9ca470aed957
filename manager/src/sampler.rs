//! The sampler: per GPU, health from queries and events, the samples
//! behind status and metrics, and the backstop (NVML's view of GPU
//! processes held against the allocations, [`crate::backstop`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backstop::Backstop;
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

    // Backstop: each GPU's processes against the allocations they are
    // proven to be in (crate::enforce, crate::identity).
    let confirmed = crate::enforce::run(
        core,
        &crate::identity::HostProc::host(),
        &driver_procs,
        now,
        backstop,
    );
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
                    Ok(Some(ev)) => {
                        on_event(&core, ev);
                        crate::core::Passes::count(&core.passes.gpu_events);
                    }
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
