//! The `hook` section of `tessera-bench`: what the shim adds per call (a
//! zero-duration `cuLaunchKernel`, a `cuMemAlloc_v2`/`cuMemFree_v2` pair),
//! through each client style, as nanoseconds and as a ratio to the direct
//! call; what the pool and graph-memory accounting adds (stream-ordered
//! alloc/free pairs from the default pool and from a pool that keeps
//! everything, launches of a graph that allocates and frees); and how long
//! joining takes when 256 processes start at once.
//!
//! Per-call costs are timed inside the probe (process start-up is not
//! counted), direct and through the shim interleaved, median of `runs`.
//! Join time is what the shim itself spends at `cuInit` (opening the
//! allocation's files, mapping devices by UUID, claiming a slot; the
//! driver's own `cuInit` excluded), as each process measured and logged it,
//! wall-clock and CPU; the probes' whole `cuInit` is shown beside it, with
//! and without the shim.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};

use super::Table;
use crate::paths::hook_library;
use crate::probe::{Mode, ProbeChild, ProbeOutput};
use crate::sim::SimNode;

/// How a measured probe runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Direct,
    /// Preloaded, no allocation configured: every call passes through.
    Ungoverned,
    /// Preloaded and governed by an allocation (whole GPU: gate open).
    Governed,
}

struct Bench {
    node: SimNode,
    hook: PathBuf,
    control: PathBuf,
}

impl Bench {
    fn new() -> Result<Bench, String> {
        let hook = hook_library()
            .ok_or("libtessera.so not built: cargo build --release -p tessera-hook")?;
        let node = SimNode::builder().devices(1).memory("16Gi").build();
        let uuid = node.node().device_info(0).map_err(|e| e.to_string())?.uuid;
        let spec = ControlSpec::new(
            "bench",
            vec![DeviceSpec {
                uuid,
                memory_limit_bytes: 8 << 30,
                compute_share_ppm: 1_000_000,
                policy: Policy::Burst,
            }],
        );
        let dir = node.dir.path().join("alloc");
        let (control, _) = create_allocation_files(&dir, &spec).map_err(|e| e.to_string())?;
        Ok(Bench {
            node,
            hook,
            control,
        })
    }

    fn command(&self, mode: Mode, via: Via, script: &[&str]) -> Command {
        let mut c = self.node.probe(mode, script);
        c.env_remove("TESSERA_CONTROL")
            .env_remove("TESSERA_LOG")
            .env_remove("LD_PRELOAD");
        if via != Via::Direct {
            c.env("LD_PRELOAD", &self.hook);
        }
        if via == Via::Governed {
            c.env("TESSERA_CONTROL", &self.control);
        }
        c
    }

    fn run(&self, mode: Mode, via: Via, script: &[&str]) -> Result<ProbeOutput, String> {
        let o = self
            .command(mode, via, script)
            .output()
            .map_err(|e| format!("running the probe: {e}"))?;
        let out = ProbeOutput::from_output(o);
        if !out.status.success() || out.lines.iter().any(|l| !l.ok) {
            return Err(format!(
                "probe ({}, {via:?}) failed:\n{}{}",
                mode.name(),
                out.stdout,
                out.stderr
            ));
        }
        Ok(out)
    }
}

fn min(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value at quantile `q` (0..=1) of sorted `v`.
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Added cost per call, per client style.
pub fn call_cost(calls: u64, runs: usize) -> Result<Table, String> {
    let b = Bench::new()?;
    let launches = calls.max(1000);
    let pairs = (calls / 10).clamp(1000, 200_000);
    let script = [
        "init".to_string(),
        "ctx".to_string(),
        format!("bench-launch {launches}"),
        format!("bench-alloc {pairs} 4096"),
    ];
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        // [via][launch, alloc] samples, runs interleaved so drift hits all.
        let mut samples: [[Vec<f64>; 2]; 3] = Default::default();
        for _ in 0..runs.max(1) {
            for (i, via) in [Via::Direct, Via::Ungoverned, Via::Governed]
                .into_iter()
                .enumerate()
            {
                let o = b.run(mode, via, &script)?;
                samples[i][0].push(o.get("bench-launch").f64("ns_per_call"));
                samples[i][1].push(o.get("bench-alloc").f64("ns_per_pair"));
            }
        }
        let fastest = samples.clone().map(|s| s.map(min));
        let typical = samples.map(|s| s.map(median));
        for (k, what) in ["cuLaunchKernel", "cuMemAlloc_v2 + cuMemFree_v2"]
            .into_iter()
            .enumerate()
        {
            for (i, via) in [(1, "no allocation"), (2, "governed")] {
                let (direct, shim) = (fastest[0][k], fastest[i][k]);
                rows.push(vec![
                    mode.name().to_string(),
                    what.to_string(),
                    via.to_string(),
                    format!("{direct:.1}"),
                    format!("{shim:.1}"),
                    format!("{:+.1}", shim - direct),
                    format!("{:.3}", shim / direct),
                    format!("{:+.1}", typical[i][k] - typical[0][k]),
                ]);
            }
        }
    }
    Ok(Table {
        title: "shim: added cost per call (simulated driver, timed inside the probe)".into(),
        columns: [
            "client",
            "call",
            "shim",
            "direct ns",
            "shim ns",
            "added ns",
            "ratio",
            "added (median)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes: vec![
            format!(
                "{launches} zero-duration launches and {pairs} 4 KiB alloc/free pairs per run, {} runs of each interleaved; ns columns: the fastest run (least disturbed by other work on the box), last column: the difference of the medians",
                runs.max(1)
            ),
            "governed = in an allocation of the whole GPU (the compute gate is open: one atomic load)".into(),
        ],
    })
}

