//! Prometheus metrics: the exposition (text format 0.0.4, encoded by the
//! `prometheus-client` crate) rendered from a plain snapshot by a pure
//! function, and the HTTP endpoint (hyper) that serves `GET /metrics`. GPU
//! series carry dcgm-exporter's labels (`gpu`, `UUID`, `modelName`,
//! `Hostname`) so dashboards can join the two.
//!
//! The endpoint reads and parses a request before it renders anything. It
//! holds at most [`Limits::connections`] connections, at most
//! [`Limits::per_peer`] of them from one address, and closes any past that
//! at once (so one client's idle connections cannot starve a scraper on
//! another address); a connection that does not send its request head
//! within [`HEADER_TIMEOUT`], or is not done within [`CONNECTION_DEADLINE`],
//! is closed; at most [`Limits::renders`] expositions are rendered at once.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One GPU's values.
#[derive(Debug, Clone, Default)]
pub struct GpuMetrics {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// `nvidia`, `amd`, `hygon`: on `tessera_gpu_info` only, so the other
    /// series keep dcgm-exporter's label set.
    pub vendor: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub utilization_ratio: f64,
    pub temperature_celsius: u32,
    pub power_watts: f64,
    pub slices_allocated: u32,
    pub slices_total: u32,
    pub healthy: bool,
    /// Processes the backstop reports, by reason label.
    pub ungoverned: BTreeMap<&'static str, u64>,
}

/// One allocation's values on one of its GPUs.
#[derive(Debug, Clone, Default)]
pub struct AllocMetrics {
    /// The GPU, the allocation and its owner.
    pub subject: Subject,
    pub memory_limit_bytes: u64,
    pub memory_used_bytes: u64,
    pub compute_share_ratio: f64,
    /// `None` when no arbiter measures it: the series is left out.
    pub compute_achieved_ratio: Option<f64>,
    pub processes: u64,
    pub wait_seconds_total: f64,
    pub oom_refused_total: u64,
    /// Priority for burst time.
    pub priority: i32,
    /// Paused by `tessera pause` now.
    pub paused: bool,
    pub paused_seconds_total: f64,
}

/// A GPU and, when known, the allocation and owner a series is about.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub gpu_index: u32,
    pub uuid: String,
    pub model: String,
    /// Empty for a process in no allocation.
    pub allocation: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// An allocation found damaged at start-up and repaired, on one of its GPUs.
#[derive(Debug, Clone, Default)]
pub struct RecoveredMetrics {
    pub subject: Subject,
    /// What was repaired: "record", "control", "state", joined by `+`.
    pub repaired: String,
}

/// Processes the backstop stopped since the manager started.
#[derive(Debug, Clone, Default)]
pub struct StopMetrics {
    pub subject: Subject,
    /// `no_shim`, `other_gpu`, `over_limit` or `over_limit_no_shim`.
    pub reason: &'static str,
    pub stops: u64,
    /// What the stopped processes held on the GPU at their samples.
    pub bytes: u64,
}

