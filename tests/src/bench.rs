//! Benchmarks printed as tables by `tessera-bench` (numbers, never assertions). Each
//! section is a function returning a [`Table`]; the binary picks sections by name.

use std::fmt::Write as _;

pub mod compute;
pub mod dra;
pub mod dropin;
pub mod hook;
pub mod many;
pub mod race;
pub mod real;
pub mod run;
pub mod soak;

use crate::probe::Mode;
use crate::sim::SimNode;

/// A printed result: a title, column names and rows.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(String::len)
                    .chain([self.columns[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut s = format!("{}\n", self.title);
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:>w$}"))
                .collect::<Vec<_>>()
                .join("  ")
        };
        let _ = writeln!(s, "{}", line(&self.columns));
        for r in &self.rows {
            let _ = writeln!(s, "{}", line(r));
        }
        for n in &self.notes {
            let _ = writeln!(s, "  {n}");
        }
        s
    }

    /// The table as Markdown (a pipe table, the notes as a list after it),
    /// to paste into the README as printed.
    pub fn markdown(&self) -> String {
        let cell = |c: &str| c.replace('|', "\\|");
        let row = |cells: &[String]| {
            format!(
                "| {} |",
                cells
                    .iter()
                    .map(|c| cell(c))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        };
        let mut s = format!("**{}**\n\n", self.title);
        let _ = writeln!(s, "{}", row(&self.columns));
        let _ = writeln!(
            s,
            "|{}|",
            self.columns
                .iter()
                .map(|_| "---")
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let _ = writeln!(s, "{}", row(r));
        }
        if !self.notes.is_empty() {
            s.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        s
    }
}

/// The simulated driver's cost per `cuLaunchKernel` of a zero-duration kernel, measured
/// inside the probe (so process start-up is not counted), for each way of reaching the
/// driver. `runs` repetitions per client; the median is reported with the spread.
pub fn sim_launch_cost(calls: u64, runs: usize) -> Result<Table, String> {
    let node = SimNode::builder().devices(1).build();
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        let mut samples = Vec::new();
        for _ in 0..runs.max(1) {
            let out = node.run(mode, &["init", "ctx", &format!("bench-launch {calls}")]);
            let line = out
                .lines
                .iter()
                .find(|l| l.cmd == "bench-launch" && l.ok)
                .ok_or_else(|| {
                    format!(
                        "probe ({}) failed:\n{}{}",
                        mode.name(),
                        out.stdout,
                        out.stderr
                    )
                })?;
            samples.push(line.f64("ns_per_call"));
        }
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        rows.push(vec![
            mode.name().to_string(),
            calls.to_string(),
            format!("{median:.1}"),
            format!("{:.1}", samples[0]),
            format!("{:.1}", samples[samples.len() - 1]),
        ]);
    }
    Ok(Table {
        title: "simulated driver: cuLaunchKernel of a zero-duration kernel, per call".into(),
        columns: ["client", "calls", "ns/call", "min", "max"]
            .map(String::from)
            .to_vec(),
        rows,
        notes: vec![format!(
            "median of {runs} runs per client, timed inside the probe; link = -lcuda, dlopen = dlsym, procaddr = cuGetProcAddress_v2"
        )],
    })
}
