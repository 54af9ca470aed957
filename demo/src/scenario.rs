//! The demo's workloads, what each should get, and the bounds that decide
//! whether the demo passes. Pure data and arithmetic, no I/O.

use serde::Serialize;
use tessera_shm::Policy;

const GIB: u64 = 1 << 30;

/// One workload of the demo: an allocation and the process that uses it.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub name: &'static str,
    /// Index of the simulated GPU.
    pub gpu: usize,
    pub memory_limit: u64,
    /// What the process allocates and holds.
    pub hold: u64,
    /// Compute share target, parts per million.
    pub share_ppm: u32,
    #[serde(serialize_with = "ser_policy")]
    pub policy: Policy,
    pub kernel_us: u64,
    /// Tries to allocate past its limit every this many seconds.
    pub oversubscribe_every: Option<f64>,
}

fn ser_policy<S: serde::Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// Two GPUs, five workloads, both policies, one that over-allocates.
///
/// GPU 0 is fully subscribed: two guaranteed jobs (capped at their share)
/// and a burst notebook that gets what they leave. GPU 1 holds two burst
/// jobs with 25% each: alone, they split the idle GPU between them.
pub fn default_scenario() -> Vec<Workload> {
    vec![
        Workload {
            name: "train-a",
            gpu: 0,
            memory_limit: 6 * GIB,
            hold: 5 * GIB,
            share_ppm: 500_000,
            policy: Policy::Guaranteed,
            kernel_us: 2_000,
            oversubscribe_every: None,
        },
        Workload {
            name: "train-b",
            gpu: 0,
            memory_limit: 4 * GIB,
            hold: 3 * GIB,
            share_ppm: 300_000,
            policy: Policy::Guaranteed,
            kernel_us: 1_000,
            oversubscribe_every: None,
        },
        Workload {
            name: "notebook",
            gpu: 0,
            memory_limit: 2 * GIB,
            hold: GIB,
            share_ppm: 200_000,
            policy: Policy::Burst,
            kernel_us: 500,
            oversubscribe_every: Some(5.0),
        },
        Workload {
            name: "infer-x",
            gpu: 1,
            memory_limit: 4 * GIB,
            hold: 3 * GIB,
            share_ppm: 250_000,
            policy: Policy::Burst,
            kernel_us: 200,
            oversubscribe_every: None,
        },
        Workload {
            name: "infer-y",
            gpu: 1,
            memory_limit: 4 * GIB,
            hold: 2 * GIB,
            share_ppm: 250_000,
            policy: Policy::Burst,
            kernel_us: 5_000,
            oversubscribe_every: None,
        },
    ]
}

/// How far a measured share may be from what its policy promises, in
/// percentage points. The arbiter's own tests hold ±1 pp over 10 s; the
/// demo runs five workloads at once on a laptop, so it allows 2.
pub const SHARE_TOLERANCE_PP: f64 = 2.0;

/// What one workload got, measured against the simulated GPU's ground truth.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: &'static str,
    pub gpu: usize,
    pub policy: &'static str,
    pub target_pct: f64,
    pub achieved_pct: f64,
    /// What the policy promises: shown as "= 50.0% ±2.0" or "≥ 23.0%", in
    /// JSON as numbers.
    pub bound: Bound,
    pub memory_limit: u64,
    /// Highest device memory the process held (ground truth).
    pub memory_peak: u64,
    pub oom_refused: u64,
    pub ok: bool,
    /// Why not, when not.
    pub problems: Vec<String>,
}

/// The share a policy promises, in percent of the GPU's time.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Guaranteed: the share, give or take `tolerance_pp` percentage points.
    Equals { pct: f64, tolerance_pp: f64 },
    /// Burst: at least this much.
    AtLeast { pct: f64 },
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so the summary table's widths apply.
        f.pad(&match self {
            Self::Equals { pct, tolerance_pp } => format!("= {pct:.1}% ±{tolerance_pp}"),
            Self::AtLeast { pct } => format!("≥ {pct:.1}%"),
        })
    }
}