/// What an allocation's proven processes held on one of its GPUs at the
/// backstop's last pass, by the driver's count, before any stop.
#[derive(Debug, Clone, Default)]
pub struct StandingMetrics {
    pub subject: Subject,
    pub held_bytes: u64,
    /// `held_bytes` beyond the limit; 0 within it.
    pub over_limit_bytes: u64,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct MetricsSnapshot {
    pub hostname: String,
    pub gpus: Vec<GpuMetrics>,
    pub allocations: Vec<AllocMetrics>,
    pub recovered: Vec<RecoveredMetrics>,
    pub backstop_stops: Vec<StopMetrics>,
    /// Backstop passes completed since the manager started.
    pub backstop_passes: u64,
    pub backstop_standings: Vec<StandingMetrics>,
    /// Reaper passes completed since start.
    pub reaper_passes: u64,
    /// GPU events (XIDs, lost GPUs) handled since start.
    pub gpu_events: u64,
    /// Completed waits of the GPU event watcher since start (above 0 once
    /// it is registered).
    pub gpu_event_waits: u64,
}

/// Every metric: name as exposed, type, help. The order is the exposition's.
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        "tessera_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use, as the driver reports it.",
    ),
    (
        "tessera_gpu_memory_total_bytes",
        "gauge",
        "GPU memory capacity.",
    ),
    (
        "tessera_gpu_utilization_ratio",
        "gauge",
        "Fraction of time the GPU was busy (0..1).",
    ),
    (
        "tessera_gpu_temperature_celsius",
        "gauge",
        "GPU temperature.",
    ),
    ("tessera_gpu_power_watts", "gauge", "GPU power draw."),
    (
        "tessera_gpu_slices_allocated",
        "gauge",
        "Slices of the GPU held by allocations.",
    ),
    ("tessera_gpu_slices", "gauge", "Slices the GPU is cut into."),
    (
        "tessera_gpu_info",
        "gauge",
        "Always 1; its labels describe the GPU, vendor among them.",
    ),
    (
        "tessera_gpu_healthy",
        "gauge",
        "1 when the GPU is healthy, 0 when not.",
    ),
    (
        "tessera_ungoverned_processes",
        "gauge",
        "Processes using the GPU outside their allocation, by reason (no_shim, other_gpu, over_limit, over_limit_no_shim).",
    ),
    (
        "tessera_allocation_memory_limit_bytes",
        "gauge",
        "The allocation's memory limit on the GPU.",
    ),
    (
        "tessera_allocation_memory_used_bytes",
        "gauge",
        "Memory the allocation's processes hold on the GPU.",
    ),
    (
        "tessera_allocation_compute_share_ratio",
        "gauge",
        "The allocation's target share of the GPU's time (0..1).",
    ),
    (
        "tessera_allocation_compute_achieved_ratio",
        "gauge",
        "Share of the GPU's time the allocation held recently (0..1).",
    ),
    (
        "tessera_allocation_processes",
        "gauge",
        "Processes joined to the allocation.",
    ),
    (
        "tessera_allocation_wait_seconds_total",
        "counter",
        "Time the allocation's processes spent waiting for the GPU.",
    ),
    (
        "tessera_allocation_oom_refused_total",
        "counter",
        "Allocations refused because they would exceed the memory limit.",
    ),
    (
        "tessera_allocation_priority",
        "gauge",
        "Priority for burst time (higher first; 0 by default).",
    ),
    (
        "tessera_allocation_paused",
        "gauge",
        "1 while the allocation is paused (tessera pause), else 0.",
    ),
    (
        "tessera_allocation_paused_seconds_total",
        "counter",
        "Time the allocation has spent paused.",
    ),
    (
        "tessera_allocation_recovered",
        "gauge",
        "1 for an allocation whose files were found damaged at start-up and repaired, by what was repaired (record, control, state).",
    ),
    (
        "tessera_backstop_stops_total",
        "counter",
        "Processes the backstop stopped (SIGKILL) since the manager started, by reason and owner.",
    ),
    (
        "tessera_backstop_stopped_bytes_total",
        "counter",
        "GPU memory the processes the backstop stopped held at their samples, by reason and owner.",
    ),
    (
        "tessera_backstop_held_bytes",
        "gauge",
        "Memory the allocation's processes held on the GPU at the backstop's last pass, by the driver's count.",
    ),
    (
        "tessera_backstop_over_limit_bytes",
        "gauge",
        "How far the allocation was over its limit on the GPU at the backstop's last pass, by the driver's count, before any stop (0 within).",
    ),
    (
        "tessera_backstop_passes_total",
        "counter",
        "Backstop passes completed since the manager started.",
    ),
    (
        "tessera_manager_passes_total",
        "counter",
        "Background passes the manager completed since it started, by pass (reaper, gpu_event: GPU events handled, gpu_event_wait: waits of the GPU event watcher, above 0 once it is registered).",
    ),
];

type Labels = Vec<(String, String)>;

/// One family of the exposition, of either kind.
#[derive(Clone)]
enum Series {
    Gauge(Family<Labels, Gauge<f64, AtomicU64>>),
    Counter(Family<Labels, Counter<f64, AtomicU64>>),
}

impl Series {
    fn add(&self, labels: Labels, v: f64) {
        match self {
            Series::Gauge(f) => {
                f.get_or_create(&labels).set(v);
            }
            Series::Counter(f) => {
                // A counter the snapshot already totals: one increment by
                // the total, on a family made fresh for this scrape.
                f.get_or_create(&labels).inc_by(v);
            }
        }
    }
}

