//! Prometheus metrics: the text exposition (format 0.0.4), rendered from a
//! plain snapshot by a pure function, and a minimal HTTP/1.1 responder for
//! `GET /metrics`. GPU series carry dcgm-exporter's labels (`gpu`, `UUID`,
//! `modelName`, `Hostname`) so dashboards can join the two.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One GPU's values.
#[derive(Debug, Clone, Default)]
pub struct GpuMetrics {
    pub index: u32,
    pub uuid: String,
    pub model: String,
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
    pub gpu_index: u32,
    pub uuid: String,
    pub model: String,
    pub allocation: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub memory_limit_bytes: u64,
    pub memory_used_bytes: u64,
    pub compute_share_ratio: f64,
    /// `None` when no arbiter measures it: the series is left out.
    pub compute_achieved_ratio: Option<f64>,
    pub processes: u64,
    pub wait_seconds_total: f64,
    pub oom_refused_total: u64,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct MetricsSnapshot {
    pub hostname: String,
    pub gpus: Vec<GpuMetrics>,
    pub allocations: Vec<AllocMetrics>,
}

/// Every metric: name, type, help. The order is the exposition's.
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
    (
        "tessera_gpu_slices_total",
        "gauge",
        "Slices the GPU is cut into.",
    ),
    (
        "tessera_gpu_healthy",
        "gauge",
        "1 when the GPU is healthy, 0 when not.",
    ),
    (
        "tessera_ungoverned_processes",
        "gauge",
        "Processes using the GPU outside their allocation, by reason (no_shim, other_gpu, over_limit).",
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
];

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A sample value as Prometheus reads it.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders the exposition.
pub fn render(s: &MetricsSnapshot) -> String {
    let mut rows: BTreeMap<&str, Vec<(String, f64)>> = BTreeMap::new();
    let mut add = |name: &'static str, l: String, v: f64| {
        rows.entry(name).or_default().push((l, v));
    };
    for g in &s.gpus {
        let idx = g.index.to_string();
        let base = [
            ("gpu", idx.as_str()),
            ("UUID", g.uuid.as_str()),
            ("modelName", g.model.as_str()),
            ("Hostname", s.hostname.as_str()),
        ];
        let l = labels(&base);
        add(
            "tessera_gpu_memory_used_bytes",
            l.clone(),
            g.memory_used_bytes as f64,
        );
        add(
            "tessera_gpu_memory_total_bytes",
            l.clone(),
            g.memory_total_bytes as f64,
        );
        add(
            "tessera_gpu_utilization_ratio",
            l.clone(),
            g.utilization_ratio,
        );
        add(
            "tessera_gpu_temperature_celsius",
            l.clone(),
            f64::from(g.temperature_celsius),
        );
        add("tessera_gpu_power_watts", l.clone(), g.power_watts);
        add(
            "tessera_gpu_slices_allocated",
            l.clone(),
            f64::from(g.slices_allocated),
        );
        add(
            "tessera_gpu_slices_total",
            l.clone(),
            f64::from(g.slices_total),
        );
        add("tessera_gpu_healthy", l, if g.healthy { 1.0 } else { 0.0 });
        for (reason, n) in &g.ungoverned {
            let mut with = base.to_vec();
            with.push(("reason", reason));
            add("tessera_ungoverned_processes", labels(&with), *n as f64);
        }
    }
    for a in &s.allocations {
        let idx = a.gpu_index.to_string();
        let l = labels(&[
            ("gpu", idx.as_str()),
            ("UUID", a.uuid.as_str()),
            ("modelName", a.model.as_str()),
            ("Hostname", s.hostname.as_str()),
            ("allocation", a.allocation.as_str()),
            ("namespace", a.namespace.as_str()),
            ("pod", a.pod.as_str()),
            ("container", a.container.as_str()),
        ]);
        add(
            "tessera_allocation_memory_limit_bytes",
            l.clone(),
            a.memory_limit_bytes as f64,
        );
        add(
            "tessera_allocation_memory_used_bytes",
            l.clone(),
            a.memory_used_bytes as f64,
        );
        add(
            "tessera_allocation_compute_share_ratio",
            l.clone(),
            a.compute_share_ratio,
        );
        if let Some(r) = a.compute_achieved_ratio {
            add("tessera_allocation_compute_achieved_ratio", l.clone(), r);
        }
        add(
            "tessera_allocation_processes",
            l.clone(),
            a.processes as f64,
        );
        add(
            "tessera_allocation_wait_seconds_total",
            l.clone(),
            a.wait_seconds_total,
        );
        add(
            "tessera_allocation_oom_refused_total",
            l,
            a.oom_refused_total as f64,
        );
    }
    let mut out = String::new();
    for (name, kind, help) in METRICS {
        // HELP and TYPE always, so a scraper learns every family even on a
        // node with no allocations yet.
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (l, v) in rows.get(name).map(Vec::as_slice).unwrap_or_default() {
            let _ = writeln!(out, "{name}{l} {}", value(*v));
        }
    }
    out
}