/// Judges one workload: its share against its policy, its memory against
/// its limit, and, for the one that over-allocates, that it was refused.
pub fn judge(w: &Workload, achieved_pct: f64, memory_peak: u64, oom_refused: u64) -> Outcome {
    let target_pct = f64::from(w.share_ppm) / 10_000.0;
    let mut problems = Vec::new();
    let bound = match w.policy {
        Policy::Guaranteed => {
            if (achieved_pct - target_pct).abs() > SHARE_TOLERANCE_PP {
                problems.push(format!(
                    "share {achieved_pct:.1}% is not within ±{SHARE_TOLERANCE_PP} pp of {target_pct:.1}%"
                ));
            }
            Bound::Equals {
                pct: target_pct,
                tolerance_pp: SHARE_TOLERANCE_PP,
            }
        }
        Policy::Burst => {
            let floor = target_pct - SHARE_TOLERANCE_PP;
            if achieved_pct < floor {
                problems.push(format!(
                    "share {achieved_pct:.1}% is below its floor {floor:.1}%"
                ));
            }
            Bound::AtLeast { pct: floor }
        }
    };
    if memory_peak > w.memory_limit {
        problems.push(format!(
            "held {memory_peak} bytes, over its limit of {}",
            w.memory_limit
        ));
    }
    if w.oversubscribe_every.is_some() && oom_refused == 0 {
        problems.push("allocated past its limit and was never refused".into());
    }
    Outcome {
        name: w.name,
        gpu: w.gpu,
        policy: w.policy.name(),
        target_pct,
        achieved_pct,
        bound,
        memory_limit: w.memory_limit,
        memory_peak,
        oom_refused,
        ok: problems.is_empty(),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(policy: Policy) -> Workload {
        Workload {
            policy,
            ..default_scenario()[0].clone()
        }
    }

    #[test]
    fn guaranteed_is_judged_both_ways() {
        assert!(judge(&w(Policy::Guaranteed), 50.0, 0, 0).ok);
        assert!(judge(&w(Policy::Guaranteed), 51.9, 0, 0).ok);
        assert!(
            !judge(&w(Policy::Guaranteed), 52.5, 0, 0).ok,
            "over the cap"
        );
        assert!(!judge(&w(Policy::Guaranteed), 47.0, 0, 0).ok, "short of it");
    }

    #[test]
    fn burst_is_a_floor() {
        assert!(judge(&w(Policy::Burst), 90.0, 0, 0).ok);
        assert!(judge(&w(Policy::Burst), 48.5, 0, 0).ok);
        let o = judge(&w(Policy::Burst), 40.0, 0, 0);
        assert!(!o.ok);
        assert!(o.problems[0].contains("below its floor"));
    }

    #[test]
    fn memory_over_limit_and_missing_refusal_fail() {
        let base = w(Policy::Guaranteed);
        assert!(!judge(&base, 50.0, base.memory_limit + 1, 0).ok);
        assert!(judge(&base, 50.0, base.memory_limit, 0).ok);
        let notebook = default_scenario()[2].clone();
        assert!(!judge(&notebook, 25.0, 0, 0).ok);
        assert!(judge(&notebook, 25.0, 0, 3).ok);
    }

    #[test]
    fn scenario_fits_the_simulated_node() {
        let s = default_scenario();
        for gpu in 0..2 {
            let shares: u32 = s.iter().filter(|w| w.gpu == gpu).map(|w| w.share_ppm).sum();
            assert!(shares <= 1_000_000, "GPU {gpu} oversubscribed: {shares}");
            let mem: u64 = s
                .iter()
                .filter(|w| w.gpu == gpu)
                .map(|w| w.memory_limit)
                .sum();
            assert!(mem <= 16 * GIB);
        }
        assert!(s.iter().all(|w| w.hold <= w.memory_limit));
        assert!(s.iter().any(|w| w.policy == Policy::Guaranteed));
        assert!(s.iter().any(|w| w.policy == Policy::Burst));
        assert!(s.iter().any(|w| w.oversubscribe_every.is_some()));
    }
}