/// Label pairs, owned, in the order given.
fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// dcgm-exporter's labels of a GPU, so that dashboards can join the two.
fn gpu_labels<'a>(
    host: &'a str,
    idx: &'a str,
    uuid: &'a str,
    model: &'a str,
) -> [(&'static str, &'a str); 4] {
    [
        ("gpu", idx),
        ("UUID", uuid),
        ("modelName", model),
        ("Hostname", host),
    ]
}

/// A GPU's labels, then the owner's: a series about an allocation (or a
/// process in none, all four empty) on that GPU.
fn owner_labels(gpu: &[(&str, &str)], owner: [&String; 4]) -> Labels {
    let [allocation, namespace, pod, container] = owner;
    let mut l = gpu.to_vec();
    l.extend([
        ("allocation", allocation.as_str()),
        ("namespace", namespace.as_str()),
        ("pod", pod.as_str()),
        ("container", container.as_str()),
    ]);
    labels(&l)
}

/// Renders the exposition (Prometheus text format 0.0.4). A family with no
/// series (no allocation yet, no arbiter measuring) is left out, HELP and
/// TYPE included, as the library does.
pub fn render(s: &MetricsSnapshot) -> String {
    let mut registry = Registry::default();
    let mut series: HashMap<&str, Series> = HashMap::new();
    for (name, kind, help) in METRICS {
        // The library adds the help's final period and a counter's
        // `_total` itself.
        let help = help.strip_suffix('.').unwrap_or(help);
        let family = if *kind == "counter" {
            let f = Family::<Labels, Counter<f64, AtomicU64>>::default();
            let base = name.strip_suffix("_total").unwrap_or(name);
            registry.register(base, help, f.clone());
            Series::Counter(f)
        } else {
            let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            registry.register(*name, help, f.clone());
            Series::Gauge(f)
        };
        series.insert(name, family);
    }
    let add = |name: &str, l: Labels, v: f64| {
        if let Some(f) = series.get(name) {
            f.add(l, v);
        }
    };
    let subject_labels = |x: &Subject| {
        let idx = x.gpu_index.to_string();
        let gpu = gpu_labels(&s.hostname, &idx, &x.uuid, &x.model);
        owner_labels(&gpu, [&x.allocation, &x.namespace, &x.pod, &x.container])
    };
    for g in &s.gpus {
        let idx = g.index.to_string();
        let base = gpu_labels(&s.hostname, &idx, &g.uuid, &g.model);
        let l = labels(&base);
        for (name, v) in [
            ("tessera_gpu_memory_used_bytes", g.memory_used_bytes as f64),
            (
                "tessera_gpu_memory_total_bytes",
                g.memory_total_bytes as f64,
            ),
            ("tessera_gpu_utilization_ratio", g.utilization_ratio),
            (
                "tessera_gpu_temperature_celsius",
                f64::from(g.temperature_celsius),
            ),
            ("tessera_gpu_power_watts", g.power_watts),
            (
                "tessera_gpu_slices_allocated",
                f64::from(g.slices_allocated),
            ),
            ("tessera_gpu_slices", f64::from(g.slices_total)),
            ("tessera_gpu_healthy", if g.healthy { 1.0 } else { 0.0 }),
        ] {
            add(name, l.clone(), v);
        }
        let mut info = base.to_vec();
        info.push(("vendor", &g.vendor));
        add("tessera_gpu_info", labels(&info), 1.0);
        for (reason, n) in &g.ungoverned {
            let mut with = base.to_vec();
            with.push(("reason", reason));
            add("tessera_ungoverned_processes", labels(&with), *n as f64);
        }
    }
    for a in &s.allocations {
        let l = subject_labels(&a.subject);
        let achieved = a.compute_achieved_ratio;
        for (name, v) in [
            (
                "tessera_allocation_memory_limit_bytes",
                Some(a.memory_limit_bytes as f64),
            ),
            (
                "tessera_allocation_memory_used_bytes",
                Some(a.memory_used_bytes as f64),
            ),
            (
                "tessera_allocation_compute_share_ratio",
                Some(a.compute_share_ratio),
            ),
            // No arbiter measuring: no series.
            ("tessera_allocation_compute_achieved_ratio", achieved),
            ("tessera_allocation_processes", Some(a.processes as f64)),
            (
                "tessera_allocation_wait_seconds_total",
                Some(a.wait_seconds_total),
            ),
            (
                "tessera_allocation_oom_refused_total",
                Some(a.oom_refused_total as f64),
            ),
            ("tessera_allocation_priority", Some(f64::from(a.priority))),
            (
                "tessera_allocation_paused",
                Some(if a.paused { 1.0 } else { 0.0 }),
            ),
            (
                "tessera_allocation_paused_seconds_total",
                Some(a.paused_seconds_total),
            ),
        ] {
            if let Some(v) = v {
                add(name, l.clone(), v);
            }
        }
    }
    for r in &s.recovered {
        let mut l = subject_labels(&r.subject);
        l.push(("repaired".into(), r.repaired.clone()));
        add("tessera_allocation_recovered", l, 1.0);
    }
    for b in &s.backstop_stops {
        let mut l = subject_labels(&b.subject);
        l.push(("reason".into(), b.reason.into()));
        add("tessera_backstop_stops_total", l.clone(), b.stops as f64);
        add("tessera_backstop_stopped_bytes_total", l, b.bytes as f64);
    }
    for b in &s.backstop_standings {
        let l = subject_labels(&b.subject);
        add(
            "tessera_backstop_held_bytes",
            l.clone(),
            b.held_bytes as f64,
        );
        add(
            "tessera_backstop_over_limit_bytes",
            l,
            b.over_limit_bytes as f64,
        );
    }
    add(
        "tessera_backstop_passes_total",
        labels(&[("Hostname", &s.hostname)]),
        s.backstop_passes as f64,
    );
    for (pass, n) in [
        ("reaper", s.reaper_passes),
        ("gpu_event", s.gpu_events),
        ("gpu_event_wait", s.gpu_event_waits),
    ] {
        let l = labels(&[("Hostname", &s.hostname), ("pass", pass)]);
        add("tessera_manager_passes_total", l, n as f64);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_text::encode(&mut out, &registry);
    out
}

/// The content type of the text exposition.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;
/// How much the endpoint holds at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections in all.
    pub connections: usize,
    /// Open connections from one address.
    pub per_peer: usize,
    /// Expositions being rendered.
    pub renders: usize,
    /// Time a client has to send its request head ([`HEADER_TIMEOUT`]).
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            per_peer: 8,
            renders: 4,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}
