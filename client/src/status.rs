//! `tessera status`: one table like `nvidia-smi`'s, per GPU and per
//! allocation, or the same as JSON.

use serde_json::{Value, json};
use tessera_proto::manager::v1 as pb;

use tessera_contract::units::{FULL_COMPUTE_PPM, format_bytes, format_ppm};

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera status` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tessera status`, printing to stdout.
pub fn status(args: &StatusArgs) -> Result<(), CliError> {
    let rt = runtime()?;
    let status = rt.block_on(async {
        let mut c = client::connect(&args.socket.socket).await?;
        let s = c.get_node_status(pb::NodeStatusRequest {}).await?;
        Ok::<_, CliError>(s.into_inner())
    })?;
    if args.json {
        let text = serde_json::to_string_pretty(&to_json(&status)).map_err(|e| CliError::Io {
            what: "cannot write JSON".into(),
            error: std::io::Error::other(e),
        })?;
        println!("{text}");
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// Pads columns to their widest cell, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn s(x: impl Into<String>) -> String {
    x.into()
}

fn policy_str(raw: i32) -> &'static str {
    match pb::ComputePolicy::try_from(raw) {
        Ok(pb::ComputePolicy::Guaranteed) => "guaranteed",
        Ok(pb::ComputePolicy::Burst) => "burst",
        _ => "default",
    }
}

fn owner(a: &pb::Allocation) -> String {
    if a.pod.is_empty() {
        a.labels
            .get("source")
            .map(|src| format!("({src})"))
            .unwrap_or_else(|| "-".into())
    } else if a.container.is_empty() {
        format!("{}/{}", a.namespace, a.pod)
    } else {
        format!("{}/{}/{}", a.namespace, a.pod, a.container)
    }
}

/// The table `tessera status` prints.
/// A GPU's vendor; none from a manager older than vendors, which read only
/// NVIDIA's GPUs.
fn vendor(g: &pb::GpuStatus) -> &str {
    if g.vendor.is_empty() {
        "nvidia"
    } else {
        &g.vendor
    }
}

