//! DRA prepare latency: `tessera dra-plugin` (in this process) between the
//! fake kubelet and API server of `tessera_dra_plugin::testing`, on a
//! simulated node with the real manager (a child process). Each run puts
//! one allocated claim in the API server and times NodePrepareResources for
//! it as the kubelet calls it (read the claim over HTTP, node status, the
//! manager's CreateAllocation, the CDI spec and the checkpoint written and
//! synced), then NodeUnprepareResources. The target: prepare under
//! 50 ms.

use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use tessera_dra_plugin::names::{gpu_device, slice_device};
use tessera_dra_plugin::testing::{FakeApiServer, register};
use tessera_dra_plugin::{DRIVER_NAME, DraPluginArgs};
use tessera_proto::dra::v1 as dra;
use tessera_proto::manager::v1 as pb;

use super::Table;
use super::soak::Manager;
use crate::sim::SimNode;

const NODE: &str = "bench-node";
/// The prepare target of issue 22.
pub const TARGET_MS: f64 = 50.0;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: DraPluginArgs,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Writes a small file and syncs it and its directory, as a CDI spec or a
/// checkpoint is written.
fn synced_write(path: &std::path::Path) -> Result<(), String> {
    use std::io::Write as _;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::create(path).map_err(err)?;
    f.write_all(&[b'x'; 1024]).map_err(err)?;
    f.sync_all().map_err(err)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
    }
    Ok(())
}

/// Median, 90th percentile and largest of `v` (sorted here).
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9), v[v.len() - 1])
}

