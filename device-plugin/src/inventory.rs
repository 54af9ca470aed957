//! The node's GPUs as the manager reports them, and each GPU's measured
//! utilization over a sliding window (for `spread` and `sharedThreshold`).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use tessera_proto::manager::v1::{GpuStatus, NodeStatus};

/// Window over which the idle fraction is measured.
pub const UTILIZATION_WINDOW: Duration = Duration::from_secs(60);

/// One GPU, as far as the plugin cares.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// `nvidia`, `amd`, `hygon` (an older manager's silence: `nvidia`).
    pub vendor: String,
    pub name: String,
    pub memory_total_bytes: u64,
    /// None when the manager does not know (reported as -1).
    pub numa_node: Option<i64>,
    pub healthy: bool,
    pub unhealthy_reason: String,
    pub utilization_percent: u32,
}

impl From<&GpuStatus> for Gpu {
    fn from(g: &GpuStatus) -> Self {
        Self {
            index: g.index,
            uuid: g.uuid.clone(),
            vendor: if g.vendor.is_empty() {
                tessera_contract::Vendor::Nvidia.as_str().to_owned()
            } else {
                g.vendor.clone()
            },
            name: g.name.clone(),
            memory_total_bytes: g.memory_total_bytes,
            numa_node: (g.numa_node >= 0).then_some(i64::from(g.numa_node)),
            healthy: g.healthy,
            unhealthy_reason: g.unhealthy_reason.clone(),
            utilization_percent: g.utilization_percent.min(100),
        }
    }
}

/// The GPUs of a node status, in index order.
pub fn gpus_of(status: &NodeStatus) -> Vec<Gpu> {
    let mut gpus: Vec<Gpu> = status.gpus.iter().map(Gpu::from).collect();
    gpus.sort_by_key(|g| g.index);
    gpus
}

/// Utilization samples of one GPU; each sample holds until the next one.
#[derive(Debug, Clone)]
pub struct UtilizationWindow {
    window: Duration,
    samples: VecDeque<(Instant, u32)>,
}

impl Default for UtilizationWindow {
    fn default() -> Self {
        Self::new(UTILIZATION_WINDOW)
    }
}

impl UtilizationWindow {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Records a utilization (percent) measured at `at`.
    pub fn record(&mut self, at: Instant, percent: u32) {
        if self.samples.back().is_some_and(|&(t, _)| at < t) {
            // Out of order: clocks do not go back; ignore the stale sample.
            return;
        }
        self.samples.push_back((at, percent.min(100)));
        // Keep the last sample from before the window: it covers its start.
        let start = at.checked_sub(self.window).unwrap_or(at);
        while self.samples.len() >= 2 && self.samples[1].0 <= start {
            self.samples.pop_front();
        }
    }

    /// Mean utilization (0..=1) over the window ending at `now`, weighted by
    /// how long each sample held. None before the first sample.
    pub fn mean_utilization(&self, now: Instant) -> Option<f64> {
        let &(first_t, first_v) = self.samples.front()?;
        let start = now.checked_sub(self.window).unwrap_or(first_t);
        let mut busy = 0.0;
        let mut total = 0.0;
        for (i, &(t, v)) in self.samples.iter().enumerate() {
            let end = self.samples.get(i + 1).map_or(now, |&(next, _)| next);
            let from = t.max(start);
            if end > from {
                let d = (end - from).as_secs_f64();
                busy += d * f64::from(v) / 100.0;
                total += d;
            }
        }
        if total > 0.0 {
            Some(busy / total)
        } else {
            // All samples at `now`: the latest is the best estimate.
            let v = self.samples.back().map_or(first_v, |&(_, v)| v);
            Some(f64::from(v) / 100.0)
        }
    }

    /// Idle fraction (0..=1) over the window; None before the first sample.
    pub fn idle_fraction(&self, now: Instant) -> Option<f64> {
        self.mean_utilization(now).map(|u| 1.0 - u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn time_weighted_mean() {
        let t0 = Instant::now();
        let mut w = UtilizationWindow::new(s(60));
        assert_eq!(w.idle_fraction(t0), None);
        w.record(t0, 100);
        w.record(t0 + s(30), 0);
        // 30 s at 100%, 30 s at 0%.
        let m = w.mean_utilization(t0 + s(60)).expect("sample");
        assert!((m - 0.5).abs() < 1e-9, "{m}");
        // 90 s later the busy half has left the window.
        let idle = w.idle_fraction(t0 + s(120)).expect("sample");
        assert!((idle - 1.0).abs() < 1e-9, "{idle}");
    }

    #[test]
    fn old_samples_fall_out_but_cover_the_window_start() {
        let t0 = Instant::now();
        let mut w = UtilizationWindow::new(s(60));
        w.record(t0, 80);
        w.record(t0 + s(100), 20);
        // Window [50, 110]: 80% for 50 s, 20% for 10 s.
        let m = w.mean_utilization(t0 + s(110)).expect("sample");
        assert!((m - (0.8 * 50.0 + 0.2 * 10.0) / 60.0).abs() < 1e-9, "{m}");
        w.record(t0 + s(200), 20);
        assert_eq!(
            w.samples.len(),
            2,
            "samples older than the window are dropped"
        );
    }

    #[test]
    fn single_sample_and_stale_samples() {
        let t0 = Instant::now();
        let mut w = UtilizationWindow::new(s(60));
        w.record(t0 + s(10), 90);
        assert_eq!(w.mean_utilization(t0 + s(10)), Some(0.9));
        w.record(t0, 0);
        assert_eq!(
            w.mean_utilization(t0 + s(20)),
            Some(0.9),
            "stale sample ignored"
        );
    }

    #[test]
    fn gpu_from_status() {
        let g = Gpu::from(&GpuStatus {
            index: 2,
            uuid: "GPU-x".into(),
            numa_node: -1,
            utilization_percent: 250,
            healthy: true,
            ..Default::default()
        });
        assert_eq!(g.numa_node, None);
        assert_eq!(g.utilization_percent, 100);
        let g = Gpu::from(&GpuStatus {
            numa_node: 1,
            ..Default::default()
        });
        assert_eq!(g.numa_node, Some(1));
    }
}
