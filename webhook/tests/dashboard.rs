//! The Grafana dashboard: valid JSON, every query over the manager's agreed metric names
//! (a renamed metric would leave a panel empty), every agreed metric shown somewhere.

use std::collections::BTreeSet;

use serde_json::Value;

const DASHBOARD: &str = include_str!("../../deploy/grafana/tessera-dashboard.json");

/// The manager's metrics as agreed in docs/architecture.md.
const METRICS: &[&str] = &[
    "tessera_gpu_memory_used_bytes",
    "tessera_gpu_memory_total_bytes",
    "tessera_gpu_utilization_ratio",
    "tessera_gpu_temperature_celsius",
    "tessera_gpu_power_watts",
    "tessera_gpu_slices_allocated",
    "tessera_gpu_slices",
    "tessera_gpu_healthy",
    "tessera_allocation_memory_limit_bytes",
    "tessera_allocation_memory_used_bytes",
    "tessera_allocation_compute_share_ratio",
    "tessera_allocation_compute_achieved_ratio",
    "tessera_allocation_processes",
    "tessera_allocation_wait_seconds_total",
    "tessera_allocation_oom_refused_total",
    "tessera_ungoverned_processes",
];

/// Label names the agreed series carry.
const LABELS: &[&str] = &[
    "gpu",
    "UUID",
    "modelName",
    "Hostname",
    "allocation",
    "namespace",
    "pod",
    "container",
];

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("tessera_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn all_panels(v: &Value, out: &mut Vec<Value>) {
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p.clone());
        all_panels(p, out);
    }
}

#[test]
fn queries_use_only_agreed_metrics_and_show_all_of_them() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    let mut panels = Vec::new();
    all_panels(&dash, &mut panels);
    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for p in &panels {
        assert!(
            ids.insert(p["id"].as_i64().expect("panel id")),
            "duplicate id"
        );
        assert!(p["gridPos"]["w"].as_i64().is_some(), "{}", p["title"]);
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{expr}");
            for n in names {
                assert!(
                    METRICS.contains(&n.as_str()),
                    "unknown metric {n} in {expr}"
                );
                used.insert(n);
            }
            // Legends name only labels the series have.
            let legend = t["legendFormat"].as_str().unwrap_or_default();
            for part in legend.split("{{").skip(1) {
                let label = part.split("}}").next().unwrap_or_default().trim();
                assert!(LABELS.contains(&label), "unknown label {label} in {legend}");
            }
        }
    }
    let all: BTreeSet<String> = METRICS.iter().map(|s| s.to_string()).collect();
    assert_eq!(used, all, "every agreed metric appears in some panel");

    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "node", "gpu", "namespace"]);
}

#[test]
fn metric_name_scanner_finds_names() {
    assert_eq!(
        metric_names("sum(tessera_a_b{x=\"y\"}) / sum(tessera_c)"),
        ["tessera_a_b", "tessera_c"]
    );
    assert!(metric_names("up").is_empty());
}