pub fn render(st: &pb::NodeStatus) -> String {
    let mut out = format!(
        "Tessera on {} · driver {} · {} GPU{} · {} allocation{}\n\n",
        st.hostname,
        if st.driver_version.is_empty() {
            "?"
        } else {
            &st.driver_version
        },
        st.gpus.len(),
        if st.gpus.len() == 1 { "" } else { "s" },
        st.allocations.len(),
        if st.allocations.len() == 1 { "" } else { "s" },
    );
    let mut rows = vec![vec![
        s("GPU"),
        s("VENDOR"),
        s("NAME"),
        s("MEMORY USED"),
        s("UTIL"),
        s("TEMP"),
        s("POWER"),
        s("ALLOCATED MEM"),
        s("ALLOCATED COMPUTE"),
        s("HEALTH"),
    ]];
    for g in &st.gpus {
        rows.push(vec![
            g.index.to_string(),
            s(vendor(g)),
            g.name.clone(),
            format!(
                "{} / {}",
                format_bytes(g.memory_used_bytes),
                format_bytes(g.memory_total_bytes)
            ),
            format!("{}%", g.utilization_percent),
            format!("{}C", g.temperature_c),
            format!("{:.0}W", f64::from(g.power_mw) / 1000.0),
            format!(
                "{} / {}",
                format_bytes(g.memory_allocated_bytes),
                format_bytes(g.memory_total_bytes)
            ),
            format_ppm(g.compute_allocated_ppm),
            if g.healthy {
                s("ok")
            } else {
                format!("UNHEALTHY: {}", g.unhealthy_reason)
            },
        ]);
    }
    out.push_str(&table(&rows));

    let gpu_index = |uuid: &str| {
        st.gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.index.to_string())
            .unwrap_or_else(|| "?".into())
    };
    out.push('\n');
    if st.allocations.is_empty() {
        out.push_str("No allocations.\n");
        return out;
    }
    let mut rows = vec![vec![
        s("ALLOCATION"),
        s("GPU"),
        s("POLICY"),
        s("MEMORY USED / LIMIT"),
        s("COMPUTE ACHIEVED / TARGET"),
        s("WAITED"),
        s("OOM"),
        s("PROCS"),
        s("OWNER"),
    ]];
    let mut procs = vec![vec![
        s("ALLOCATION"),
        s("HOST PID"),
        s("PID"),
        s("GPU MEMORY"),
    ]];
    for a in &st.allocations {
        let Some(rec) = &a.allocation else { continue };
        for d in &a.devices {
            rows.push(vec![
                rec.id.clone(),
                gpu_index(&d.gpu_uuid),
                {
                    let mut p = s(policy_str(rec.policy));
                    if rec.priority != 0 {
                        p.push_str(&format!(" p{}", rec.priority));
                    }
                    if a.paused {
                        p.push_str(&format!(", PAUSED {:.1}s", a.paused_ns_total as f64 / 1e9));
                    }
                    if !a.recovered.is_empty() {
                        p.push_str(", RECOVERED");
                    }
                    p
                },
                format!(
                    "{} / {}",
                    format_bytes(d.memory_used_bytes),
                    format_bytes(d.memory_limit_bytes)
                ),
                format!(
                    "{} / {}",
                    // A whole GPU is not arbitrated: nothing is measured.
                    if d.compute_share_ppm >= FULL_COMPUTE_PPM && d.compute_achieved_ppm == 0 {
                        "-".to_owned()
                    } else {
                        format_ppm(d.compute_achieved_ppm)
                    },
                    format_ppm(d.compute_share_ppm)
                ),
                format!("{:.1}s", d.wait_ns_total as f64 / 1e9),
                d.oom_refused_total.to_string(),
                a.processes.len().to_string(),
                owner(rec),
            ]);
        }
        for p in &a.processes {
            procs.push(vec![
                rec.id.clone(),
                if p.host_pid == 0 {
                    s("?")
                } else {
                    p.host_pid.to_string()
                },
                p.container_pid.to_string(),
                p.memory_used_bytes
                    .iter()
                    .map(|b| format_bytes(*b))
                    .collect::<Vec<_>>()
                    .join(" + "),
            ]);
        }
    }
    out.push_str(&table(&rows));
    // What RECOVERED means for each, in full.
    for a in st.allocations.iter().filter(|a| !a.recovered.is_empty()) {
        let id = a.allocation.as_ref().map_or("?", |r| r.id.as_str());
        out.push_str(&format!(
            "RECOVERED {id}: damaged files found at the manager's start: {}\n",
            a.recovered
        ));
    }
    if procs.len() > 1 {
        out.push('\n');
        out.push_str(&table(&procs));
    }
    out
}

