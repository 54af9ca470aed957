//! `tessera simulate --bench`: decision time of each policy on the trace's
//! cluster and on one ten times its size (the same nodes repeated), one
//! seed, the demand inflated to 130% of each cluster's capacity.

use std::fmt::Write as _;

use tessera_placement::{Node, Policy, Request};

use crate::replay::{arrival_order, replay};
use crate::report::percentile_us;
use crate::{MIX_COVERAGE, SimulateError};

/// The cluster sizes the bench runs: 1× and 10× the trace's nodes.
pub const SCALES: [usize; 2] = [1, 10];

/// `nodes` repeated `k` times (names suffixed with the copy).
pub fn repeat(nodes: &[Node], k: usize) -> Vec<Node> {
    (0..k)
        .flat_map(|c| {
            nodes.iter().map(move |n| {
                let mut n = n.clone();
                if c > 0 {
                    n.name = format!("{}-x{c}", n.name);
                }
                n
            })
        })
        .collect()
}

/// The bench table.
pub fn run(
    nodes: &[Node],
    pods: &[Request],
    policies: &[Policy],
    seed: u64,
) -> Result<String, SimulateError> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "placement decision time (seed {seed}, demand to 130% of capacity)"
    );
    let _ = writeln!(
        s,
        "{:<18} {:>7} {:>9} {:>11} {:>11} {:>11} {:>8}",
        "policy", "nodes", "decisions", "p50 µs", "p99 µs", "max µs", "buckets"
    );
    for &p in policies {
        let mix = p.task_mix(pods, MIX_COVERAGE);
        for k in SCALES {
            let cluster = repeat(nodes, k);
            let cap = cluster.iter().map(|n| n.gpus.len() as u64).sum::<u64>() * 1000;
            let order = arrival_order(pods, cap, seed);
            let o = replay(&cluster, pods, &mix, &order, p, seed)?;
            let mut ns = o.decision_ns.clone();
            ns.sort_unstable();
            let _ = writeln!(
                s,
                "{:<18} {:>7} {:>9} {:>11.1} {:>11.1} {:>11.1} {:>8}",
                p.to_string(),
                cluster.len(),
                ns.len(),
                percentile_us(&ns, 0.5),
                percentile_us(&ns, 0.99),
                percentile_us(&ns, 1.0),
                o.buckets
            );
        }
    }
    Ok(s)
}