/// `poolbench` (poolbench.c), compiled once per build against the
/// simulated driver.
fn poolbench() -> Result<PathBuf, String> {
    let src = include_str!("poolbench.c");
    let dir = crate::paths::work_dir();
    let out = dir.join(format!("poolbench-{}", crate::cc::fingerprint(src)));
    if out.is_file() {
        return Ok(out);
    }
    let lib = format!("-L{}", crate::paths::sim_lib_dir().dir.display());
    crate::cc::cc_text(src, &out, &["-O2", &lib, "-lcuda"])?;
    Ok(out)
}

/// Added cost of the pool and graph-memory accounting per call.
pub fn pool_cost(calls: u64, runs: usize) -> Result<Table, String> {
    let b = Bench::new()?;
    let exe = poolbench()?;
    let n = (calls / 10).clamp(1000, 200_000);
    const MEASURES: [(&str, &str); 3] = [
        (
            "async-pair",
            "cuMemAllocAsync + cuMemFreeAsync (default pool)",
        ),
        (
            "pool-pair",
            "cuMemAllocFromPoolAsync + cuMemFreeAsync (own pool, keeps all)",
        ),
        (
            "graph-launch",
            "cuGraphLaunch of a graph that allocates and frees 1 MiB",
        ),
    ];
    // [via][measure] samples, runs interleaved.
    let mut samples: [[Vec<f64>; 3]; 2] = Default::default();
    for _ in 0..runs.max(1) {
        for (i, via) in [Via::Direct, Via::Governed].into_iter().enumerate() {
            let mut c = b.node.command(&exe);
            c.arg(n.to_string())
                .env_remove("TESSERA_CONTROL")
                .env_remove("TESSERA_LOG")
                .env_remove("LD_PRELOAD");
            if via == Via::Governed {
                c.env("LD_PRELOAD", &b.hook)
                    .env("TESSERA_CONTROL", &b.control);
            }
            let o = ProbeOutput::from_output(c.output().map_err(|e| format!("poolbench: {e}"))?);
            if !o.status.success() || o.lines.iter().any(|l| !l.ok) {
                return Err(format!(
                    "poolbench ({via:?}) failed:\n{}{}",
                    o.stdout, o.stderr
                ));
            }
            for (k, (m, _)) in MEASURES.iter().enumerate() {
                samples[i][k].push(o.get(m).f64("ns_per_call"));
            }
        }
    }
    let fastest = samples.clone().map(|s| s.map(min));
    let typical = samples.map(|s| s.map(median));
    let rows = MEASURES
        .iter()
        .enumerate()
        .map(|(k, (_, what))| {
            let (direct, shim) = (fastest[0][k], fastest[1][k]);
            vec![
                what.to_string(),
                format!("{direct:.1}"),
                format!("{shim:.1}"),
                format!("{:+.1}", shim - direct),
                format!("{:.3}", shim / direct),
                format!("{:+.1}", typical[1][k] - typical[0][k]),
            ]
        })
        .collect();
    Ok(Table {
        title: "shim: added cost of pool and graph-memory accounting per call (simulated driver, timed inside the client)".into(),
        columns: ["call", "direct ns", "shim ns", "added ns", "ratio", "added (median)"]
            .map(String::from)
            .to_vec(),
        rows,
        notes: vec![format!(
            "{n} pairs ({} launches) per run, 1 MiB each, {} runs interleaved, governed by an allocation of half the GPU; ns columns: the fastest run, last column: the difference of the medians; linked client (-lcuda)",
            (n / 10).max(100),
            runs.max(1)
        )],
    })
}

/// How the processes of the join benchmark start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Spawned back to back, each calling `cuInit` as soon as it runs.
    Spawned,
    /// All started and waiting, then told to `cuInit` at the same instant.
    Released,
}