/// Time a client has to send its request head (Prometheus sends it at once).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time one connection may take, request to last byte.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// Largest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;

fn text(status: StatusCode, ctype: &'static str, body: String) -> Response<String> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    r
}

/// The response to one parsed request; `body` renders the exposition
/// (only for `GET`/`HEAD /metrics`, after the request was read).
async fn respond(
    req: Request<Incoming>,
    body: Arc<dyn Fn() -> String + Send + Sync>,
    renders: Arc<tokio::sync::Semaphore>,
) -> Response<String> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET and HEAD\n".into(),
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            // Rendering reads shared memory and takes locks: off the
            // async workers, a few at a time.
            let Ok(_turn) = renders.acquire_owned().await else {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "shutting down\n".into(),
                );
            };
            match tokio::task::spawn_blocking(move || body()).await {
                Ok(t) => text(StatusCode::OK, CONTENT_TYPE, t),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    "rendering failed\n".into(),
                ),
            }
        }
        "/" => text(
            StatusCode::OK,
            PLAIN,
            "Tessera manager: metrics at /metrics\n".into(),
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
    }
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Open connections, in all and per address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One open connection's place in [`Open`], given back when dropped.
struct Slot {
    open: Arc<parking_lot::Mutex<Open>>,
    peer: IpAddr,
}

