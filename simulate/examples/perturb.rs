//! Perturbed variants of an openb pod list, to judge whether a policy tuned
//! on the shared traces holds on traces it has not seen (the published set
//! has more variants than the shared ones). Each variant changes one thing
//! the structure of the problem depends on, reproducibly from a seed:
//!
//! - `spec:P`: P% of the GPU pods ask for particular GPU models, their model
//!   lists drawn from the pods of `--donor` that ask for one (the trace's own
//!   model constraints are cleared first);
//! - `share:F`: pods dropped at random until sharing pods carry F% of the
//!   GPU demand (more or fewer whole-GPU pods);
//! - `multi:F`: the same for multi-GPU pods;
//! - `cpu:F`: the same for CPU-only pods, as a share of all pods;
//! - `nodes:P`: (with `--nodes`) P% of the nodes take the model of another
//!   node with as many GPUs (another GPU-model mix and node order).
//!
//! ```text
//! cargo run --release -p tessera-simulate --example perturb -- \
//!     --pods openb_pod_list_default.csv --out /tmp/v.csv --seed 7 spec:30 \
//!     --donor openb_pod_list_gpuspec20.csv
//! ```
//!
//! Rows keep their columns; only what the variant names changes.

use std::path::PathBuf;

use clap::Parser;
use tessera_simulate::replay::Rng;

#[derive(Parser)]
struct Cli {
    /// The pod list (or, for `nodes:P`, the node list) to perturb.
    #[arg(long)]
    pods: PathBuf,
    /// Where to write the variant.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// For `spec:P`: the pod list whose model constraints are drawn from.
    #[arg(long)]
    donor: Option<PathBuf>,
    /// The variant: spec:P, share:F, multi:F, cpu:F or nodes:P.
    variant: String,
}

type Rows = (String, Vec<Vec<String>>);

fn read(path: &PathBuf) -> Result<Rows, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| format!("{}: empty", path.display()))?;
    let rows = lines
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    Ok((header.to_owned(), rows))
}

fn col(header: &str, name: &str) -> Result<usize, String> {
    header
        .split(',')
        .position(|h| h.trim() == name)
        .ok_or_else(|| format!("no column {name:?}"))
}

fn num(row: &[String], i: usize) -> u64 {
    row.get(i).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Drops rows at random among those `drop_from` picks until `done` holds
/// (or none is left to drop).
fn drop_until(
    rows: &mut Vec<Vec<String>>,
    rng: &mut Rng,
    drop_from: impl Fn(&[String]) -> bool,
    done: impl Fn(&[Vec<String>]) -> bool,
) {
    while !done(rows) {
        let candidates: Vec<usize> = (0..rows.len()).filter(|&i| drop_from(&rows[i])).collect();
        if candidates.is_empty() {
            return;
        }
        // Several at a time: the traces have thousands of rows.
        for _ in 0..(candidates.len() / 50).max(1) {
            let i = candidates[rng.below(candidates.len())];
            if i < rows.len() {
                rows[i].clear();
            }
        }
        rows.retain(|r| !r.is_empty());
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let (kind, arg) = cli
        .variant
        .split_once(':')
        .ok_or("the variant is NAME:VALUE")?;
    let value: f64 = arg
        .parse()
        .map_err(|_| format!("{arg:?} is not a number"))?;
    if !(0.0..=100.0).contains(&value) {
        return Err(format!("{value}: a percentage 0..100"));
    }
    let mut rng = Rng::new(cli.seed);
    let (header, mut rows) = read(&cli.pods)?;
    if kind == "nodes" {
        let (gpu, model) = (col(&header, "gpu")?, col(&header, "model")?);
        let original: Vec<Vec<String>> = rows.clone();
        for row in rows.iter_mut() {
            if rng.below(10_000) as f64 >= value * 100.0 {
                continue;
            }
            let same: Vec<&Vec<String>> = original
                .iter()
                .filter(|r| num(r, gpu) == num(row, gpu))
                .collect();
            row[model] = same[rng.below(same.len())][model].clone();
        }
    } else {
        let (n, m) = (col(&header, "num_gpu")?, col(&header, "gpu_milli")?);
        let demand = |r: &[String]| num(r, n) * num(r, m).min(1000);
        let is_share = |r: &[String]| num(r, n) == 1 && num(r, m) < 1000 && num(r, m) > 0;
        let is_multi = |r: &[String]| num(r, n) > 1;
        let is_cpu = |r: &[String]| demand(r) == 0;
        let frac = |rows: &[Vec<String>], part: &dyn Fn(&[String]) -> bool| {
            let all: u64 = rows.iter().map(|r| demand(r)).sum();
            let p: u64 = rows.iter().filter(|r| part(r)).map(|r| demand(r)).sum();
            p as f64 * 100.0 / all.max(1) as f64
        };
        let want = value;
        match kind {
            "spec" => {
                let spec = col(&header, "gpu_spec")?;
                let donor = cli.donor.as_ref().ok_or("spec:P needs --donor")?;
                let (dh, drows) = read(donor)?;
                let ds = col(&dh, "gpu_spec")?;
                let specs: Vec<String> = drows
                    .iter()
                    .filter_map(|r| r.get(ds).filter(|s| !s.trim().is_empty()).cloned())
                    .collect();
                if specs.is_empty() {
                    return Err("the donor has no pod asking for a model".into());
                }
                for row in rows.iter_mut() {
                    row[spec] = String::new();
                    if demand(row) > 0 && (rng.below(10_000) as f64) < want * 100.0 {
                        row[spec] = specs[rng.below(specs.len())].clone();
                    }
                }
            }
            "share" | "multi" => {
                let part: &dyn Fn(&[String]) -> bool = if kind == "share" {
                    &is_share
                } else {
                    &is_multi
                };
                if frac(&rows, part) < want {
                    drop_until(
                        &mut rows,
                        &mut rng,
                        |r| demand(r) > 0 && !part(r),
                        |rs| frac(rs, part) >= want,
                    );
                } else {
                    drop_until(&mut rows, &mut rng, part, |rs| frac(rs, part) <= want);
                }
            }
            "cpu" => {
                let share = |rs: &[Vec<String>]| {
                    rs.iter().filter(|r| is_cpu(r)).count() as f64 * 100.0 / rs.len().max(1) as f64
                };
                if share(&rows) < want {
                    drop_until(&mut rows, &mut rng, |r| !is_cpu(r), |rs| share(rs) >= want);
                } else {
                    drop_until(&mut rows, &mut rng, is_cpu, |rs| share(rs) <= want);
                }
            }
            _ => {
                return Err(format!(
                    "unknown variant {kind:?} (spec, share, multi, cpu, nodes)"
                ));
            }
        }
    }
    let mut out = header;
    out.push('\n');
    for r in &rows {
        out.push_str(&r.join(","));
        out.push('\n');
    }
    std::fs::write(&cli.out, out).map_err(|e| format!("{}: {e}", cli.out.display()))
}

fn main() -> std::process::ExitCode {
    match run(&Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
