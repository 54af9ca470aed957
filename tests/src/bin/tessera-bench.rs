//! `tessera-bench`: prints benchmark tables. `cargo run --release -p tessera-e2e --bin
//! tessera-bench -- sim|hook|compute|all [--calls N] [--runs N]`.

use anyhow::{Context, Result, bail};
use tessera_e2e::bench;

const USAGE: &str = "usage: tessera-bench <section>... [--calls N] [--runs N]\nsections: sim (simulated driver launch cost), hook (shim cost per call, join time), compute (time-slice shares, gate cost), all";

fn main() -> Result<()> {
    let mut sections = Vec::new();
    let mut calls: u64 = 1_000_000;
    let mut runs: usize = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--calls" => calls = args.next().context(USAGE)?.parse().context("--calls")?,
            "--runs" => runs = args.next().context(USAGE)?.parse().context("--runs")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            s if s.starts_with('-') => bail!("unknown option {s}\n{USAGE}"),
            s => sections.push(s.to_string()),
        }
    }
    if sections.is_empty() {
        bail!("{USAGE}");
    }
    for s in &sections {
        let mut tables = Vec::new();
        if matches!(s.as_str(), "sim" | "all") {
            tables.push(bench::sim_launch_cost(calls, runs).map_err(anyhow::Error::msg)?);
        }
        if matches!(s.as_str(), "hook" | "all") {
            tables.extend(bench::hook::tables(calls, runs).map_err(anyhow::Error::msg)?);
        }
        if matches!(s.as_str(), "compute" | "all") {
            let measure = std::time::Duration::from_secs(10);
            tables.extend(bench::compute::tables(measure).map_err(anyhow::Error::msg)?);
        }
        if tables.is_empty() {
            bail!("unknown section {s}\n{USAGE}");
        }
        for table in tables {
            println!("{}", table.render());
        }
    }
    Ok(())
}
