//! Text rendering of the demo: live frames (bars for a terminal, one plain
//! line otherwise) and the closing summary table. Pure string building.

use crate::scenario::Outcome;

/// What the demo knows about one workload at one moment.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub name: String,
    pub gpu: usize,
    pub policy: String,
    pub memory_used: u64,
    pub memory_limit: u64,
    pub target_pct: f64,
    /// Share of the GPU's time over the measuring window so far.
    pub achieved_pct: f64,
    pub oom_refused: u64,
    pub processes: usize,
}

/// Per GPU: busy fraction over the window and memory used on the device.
#[derive(Debug, Clone, Default)]
pub struct GpuRow {
    pub index: usize,
    /// `nvidia`, `amd`.
    pub vendor: String,
    pub name: String,
    pub busy_pct: f64,
    pub memory_used: u64,
    pub memory_total: u64,
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// A bar of `width` cells filled to `frac`, e.g. `[#####.....]`.
pub fn bar(frac: f64, width: usize) -> String {
    let frac = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (frac * width as f64).round() as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

/// A bar of achieved share with the target marked by `|`.
pub fn share_bar(achieved_pct: f64, target_pct: f64, width: usize) -> String {
    let mut cells: Vec<char> = bar(achieved_pct / 100.0, width)
        .trim_matches(|c| c == '[' || c == ']')
        .chars()
        .collect();
    let t = ((target_pct / 100.0) * width as f64).round() as usize;
    if let Some(c) = cells.get_mut(t.min(width.saturating_sub(1))) {
        *c = '|';
    }
    format!("[{}]", cells.into_iter().collect::<String>())
}

/// A full-screen frame for a terminal.
pub fn frame(elapsed_s: f64, total_s: f64, gpus: &[GpuRow], rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Tessera demo — simulated node, {:.0}s of {:.0}s  (shares measured on the GPU's ground truth)\n\n",
        elapsed_s, total_s
    ));
    for g in gpus {
        out.push_str(&format!(
            "GPU {} {} {}  busy {:5.1}% {}  memory {:5.1}/{:4.1} GiB {}\n",
            g.index,
            g.vendor,
            g.name,
            g.busy_pct,
            bar(g.busy_pct / 100.0, 20),
            gib(g.memory_used),
            gib(g.memory_total),
            bar(g.memory_used as f64 / g.memory_total.max(1) as f64, 20),
        ));
        out.push_str(&format!(
            "  {:<10} {:<10} {:>17} {:<22} {:>15} {:<22} {:>4}\n",
            "workload", "policy", "memory", "", "compute", "(| = target)", "OOMs"
        ));
        for r in rows.iter().filter(|r| r.gpu == g.index) {
            out.push_str(&format!(
                "  {:<10} {:<10} {:5.2}/{:5.2} GiB {} {:5.1}%/{:4.1}% {} {:>4}\n",
                r.name,
                r.policy,
                gib(r.memory_used),
                gib(r.memory_limit),
                bar(r.memory_used as f64 / r.memory_limit.max(1) as f64, 20),
                r.achieved_pct,
                r.target_pct,
                share_bar(r.achieved_pct, r.target_pct, 20),
                r.oom_refused,
            ));
        }
        out.push('\n');
    }
    out
}

/// One line per tick when stdout is not a terminal.
pub fn plain_line(elapsed_s: f64, rows: &[Row]) -> String {
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {:.1}%/{:.0}% {:.2}/{:.2}GiB oom={}",
                r.name,
                r.achieved_pct,
                r.target_pct,
                gib(r.memory_used),
                gib(r.memory_limit),
                r.oom_refused
            )
        })
        .collect();
    format!("t={elapsed_s:5.1}s  {}", parts.join(" | "))
}

/// The closing table: target vs achieved for every workload.
pub fn summary(outcomes: &[Outcome], gpus: &[GpuRow]) -> String {
    let mut out = String::from(
        "\nSummary (shares over the measuring window, memory peak from the simulated GPU):\n\n",
    );
    out.push_str(&format!(
        "{:<10} {:>3} {:<10} {:>7} {:>9} {:<14} {:>16} {:>5}  {}\n",
        "workload",
        "gpu",
        "policy",
        "target",
        "achieved",
        "bound",
        "memory peak/lim",
        "OOMs",
        "result"
    ));
    for o in outcomes {
        out.push_str(&format!(
            "{:<10} {:>3} {:<10} {:>6.1}% {:>8.1}% {:<14} {:>7.2}/{:<5.2}GiB {:>5}  {}\n",
            o.name,
            o.gpu,
            o.policy,
            o.target_pct,
            o.achieved_pct,
            o.bound,
            gib(o.memory_peak),
            gib(o.memory_limit),
            o.oom_refused,
            if o.ok {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", o.problems.join("; "))
            }
        ));
    }
    for g in gpus {
        out.push_str(&format!(
            "GPU {} busy {:.1}% of the window\n",
            g.index, g.busy_pct
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_in_proportion() {
        assert_eq!(bar(0.0, 4), "[....]");
        assert_eq!(bar(0.5, 4), "[##..]");
        assert_eq!(bar(1.7, 4), "[####]");
        assert_eq!(bar(f64::NAN, 4), "[....]");
        assert_eq!(share_bar(25.0, 50.0, 4), "[#.|.]");
        assert_eq!(share_bar(100.0, 100.0, 4), "[###|]");
    }

    #[test]
    fn frame_shows_every_workload_under_its_gpu() {
        let gpus = vec![
            GpuRow {
                index: 0,
                vendor: "nvidia".into(),
                name: "sim".into(),
                busy_pct: 99.0,
                memory_used: 1 << 30,
                memory_total: 16 << 30,
            },
            GpuRow {
                index: 1,
                ..Default::default()
            },
        ];
        let rows = vec![
            Row {
                name: "a".into(),
                gpu: 1,
                memory_limit: 1,
                ..Default::default()
            },
            Row {
                name: "b".into(),
                gpu: 0,
                oom_refused: 7,
                ..Default::default()
            },
        ];
        let f = frame(1.0, 30.0, &gpus, &rows);
        let gpu1 = f.find("GPU 1").unwrap();
        assert!(f.contains("GPU 0 nvidia sim "), "{f}");
        assert!(f.find("  a ").unwrap() > gpu1);
        assert!(f.find("  b ").unwrap() < gpu1);
        assert!(f.contains("   7\n"));
        assert!(plain_line(2.0, &rows).contains("b 0.0%/0% 0.00/0.00GiB oom=7"));
    }
}
