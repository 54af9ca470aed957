//! `tessera demo`: a simulated GPU node, the real manager and five real
//! workload processes under the shim, shown live, judged at the end.
//!
//! Everything here is what an operator would run on a GPU node, pointed at
//! the simulated driver: the manager is the `tessera manager` binary, the
//! workloads are CUDA driver-API programs loaded with `LD_PRELOAD`, and the
//! figures come from the simulated GPU's ground truth (what its engine ran,
//! what its memory held), not from Tessera's own bookkeeping.

pub mod render;
pub mod scenario;
pub mod workload;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_contract::labels;
use tessera_proto::manager::v1 as pb;
use tessera_shm::Policy;
use tessera_sim::config::NodeConfig;
use tessera_sim::node::Node;

use crate::render::{GpuRow, Row};
use crate::scenario::{Outcome, Workload, default_scenario, judge};

/// `tessera demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How long the workloads run, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seconds at the start left out of the measurement (start-up, first allocations).
    #[arg(long, default_value_t = 3.0)]
    pub warmup: f64,
    /// JSON lines on stdout instead of the live table: a `progress` object
    /// every half second, then the `summary` (numbers, not display strings).
    #[arg(long)]
    pub json: bool,
    /// Keep the demo's working directory (manager state, logs) for inspection.
    #[arg(long)]
    pub keep: bool,
}

/// Why the demo could not run (as opposed to ran and failed its bounds).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("the manager: {0}")]
    Manager(String),
    #[error("workload {name}: {message}")]
    Workload { name: String, message: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> DemoError + '_ {
    move |e| DemoError::Setup(format!("{what}: {e}"))
}

/// The summary the demo ends with.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub ok: bool,
    pub measured_seconds: f64,
    pub gpus: Vec<serde_json::Value>,
    pub workloads: Vec<Outcome>,
}

/// A running workload process and what it reported.
struct Running {
    spec: Workload,
    child: Child,
    allocated: Arc<AtomicU64>,
    ooms_seen: Arc<AtomicU64>,
    stderr_path: PathBuf,
}

/// Kills what it holds when dropped, so an error midway leaves no strays.
struct Reaper {
    children: Vec<Child>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sim_env(state: &Path) -> Vec<(&'static str, String)> {
    vec![
        (tessera_sim::config::ENV_STATE, state.display().to_string()),
        // A mixed node: the workloads' two NVIDIA GPUs and an AMD GPU beside them, which
        // the manager reads through ROCm SMI (HIP workloads are the shim's tests').
        (tessera_sim::config::ENV_GPUS, "nvidia,nvidia,amd".into()),
        (tessera_sim::config::ENV_MEMORY, "16Gi".into()),
    ]
}

fn find_hook() -> Result<PathBuf, DemoError> {
    let dirs = tessera_sim::libs::search_dirs();
    dirs.iter()
        .map(|d| d.join("libtessera.so"))
        .find(|p| p.exists())
        .ok_or_else(|| {
            DemoError::Setup(format!(
                "libtessera.so not found next to the tessera binary (searched {dirs:?}); build the workspace with cargo"
            ))
        })
}

fn runtime() -> Result<tokio::runtime::Runtime, DemoError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DemoError::Io)
}

/// One `--json` progress line: what the live table shows, as numbers.
fn progress_json(elapsed: f64, measured: f64, gpus: &[GpuRow], rows: &[Row]) -> serde_json::Value {
    serde_json::json!({
        "event": "progress",
        "elapsed_seconds": elapsed,
        "measured_seconds": measured,
        "gpus": gpus.iter().map(|g| serde_json::json!({
            "gpu": g.index,
            "vendor": g.vendor,
            "name": g.name,
            "busy_pct": g.busy_pct,
            "memory_used_bytes": g.memory_used,
            "memory_total_bytes": g.memory_total,
        })).collect::<Vec<_>>(),
        "workloads": rows.iter().map(|r| serde_json::json!({
            "name": r.name,
            "gpu": r.gpu,
            "policy": r.policy,
            "target_pct": r.target_pct,
            "achieved_pct": r.achieved_pct,
            "memory_used_bytes": r.memory_used,
            "memory_limit_bytes": r.memory_limit,
            "oom_refused": r.oom_refused,
            "processes": r.processes,
        })).collect::<Vec<_>>(),
    })
}

