//! What `tessera simulate` prints: per policy, the figures over the seeds
//! (a table or JSON), and the SVG plot of unallocated share against arrived
//! demand.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::{CURVE_POINTS, Outcome};

/// One policy's figures over its seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub policy: String,
    pub seeds: Vec<u64>,
    /// Mean over the seeds.
    pub unallocated_pct_at_100: f64,
    /// Sample standard deviation over the seeds.
    pub unallocated_pct_at_100_std: f64,
    pub unallocated_pct_at_100_min: f64,
    pub unallocated_pct_at_100_max: f64,
    pub fragmentation_pct_at_100: f64,
    /// Mean over the seeds of the pods that fitted nowhere by 100% arrived.
    pub failed_pods: f64,
    /// The same over the whole replay (to 130%).
    pub failed_pods_to_end: f64,
    pub decision_us_p50: f64,
    pub decision_us_p99: f64,
    pub decision_us_max: f64,
    pub decisions: u64,
    /// Mean unallocated share at 0, 1, ..., 130% arrived.
    #[serde(skip)]
    pub curve: Vec<f64>,
}

impl Summary {
    /// Summarises one policy's outcomes (all of one policy).
    pub fn of(outcomes: &[Outcome]) -> Summary {
        let n = outcomes.len().max(1) as f64;
        let u: Vec<f64> = outcomes.iter().map(|o| o.unallocated_pct_at_100).collect();
        let mean = u.iter().sum::<f64>() / n;
        let std = if u.len() > 1 {
            (u.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let mut ns: Vec<u64> = outcomes
            .iter()
            .flat_map(|o| o.decision_ns.iter().copied())
            .collect();
        ns.sort_unstable();
        let mut curve = vec![0.0; CURVE_POINTS];
        let mut counts = vec![0u32; CURVE_POINTS];
        for o in outcomes {
            for (i, v) in o.curve.iter().enumerate() {
                curve[i] += v;
                counts[i] += 1;
            }
        }
        let curve = curve
            .iter()
            .zip(&counts)
            .take_while(|(_, c)| **c > 0)
            .map(|(s, c)| s / f64::from(*c))
            .collect();
        Summary {
            policy: outcomes
                .first()
                .map(|o| o.policy.to_string())
                .unwrap_or_default(),
            seeds: outcomes.iter().map(|o| o.seed).collect(),
            unallocated_pct_at_100: mean,
            unallocated_pct_at_100_std: std,
            unallocated_pct_at_100_min: u.iter().copied().fold(f64::INFINITY, f64::min),
            unallocated_pct_at_100_max: u.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            fragmentation_pct_at_100: outcomes
                .iter()
                .map(|o| o.fragmentation_pct_at_100)
                .sum::<f64>()
                / n,
            failed_pods: outcomes
                .iter()
                .map(|o| o.failed_pods_at_100 as f64)
                .sum::<f64>()
                / n,
            failed_pods_to_end: outcomes.iter().map(|o| o.failed_pods as f64).sum::<f64>() / n,
            decision_us_p50: percentile_us(&ns, 0.50),
            decision_us_p99: percentile_us(&ns, 0.99),
            decision_us_max: ns.last().map_or(0.0, |&x| x as f64 / 1000.0),
            decisions: ns.len() as u64,
            curve,
        }
    }
}

/// The `q` quantile (nearest rank) of sorted nanoseconds, in microseconds.
pub fn percentile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    sorted_ns[rank - 1] as f64 / 1000.0
}

/// The table `tessera simulate` prints.
pub fn table(trace: &str, summaries: &[Summary], published: Option<f64>) -> String {
    let mut s = String::new();
    let seeds = summaries.first().map(|x| x.seeds.len()).unwrap_or(0);
    let _ = writeln!(s, "trace {trace}, {seeds} seeds");
    let _ = writeln!(
        s,
        "{:<18} {:>22} {:>13} {:>8} {:>12} {:>12}",
        "policy", "unallocated% @100", "frag% @100", "failed", "decide p50", "decide p99"
    );
    for x in summaries {
        let _ = writeln!(
            s,
            "{:<18} {:>9.2} ± {:<4.2} [{:.2}..{:.2}] {:>7.2} {:>8.1} {:>9.1} µs {:>9.1} µs",
            x.policy,
            x.unallocated_pct_at_100,
            x.unallocated_pct_at_100_std,
            x.unallocated_pct_at_100_min,
            x.unallocated_pct_at_100_max,
            x.fragmentation_pct_at_100,
            x.failed_pods,
            x.decision_us_p50,
            x.decision_us_p99,
        );
    }
    if let Some(p) = published {
        let _ = writeln!(
            s,
            "published FGD (the trace folder's README): {p:.2}; mean − published, in standard deviations of the policy's seeds:"
        );
        for x in summaries {
            let d = x.unallocated_pct_at_100 - p;
            let sd = x.unallocated_pct_at_100_std;
            let k = if sd > 0.0 {
                format!("{:+.1} sd", d / sd)
            } else {
                "-".to_owned()
            };
            let _ = writeln!(s, "{:<18} {:>+9.2} ({k})", x.policy, d);
        }
    }
    s
}

/// The published FGD figure for the pod list `trace` (`openb_pod_list_X`),
/// from the results table of the README beside it (the row `| X |`, the
/// column `FGD`), when it has one.
pub fn published_fgd(readme: &str, trace: &str) -> Option<f64> {
    let name = trace.strip_prefix("openb_pod_list_").unwrap_or(trace);
    let cells = |l: &str| -> Vec<String> {
        l.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('*').trim().to_owned())
            .collect()
    };
    let mut column = None;
    for line in readme.lines().filter(|l| l.trim_start().starts_with('|')) {
        let c = cells(line);
        if c.first().is_some_and(|x| x == "trace") {
            column = c.iter().position(|x| x == "FGD");
        } else if let Some(i) = column
            && c.first().is_some_and(|x| x == name)
        {
            return c.get(i).and_then(|v| v.parse().ok());
        }
    }
    None
}

