//! `tessera simulate`: replays a cluster trace in the openb CSV format
//! through the placement engine with the published protocol, and reports
//! per policy the unallocated GPU share at 100% arrived demand.
//!
//! - [`trace`]: reading the node and pod lists.
//! - [`mod@replay`]: the protocol (seeded shuffle, inflation, one attempt).
//! - [`report`]: the table, JSON and the SVG plot.
//! - [`mod@bench`]: decision time at the trace's size and ten times it.

pub mod bench;
pub mod replay;
pub mod report;
pub mod trace;

use std::path::PathBuf;

use tessera_placement::{PlaceError, Policy, PolicyError, TaskMix};

use crate::replay::{Outcome, arrival_order, node_order, replay};
use crate::report::Summary;

/// Share of the trace's pods whose task types make the fragmentation
/// measure's mix (the published protocol's 95%).
pub const MIX_COVERAGE: f64 = 0.95;

/// Flags of `tessera simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// The node list (openb CSV: sn,cpu_milli,memory_mib,gpu,model).
    #[arg(long, value_name = "FILE")]
    pub nodes: PathBuf,
    /// The pod list (openb CSV: name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...).
    #[arg(long, value_name = "FILE")]
    pub pods: PathBuf,
    /// Policies to compare, comma-separated: defrag, fgd, binpack, spread,
    /// `shared-threshold[:T]`; `all` for every one. Default: the policy a node
    /// gets when its config names none.
    #[arg(long, value_name = "NAME[,NAME...]")]
    pub policy: Option<String>,
    /// Seeds: `42..51` (inclusive), `7`, or `1,2,3`.
    #[arg(long, default_value = "42..51")]
    pub seeds: String,
    /// Print JSON (one object per policy) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG of unallocated share against arrived demand.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Instead of the replay table: decision time at the trace's size and
    /// at ten times it (the nodes repeated), one seed.
    #[arg(long)]
    pub bench: bool,
    /// Keep the node list's order for every seed (ties go to the first node
    /// of the file) instead of the published simulator's random node order
    /// per seed.
    #[arg(long)]
    pub trace_node_order: bool,
}

/// Why `tessera simulate` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("--seeds {0:?}: expected FIRST..LAST, a number, or a comma-separated list")]
    Seeds(String),
    #[error("placement: {0}")]
    Place(#[from] PlaceError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Parses `--policy`.
pub fn parse_policies(s: Option<&str>) -> Result<Vec<Policy>, PolicyError> {
    match s {
        None => Ok(vec![Policy::default()]),
        Some(s) if s.trim().eq_ignore_ascii_case("all") => Ok(Policy::ALL.to_vec()),
        Some(s) => s.split(',').map(str::parse).collect(),
    }
}

/// Parses `--seeds`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, SimulateError> {
    let bad = || SimulateError::Seeds(s.to_owned());
    let seeds: Vec<u64> = if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad())?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .map_err(|_| bad())?;
        if b < a || b - a >= 10_000 {
            return Err(bad());
        }
        (a..=b).collect()
    } else {
        s.split(',')
            .map(|x| x.trim().parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?
    };
    if seeds.is_empty() {
        return Err(bad());
    }
    Ok(seeds)
}

/// Every (policy, seed) replay of a trace, run on the machine's cores.
/// Each seed orders the nodes at random ([`node_order`]) unless
/// `trace_node_order`; every policy of a seed sees the same order.
pub fn run_all(
    nodes: &[tessera_placement::Node],
    pods: &[tessera_placement::Request],
    policies: &[Policy],
    seeds: &[u64],
    trace_node_order: bool,
) -> Result<Vec<Vec<Outcome>>, SimulateError> {
    // Each policy's own mix of the trace's task types (FGD's protocol gives
    // a policy the trace's typical task types, as a cluster's history would).
    let mixes: Vec<TaskMix> = policies
        .iter()
        .map(|p| p.task_mix(pods, MIX_COVERAGE))
        .collect();
    let capacity = nodes.iter().map(|n| n.gpus.len() as u64).sum::<u64>() * 1000;
    let orders: Vec<Vec<usize>> = seeds
        .iter()
        .map(|&s| arrival_order(pods, capacity, s))
        .collect();
    let clusters: Vec<Vec<tessera_placement::Node>> = seeds
        .iter()
        .map(|&s| {
            if trace_node_order {
                nodes.to_vec()
            } else {
                node_order(nodes.len(), s)
                    .into_iter()
                    .map(|i| nodes[i].clone())
                    .collect()
            }
        })
        .collect();
    let jobs: Vec<(usize, usize)> = (0..policies.len())
        .flat_map(|p| (0..seeds.len()).map(move |s| (p, s)))
        .collect();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Vec<(usize, Result<Outcome, PlaceError>)>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(p, s)) = jobs.get(j) else { break };
                        out.push((
                            j,
                            replay(
                                &clusters[s],
                                pods,
                                &mixes[p],
                                &orders[s],
                                policies[p],
                                seeds[s],
                            ),
                        ));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a replay thread panicked"))
            .collect()
    });
    let mut flat: Vec<(usize, Result<Outcome, PlaceError>)> =
        results.into_iter().flatten().collect();
    flat.sort_by_key(|(j, _)| *j);
    let mut per_policy: Vec<Vec<Outcome>> = vec![Vec::new(); policies.len()];
    for (j, r) in flat {
        per_policy[jobs[j].0].push(r?);
    }
    Ok(per_policy)
}

/// `tessera simulate`: prints the table (or JSON); writes the plot.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    print!("{}", output(args)?);
    Ok(())
}

/// What `tessera simulate` prints (and the plot it writes).
pub fn output(args: &SimulateArgs) -> Result<String, SimulateError> {
    let policies = parse_policies(args.policy.as_deref())?;
    let seeds = parse_seeds(&args.seeds)?;
    let nodes = trace::read_nodes(&args.nodes)?;
    let pods = trace::read_pods(&args.pods)?;
    if args.bench {
        return bench::run(&nodes, &pods, &policies, seeds[0]);
    }
    let outcomes = run_all(&nodes, &pods, &policies, &seeds, args.trace_node_order)?;
    let summaries: Vec<Summary> = outcomes.iter().map(|o| Summary::of(o)).collect();
    let name = args
        .pods
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The published figure, when the trace's folder has the README with
    // the results table (the openb folder has).
    let published = args
        .pods
        .parent()
        .map(|d| d.join("README.md"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|r| report::published_fgd(&r, &name));
    let out = if args.json {
        let mut v = serde_json::json!({ "trace": name, "policies": summaries });
        if let Some(p) = published {
            v["published_fgd"] = p.into();
            for (x, s) in v["policies"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .zip(&summaries)
            {
                x["margin_to_published"] = (s.unallocated_pct_at_100 - p).into();
            }
        }
        format!("{v:#}\n")
    } else {
        report::table(&name, &summaries, published)
    };
    if let Some(path) = &args.plot {
        let title = format!(
            "{name}: unallocated GPU vs arrived demand ({} seeds)",
            seeds.len()
        );
        std::fs::write(path, report::svg(&title, &summaries)).map_err(|source| {
            SimulateError::Write {
                path: path.display().to_string(),
                source,
            }
        })?;
    }
    Ok(out)
}