/// Runs the demo; returns whether every workload stayed within its bounds.
pub fn run(args: &DemoArgs) -> Result<bool, DemoError> {
    let exe = std::env::current_exe()?;
    let work = tempfile::Builder::new().prefix("tessera-demo.").tempdir()?;
    let dir = work.path().to_owned();
    if args.keep {
        // Leak the guard: the directory outlives the demo on purpose.
        let _ = work.keep();
    }
    let libs =
        tessera_sim::libs::install_lib_dir(&dir.join("lib")).map_err(setup("simulated driver"))?;
    let hook = find_hook()?;
    let node_path = dir.join("node");
    let env = sim_env(&node_path);
    let lookup = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let config = NodeConfig::from_lookup(lookup).map_err(setup("simulated node config"))?;
    let node = Node::open(&node_path, &config).map_err(setup("simulated node"))?;

    let mut reaper = Reaper {
        children: Vec::new(),
    };
    let socket = dir.join("manager.sock");
    let manager_log = dir.join("manager.log");
    // The simulated ROCm SMI, when it was built (it is a dependency of the demo); without
    // it the manager shows the NVIDIA GPUs only.
    let rocm_smi = tessera_sim::libs::find_built_library("libtessera_sim_rocm_smi.so").ok();
    let mut manager = Command::new(&exe);
    manager.arg("manager");
    if let Some(lib) = &rocm_smi {
        manager.arg("--rocm-smi-library").arg(lib);
    }
    let manager = manager
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(&socket)
        .arg("--nvml-library")
        .arg(libs.dir.join("libnvidia-ml.so.1"))
        .arg("--hook-library")
        .arg(&hook)
        .arg("--metrics-addr")
        .arg("127.0.0.1:0")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LD_LIBRARY_PATH", &libs.dir)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&manager_log)?)
        .spawn()
        .map_err(setup("starting `tessera manager`"))?;
    reaper.children.push(manager);

    let rt = runtime()?;
    let mut client = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match tessera_client::connect(&socket).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => {
                    let log = std::fs::read_to_string(&manager_log).unwrap_or_default();
                    return Err(DemoError::Manager(format!("{e}\n{log}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })?;
    let status = rt
        .block_on(client.get_node_status(pb::NodeStatusRequest {}))
        .map_err(|e| DemoError::Manager(e.message().to_owned()))?
        .into_inner();
    let uuid_of = |gpu: usize| -> Result<String, DemoError> {
        status
            .gpus
            .iter()
            .find(|g| g.index as usize == gpu)
            .map(|g| g.uuid.clone())
            .ok_or_else(|| DemoError::Manager(format!("no GPU {gpu} in the inventory")))
    };

    let specs = default_scenario();
    let mut running = Vec::new();
    let mut alloc_ids = Vec::new();
    for w in &specs {
        let req = pb::CreateAllocationRequest {
            policy: match w.policy {
                Policy::Guaranteed => pb::ComputePolicy::Guaranteed,
                Policy::Burst => pb::ComputePolicy::Burst,
            } as i32,
            labels: HashMap::from([(labels::SOURCE.to_owned(), labels::SOURCE_DEMO.to_owned())]),
            ..pb::CreateAllocationRequest::one_device(
                format!("demo-{}", w.name),
                uuid_of(w.gpu)?,
                w.memory_limit,
                w.share_ppm,
            )
        };
        let alloc = rt
            .block_on(client.create_allocation(req))
            .map_err(|e| {
                DemoError::Manager(format!("create allocation for {}: {}", w.name, e.message()))
            })?
            .into_inner();
        alloc_ids.push(alloc.id.clone());
        running.push(spawn_workload(
            &exe, w, &alloc, &hook, &libs.dir, &env, &dir, args,
        )?);
    }

    let tty = std::io::stdout().is_terminal() && !args.json;
    let start = Instant::now();
    let total = Duration::from_secs_f64(args.duration);
    let warmup = Duration::from_secs_f64(args.warmup.min(args.duration / 2.0));
    let mut window: Option<(Instant, Vec<u64>, Vec<u64>)> = None; // start, busy per workload, busy per gpu
    let mut peaks = vec![0u64; running.len()];
    let mut last_rows = Vec::new();
    let mut last_gpus = Vec::new();
    let mut measured = 0.0;
    let mut out = std::io::stdout();
    while start.elapsed() < total {
        std::thread::sleep(Duration::from_millis(500));
        let now = Instant::now();
        let snap = Snapshot::take(&node, &running);
        for (p, m) in peaks.iter_mut().zip(&snap.memory) {
            *p = (*p).max(*m);
        }
        // Measure only once every workload holds its memory and runs.
        let all_running = running
            .iter()
            .all(|r| r.allocated.load(Ordering::Relaxed) > 0);
        if window.is_none() && now.duration_since(start) >= warmup && all_running {
            window = Some((now, snap.busy.clone(), snap.gpu_busy.clone()));
        }
        let st = rt
            .block_on(client.get_node_status(pb::NodeStatusRequest {}))
            .ok()
            .map(|r| r.into_inner());
        let (rows, gpus) = rows_for(&running, &snap, window.as_ref(), now, st.as_ref(), &node);
        if let Some((w0, _, _)) = &window {
            measured = now.duration_since(*w0).as_secs_f64();
        }
        if args.json {
            let _ = writeln!(
                out,
                "{}",
                progress_json(start.elapsed().as_secs_f64(), measured, &gpus, &rows)
            );
            let _ = out.flush();
        } else {
            let el = start.elapsed().as_secs_f64();
            if tty {
                let _ = write!(
                    out,
                    "\x1b[H\x1b[2J{}",
                    render::frame(el, args.duration, &gpus, &rows)
                );
            } else {
                let _ = writeln!(out, "{}", render::plain_line(el, &rows));
            }
            let _ = out.flush();
        }
        last_rows = rows;
        last_gpus = gpus;
        for r in &mut running {
            if let Ok(Some(status)) = r.child.try_wait()
                && !status.success()
            {
                let err = std::fs::read_to_string(&r.stderr_path).unwrap_or_default();
                return Err(DemoError::Workload {
                    name: r.spec.name.to_owned(),
                    message: format!("exited with {status}: {}", err.trim()),
                });
            }
        }
    }

    let outcomes: Vec<Outcome> = running
        .iter()
        .zip(&last_rows)
        .zip(&peaks)
        .map(|((r, row), peak)| {
            let ooms = row.oom_refused.max(r.ooms_seen.load(Ordering::Relaxed));
            judge(&r.spec, row.achieved_pct, *peak, ooms)
        })
        .collect();
    let ok = outcomes.iter().all(|o| o.ok);

    // Workloads end by themselves at the duration; give them a moment.
    for r in &mut running {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(r.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
    for id in alloc_ids {
        let _ = rt.block_on(client.delete_allocation(pb::DeleteAllocationRequest { id }));
    }
    if let Some(m) = reaper.children.first() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(m.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }

    let summary = Summary {
        ok,
        measured_seconds: measured,
        gpus: last_gpus
            .iter()
            .map(|g| serde_json::json!({"gpu": g.index, "busy_pct": g.busy_pct}))
            .collect(),
        workloads: outcomes,
    };
    if args.json {
        let mut line = serde_json::to_value(&summary).map_err(setup("summary"))?;
        line["event"] = "summary".into();
        println!("{line}");
    } else {
        print!("{}", render::summary(&summary.workloads, &last_gpus));
        println!(
            "\n{}",
            if ok {
                "Every workload stayed within its bounds."
            } else {
                "Some workloads left their bounds (see FAIL above)."
            }
        );
        if args.keep {
            println!("Working directory kept: {}", dir.display());
        }
    }
    Ok(ok)
}

#[allow(clippy::too_many_arguments)]
fn spawn_workload(
    exe: &Path,
    w: &Workload,
    alloc: &pb::Allocation,
    hook: &Path,
    lib_dir: &Path,
    env: &[(&'static str, String)],
    dir: &Path,
    args: &DemoArgs,
) -> Result<Running, DemoError> {
    let stderr_path = dir.join(format!("{}.stderr", w.name));
    let mut cmd = Command::new(exe);
    cmd.arg("__workload")
        .arg("--uuid")
        .arg(&alloc.devices[0].gpu_uuid)
        .arg("--memory")
        .arg(w.hold.to_string())
        .arg("--kernel-us")
        .arg(w.kernel_us.to_string())
        .arg("--seconds")
        .arg((args.duration + 1.0).to_string());
    if let Some(s) = w.oversubscribe_every {
        cmd.arg("--oversubscribe-every").arg(s.to_string());
    }
    let hook_s = hook.display().to_string();
    for (k, v) in tessera_client::run::child_env(alloc, &hook_s, None) {
        cmd.env(k, v);
    }
    let mut child = cmd
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LD_LIBRARY_PATH", lib_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path)?)
        .spawn()
        .map_err(|e| DemoError::Workload {
            name: w.name.to_owned(),
            message: e.to_string(),
        })?;
    let allocated = Arc::new(AtomicU64::new(0));
    let ooms_seen = Arc::new(AtomicU64::new(0));
    if let Some(stdout) = child.stdout.take() {
        let (a, o) = (allocated.clone(), ooms_seen.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                match v["event"].as_str() {
                    Some("allocated") => {
                        a.store(v["bytes"].as_u64().unwrap_or(0), Ordering::Relaxed)
                    }
                    Some("oom") => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        });
    }
    Ok(Running {
        spec: w.clone(),
        child,
        allocated,
        ooms_seen,
        stderr_path,
    })
}

/// Ground truth at one moment, per workload (by its process) and per GPU.
struct Snapshot {
    busy: Vec<u64>,
    memory: Vec<u64>,
    gpu_busy: Vec<u64>,
}

impl Snapshot {
    fn take(node: &Node, running: &[Running]) -> Snapshot {
        let procs = node.processes();
        let mut busy = Vec::new();
        let mut memory = Vec::new();
        for r in running {
            let pid = r.child.id();
            let p = procs.iter().find(|p| p.pid == pid);
            busy.push(
                p.and_then(|p| p.busy_ns.get(r.spec.gpu).copied())
                    .unwrap_or(0),
            );
            memory.push(
                p.and_then(|p| p.memory.get(r.spec.gpu).copied())
                    .unwrap_or(0),
            );
        }
        let gpu_busy = (0..node.device_count())
            .map(|d| node.device_usage(d).map(|u| u.busy_ns).unwrap_or(0))
            .collect();
        Snapshot {
            busy,
            memory,
            gpu_busy,
        }
    }
}

fn rows_for(
    running: &[Running],
    snap: &Snapshot,
    window: Option<&(Instant, Vec<u64>, Vec<u64>)>,
    now: Instant,
    status: Option<&pb::NodeStatus>,
    node: &Node,
) -> (Vec<Row>, Vec<GpuRow>) {
    let pct = |now_busy: u64, then_busy: u64, since: Instant| {
        let wall = now.duration_since(since).as_nanos().max(1) as f64;
        100.0 * now_busy.saturating_sub(then_busy) as f64 / wall
    };
    let rows = running
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let alloc = status.and_then(|s| {
                s.allocations.iter().find(|a| {
                    a.allocation
                        .as_ref()
                        .is_some_and(|al| al.id == format!("demo-{}", r.spec.name))
                })
            });
            let dev = alloc.and_then(|a| a.devices.first());
            Row {
                name: r.spec.name.to_owned(),
                gpu: r.spec.gpu,
                policy: r.spec.policy.name().to_owned(),
                memory_used: snap.memory[i],
                memory_limit: r.spec.memory_limit,
                target_pct: f64::from(r.spec.share_ppm) / 10_000.0,
                achieved_pct: window.map_or(0.0, |(t0, b0, _)| pct(snap.busy[i], b0[i], *t0)),
                oom_refused: dev.map_or(0, |d| d.oom_refused_total),
                processes: alloc.map_or(0, |a| a.processes.len()),
            }
        })
        .collect();
    let gpus = (0..node.device_count())
        .map(|d| {
            let info = node.device_info(d).ok();
            let usage = node.device_usage(d).ok();
            GpuRow {
                index: d as usize,
                vendor: info
                    .as_ref()
                    .map(|i| i.vendor.as_str().to_owned())
                    .unwrap_or_default(),
                name: info.map(|i| i.name).unwrap_or_default(),
                busy_pct: window.map_or(0.0, |(t0, _, g0)| {
                    pct(snap.gpu_busy[d as usize], g0[d as usize], *t0).min(100.0)
                }),
                memory_used: usage.as_ref().map_or(0, |u| u.memory_used),
                memory_total: usage.as_ref().map_or(0, |u| u.memory_total),
            }
        })
        .collect();
    (rows, gpus)
}
