//! Hundreds of processes at once: `n` processes joining one allocation, and `n`
//! allocations of one process each, all started back to back; each process calls
//! `cuInit` and makes a context. Figures: the shim's join (from its own log line: files
//! checked, slot claimed, devices mapped) at p50/p99/max, and the total time from the
//! first start until every process has its context.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};

use super::Table;
use super::hook::{join_lines, quantile};
use crate::hook_library;
use crate::probe::{Mode, ProbeChild};
use crate::sim::SimNode;

/// Starts `n` probes from `command`, each told `init` then `ctx` at once; the time until
/// all answered.
fn herd(n: usize, command: impl Fn(usize) -> Command) -> Result<f64, String> {
    const T: std::time::Duration = std::time::Duration::from_secs(300);
    let t0 = Instant::now();
    let mut probes: Vec<ProbeChild> = (0..n).map(|i| ProbeChild::start(command(i))).collect();
    for p in &mut probes {
        p.send("init");
        p.send("ctx");
    }
    for p in &mut probes {
        for cmd in ["init", "ctx"] {
            let l = p
                .try_next(T)
                .ok_or(format!("no answer to {cmd} in {T:?}"))?;
            if !l.ok {
                return Err(format!("{cmd} failed: {}", l.raw));
            }
        }
    }
    let total = t0.elapsed().as_secs_f64();
    for p in probes {
        p.finish();
    }
    Ok(total)
}

fn spec(id: &str, uuid: &str, bytes: u64) -> ControlSpec {
    ControlSpec::new(
        id,
        vec![DeviceSpec {
            uuid: uuid.to_owned(),
            memory_limit_bytes: bytes,
            compute_share_ppm: 1_000_000,
            policy: Policy::Burst,
        }],
    )
}

fn governed(node: &SimNode, hook: &Path, dir: &Path, logs: &Path, i: usize) -> Command {
    let mut c = node.probe(Mode::Link, &[]);
    c.env("LD_PRELOAD", hook)
        .env("TESSERA_CONTROL", dir.join("control"))
        .env("TESSERA_STATE", dir.join("state"))
        .env("TESSERA_LOG", "info")
        .env("TESSERA_LOG_FILE", logs.join(format!("hook.{i}.log")));
    c
}

/// The section's table for `n` processes.
pub fn table(n: usize) -> Result<Table, String> {
    let hook = hook_library().ok_or("libtessera.so not built: cargo build -p tessera-hook")?;
    let node = SimNode::builder().devices(1).memory("256Gi").build();
    let uuid = node.node().device_info(0).map_err(|e| e.to_string())?.uuid;
    let root = node.dir.path().to_owned();
    let mut rows = Vec::new();
    for (name, one_allocation) in [
        (format!("{n} processes, one allocation"), true),
        (format!("{n} allocations, one process each"), false),
    ] {
        let tag = if one_allocation { "one" } else { "many" };
        let logs = root.join(format!("logs-{tag}"));
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let dirs: Vec<_> = if one_allocation {
            let d = root.join("alloc-one");
            create_allocation_files(&d, &spec("one", &uuid, 32 << 30))
                .map_err(|e| e.to_string())?;
            vec![d; n]
        } else {
            (0..n)
                .map(|i| {
                    let d = root.join(format!("alloc-{i}"));
                    create_allocation_files(&d, &spec(&format!("a{i}"), &uuid, 1 << 30))
                        .map(|_| d)
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<_, _>>()?
        };
        let total = herd(n, |i| governed(&node, &hook, &dirs[i], &logs, i))?;
        let lines = join_lines(&logs)?;
        if lines.len() != n {
            return Err(format!(
                "{} of {n} processes logged their join",
                lines.len()
            ));
        }
        let mut joins: Vec<f64> = lines.iter().map(|j| j.0).collect();
        let mut cpu: Vec<f64> = lines.iter().map(|j| j.1).collect();
        joins.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        let ms = |ns: f64| format!("{:.2}", ns / 1e6);
        rows.push(vec![
            name,
            ms(quantile(&joins, 0.5)),
            ms(quantile(&joins, 0.99)),
            ms(joins[joins.len() - 1]),
            ms(quantile(&cpu, 0.5)),
            ms(quantile(&cpu, 0.99)),
            format!("{total:.2}"),
        ]);
        node.node().reap_dead();
    }
    Ok(Table {
        title: format!("many processes: {n} started back to back, each cuInit + a context"),
        columns: [
            "case",
            "join p50 ms",
            "join p99 ms",
            "join max ms",
            "join CPU p50 ms",
            "join CPU p99 ms",
            "all started s",
        ]
            .map(String::from)
            .to_vec(),
        rows,
        notes: vec![
            "join: the shim's own (files opened and checked, slot claimed, devices mapped by UUID, gate set up), from its log; wall time includes waiting for a CPU among 500 starting processes, CPU time is the work itself".into(),
            "all started: from the first spawn until every process has answered cuInit and made its context (process start, loader, driver included)".into(),
        ],
    })
}