/// `runs` prepares and unprepares of one claim each: the slices layout
/// (two slices of one GPU) and the shared layout (5Gi and 30 % of one GPU),
/// alternating.
pub fn table(runs: usize) -> Result<Table, String> {
    let node = SimNode::builder().devices(2).memory("16Gi").build();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let manager = Manager::start(&node, &dir.path().join("manager"))?;
    let uuids: Vec<String> = manager.status()?.gpus.into_iter().map(|g| g.uuid).collect();
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let (slices, shared, mut parts) = rt.block_on(async {
        let api = FakeApiServer::start().await.map_err(|e| e.to_string())?;
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)
            .map_err(|e| e.to_string())?;
        let s = |p: &str| dir.path().join(p).display().to_string();
        let cli = Cli::try_parse_from([
            "dra-plugin",
            "--node-name",
            NODE,
            "--registry-dir",
            &s("registry"),
            "--plugin-dir",
            &s("plugin"),
            "--cdi-dir",
            &s("cdi"),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--socket",
            &manager.socket().display().to_string(),
            "--hook-library",
            &crate::hook_library().unwrap_or_default().display().to_string(),
            "--preload-file",
            &s("ld.so.preload"),
        ])
        .map_err(|e| e.to_string())?;
        let opts = cli.args.options().map_err(|e| e.to_string())?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let plugin = tokio::spawn(tessera_dra_plugin::run(opts, async {
            let _ = stopped.await;
        }));
        let (_, mut kubelet) = register(&dir.path().join("registry"), DRIVER_NAME, Duration::from_secs(60))
            .await?;
        let mut slices = Vec::new();
        let mut shared = Vec::new();
        // The parts of a prepare, timed on their own: the manager's node
        // status and CreateAllocation, and one file written and synced with
        // its directory (a prepare writes two: the CDI spec, the checkpoint).
        let mut mgr = tessera_client::connect(&manager.socket())
            .await
            .map_err(|e| e.to_string())?;
        let mut parts: [Vec<f64>; 3] = Default::default();
        for i in 0..runs {
            let uid = format!("{i:08x}-0000-4000-8000-00000000beef");
            let name = format!("bench-{i}");
            let gpu = &uuids[i % uuids.len()];
            let (results, layout) = if i % 2 == 0 {
                let r = |n| json!({"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": slice_device(gpu, n)});
                (vec![r(0), r(1)], &mut slices)
            } else {
                (
                    vec![json!({"request": "gpu", "driver": DRIVER_NAME, "pool": NODE,
                                "device": gpu_device(gpu),
                                "consumedCapacity": {"memory": "5Gi", "compute": "30"}})],
                    &mut shared,
                )
            };
            api.put_claim(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "bench", "uid": uid},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
                "status": {"allocation": {"devices": {"results": results}}},
            }));
            let claim = dra::Claim {
                namespace: "bench".into(),
                uid: uid.clone(),
                name,
            };
            let t0 = Instant::now();
            let r = kubelet
                .node_prepare_resources(dra::NodePrepareResourcesRequest {
                    claims: vec![claim.clone()],
                })
                .await
                .map_err(|s| format!("prepare: {s}"))?
                .into_inner();
            let prepare = t0.elapsed();
            match r.claims.get(&uid) {
                Some(c) if c.error.is_empty() && !c.devices.is_empty() => {}
                other => return Err(format!("claim {uid} not prepared: {other:?}")),
            }
            let t1 = Instant::now();
            let u = kubelet
                .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                    claims: vec![claim],
                })
                .await
                .map_err(|s| format!("unprepare: {s}"))?
                .into_inner();
            let unprepare = t1.elapsed();
            if u.claims.get(&uid).is_none_or(|c| !c.error.is_empty()) {
                return Err(format!("claim {uid} not unprepared: {u:?}"));
            }
            layout.push((ms(prepare), ms(unprepare)));

            let t = Instant::now();
            mgr.get_node_status(pb::NodeStatusRequest {})
                .await
                .map_err(|s| format!("node status: {s}"))?;
            parts[0].push(ms(t.elapsed()));
            let id = format!("bench-direct-{i}");
            let t = Instant::now();
            mgr.create_allocation(pb::CreateAllocationRequest {
                id: id.clone(),
                devices: vec![pb::DeviceRequest {
                    gpu_uuid: gpu.clone(),
                    memory_limit_bytes: 1 << 30,
                    compute_share_ppm: 100_000,
                    slices: 0,
                }],
                ..Default::default()
            })
            .await
            .map_err(|s| format!("create: {s}"))?;
            parts[1].push(ms(t.elapsed()));
            mgr.delete_allocation(pb::DeleteAllocationRequest { id })
                .await
                .map_err(|s| format!("delete: {s}"))?;
            let t = Instant::now();
            synced_write(&dir.path().join("sync-probe"))?;
            parts[2].push(ms(t.elapsed()));
        }
        let _ = stop.send(());
        let _ = plugin.await;
        Ok::<_, String>((slices, shared, parts))
    })?;
    let mut rows = Vec::new();
    for (what, samples) in [
        ("slices (2 slices)", &slices),
        ("shared (5Gi, 30%)", &shared),
    ] {
        let (mut p, mut u): (Vec<f64>, Vec<f64>) = samples.iter().copied().unzip();
        let (pm, p90, pmax) = spread(&mut p);
        let (um, u90, _) = spread(&mut u);
        rows.push(vec![
            what.to_owned(),
            samples.len().to_string(),
            format!("{pm:.1}"),
            format!("{p90:.1}"),
            format!("{pmax:.1}"),
            format!("{um:.1}"),
            format!("{u90:.1}"),
            if p90 < TARGET_MS { "yes" } else { "no" }.to_owned(),
        ]);
    }
    for (what, v) in [
        "  part: manager GetNodeStatus",
        "  part: manager CreateAllocation",
        "  part: one file written + fsync (x2 per prepare)",
    ]
    .into_iter()
    .zip(parts.iter_mut())
    {
        let (p50, p90, max) = spread(v);
        rows.push(vec![
            what.to_owned(),
            v.len().to_string(),
            format!("{p50:.1}"),
            format!("{p90:.1}"),
            format!("{max:.1}"),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    Ok(Table {
        title: "DRA plugin: NodePrepareResources / NodeUnprepareResources of one claim (ms)".into(),
        columns: [
            "claim",
            "runs",
            "prepare p50",
            "prepare p90",
            "prepare max",
            "unprepare p50",
            "unprepare p90",
            "p90 < 50 ms",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes: vec![
            "prepare: claim read over HTTP, node status, CreateAllocation, CDI spec and checkpoint written and synced".into(),
        ],
    })
}
