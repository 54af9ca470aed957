//! GPU health as a pure state machine: XID events and failed queries make a
//! GPU unhealthy; it is healthy again once it answers and no critical XID
//! came for the recovery period. Time is passed in, so tests need no clock.
//!
//! NVML reports XIDs as one-off events with no "cleared" counterpart, so
//! recovery after an XID is a hold-off: a GPU that keeps failing keeps
//! sending XIDs (or stops answering, which is tracked separately).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// What counts as unhealthy and for how long.
#[derive(Debug, Clone)]
pub struct HealthPolicy {
    /// XIDs that are the application's fault: logged, GPU stays healthy.
    pub ignored_xids: BTreeSet<u64>,
    /// How long a critical XID keeps a GPU unhealthy.
    pub xid_recovery: Duration,
}

/// The health of one GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuHealth {
    /// The GPU did not answer its last query.
    lost: Option<String>,
    /// The latest critical XID and when it stops counting.
    xid: Option<(u64, Instant)>,
}

/// What an event did to a GPU's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing visible changed.
    None,
    /// Healthy → unhealthy.
    Failed,
    /// Unhealthy → healthy.
    Recovered,
    /// Still unhealthy, for another reason.
    Reason,
}

impl GpuHealth {
    pub fn healthy(&self) -> bool {
        self.lost.is_none() && self.xid.is_none()
    }

    /// Why the GPU is unhealthy; empty when it is healthy.
    pub fn reason(&self) -> String {
        match (&self.lost, self.xid) {
            (Some(why), _) => why.clone(),
            (None, Some((0, _))) => "critical XID (number unknown)".into(),
            (None, Some((xid, _))) => format!("critical XID {xid}"),
            (None, None) => String::new(),
        }
    }

    fn change(&mut self, before: (bool, String)) -> Change {
        match (before.0, self.healthy()) {
            (true, false) => Change::Failed,
            (false, true) => Change::Recovered,
            (false, false) if before.1 != self.reason() => Change::Reason,
            _ => Change::None,
        }
    }

    fn snapshot(&self) -> (bool, String) {
        (self.healthy(), self.reason())
    }

    /// An XID event arrived.
    pub fn on_xid(&mut self, policy: &HealthPolicy, xid: u64, now: Instant) -> Change {
        if policy.ignored_xids.contains(&xid) {
            return Change::None;
        }
        let before = self.snapshot();
        self.xid = Some((xid, now + policy.xid_recovery));
        self.change(before)
    }

    /// The driver reported the GPU lost.
    pub fn on_lost(&mut self, why: &str) -> Change {
        let before = self.snapshot();
        self.lost = Some(why.to_owned());
        self.change(before)
    }

    /// A query of the GPU succeeded at `now`.
    pub fn on_answer(&mut self, now: Instant) -> Change {
        let before = self.snapshot();
        self.lost = None;
        if let Some((_, until)) = self.xid
            && now >= until
        {
            self.xid = None;
        }
        self.change(before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> HealthPolicy {
        HealthPolicy {
            ignored_xids: [13, 31, 43, 45, 68].into_iter().collect(),
            xid_recovery: Duration::from_secs(10),
        }
    }

    #[test]
    fn application_xids_leave_the_gpu_healthy() {
        let mut h = GpuHealth::default();
        let t = Instant::now();
        for xid in [13, 31, 43, 45, 68] {
            assert_eq!(h.on_xid(&policy(), xid, t), Change::None);
        }
        assert!(h.healthy());
        assert_eq!(h.reason(), "");
    }

    #[test]
    fn a_critical_xid_holds_until_the_recovery_period_passes() {
        let p = policy();
        let mut h = GpuHealth::default();
        let t0 = Instant::now();
        assert_eq!(h.on_xid(&p, 79, t0), Change::Failed);
        assert!(!h.healthy());
        assert_eq!(h.reason(), "critical XID 79");
        assert_eq!(h.on_answer(t0 + Duration::from_secs(9)), Change::None);
        assert!(!h.healthy());
        // Another XID restarts the hold-off.
        assert_eq!(
            h.on_xid(&p, 48, t0 + Duration::from_secs(9)),
            Change::Reason
        );
        assert_eq!(h.on_answer(t0 + Duration::from_secs(11)), Change::None);
        assert_eq!(h.on_answer(t0 + Duration::from_secs(19)), Change::Recovered);
        assert!(h.healthy());
    }

    #[test]
    fn a_lost_gpu_recovers_when_it_answers_again() {
        let mut h = GpuHealth::default();
        let t = Instant::now();
        assert_eq!(h.on_lost("GPU lost"), Change::Failed);
        assert_eq!(h.on_lost("GPU lost"), Change::None);
        assert_eq!(h.reason(), "GPU lost");
        assert_eq!(h.on_answer(t), Change::Recovered);
        assert!(h.healthy());
    }

    #[test]
    fn lost_and_xid_together_need_both_to_clear() {
        let p = policy();
        let mut h = GpuHealth::default();
        let t = Instant::now();
        h.on_xid(&p, 79, t);
        assert_eq!(h.on_lost("GPU lost"), Change::Reason);
        assert_eq!(h.on_answer(t + Duration::from_secs(1)), Change::Reason);
        assert_eq!(h.reason(), "critical XID 79");
        assert_eq!(h.on_answer(t + Duration::from_secs(10)), Change::Recovered);
    }

    #[test]
    fn unknown_xid_numbers_are_critical() {
        let mut h = GpuHealth::default();
        assert_eq!(h.on_xid(&policy(), 0, Instant::now()), Change::Failed);
        assert!(h.reason().contains("unknown"));
    }
}
