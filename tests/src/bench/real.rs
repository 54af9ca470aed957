//! `tessera-bench compute --real`: the compute scenarios against whatever
//! `libcuda.so.1` the process finds (a real GPU's driver; the simulator's
//! when `LD_LIBRARY_PATH` points there, as `tests/gpu/run.sh --sim` does),
//! with no simulator knob: the kernels come from a PTX string shipped here,
//! a kernel that spins on the GPU's global timer for its argument's length.
//!
//! There is no ground truth of the engine's timeline on a real GPU, so an
//! allocation's achieved share is what its own workloads report: kernels
//! completed times their length, over the time they ran. That holds because
//! the arbiter lets one allocation's work run at a time: a spinning kernel's
//! wall time is then its own time on the GPU. Hand-over latencies are the
//! in-process arbiter's, as in the simulated bench.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tessera_manager::arbiter::{Arbiter, ArbiterConfig, OpenFiles, percentile};
use tessera_shm::{ControlSpec, DeviceSpec, create_allocation_files};

use super::compute::{AllocFiles, AllocSpec, Scenario, Workload, workload_binary};
use crate::bench::Table;

/// The kernel: `spin(u64 ns)` busy-waits on `%globaltimer` (ns since an
/// epoch, the GPU's wall clock) until `ns` have passed since it started.
/// One thread of one block: the length, not the occupancy, is what the
/// arbiter shares. PTX ISA 7.8 for sm_80 and later, so the driver JITs it
/// for the GPU it finds (an H200 is sm_90).
pub const SPIN_PTX: &str = r#"
.version 7.8
.target sm_80
.address_size 64

.visible .entry spin(
    .param .u64 spin_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [spin_ns];
    mov.u64 %rd2, %globaltimer;
    add.s64 %rd3, %rd2, %rd1;
LOOP:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra LOOP;
    ret;
}
"#;

/// The scenarios of the real run: the issue's shapes that fit in a few
/// minutes on one GPU, each `measure` long.
pub fn scenarios(measure: Duration) -> Vec<Scenario> {
    let triple = || {
        vec![
            AllocSpec::guaranteed(20),
            AllocSpec::guaranteed(30),
            AllocSpec::guaranteed(50),
        ]
    };
    let us = Duration::from_micros;
    let mut out = vec![
        Scenario::new(
            "guaranteed 30 alone, 1000 us kernels",
            vec![AllocSpec::guaranteed(30)],
            us(1_000),
            measure,
        ),
        Scenario::new(
            "guaranteed 20/30/50, 50 us kernels",
            triple(),
            us(50),
            measure,
        ),
        Scenario::new(
            "guaranteed 20/30/50, 1000 us kernels",
            triple(),
            us(1_000),
            measure,
        ),
        Scenario::new(
            "guaranteed 20/30/50, 20000 us kernels",
            triple(),
            us(20_000),
            measure,
        ),
    ];
    let mut sync = Scenario::new(
        "guaranteed 30+70, 1000 us kernels, sync every 2",
        vec![AllocSpec::guaranteed(30), AllocSpec::guaranteed(70)],
        us(1_000),
        measure,
    );
    sync.sync_every = 2;
    out.push(sync);
    out
}

/// What one scenario got on the real driver.
#[derive(Debug, Clone)]
pub struct RealOutcome {
    pub name: String,
    pub allocs: Vec<AllocSpec>,
    /// % of the run each allocation's kernels ran (their own count).
    pub achieved: Vec<f64>,
    pub handover_p50: Option<u64>,
    pub handover_p99: Option<u64>,
    pub failures: Vec<String>,
}