impl Slot {
    /// A place for a connection from `peer`, or `None` past the limits.
    fn take(open: &Arc<parking_lot::Mutex<Open>>, peer: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut o = open.lock();
        let mine = o.by_peer.get(&peer).copied().unwrap_or(0);
        if o.total >= limits.connections || mine >= limits.per_peer {
            return None;
        }
        o.total += 1;
        o.by_peer.insert(peer, mine + 1);
        Some(Slot {
            open: open.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock();
        o.total -= 1;
        if let Some(n) = o.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                o.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Serves `GET /metrics` with `body()` until `stop` turns true, within the
/// default [`Limits`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    serve_with(listener, body, stop, Limits::default()).await
}

/// [`serve`] within `limits`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) {
    let body: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(body);
    let renders = Arc::new(tokio::sync::Semaphore::new(limits.renders.max(1)));
    let open = Arc::new(parking_lot::Mutex::new(Open::default()));
    loop {
        let accepted = tokio::select! {
            () = stopped(&mut stop) => return,
            accepted = listener.accept() => accepted,
        };
        let (conn, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: back off rather than spin.
                tracing::debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Past a limit the connection is closed unread: it costs nothing
        // and leaves room for others.
        let Some(slot) = Slot::take(&open, peer.ip(), &limits) else {
            drop(conn);
            continue;
        };
        let body = body.clone();
        let renders = renders.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let body = body.clone();
                let renders = renders.clone();
                async move { Ok::<_, Infallible>(respond(req, body, renders).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(false)
                .serve_connection(TokioIo::new(conn), service);
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Allocation a1's owner on GPU 0, as the snapshot's allocation has it.
    fn owned() -> Subject {
        Subject {
            gpu_index: 0,
            uuid: "GPU-a".into(),
            model: "Sim \"H100\"".into(),
            allocation: "a1".into(),
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
        }
    }

    fn snapshot() -> MetricsSnapshot {
        MetricsSnapshot {
            hostname: "node-1".into(),
            gpus: vec![GpuMetrics {
                index: 0,
                uuid: "GPU-a".into(),
                model: "Sim \"H100\"".into(),
                vendor: "nvidia".into(),
                memory_used_bytes: 1 << 30,
                memory_total_bytes: 16 << 30,
                utilization_ratio: 0.25,
                temperature_celsius: 40,
                power_watts: 123.5,
                slices_allocated: 3,
                slices_total: 10,
                healthy: true,
                ungoverned: [("no_shim", 1), ("over_limit", 0)].into_iter().collect(),
            }],
            allocations: vec![AllocMetrics {
                subject: owned(),
                memory_limit_bytes: 4 << 30,
                memory_used_bytes: 1 << 20,
                compute_share_ratio: 0.3,
                compute_achieved_ratio: None,
                processes: 2,
                wait_seconds_total: 1.5,
                oom_refused_total: 7,
                priority: -2,
                paused: true,
                paused_seconds_total: 2.5,
            }],
            recovered: vec![RecoveredMetrics {
                subject: owned(),
                repaired: "record+state".into(),
            }],
            backstop_stops: vec![
                StopMetrics {
                    subject: owned(),
                    reason: "over_limit",
                    stops: 3,
                    bytes: 5 << 30,
                },
                StopMetrics {
                    subject: Subject {
                        gpu_index: 0,
                        uuid: "GPU-a".into(),
                        model: "Sim \"H100\"".into(),
                        ..Default::default()
                    },
                    reason: "no_shim",
                    stops: 1,
                    bytes: 1 << 20,
                },
            ],
            backstop_passes: 42,
            backstop_standings: vec![StandingMetrics {
                subject: owned(),
                held_bytes: 6 << 30,
                over_limit_bytes: 2 << 30,
            }],
            reaper_passes: 5,
            gpu_events: 2,
            gpu_event_waits: 9,
        }
    }

    /// The value of the sample `name` + `labels` (exactly as exposed).
    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        let prefix = format!("{name}{labels} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn every_family_has_help_and_type_and_the_values_are_exact() {
        let text = render(&snapshot());
        for (name, kind, help) in METRICS {
            if *name == "tessera_allocation_compute_achieved_ratio" {
                continue; // no series: see below
            }
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
            assert!(text.contains(&format!("# HELP {name} {help}\n")), "{name}");
        }
        let gpu = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1"}"#;
        let no_shim =
            r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",reason="no_shim"}"#;
        let alloc = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",allocation="a1",namespace="ns",pod="p",container="c"}"#;
        let recovered = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",allocation="a1",namespace="ns",pod="p",container="c",repaired="record+state"}"#;
        let stops = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",allocation="a1",namespace="ns",pod="p",container="c",reason="over_limit"}"#;
        let stray = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",allocation="",namespace="",pod="",container="",reason="no_shim"}"#;
        for (name, labels, want) in [
            ("tessera_gpu_memory_total_bytes", gpu, 17179869184.0),
            ("tessera_gpu_utilization_ratio", gpu, 0.25),
            ("tessera_gpu_power_watts", gpu, 123.5),
            ("tessera_gpu_healthy", gpu, 1.0),
            ("tessera_gpu_slices", gpu, 10.0),
            ("tessera_gpu_slices_allocated", gpu, 3.0),
            (
                "tessera_gpu_info",
                r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",vendor="nvidia"}"#,
                1.0,
            ),
            ("tessera_ungoverned_processes", no_shim, 1.0),
            ("tessera_allocation_compute_share_ratio", alloc, 0.3),
            ("tessera_allocation_oom_refused_total", alloc, 7.0),
            ("tessera_allocation_priority", alloc, -2.0),
            ("tessera_allocation_paused", alloc, 1.0),
            ("tessera_allocation_paused_seconds_total", alloc, 2.5),
            ("tessera_allocation_wait_seconds_total", alloc, 1.5),
            ("tessera_allocation_recovered", recovered, 1.0),
            ("tessera_backstop_stops_total", stops, 3.0),
            ("tessera_backstop_stops_total", stray, 1.0),
            ("tessera_backstop_stopped_bytes_total", stops, 5368709120.0),
            ("tessera_backstop_stopped_bytes_total", stray, 1048576.0),
            ("tessera_backstop_held_bytes", alloc, 6442450944.0),
            ("tessera_backstop_over_limit_bytes", alloc, 2147483648.0),
            (
                "tessera_backstop_passes_total",
                r#"{Hostname="node-1"}"#,
                42.0,
            ),
            (
                "tessera_manager_passes_total",
                r#"{Hostname="node-1",pass="reaper"}"#,
                5.0,
            ),
            (
                "tessera_manager_passes_total",
                r#"{Hostname="node-1",pass="gpu_event"}"#,
                2.0,
            ),
            (
                "tessera_manager_passes_total",
                r#"{Hostname="node-1",pass="gpu_event_wait"}"#,
                9.0,
            ),
        ] {
            assert_eq!(sample(&text, name, labels), Some(want), "{name}{labels}");
        }
        assert!(!text.contains("tessera_gpu_slices_total"), "{text}");
        // No arbiter: no achieved series, and so no family.
        assert!(!text.contains("tessera_allocation_compute_achieved_ratio"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = snapshot();
        s.gpus[0].model = "a\\b\"c\nd".into();
        let text = render(&s);
        assert!(text.contains(r#"modelName="a\\b\"c\nd""#), "{text}");
    }

    /// A server on a free port whose renders are counted.
    struct TestServer {
        addr: std::net::SocketAddr,
        renders: Arc<AtomicUsize>,
        stop: tokio::sync::watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    impl TestServer {
        async fn start() -> Self {
            Self::with(Limits::default()).await
        }

        async fn with(limits: Limits) -> Self {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let renders = Arc::new(AtomicUsize::new(0));
            let r = renders.clone();
            let (stop, rx) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(serve_with(
                l,
                move || {
                    r.fetch_add(1, Ordering::SeqCst);
                    "up 1\n".to_owned()
                },
                rx,
                limits,
            ));
            TestServer {
                addr,
                renders,
                stop,
                task,
            }
        }

        fn renders(&self) -> usize {
            self.renders.load(Ordering::SeqCst)
        }

        /// Stops it and waits until it has.
        async fn stop(self) {
            self.stop.send(true).unwrap();
            self.task.await.unwrap();
        }

        async fn connect(&self) -> tokio::net::TcpStream {
            tokio::net::TcpStream::connect(self.addr).await.unwrap()
        }
    }

    async fn exchange(c: &mut tokio::net::TcpStream, req: &str) -> String {
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_routes_over_http() {
        let srv = TestServer::start().await;
        let addr = srv.addr;
        let get = |req: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            exchange(&mut c, req).await
        };
        let out = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(
            out.to_ascii_lowercase()
                .contains(&format!("content-type: {CONTENT_TYPE}")),
            "{out}"
        );
        assert!(out.ends_with("\r\n\r\nup 1\n"), "{out}");
        let out = get("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\n"),
            "{out}"
        );
        let out = get("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        let out = get("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        let out = get("this is not http\r\n\r\n").await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
        // Only the two requests for /metrics rendered.
        assert_eq!(srv.renders(), 2);
        srv.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_rendered_before_the_request_is_read() {
        let srv = TestServer::start().await;
        let mut c = srv.connect().await;
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost").await.unwrap();
        // On the paused clock this sleep ends only once every task is idle:
        // the server has read all there is and waits for the rest.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(srv.renders(), 0, "rendered on connect");
        let out = exchange(&mut c, ": x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert_eq!(srv.renders(), 1);
        srv.stop().await;
    }

    /// A connection to `addr` from the local address `from`.
    async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> tokio::net::TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind((std::net::Ipv4Addr::from(from), 0).into()).unwrap();
        s.connect(addr).await.unwrap()
    }

    /// True when the server closes `c` without a word.
    async fn closed_unanswered(c: &mut tokio::net::TcpStream) -> bool {
        let _ = c
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut out = Vec::new();
        // A hang guard: the server closes it at once, but a loaded box runs it late.
        let read = tokio::time::timeout(HANG, c.read_to_end(&mut out)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_))) && out.is_empty()
    }

    /// How long a test waits for what must happen: a hang guard, never a
    /// measure (the suite runs beside busy CPUs).
    const HANG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn one_address_cannot_hold_every_connection() {
        // The idle connections must stay open through the test: with the
        // default 2 s header timeout a loaded box could see them closed (and
        // their places given back) before the caps are tried.
        let limits = Limits {
            connections: 6,
            per_peer: 3,
            renders: 1,
            header_timeout: Duration::from_secs(600),
        };
        let srv = TestServer::with(limits).await;
        let addr = srv.addr;
        // One address's idle connections up to its share ...
        let mut idle = Vec::new();
        for _ in 0..limits.per_peer {
            idle.push(connect_from([127, 0, 0, 1], addr).await);
        }
        // ... and one more from it is closed unread,
        let mut extra = connect_from([127, 0, 0, 1], addr).await;
        assert!(
            closed_unanswered(&mut extra).await,
            "past the per-address cap"
        );
        // while another address is served at once.
        let mut other = connect_from([127, 0, 0, 2], addr).await;
        let out = exchange(&mut other, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert_eq!(srv.renders(), 1);
        // Past the total, every address is refused.
        for _ in 0..limits.per_peer {
            idle.push(connect_from([127, 0, 0, 3], addr).await);
        }
        let mut fourth = connect_from([127, 0, 0, 4], addr).await;
        assert!(closed_unanswered(&mut fourth).await, "past the total cap");
        // Connections that end give their place back.
        drop(idle);
        let out = tokio::time::timeout(HANG, async {
            loop {
                let mut c = connect_from([127, 0, 0, 1], addr).await;
                let out = exchange(&mut c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
                if !out.is_empty() {
                    return out;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("served once the idle connections ended");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        srv.stop().await;
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_header_timeout() {
        let srv = TestServer::start().await;
        // Before the connection exists: the connection deadline, counted from
        // the server's accept, cannot end it before t0 + CONNECTION_DEADLINE.
        let t0 = std::time::Instant::now();
        let mut c = srv.connect().await;
        let mut out = Vec::new();
        // The wait is a hang guard, not a measure.
        let read = tokio::time::timeout(HANG, c.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "still open after {HANG:?}");
        // Closed by the header timeout (2 s), not by the connection deadline:
        // only a box stalled for most of 30 s could blur the two.
        let closed = t0.elapsed();
        assert!(
            closed < CONNECTION_DEADLINE,
            "closed after {closed:?}: by the connection deadline"
        );
        assert_eq!(srv.renders(), 0);
        srv.stop().await;
    }
}
