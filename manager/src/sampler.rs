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

/// How long one wait for a GPU event lasts, so that shutdown is prompt.
const EVENT_WAIT: Duration = Duration::from_millis(200);

/// How long the manager's start waits for the event watcher's first wait:
/// a bound for a driver that hangs, never reached by one that answers.
const EVENT_REGISTER_DEADLINE: Duration = Duration::from_secs(10);

/// Starts the thread that waits for GPU events (XIDs, lost GPUs) and
/// returns once its first wait has come back, so a manager serves with its
/// watcher registered: the driver delivers an event only to a watcher that
/// exists when it happens, and one missed is lost for good.
///
/// The first wait does not block (it registers and takes what is already
/// there). Every completed wait, with an event or without, counts a
/// `gpu_event_wait` pass: above 0 means registered ("GPU event watcher
/// registered" in the log), and a pass that began after some action and
/// came back empty means nothing from that action was pending.
pub(crate) fn spawn_events(core: Arc<Core>) -> std::io::Result<JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("tessera-events".into())
        .spawn(move || {
            let mut ready = Some(ready_tx);
            let mut complained = false;
            let mut registered = false;
            let mut timeout = Duration::ZERO;
            while !core.stop.load(Ordering::Acquire) {
                let result = core.backend.wait_event(timeout);
                timeout = EVENT_WAIT;
                let failed = match result {
                    Ok(ev) => {
                        if !registered {
                            registered = true;
                            tracing::info!("GPU event watcher registered");
                        }
                        if let Some(ev) = ev {
                            on_event(&core, ev);
                            crate::core::Passes::count(&core.passes.gpu_events);
                        }
                        crate::core::Passes::count(&core.passes.gpu_event_waits);
                        false
                    }
                    Err(e) => {
                        if !complained {
                            tracing::warn!(error = %e, "GPU health events unavailable; relying on sampling");
                            complained = true;
                        }
                        true
                    }
                };
                // The start goes on after the first answer, registered or not.
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
                if failed {
                    std::thread::sleep(EVENT_WAIT);
                }
            }
        })?;
    // Err: the deadline passed, or the thread died; the manager serves
    // anyway (sampling still finds lost GPUs) and the pass count says when
    // the watcher is registered.
    let _ = ready_rx.recv_timeout(EVENT_REGISTER_DEADLINE);
    Ok(handle)
}