/// The content type of the text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The response to one request head.
fn respond(head: &str, body: &dyn Fn() -> String) -> (String, String) {
    let mut parts = head
        .lines()
        .next()
        .unwrap_or_default()
        .split_ascii_whitespace();
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default();
    let (status, ctype, text) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, body()),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "Tessera manager: metrics at /metrics\n".to_owned(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".into(),
        ),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text.len()
    );
    let body = if method == "HEAD" {
        String::new()
    } else {
        text
    };
    (header, body)
}

async fn handle(mut conn: tokio::net::TcpStream, body: &(dyn Fn() -> String + Sync)) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head (the body of a GET is ignored); cap its size
    // and time so a slow or hostile client cannot hold the task.
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() > 16 * 1024 {
                break;
            }
        }
        std::io::Result::Ok(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return;
    }
    let head = String::from_utf8_lossy(&buf);
    let (header, text) = respond(&head, &body);
    let _ = conn.write_all(header.as_bytes()).await;
    let _ = conn.write_all(text.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// Serves `GET /metrics` with `body()` until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let body = std::sync::Arc::new(body);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => {
                let Ok((conn, _)) = accepted else { continue };
                let body = body.clone();
                tokio::spawn(async move {
                    // Rendering reads shared memory and takes locks: keep
                    // it off the async workers.
                    let text = tokio::task::spawn_blocking(move || body()).await.unwrap_or_default();
                    handle(conn, &move || text.clone()).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> MetricsSnapshot {
        MetricsSnapshot {
            hostname: "node-1".into(),
            gpus: vec![GpuMetrics {
                index: 0,
                uuid: "GPU-a".into(),
                model: "Sim \"H100\"".into(),
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
                gpu_index: 0,
                uuid: "GPU-a".into(),
                model: "Sim \"H100\"".into(),
                allocation: "a1".into(),
                namespace: "ns".into(),
                pod: "p".into(),
                container: "c".into(),
                memory_limit_bytes: 4 << 30,
                memory_used_bytes: 1 << 20,
                compute_share_ratio: 0.3,
                compute_achieved_ratio: None,
                processes: 2,
                wait_seconds_total: 1.5,
                oom_refused_total: 7,
            }],
        }
    }

    #[test]
    fn every_family_has_help_and_type_and_the_values_are_exact() {
        let text = render(&snapshot());
        for (name, kind, _) in METRICS {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
        let gpu = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1"}"#;
        assert!(text.contains(&format!(
            "tessera_gpu_memory_total_bytes{gpu} 17179869184\n"
        )));
        assert!(text.contains(&format!("tessera_gpu_utilization_ratio{gpu} 0.25\n")));
        assert!(text.contains(&format!("tessera_gpu_power_watts{gpu} 123.5\n")));
        assert!(text.contains(&format!("tessera_gpu_healthy{gpu} 1\n")));
        assert!(text.contains(
            r#"tessera_ungoverned_processes{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",reason="no_shim"} 1"#
        ));
        let alloc = r#"{gpu="0",UUID="GPU-a",modelName="Sim \"H100\"",Hostname="node-1",allocation="a1",namespace="ns",pod="p",container="c"}"#;
        assert!(text.contains(&format!(
            "tessera_allocation_compute_share_ratio{alloc} 0.3\n"
        )));
        assert!(text.contains(&format!("tessera_allocation_oom_refused_total{alloc} 7\n")));
        assert!(text.contains(&format!(
            "tessera_allocation_wait_seconds_total{alloc} 1.5\n"
        )));
        // No arbiter: no achieved series, but the family is declared.
        assert!(!text.contains("tessera_allocation_compute_achieved_ratio{"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }

    #[test]
    fn http_routes() {
        let body = || "x 1\n".to_owned();
        let (h, b) = respond("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", &body);
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n") && h.contains(CONTENT_TYPE));
        assert!(h.contains("Content-Length: 4\r\n"));
        assert_eq!(b, "x 1\n");
        let (h, b) = respond("HEAD /metrics HTTP/1.1\r\n\r\n", &body);
        assert!(h.contains("Content-Length: 4") && b.is_empty());
        assert!(
            respond("GET /nope HTTP/1.1\r\n\r\n", &body)
                .0
                .contains("404")
        );
        assert!(
            respond("POST /metrics HTTP/1.1\r\n\r\n", &body)
                .0
                .contains("405")
        );
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(serve(l, || "up 1\n".to_owned(), rx));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.ends_with("\r\n\r\nup 1\n"), "{out}");
        tx.send(true).unwrap();
        server.await.unwrap();
    }
}