const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// An SVG of mean unallocated share (y) against arrived demand (x), one
/// line per policy, drawn from 50% arrived (below that every policy has
/// placed everything), with the line of a perfect packing (100 − arrived).
pub fn svg(title: &str, summaries: &[Summary]) -> String {
    let (w, h) = (760.0, 460.0);
    let (left, right, top, bottom) = (64.0, 170.0, 36.0, 52.0);
    let (x0, x1) = (50.0, 130.0);
    let ymax = summaries
        .iter()
        .flat_map(|s| s.curve.iter().skip(x0 as usize))
        .fold(10.0f64, |m, &v| m.max(v));
    let ymax = (ymax / 10.0).ceil() * 10.0;
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| top + (1.0 - y / ymax) * (h - top - bottom);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        (left + w - right) / 2.0,
        escape(title)
    );
    for i in 0..=8 {
        let x = x0 + f64::from(i) * 10.0;
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#ddd"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
            px(x),
            py(0.0),
            py(ymax),
            py(0.0) + 16.0,
            x
        );
    }
    let steps = (ymax / 10.0) as u32;
    for i in 0..=steps {
        let y = f64::from(i) * 10.0;
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{3:.1}" y="{4:.1}" text-anchor="end">{5}</text>"##,
            px(x0),
            py(y),
            px(x1),
            px(x0) - 6.0,
            py(y) + 4.0,
            y
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">arrived GPU demand, % of capacity</text>"#,
        px((x0 + x1) / 2.0),
        h - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">unallocated GPU, %</text>"#,
        py(ymax / 2.0)
    );
    // A perfect packing: everything that arrives is placed.
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/>"##,
        px(x0),
        py((100.0 - x0).min(ymax)),
        px(100.0),
        py(0.0),
        px(x1),
        py(0.0)
    );
    let _ = writeln!(
        s,
        r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#555" stroke-dasharray="2 2"/>"##,
        px(100.0),
        py(0.0),
        py(ymax)
    );
    for (k, sum) in summaries.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts: Vec<String> = sum
            .curve
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as f64 >= x0)
            .map(|(i, &v)| format!("{:.1},{:.1}", px(i as f64), py(v.min(ymax))))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 10.0 + k as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="{color}" stroke-width="2"/><text x="{3:.1}" y="{4:.1}">{5} ({6:.2}%)</text>"#,
            w - right + 12.0,
            ly,
            w - right + 36.0,
            w - right + 42.0,
            ly + 4.0,
            escape(&sum.policy),
            sum.unallocated_pct_at_100
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
