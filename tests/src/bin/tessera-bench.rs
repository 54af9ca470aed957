//! `tessera-bench`: prints benchmark tables. `cargo run --release -p tessera-e2e --bin
//! tessera-bench -- sim|hook|compute|compute-shapes|compute-detail|compute-sync|compute-handover|race|many|dra|dropin|run|all [--calls N] [--runs N] [--measure SECS]
//! [--processes N] [--race-secs SECS] [--only TEXT] [--markdown] [--together]`. `all` prints one summary table (figure,
//! measured, target, verdict) before every section's own tables. `soak --minutes N
//! [--seed S]` drives a simulated node with random events and faults for at least N
//! minutes and until it has taken every action of its mix, checking its
//! invariants after every step; it exits 1 on any violation. `run`: `tessera run -- true`
//! start-up (node's manager, private manager warm and cold) beside a bare start.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tessera_e2e::bench::{self, Table};

const USAGE: &str = "usage: tessera-bench <section>... [--calls N] [--runs N] [--measure SECS] [--processes N] [--race-secs SECS] [--real] [--only TEXT] [--markdown] [--together] [--contested-idle-release SECS] [--grant-ahead SECS] [--renew-ahead SECS] [--charge-from-grant] [--no-cut-off-away] [--arbiter-nice N] [--ungoverned]
       tessera-bench soak [--minutes N] [--seed S]
sections: sim (simulated driver launch cost), run (`tessera run -- true` start-up: node's manager, private manager warm and cold, beside a bare start), hook (shim cost per call, join time), compute (time-slice shares of every program shape, one row per shape and allocation mix; then the shares with no arbiter and the gate's cost), compute-shapes (only the shapes' table), compute-detail (the earlier per-allocation share tables: 20/30/50, burst 25+25, launch calls, programs that synchronise, the hand-over rules), compute-sync (only the shares of programs that synchronise), compute-handover (only the hand-over, pre-armed and after the drain, side by side), race (processes racing one memory limit), many (500 processes in one allocation, 500 allocations: join and start times), dra (DRA plugin prepare/unprepare latency of one claim, 20 x --runs), dropin (the compute shares HAMi/Volcano pods ask for, target vs achieved), all (a summary table, then every section)
soak: a seeded random mix of node events and faults for at least N minutes (3), and on until it has taken 200 steps and every action of the mix at least once (at most 30 minutes more), invariants checked after every step; exits 1 on a violation
--real: compute against the libcuda.so.1 the process finds (a real GPU), kernels from the bench's PTX, shares by the workloads' own counts; its last line is a JSON summary
--only TEXT: compute, compute-shapes: only the scenarios whose name (shape, allocations) contains TEXT, any case; --markdown: tables as Markdown (pasteable into the README)
--measure: seconds per compute scenario (10); --processes, --race-secs: the race's processes (16) and length (5)
--together: compute, compute-shapes: a shape's allocation mixes at once (a loaded host: up to ten workloads on its cores) instead of one mix at a time
--contested-idle-release SECS: compute sections: the arbiter's idle release while another allocation waits (default 0.0005), to compare rules at one load
--grant-ahead SECS: compute sections: how long before an allocation is expected back from a host gap it may be granted (default 0.0002; 0: only at its gate), to compare rules at one load
--renew-ahead SECS: compute sections: how long before its quantum's end a holder that would win the next pick anyway is renewed (default 0.005, at most half the quantum; 0: at the end, the rule before), to compare rules at one load
--charge-from-grant: compute sections: a holder's time starts at its grant, the rule before its first launch started it (while no one else waits), to compare rules at one load
--no-cut-off-away: compute sections: a holder cut off at its quantum while its processes yield is expected back only after an idle revocation (the rule before; by default it is away in its host gap from then, and granted ahead), to compare rules at one load
--arbiter-nice N: compute sections: the nice value of the arbiter's threads (default -10, where the bench may raise them, as the manager; 0: the bench's own priority, the rule before), to compare rules at one load
--ungoverned: compute-shapes: each mix's programs on one GPU with no gate (whole-GPU allocations), against the governed targets: what they get with nothing between them";