/// The UUID of CUDA device 0 as the driver names it (the workload's `uuid`
/// mode, outside any allocation).
///
/// # Errors
/// When the workload cannot run or prints no UUID (no driver, no GPU).
pub fn gpu_uuid() -> Result<String, String> {
    let out = Command::new(workload_binary())
        .arg("uuid")
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("running the workload: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let uuid = text.trim();
    if !out.status.success() || !uuid.starts_with("GPU-") {
        return Err(format!(
            "no GPU found: {} {}",
            uuid,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(uuid.to_string())
}

/// `launches=<n>` and `elapsed_ns=<t>` of a workload's `done` line.
pub fn parse_done(line: &str) -> Option<(u64, f64)> {
    let mut launches = None;
    let mut elapsed = None;
    for field in line.split_whitespace() {
        if let Some(v) = field.strip_prefix("launches=") {
            launches = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("elapsed_ns=") {
            elapsed = v.parse().ok();
        }
    }
    Some((launches?, elapsed?))
}

/// Runs one scenario on GPU `uuid` under `arbiter`, its allocation files in
/// `dir`, its workloads loading the PTX at `ptx`.
///
/// # Panics
/// On set-up failures (files, processes).
pub fn run(arbiter: &Arbiter, uuid: &str, dir: &Path, ptx: &Path, sc: &Scenario) -> RealOutcome {
    let files: Vec<AllocFiles> = sc
        .allocs
        .iter()
        .enumerate()
        .map(|(i, &spec)| {
            let id = format!("real-{i}");
            let adir = dir.join(&id);
            let (control, state) = create_allocation_files(
                &adir,
                &ControlSpec::new(
                    &id,
                    vec![DeviceSpec {
                        uuid: uuid.to_string(),
                        memory_limit_bytes: 4 << 30,
                        compute_share_ppm: spec.share_ppm,
                        policy: spec.policy,
                    }],
                ),
            )
            .expect("creating the allocation's files");
            AllocFiles {
                id,
                control,
                state,
                spec,
            }
        })
        .collect();
    for f in &files {
        let opened = OpenFiles::open(&f.control, &f.state).expect("opening the allocation");
        arbiter
            .add_allocation(Arc::new(opened), 0)
            .expect("adding the allocation to the arbiter");
    }
    let before = handovers(arbiter, uuid).len();
    let seconds = (sc.warmup + sc.measure).as_secs_f64();
    let mut workloads: Vec<Workload> = files
        .iter()
        .map(|f| {
            let mut cmd = Command::new(workload_binary());
            cmd.env("TESSERA_BENCH_PTX", ptx);
            Workload::start(cmd, f, 0, sc, seconds)
        })
        .collect();
    let mut failures = Vec::new();
    for w in &mut workloads {
        if w.wait_line("ready", Duration::from_secs(60)).is_none() {
            failures.push(format!("workload {} did not start: {:?}", w.pid(), w.seen));
        }
    }
    let kernel_ns = sc.kernel.as_nanos() as f64;
    let achieved = workloads
        .into_iter()
        .map(
            |w| match w.finish(Duration::from_secs_f64(seconds + 60.0)) {
                Ok(done) => match parse_done(&done) {
                    Some((n, elapsed)) if elapsed > 0.0 => n as f64 * kernel_ns / elapsed * 100.0,
                    _ => {
                        failures.push(format!("unreadable done line {done:?}"));
                        0.0
                    }
                },
                Err(e) => {
                    failures.push(e);
                    0.0
                }
            },
        )
        .collect();
    let samples: Vec<u64> = handovers(arbiter, uuid).into_iter().skip(before).collect();
    for f in &files {
        let _ = arbiter.remove_allocation(&f.id);
    }
    RealOutcome {
        name: sc.name.clone(),
        allocs: sc.allocs.clone(),
        achieved,
        handover_p50: percentile(&samples, 50.0),
        handover_p99: percentile(&samples, 99.0),
        failures,
    }
}

fn handovers(arbiter: &Arbiter, uuid: &str) -> Vec<u64> {
    arbiter
        .gpu_stats_of(uuid)
        .map(|g| g.handover_ns)
        .unwrap_or_default()
}

/// The worst distance of a guaranteed share from its target, in points.
pub fn worst_miss(outcomes: &[RealOutcome]) -> f64 {
    outcomes
        .iter()
        .flat_map(|o| {
            o.allocs
                .iter()
                .zip(&o.achieved)
                .map(|(a, got)| (f64::from(a.share_ppm) / 10_000.0 - got).abs())
        })
        .fold(0.0, f64::max)
}

/// Runs [`scenarios`] one after another on CUDA device 0; returns the table
/// and a one-line JSON summary (`ok`: every guaranteed share within 2
/// points, no workload failed; `worst_miss_pp`; `handover_p99_ms`).
///
/// # Errors
/// When no GPU is found or the arbiter cannot start.
pub fn table(measure: Duration) -> Result<(Table, String), String> {
    let uuid = gpu_uuid()?;
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let ptx: PathBuf = dir.path().join("spin.ptx");
    std::fs::write(&ptx, SPIN_PTX).map_err(|e| format!("writing the PTX: {e}"))?;
    let arbiter = Arbiter::new(ArbiterConfig::default()).map_err(|e| e.to_string())?;
    let outcomes: Vec<RealOutcome> = scenarios(measure)
        .iter()
        .map(|sc| run(&arbiter, &uuid, dir.path(), &ptx, sc))
        .collect();
    let ms = |v: Option<u64>| v.map_or("-".into(), |ns| format!("{:.2}", ns as f64 / 1e6));
    let rows = outcomes
        .iter()
        .map(|o| {
            let pair = |v: Vec<String>| v.join(" / ");
            vec![
                o.name.clone(),
                pair(
                    o.allocs
                        .iter()
                        .map(|a| format!("{}", a.share_ppm / 10_000))
                        .collect(),
                ),
                pair(o.achieved.iter().map(|a| format!("{a:.2}")).collect()),
                ms(o.handover_p50),
                ms(o.handover_p99),
            ]
        })
        .collect();
    let failures: Vec<String> = outcomes.iter().flat_map(|o| o.failures.clone()).collect();
    let worst = worst_miss(&outcomes);
    let p99 = outcomes.iter().filter_map(|o| o.handover_p99).max();
    let mut notes = vec![
        format!(
            "GPU {uuid}; {} s per scenario after {} ms of warm-up; achieved = the allocation's completed kernels x their length / its run time (its own count: no engine timeline on a real GPU).",
            measure.as_secs_f64(),
            scenarios(measure)[0].warmup.as_millis()
        ),
        "Kernels: `spin` from the bench's PTX, one thread spinning on %globaltimer for the kernel's length.".into(),
    ];
    notes.extend(failures.iter().map(|f| format!("FAILED: {f}")));
    let ok = failures.is_empty() && worst <= 2.0;
    let summary = format!(
        "{{\"ok\": {ok}, \"worst_miss_pp\": {worst:.2}, \"handover_p99_ms\": {}, \"gpu\": \"{uuid}\"}}",
        p99.map_or("null".into(), |ns| format!("{:.2}", ns as f64 / 1e6))
    );
    Ok((
        Table {
            title: "Compute shares on the real driver (tessera-bench compute --real)".into(),
            columns: [
                "scenario",
                "target %",
                "achieved %",
                "hand-over p50 ms",
                "hand-over p99 ms",
            ]
            .map(String::from)
            .to_vec(),
            rows,
            notes,
        },
        summary,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_done_line_is_read_and_a_bad_one_is_not() {
        assert_eq!(
            parse_done("done launches=42 elapsed_ns=1000000"),
            Some((42, 1e6))
        );
        assert_eq!(parse_done("done launches=42"), None);
        assert_eq!(parse_done("done launches=x elapsed_ns=1"), None);
    }

    #[test]
    fn the_ptx_declares_the_kernel_the_workload_asks_for() {
        assert!(SPIN_PTX.contains(".entry spin("));
        assert!(SPIN_PTX.contains("%globaltimer"));
    }
}
