//! The compute shares drop-in pods ask for (HAMi's `gpucores`, Volcano's
//! `vgpu-cores`: caps, translated to `guaranteed` shares of whole slices, docs/dropin.md)
//! measured on the simulated GPU under the real arbiter: how close each comes to its
//! target (the bench's row, `tessera-bench dropin`) and the bound it may never pass (the
//! test's assertion, `tests/tests/dropin_compute.rs`).

use std::time::Duration;

use tessera_manager::arbiter::ArbiterConfig;

use crate::bench::Table;
use crate::bench::compute::{AllocSpec, Outcome, Scenario, run_round};

/// One allocation of a drop-in scenario: the pod's own words, and the share they
/// translate to (on 8 slices per GPU, each 12.5 %).
#[derive(Debug, Clone, PartialEq)]
pub struct DropinAlloc {
    pub words: &'static str,
    pub spec: AllocSpec,
}

/// The three scenarios, one per GPU of one round, 1 ms kernels: a 25 + 75 pair
/// that fills the GPU, a 50 alone (capped on an otherwise idle GPU), and a
/// 25 + 50 pair that leaves a quarter idle.
pub fn scenarios(measure: Duration) -> Vec<(Scenario, Vec<DropinAlloc>)> {
    let g = |words, percent| DropinAlloc {
        words,
        spec: AllocSpec::guaranteed(percent),
    };
    let shapes = [
        (
            "HAMi 25 + Volcano 75",
            vec![
                g("nvidia.com/gpumem: 8192, gpucores: 25", 25),
                g("volcano.sh/vgpu-memory: 24576, vgpu-cores: 75", 75),
            ],
        ),
        (
            "HAMi 50 alone",
            vec![g("nvidia.com/gpumem: 16384, gpucores: 50", 50)],
        ),
        (
            "Volcano 25 + HAMi 50",
            vec![
                g("volcano.sh/vgpu-memory: 8192, vgpu-cores: 25", 25),
                g("nvidia.com/gpumem: 16384, gpucores: 50", 50),
            ],
        ),
    ];
    shapes
        .into_iter()
        .map(|(name, allocs)| {
            let sc = Scenario::new(
                name,
                allocs.iter().map(|a| a.spec).collect(),
                Duration::from_millis(1),
                measure,
            );
            (sc, allocs)
        })
        .collect()
}

/// Runs [`scenarios`] in one round ([`run_round`]).
///
/// # Errors
/// Set-up failures (the arbiter, a scenario that panicked).
pub fn run(measure: Duration) -> Result<Vec<(Outcome, Vec<DropinAlloc>)>, String> {
    let (scs, allocs): (Vec<Scenario>, Vec<Vec<DropinAlloc>>) =
        scenarios(measure).into_iter().unzip();
    Ok(run_round(&scs)?.into_iter().zip(allocs).collect())
}

/// The share allocation `i` asked for, in percent.
pub fn share_pp(o: &Outcome, i: usize) -> f64 {
    f64::from(o.allocs[i].share_ppm) / 10_000.0
}

/// How far above its share a guaranteed allocation's measured share may be, in
/// percentage points of the window, when the arbiter works: the arbiter's cap lets
/// the grants that start in a window hold at most `share × (window + catch_up)`, a
/// hold begun before the window adds at most the longest hold, and the ground truth
/// and the arbiter's account differ by one hold at the far end. Hence `share ×
/// catch_up + 2 × longest hold`, over the window (the bound `compute_shares` derives).
pub fn cap_slack_pp(o: &Outcome, i: usize) -> f64 {
    let catch_up = ArbiterConfig::default().catch_up.as_secs_f64();
    let slack = share_pp(o, i) / 100.0 * catch_up + 2.0 * o.longest_hold[i].as_secs_f64();
    slack / o.window.as_secs_f64() * 100.0
}

/// The bench's table: per allocation, the pod's words, target, achieved (ground
/// truth), held (the arbiter's charge), the distance from the target, and whether it
/// is within 1 pp (the figure).
///
/// # Errors
/// Set-up failures.
pub fn table(measure: Duration) -> Result<Table, String> {
    let mut rows = Vec::new();
    let mut notes = vec![
        format!(
            "{} s per scenario, 1 ms kernels, the three scenarios at once on three GPUs of one simulated node, one in-process arbiter (default config).",
            measure.as_secs_f64()
        ),
        "achieved = busy time on the simulated GPU's engine (ground truth); held = what the arbiter charged; target: within 1 pp of the share, never above share + bound.".into(),
    ];
    for (o, allocs) in run(measure)? {
        notes.extend(o.failures.iter().map(|f| format!("FAILED: {f}")));
        for (i, a) in allocs.iter().enumerate() {
            let off = o.achieved[i] - share_pp(&o, i);
            rows.push(vec![
                if i == 0 {
                    o.name.clone()
                } else {
                    String::new()
                },
                a.words.to_owned(),
                format!("guaranteed {}%", a.spec.share_ppm / 10_000),
                format!("{:.2}", o.achieved[i]),
                format!("{:.2}", o.held[i]),
                format!("{off:+.2}"),
                format!("{:.2}", cap_slack_pp(&o, i)),
                if off.abs() <= 1.0 { "yes" } else { "no" }.into(),
            ]);
        }
    }
    Ok(Table {
        title: "Drop-in pods' compute shares: target vs achieved (quantum 10 ms)".into(),
        columns: [
            "scenario",
            "pod's words",
            "allocation",
            "achieved %",
            "held %",
            "off pp",
            "cap bound pp",
            "within 1 pp",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes,
    })
}