struct Options {
    calls: u64,
    runs: usize,
    measure: Duration,
    processes: usize,
    race_for: Duration,
    /// `compute --real`: the scenarios on the driver the process finds.
    real: bool,
    /// Tables as Markdown, to paste into the README.
    markdown: bool,
    /// `compute`, `compute-shapes`: only the scenarios whose name has this.
    only: Option<String>,
}

/// `tessera-bench __manager <manager flags>`: the manager the soak starts and restarts
/// (the manager's library, as `tessera manager` runs it).
fn manager_main(args: Vec<String>) -> Result<()> {
    use clap::Parser;
    #[derive(Parser)]
    struct ManagerCli {
        #[command(flatten)]
        args: tessera_manager::ManagerArgs,
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = ManagerCli::try_parse_from(std::iter::once("manager".to_owned()).chain(args))?;
    let config = tessera_manager::Config::load(&cli.args)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(tessera_manager::daemon::run_with(config, |_| {}))?;
    Ok(())
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // `manager` and `run` as `tessera` spells them: the run bench starts
    // this binary in their place when the `tessera` binary was not built.
    match argv.first().map(String::as_str) {
        Some("__manager" | "manager") => return manager_main(argv[1..].to_vec()),
        // `run … -- COMMAND`; the section `run` has no `--`.
        Some("run") if argv.iter().any(|a| a == "--") => run_main(argv),
        _ => {}
    }
    if argv.first().map(String::as_str) == Some("soak") {
        return soak_main(&argv[1..]);
    }
    let mut sections = Vec::new();
    let mut o = Options {
        calls: 1_000_000,
        runs: 5,
        measure: Duration::from_secs(10),
        processes: 16,
        race_for: Duration::from_secs(5),
        real: false,
        markdown: false,
        only: None,
    };
    // A duration in seconds where 0 is a rule of its own (the one before).
    let secs_or_zero = |v: Option<String>, what: &str| -> Result<Duration> {
        let s: f64 = v.context(USAGE)?.parse().context(what.to_string())?;
        if !(s.is_finite() && s >= 0.0) {
            bail!("{what} must be 0 or a positive number of seconds");
        }
        Ok(Duration::from_secs_f64(s))
    };
    let secs = |v: Option<String>, what: &str| -> Result<Duration> {
        let d = secs_or_zero(v, what)?;
        if d.is_zero() {
            bail!("{what} must be a positive number of seconds");
        }
        Ok(d)
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--calls" => o.calls = args.next().context(USAGE)?.parse().context("--calls")?,
            "--runs" => o.runs = args.next().context(USAGE)?.parse().context("--runs")?,
            "--processes" => {
                o.processes = args.next().context(USAGE)?.parse().context("--processes")?;
            }
            "--measure" => o.measure = secs(args.next(), "--measure")?,
            "--race-secs" => o.race_for = secs(args.next(), "--race-secs")?,
            "--real" => o.real = true,
            "--markdown" => o.markdown = true,
            "--together" => bench::compute::set_mixes_together(true),
            "--contested-idle-release" => {
                let d = secs(args.next(), "--contested-idle-release")?;
                bench::compute::set_contested_idle_release(d);
            }
            "--grant-ahead" => {
                let d = secs_or_zero(args.next(), "--grant-ahead")?;
                bench::compute::set_grant_ahead(d);
            }
            "--renew-ahead" => {
                let d = secs_or_zero(args.next(), "--renew-ahead")?;
                bench::compute::set_renew_ahead(d);
            }
            "--charge-from-grant" => bench::compute::set_late_start(false),
            "--no-cut-off-away" => bench::compute::set_cut_off_away(false),
            "--arbiter-nice" => {
                let n: i32 = args
                    .next()
                    .context(USAGE)?
                    .parse()
                    .context("--arbiter-nice")?;
                if !(-20..=0).contains(&n) {
                    bail!("--arbiter-nice must be -20..=0 (0: the bench's own priority)");
                }
                bench::compute::set_arbiter_nice(n);
            }
            "--ungoverned" => bench::compute::set_ungoverned(true),
            "--only" => {
                let v = args.next().context(USAGE)?;
                if v.trim().is_empty() {
                    bail!("--only needs part of a scenario's name");
                }
                o.only = Some(v);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            s if s.starts_with('-') => bail!("unknown option {s}\n{USAGE}"),
            s if [
                "sim",
                "hook",
                "compute",
                "compute-shapes",
                "compute-detail",
                "compute-sync",
                "compute-handover",
                "race",
                "many",
                "dra",
                "dropin",
                "run",
                "all",
            ]
            .contains(&s) =>
            {
                sections.push(s.to_string());
            }
            s => bail!("unknown section {s}\n{USAGE}"),
        }
    }
    if sections.is_empty() {
        bail!("{USAGE}");
    }
    for s in &sections {
        let all = s == "all";
        let mut tables = Vec::new();
        let mut sim = None;
        let mut hook = None;
        let mut compute = Vec::new();
        let mut race = None;
        if all || s == "sim" {
            let t = bench::sim_launch_cost(o.calls, o.runs).map_err(anyhow::Error::msg)?;
            sim = Some(t.clone());
            tables.push(t);
        }
        if all || s == "hook" {
            let h = bench::hook::tables(o.calls, o.runs).map_err(anyhow::Error::msg)?;
            tables.extend(h.all().into_iter().cloned());
            hook = Some(h);
        }
        if s == "compute" && o.real {
            let (t, summary) = bench::real::table(o.measure).map_err(anyhow::Error::msg)?;
            println!("{}", t.render());
            // The last line, for tests/gpu/run.sh.
            println!("{summary}");
            continue;
        }
        if s == "compute" || s == "compute-shapes" {
            tables.push(
                bench::compute::shape_table(o.measure, o.only.as_deref())
                    .map_err(anyhow::Error::msg)?,
            );
        }
        if s == "compute" && o.only.is_none() {
            tables.extend(bench::compute::other_tables(o.measure).map_err(anyhow::Error::msg)?);
        }
        if all || s == "compute-detail" {
            compute = bench::compute::tables(o.measure).map_err(anyhow::Error::msg)?;
            tables.extend(compute.iter().cloned());
        }
        if s == "compute-handover" {
            tables.push(bench::compute::prearm_table(o.measure).map_err(anyhow::Error::msg)?);
        }
        if s == "compute-sync" {
            tables.push(bench::compute::sync_table(o.measure).map_err(anyhow::Error::msg)?);
            tables.push(bench::compute::sync_rule_table(o.measure).map_err(anyhow::Error::msg)?);
        }
        if all || s == "race" {
            let r = bench::race::race(o.processes, o.race_for).map_err(anyhow::Error::msg)?;
            tables.push(bench::race::table(&r, o.processes, o.race_for));
            race = Some(r);
        }
        if s == "run" {
            tables.push(bench::run::table(40, 15).map_err(anyhow::Error::msg)?);
        }
        if s == "many" {
            tables.push(bench::many::table(500).map_err(anyhow::Error::msg)?);
        }
        if s == "dropin" {
            tables.push(bench::dropin::table(o.measure).map_err(anyhow::Error::msg)?);
        }
        if s == "dra" {
            tables.push(bench::dra::table(o.runs.max(1) * 20).map_err(anyhow::Error::msg)?);
        }
        let render = |t: &Table| {
            if o.markdown { t.markdown() } else { t.render() }
        };
        if all {
            let summary = summary(sim.as_ref(), hook.as_ref(), &compute, race.as_ref(), &o)?;
            println!("{}", render(&summary));
        }
        for table in tables {
            println!("{}", render(&table));
        }
    }
    Ok(())
}

/// `tessera-bench run <tessera run flags>`: `tessera run` itself (the run bench's stand-in
/// for the `tessera` binary); leaves with the command's code.
fn run_main(argv: Vec<String>) -> ! {
    use clap::Parser;
    #[derive(Parser)]
    struct RunCli {
        #[command(flatten)]
        args: tessera_client::run::RunArgs,
    }
    let cli = RunCli::parse_from(argv);
    match tessera_client::run::run(&cli.args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// `tessera-bench soak [--minutes N] [--seed S]`.
fn soak_main(args: &[String]) -> Result<()> {
    let mut minutes = 3.0f64;
    let mut seed = 1u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" => minutes = it.next().context(USAGE)?.parse().context("--minutes")?,
            "--seed" => seed = it.next().context(USAGE)?.parse().context("--seed")?,
            // Asked for, the usage is the answer, not an error.
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown soak option {other}\n{USAGE}"),
        }
    }
    if !(minutes.is_finite() && minutes > 0.0) {
        bail!("--minutes must be a positive number");
    }
    let report = bench::soak::soak(Duration::from_secs_f64(minutes * 60.0), seed)
        .map_err(anyhow::Error::msg)?;
    println!("{}", report.table().render());
    if !report.violations.is_empty() {
        bail!("{} invariant violations", report.violations.len());
    }
    Ok(())
}

/// The cell of `table` in column `column`, on the first row that `pick`
/// accepts, as a number.
fn cell(table: &Table, pick: impl Fn(&[String]) -> bool, column: &str) -> Result<f64> {
    let c = table
        .columns
        .iter()
        .position(|n| n == column)
        .with_context(|| format!("no column {column:?} in {:?}", table.title))?;
    let row = table
        .rows
        .iter()
        .find(|r| pick(r))
        .with_context(|| format!("no matching row in {:?}", table.title))?;
    row.get(c)
        .and_then(|v| v.trim_start_matches('+').parse().ok())
        .with_context(|| format!("{column:?} of {row:?} is not a number"))
}

fn verdict(ok: bool) -> String {
    if ok { "ok" } else { "MISS" }.to_string()
}

/// One row per headline figure, read from the sections' tables (which keep
/// the detail and the method).
fn summary(
    sim: Option<&Table>,
    hook: Option<&bench::hook::HookTables>,
    compute: &[Table],
    race: Option<&bench::race::RaceResult>,
    o: &Options,
) -> Result<Table> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut push = |figure: String, measured: String, target: &str, v: String| {
        rows.push(vec![figure, measured, target.to_string(), v]);
    };
    if let Some(t) = sim {
        for mode in ["link", "dlopen", "procaddr"] {
            let ns = cell(t, |r| r[0] == mode, "ns/call")?;
            push(
                format!("simulated cuLaunchKernel ({mode})"),
                format!("{ns:.1} ns"),
                "-",
                "-".into(),
            );
        }
    }
    if let Some(bench::hook::HookTables { calls, pools, join }) = hook {
        for (call, name, bound) in [
            ("cuLaunchKernel", "shim added per launch", 20.0),
            (
                "cuMemAlloc_v2 + cuMemFree_v2",
                "shim added per alloc/free pair",
                1000.0,
            ),
        ] {
            for mode in ["link", "dlopen", "procaddr"] {
                let pick = |r: &[String]| r[0] == mode && r[1] == call && r[2] == "governed";
                let added = cell(calls, pick, "added ns")?;
                let ratio = cell(calls, pick, "ratio")?;
                push(
                    format!("{name} ({mode})"),
                    format!("{added:+.1} ns (x{ratio:.3})"),
                    if bound < 100.0 { "<= 20 ns" } else { "<= 1 us" },
                    verdict(added <= bound),
                );
            }
        }
        // Stream-ordered pools and graph memory: no bound of their own (they
        // are charged like any allocation); shown so a change in their cost shows.
        for (call, name) in [
            ("cuMemAllocAsync", "shim added per async alloc/free pair"),
            (
                "cuGraphLaunch",
                "shim added per launch of an allocating graph",
            ),
        ] {
            let pick = |r: &[String]| r[0].starts_with(call);
            let added = cell(pools, pick, "added ns")?;
            let ratio = cell(pools, pick, "ratio")?;
            push(
                name.into(),
                format!("{added:+.1} ns (x{ratio:.3})"),
                "-",
                "-".into(),
            );
        }
        for (what, p50_bound, p99_bound) in [("wall", 1000.0, 10_000.0), ("CPU", 1000.0, 10_000.0)]
        {
            let name = format!("released together: shim's join, {what}");
            let pick = |r: &[String]| r[0] == name;
            let p50 = cell(join, pick, "p50")?;
            let p99 = cell(join, pick, "p99")?;
            push(
                format!("join at 256 processes, {what} p50 / p99"),
                format!("{:.2} / {:.2} ms", p50 / 1000.0, p99 / 1000.0),
                "< 1 / < 10 ms",
                verdict(p50 < p50_bound && p99 < p99_bound),
            );
        }
    }
    if let Some(shares) = compute.first() {
        compute_rows(shares, &mut push)?;
    }
    if let Some(r) = race {
        push(
            format!(
                "memory race, {} processes, {} s: bytes over the limit",
                o.processes,
                o.race_for.as_secs_f64()
            ),
            format!(
                "{} (peak {:.1} of {:.0} MiB, {} samples, {} admitted / {} refused)",
                r.over_limit,
                r.peak as f64 / (1u64 << 20) as f64,
                r.limit as f64 / (1u64 << 20) as f64,
                r.samples,
                r.admitted,
                r.refused
            ),
            "0",
            verdict(r.over_limit == 0 && r.inconsistent == 0 && r.samples > 0),
        );
    }
    Ok(Table {
        title: "Summary (details in the tables below)".into(),
        columns: ["figure", "measured", "target / bound", "verdict"]
            .map(String::from)
            .to_vec(),
        rows,
        notes: vec![
            "shim rows: governed (in an allocation), fastest run; join: all started and waiting, then released at once; compute: achieved = busy time on the simulated GPU (ground truth).".into(),
        ],
    })
}