fn alloc_json(a: &pb::Allocation) -> Value {
    json!({
        "id": a.id,
        "policy": policy_str(a.policy),
        "priority": a.priority,
        "devices": a.devices.iter().map(|d| json!({
            "gpu_uuid": d.gpu_uuid,
            "memory_limit_bytes": d.memory_limit_bytes,
            "compute_share_ppm": d.compute_share_ppm,
            "slices": d.slices,
        })).collect::<Vec<_>>(),
        "device_ids": a.device_ids,
        "labels": a.labels.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "control_path": a.control_path,
        "state_path": a.state_path,
        "mounts": a.mounts.iter().map(|m| json!({
            "host_path": m.host_path,
            "container_path": m.container_path,
            "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "env": a.env.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "namespace": a.namespace,
        "pod": a.pod,
        "container": a.container,
        "created_unix_ms": a.created_unix_ms,
    })
}

/// The JSON `tessera status --json` prints: the NodeStatus message with
/// the proto's field names.
///
/// `vendor` is always set: a manager older than vendors sends none and had
/// only NVIDIA's GPUs.
pub fn to_json(st: &pb::NodeStatus) -> Value {
    json!({
        "hostname": st.hostname,
        "driver_version": st.driver_version,
        "unix_ms": st.unix_ms,
        "gpus": st.gpus.iter().map(|g| json!({
            "index": g.index,
            "uuid": g.uuid,
            "vendor": vendor(g),
            "name": g.name,
            "memory_total_bytes": g.memory_total_bytes,
            "memory_used_bytes": g.memory_used_bytes,
            "sm_count": g.sm_count,
            "pci_bus_id": g.pci_bus_id,
            "numa_node": g.numa_node,
            "compute_capability": format!("{}.{}", g.compute_capability_major, g.compute_capability_minor),
            "healthy": g.healthy,
            "unhealthy_reason": g.unhealthy_reason,
            "utilization_percent": g.utilization_percent,
            "temperature_c": g.temperature_c,
            "power_mw": g.power_mw,
            "compute_allocated_ppm": g.compute_allocated_ppm,
            "memory_allocated_bytes": g.memory_allocated_bytes,
        })).collect::<Vec<_>>(),
        "allocations": st.allocations.iter().map(|a| json!({
            "allocation": a.allocation.as_ref().map(alloc_json),
            "paused": a.paused,
            "paused_ns_total": a.paused_ns_total,
            "recovered": a.recovered,
            "devices": a.devices.iter().map(|d| json!({
                "gpu_uuid": d.gpu_uuid,
                "memory_limit_bytes": d.memory_limit_bytes,
                "memory_used_bytes": d.memory_used_bytes,
                "compute_share_ppm": d.compute_share_ppm,
                "compute_achieved_ppm": d.compute_achieved_ppm,
                "wait_ns_total": d.wait_ns_total,
                "oom_refused_total": d.oom_refused_total,
            })).collect::<Vec<_>>(),
            "processes": a.processes.iter().map(|p| json!({
                "host_pid": p.host_pid,
                "container_pid": p.container_pid,
                "memory_used_bytes": p.memory_used_bytes,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> pb::NodeStatus {
        pb::NodeStatus {
            hostname: "node-1".into(),
            driver_version: "550.1".into(),
            unix_ms: 1,
            gpus: vec![
                pb::GpuStatus {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: "Sim GPU".into(),
                    memory_total_bytes: 16 << 30,
                    memory_used_bytes: 1 << 30,
                    healthy: true,
                    utilization_percent: 25,
                    temperature_c: 40,
                    power_mw: 120_000,
                    compute_allocated_ppm: 300_000,
                    memory_allocated_bytes: 4 << 30,
                    ..Default::default()
                },
                pb::GpuStatus {
                    index: 1,
                    uuid: "GPU-b".into(),
                    vendor: "amd".into(),
                    name: "AMD Instinct MI210".into(),
                    memory_total_bytes: 16 << 30,
                    healthy: false,
                    unhealthy_reason: "critical XID 79".into(),
                    ..Default::default()
                },
            ],
            allocations: vec![pb::AllocationStatus {
                allocation: Some(pb::Allocation {
                    id: "run-1".into(),
                    policy: pb::ComputePolicy::Burst as i32,
                    labels: [("source".to_owned(), "cli".to_owned())].into(),
                    ..Default::default()
                }),
                devices: vec![pb::AllocationDeviceStatus {
                    gpu_uuid: "GPU-a".into(),
                    memory_limit_bytes: 4 << 30,
                    memory_used_bytes: 512 << 20,
                    compute_share_ppm: 300_000,
                    compute_achieved_ppm: 295_000,
                    wait_ns_total: 1_500_000_000,
                    oom_refused_total: 2,
                }],
                processes: vec![pb::ProcessStatus {
                    host_pid: 4242,
                    container_pid: 4242,
                    memory_used_bytes: vec![512 << 20],
                }],
                paused: false,
                paused_ns_total: 0,
                recovered: String::new(),
            }],
        }
    }

    #[test]
    fn the_table_shows_gpus_allocations_and_processes() {
        let t = render(&sample());
        assert!(
            t.starts_with("Tessera on node-1 · driver 550.1 · 2 GPUs · 1 allocation\n"),
            "{t}"
        );
        let gpu0 = t.lines().find(|l| l.starts_with("0 ")).unwrap();
        assert!(
            gpu0.contains("1Gi / 16Gi") && gpu0.contains("25%") && gpu0.contains("120W"),
            "{gpu0}"
        );
        assert!(
            gpu0.contains("4Gi / 16Gi") && gpu0.contains("30%") && gpu0.ends_with("ok"),
            "{gpu0}"
        );
        let gpu1 = t.lines().find(|l| l.starts_with("1 ")).unwrap();
        assert!(gpu1.ends_with("UNHEALTHY: critical XID 79"), "{gpu1}");
        // A mixed node: each GPU's vendor, an old manager's silence as NVIDIA.
        let vendor_col = t
            .lines()
            .find(|l| l.starts_with("GPU "))
            .unwrap()
            .find("VENDOR")
            .unwrap();
        assert!(gpu0[vendor_col..].starts_with("nvidia "), "{gpu0}");
        assert!(
            gpu1[vendor_col..].starts_with("amd ") && gpu1.contains("AMD Instinct MI210"),
            "{gpu1}"
        );
        let alloc = t
            .lines()
            .find(|l| l.starts_with("run-1 ") && l.contains("burst"))
            .unwrap();
        assert!(alloc.contains("512Mi / 4Gi"), "{alloc}");
        assert!(alloc.contains("29.5% / 30%"), "{alloc}");
        assert!(
            alloc.contains("1.5s") && alloc.ends_with("(cli)"),
            "{alloc}"
        );
        let proc_line = t.lines().find(|l| l.contains("4242")).unwrap();
        assert!(proc_line.ends_with("512Mi"), "{proc_line}");
        // Columns line up: every header cell starts where its values do.
        let header = t.lines().find(|l| l.starts_with("GPU ")).unwrap();
        let col = header.find("HEALTH").unwrap();
        assert_eq!(&gpu0[col..], "ok");
    }

    #[test]
    fn a_whole_gpu_has_no_measured_share() {
        let mut st = sample();
        st.allocations[0].devices[0].compute_share_ppm = 1_000_000;
        st.allocations[0].devices[0].compute_achieved_ppm = 0;
        let t = render(&st);
        assert!(t.contains("- / 100%"), "{t}");
    }

    #[test]
    fn a_paused_allocation_says_so_with_its_time() {
        let mut st = sample();
        assert!(!render(&st).contains("PAUSED"));
        st.allocations[0].paused = true;
        st.allocations[0].paused_ns_total = 2_500_000_000;
        let t = render(&st);
        let alloc = t.lines().find(|l| l.starts_with("run-1 ")).unwrap();
        assert!(alloc.contains("burst, PAUSED 2.5s"), "{alloc}");
        st.allocations[0].allocation.as_mut().unwrap().priority = 5;
        let t = render(&st);
        let alloc = t.lines().find(|l| l.starts_with("run-1 ")).unwrap();
        assert!(alloc.contains("burst p5, PAUSED 2.5s"), "{alloc}");
        assert_eq!(to_json(&st)["allocations"][0]["allocation"]["priority"], 5);
        let v = to_json(&st);
        assert_eq!(v["allocations"][0]["paused"], true);
        assert_eq!(v["allocations"][0]["paused_ns_total"], 2_500_000_000u64);
    }

    #[test]
    fn a_recovered_allocation_is_marked_and_explained() {
        let mut st = sample();
        assert!(!render(&st).contains("RECOVERED"));
        st.allocations[0].recovered = "state header restored".into();
        let t = render(&st);
        let alloc = t.lines().find(|l| l.starts_with("run-1 ")).unwrap();
        assert!(alloc.contains("burst, RECOVERED"), "{alloc}");
        assert!(
            t.contains("RECOVERED run-1: damaged files found at the manager's start: state header restored\n"),
            "{t}"
        );
        assert_eq!(
            to_json(&st)["allocations"][0]["recovered"],
            "state header restored"
        );
    }

    #[test]
    fn an_empty_node_says_so() {
        let mut st = sample();
        st.allocations.clear();
        assert!(render(&st).ends_with("No allocations.\n"));
    }

    #[test]
    fn json_carries_the_same_numbers() {
        let v = to_json(&sample());
        assert_eq!(v["gpus"][0]["memory_total_bytes"], 16u64 << 30);
        assert_eq!(v["gpus"][1]["healthy"], false);
        assert_eq!(v["gpus"][0]["vendor"], "nvidia");
        assert_eq!(v["gpus"][1]["vendor"], "amd");
        assert_eq!(v["allocations"][0]["allocation"]["id"], "run-1");
        assert_eq!(v["allocations"][0]["allocation"]["policy"], "burst");
        assert_eq!(
            v["allocations"][0]["devices"][0]["compute_achieved_ppm"],
            295_000
        );
        assert_eq!(v["allocations"][0]["processes"][0]["host_pid"], 4242);
    }
}