/// Runs `n` probes that `init`, started as `start` says; returns each
/// one's `cuInit` time (ns).
fn herd(
    b: &Bench,
    n: usize,
    via: Via,
    start: Start,
    logs: Option<&Path>,
) -> Result<Vec<f64>, String> {
    const T: Duration = Duration::from_secs(120);
    let mut probes = Vec::with_capacity(n);
    for i in 0..n {
        let script: &[&str] = match start {
            Start::Spawned => &["init"],
            Start::Released => &[],
        };
        let mut c = b.command(Mode::Link, via, script);
        if let Some(dir) = logs {
            c.env("TESSERA_LOG", "info")
                .env("TESSERA_LOG_FILE", dir.join(format!("hook.{i}.log")));
        }
        probes.push(ProbeChild::start(c));
    }
    if start == Start::Released {
        for p in &mut probes {
            let l = p.cmd("pid", T);
            if !l.ok {
                return Err(format!("probe did not start: {}", l.raw));
            }
        }
        for p in &mut probes {
            p.send("init");
        }
    }
    let mut ns = Vec::with_capacity(n);
    for p in &mut probes {
        let l = p.wait_for("init", T);
        if !l.ok {
            return Err(format!("init failed: {}", l.raw));
        }
        ns.push(l.f64("ns"));
    }
    for p in probes {
        p.finish();
    }
    Ok(ns)
}

/// The `join:` lines the shim logged: (wall ns, cpu ns).
pub(crate) fn join_lines(dir: &Path) -> Result<Vec<(f64, f64)>, String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let text = std::fs::read_to_string(e.map_err(|e| e.to_string())?.path())
            .map_err(|e| e.to_string())?;
        for line in text.lines().filter(|l| l.contains(" join: ")) {
            let field = |k: &str| -> Option<f64> {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
            };
            match (field("wall_ns="), field("cpu_ns=")) {
                (Some(w), Some(c)) => out.push((w, c)),
                _ => return Err(format!("unreadable join line: {line}")),
            }
        }
    }
    Ok(out)
}

/// Join time when `n` processes start at once.
pub fn join_time(n: usize) -> Result<Table, String> {
    let b = Bench::new()?;
    let row = |what: String, mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let us = |x: f64| format!("{:.0}", x / 1000.0);
        vec![
            what,
            us(quantile(&v, 0.5)),
            us(quantile(&v, 0.99)),
            us(v[v.len() - 1]),
        ]
    };
    let mut rows = Vec::new();
    for (start, name) in [
        (Start::Spawned, "spawned together"),
        (Start::Released, "released together"),
    ] {
        let logs = b.node.dir.path().join(format!("logs-{name}"));
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let direct = herd(&b, n, Via::Direct, start, None)?;
        let shim = herd(&b, n, Via::Governed, start, Some(&logs))?;
        let joins = join_lines(&logs)?;
        if joins.len() != n {
            return Err(format!(
                "{} of {n} processes logged their join",
                joins.len()
            ));
        }
        rows.push(row(
            format!("{name}: shim's join, wall"),
            joins.iter().map(|j| j.0).collect(),
        ));
        rows.push(row(
            format!("{name}: shim's join, CPU"),
            joins.iter().map(|j| j.1).collect(),
        ));
        rows.push(row(format!("{name}: cuInit via the shim, wall"), shim));
        rows.push(row(format!("{name}: cuInit direct, wall"), direct));
    }
    Ok(Table {
        title: format!("shim: joining when {n} processes start at once (µs)"),
        columns: ["measure", "p50", "p99", "max"].map(String::from).to_vec(),
        rows,
        notes: vec![
            "shim's join: files opened and checked, devices mapped by UUID, slot claimed, gate set up; the driver's own cuInit excluded".into(),
            "spawned together: started back to back, each calling cuInit at once; released together: all started and waiting, then told to cuInit at the same instant".into(),
            "wall time includes waiting for one of the box's CPUs; CPU time is the work itself".into(),
        ],
    })
}

/// The whole section, each table by name: the summary reads figures from
/// them, and a table added later cannot shift which one it reads.
#[derive(Debug, Clone)]
pub struct HookTables {
    /// [`call_cost`]: launch and alloc/free pairs per client style.
    pub calls: Table,
    /// [`pool_cost`]: stream-ordered pools and graph memory.
    pub pools: Table,
    /// [`join_time`] at 256 processes.
    pub join: Table,
}

impl HookTables {
    /// In the order they print.
    pub fn all(&self) -> [&Table; 3] {
        [&self.calls, &self.pools, &self.join]
    }
}

/// The whole section.
pub fn tables(calls: u64, runs: usize) -> Result<HookTables, String> {
    Ok(HookTables {
        calls: call_cost(calls, runs)?,
        pools: pool_cost(calls, runs)?,
        join: join_time(256)?,
    })
}