/// Rows of the compute shares table: one per scenario, target vs achieved,
/// GPU busy, hand-over p50/p99.
fn compute_rows(shares: &Table, push: &mut impl FnMut(String, String, &str, String)) -> Result<()> {
    let col = |name: &str| {
        shares
            .columns
            .iter()
            .position(|c| c == name)
            .with_context(|| format!("no column {name:?} in the compute table"))
    };
    let (sc, al, ach, busy, p50, p99) = (
        col("scenario")?,
        col("allocation")?,
        col("achieved %")?,
        col("GPU busy %")?,
        col("hand-over p50 ms")?,
        col("p99 ms")?,
    );
    // Scenarios: a first row with the name and the GPU's figures, then one
    // row per further allocation.
    let mut groups: Vec<Vec<&Vec<String>>> = Vec::new();
    for r in &shares.rows {
        if !r[sc].is_empty() || groups.is_empty() {
            groups.push(Vec::new());
        }
        if let Some(g) = groups.last_mut() {
            g.push(r);
        }
    }
    let num = |s: &str| -> Result<f64> { s.parse().with_context(|| format!("{s:?}: no number")) };
    for g in groups {
        let name = &g[0][sc];
        let gpu = num(&g[0][busy])?;
        let mut targets = Vec::new();
        let mut achieved = Vec::new();
        let mut burst = false;
        for r in &g {
            let (policy, pct) = r[al]
                .split_once(' ')
                .with_context(|| format!("allocation {:?}", r[al]))?;
            burst |= policy == "burst";
            targets.push(num(pct.trim_end_matches('%'))?);
            achieved.push(num(&r[ach])?);
        }
        let list = |v: &[f64], p: usize| {
            v.iter()
                .map(|x| format!("{x:.p$}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let (target, ok) = if burst {
            let even = 100.0 / achieved.len() as f64;
            let total: f64 = achieved.iter().sum();
            let split_ok = achieved
                .iter()
                .all(|a| (a / total.max(1e-9) * 100.0 - even).abs() <= 2.0);
            ("GPU >= 95%, even split +-2 pp", gpu >= 95.0 && split_ok)
        } else if g.len() == 1 {
            (
                "share -1 pp .. share",
                achieved[0] >= targets[0] - 1.0 && achieved[0] <= targets[0] + 0.1,
            )
        } else {
            (
                "each within 1 pp",
                achieved
                    .iter()
                    .zip(&targets)
                    .all(|(a, t)| (a - t).abs() <= 1.0),
            )
        };
        push(
            format!("compute {name}: target -> achieved %"),
            format!(
                "{} -> {} (GPU busy {gpu:.2}%)",
                list(&targets, 0),
                list(&achieved, 2)
            ),
            target,
            verdict(ok),
        );
        // Every scenario with more than one allocation has its hand-over row,
        // measured or not: a short window on a loaded box may see no hand-over
        // ("-"), and the summary keeps its rows whatever a run measured.
        if g[0][p50] != "-" || g.len() > 1 {
            let measured = if g[0][p50] == "-" {
                "- (no hand-over measured)".to_owned()
            } else {
                format!("{} / {} ms", g[0][p50], g[0][p99])
            };
            push(
                format!("compute {name}: hand-over p50 / p99"),
                measured,
                "-",
                "-".into(),
            );
        }
    }
    Ok(())
}
