//! The published replay protocol (the FGD paper's simulator): a seeded
//! shuffle of the trace's pods, inflation to 130% of the GPU capacity by
//! sampling with replacement, no departures, one attempt per pod.

use std::time::Instant;

use tessera_placement::cluster::MILLI;
use tessera_placement::{Engine, Node, PlaceError, Policy, Request, TaskMix};

/// Arrived GPU demand the replay inflates to, percent of capacity.
pub const INFLATE_TO_PCT: f64 = 130.0;

/// Points of the curve: one per percent of arrived demand, 0..=130.
pub const CURVE_POINTS: usize = 131;

/// A small, fast, seedable generator (splitmix64): the same seed gives the
/// same order on every machine and every build.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), without modulo bias worth noticing at
    /// trace sizes (Lemire's multiply-shift).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The pods in the order one seed replays them: the trace shuffled, then
/// pods drawn with replacement until the next would push the arrived GPU
/// demand past 130% of `capacity_milli`.
pub fn arrival_order(pods: &[Request], capacity_milli: u64, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i + 1);
        order.swap(i, j);
    }
    let limit = (capacity_milli as f64 * INFLATE_TO_PCT / 100.0) as u64;
    let mut demand: u64 = order.iter().map(|&i| pods[i].gpu_milli()).sum();
    if pods.iter().all(|p| p.gpu_milli() == 0) {
        return order;
    }
    loop {
        let i = rng.below(pods.len());
        let d = pods[i].gpu_milli();
        if demand + d > limit {
            break;
        }
        demand += d;
        order.push(i);
    }
    order
}

/// The order of the nodes one seed replays: a permutation of `0..n`.
///
/// The published simulator does not keep the node list's order: before it
/// creates the nodes it prefixes each name with a seeded random permutation
/// (`syncClusterResourceList`: `rand.Perm`, names `"%04d-" + name`), and its
/// scheduler breaks equal scores by the smallest name. Equal scores are
/// common (FGD's score is an integer, and `defrag` ties within a step), so
/// which node a tie goes to, and thus how the cluster fills, is a random
/// order per seed there, not the trace's. Drawn from its own stream so the
/// arrival order of a seed stays what it was.
pub fn node_order(n: usize, seed: u64) -> Vec<usize> {
    // "nodes" in ASCII: a stream apart from the arrivals' of the same seed.
    let mut rng = Rng::new(seed ^ 0x6E6F_6465_7300_0000);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        order.swap(i, j);
    }
    order
}

/// What one replay (one policy, one seed) measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub policy: Policy,
    pub seed: u64,
    /// Unallocated GPU share when the arrived demand reaches 100% of
    /// capacity, percent, read as the published figure is ([`Reading`]).
    pub unallocated_pct_at_100: f64,
    /// The cluster's expected fragmentation at that point, percent of
    /// capacity.
    pub fragmentation_pct_at_100: f64,
    /// Pods that fitted nowhere, among those arrived by 100%.
    pub failed_pods_at_100: u64,
    /// Pods that fitted nowhere, over the whole replay.
    pub failed_pods: u64,
    pub pods: u64,
    /// Unallocated share (percent) at 0, 1, ..., 130% arrived.
    pub curve: Vec<f64>,
    /// Time of each decision, nanoseconds.
    pub decision_ns: Vec<u64>,
    /// Buckets in the engine's index at the end.
    pub buckets: usize,
    /// GPU-milli allocated at the end and the most any GPU was ever
    /// over-committed (must be 0): checked after every placement in tests.
    pub allocated_milli: u64,
}

/// Replays `order` (indexes into `pods`) on `nodes` under `policy`.
pub fn replay(
    nodes: &[Node],
    pods: &[Request],
    mix: &TaskMix,
    order: &[usize],
    policy: Policy,
    seed: u64,
) -> Result<Outcome, PlaceError> {
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64).sum::<u64>() * u64::from(MILLI);
    let mut engine = Engine::new(nodes.to_vec(), policy, mix)?;
    let pct = |x: u64| x as f64 * 100.0 / capacity.max(1) as f64;
    let mut arrived = 0u64;
    let mut allocated = 0u64;
    let mut failed = 0u64;
    let mut failed_at_100 = None;
    let mut at_100 = None;
    let mut frag_at_100 = None;
    let mut curve = Vec::with_capacity(CURVE_POINTS);
    let mut reading = Reading::default();
    let mut decision_ns = Vec::with_capacity(order.len());
    for &i in order {
        let req = &pods[i];
        let before = (pct(arrived), 100.0 - pct(allocated));
        arrived += req.gpu_milli();
        let t = Instant::now();
        let choice = engine.decide(req);
        decision_ns.push(t.elapsed().as_nanos() as u64);
        match choice {
            Ok(c) => {
                engine.commit(&c, req)?;
                allocated += req.gpu_milli();
            }
            Err(PlaceError::NoFit) => failed += 1,
            Err(e) => return Err(e),
        }
        let (a, u) = (pct(arrived), 100.0 - pct(allocated));
        reading.after_pod(a, u);
        while curve.len() < CURVE_POINTS && a >= curve.len() as f64 {
            let x = curve.len() as f64;
            curve.push(interpolate(before, (a, u), x));
        }
        if at_100.is_none() && a >= 100.0 {
            at_100 = Some(interpolate(before, (a, u), 100.0));
            failed_at_100 = Some(failed);
            frag_at_100 = Some(pct(0) + engine.fragmentation() * 100.0 / capacity.max(1) as f64);
        }
    }
    // A trace whose demand never reaches 100%: read at the end.
    let end_unalloc = 100.0 - pct(allocated);
    while curve.len() < CURVE_POINTS && pct(arrived) >= curve.len() as f64 {
        curve.push(end_unalloc);
    }
    Ok(Outcome {
        policy,
        seed,
        unallocated_pct_at_100: reading.value().or(at_100).unwrap_or(end_unalloc),
        fragmentation_pct_at_100: frag_at_100
            .unwrap_or_else(|| engine.fragmentation() * 100.0 / capacity.max(1) as f64),
        failed_pods_at_100: failed_at_100.unwrap_or(failed),
        failed_pods: failed,
        pods: order.len() as u64,
        curve,
        decision_ns,
        buckets: engine.buckets(),
        allocated_milli: allocated,
    })
}

/// How the published figure is read off a replay. The published simulator
/// logs the used and the arrived GPU share after every pod, and its
/// analysis (`experiments/analysis/merge_alloc_discrete.py`) rounds each
/// line's arrived share to a whole percent and takes the mean allocation
/// of the lines at 100 (arrived in [99.5, 100.5]); with no line there, of
/// the lines at 99 to 101. A trace with no pod in either window is read on
/// the line between the two pods around 100% (the caller's fallback).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    near: (f64, u32),
    wide: (f64, u32),
}

impl Reading {
    /// One pod's line: arrived and unallocated share after it, percent.
    pub fn after_pod(&mut self, arrived_pct: f64, unallocated_pct: f64) {
        // Python's round() sends x.5 to the even neighbour: 99.5 and 100.5
        // both round to 100, so both ends are in.
        if (99.5..=100.5).contains(&arrived_pct) {
            self.near.0 += unallocated_pct;
            self.near.1 += 1;
        }
        if (98.5..=101.5).contains(&arrived_pct) {
            self.wide.0 += unallocated_pct;
            self.wide.1 += 1;
        }
    }

    /// The mean over the window at 100, else over 99..101; `None` when no
    /// line fell in either.
    pub fn value(&self) -> Option<f64> {
        [self.near, self.wide]
            .into_iter()
            .find(|w| w.1 > 0)
            .map(|(sum, n)| sum / f64::from(n))
    }
}

/// The y of the line through `a` and `b` at `x` (`b` when they share an x).
fn interpolate(a: (f64, f64), b: (f64, f64), x: f64) -> f64 {
    if b.0 <= a.0 {
        return b.1;
    }
    let t = ((x - a.0) / (b.0 - a.0)).clamp(0.0, 1.0);
    a.1 + t * (b.1 - a.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_uniform_enough_and_stable() {
        let mut r = Rng::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        // The sequence is part of the protocol's reproducibility.
        assert_eq!(Rng::new(42).next_u64(), Rng::new(42).next_u64());
        assert_ne!(Rng::new(42).next_u64(), Rng::new(43).next_u64());
    }

    #[test]
    fn the_reading_is_the_mean_of_the_lines_that_round_to_100() {
        let mut r = Reading::default();
        assert_eq!(r.value(), None);
        for (a, u) in [
            (98.0, 9.0),
            (99.4, 8.0),
            (99.5, 6.0),
            (100.2, 5.0),
            (100.5, 4.0),
        ] {
            r.after_pod(a, u);
        }
        r.after_pod(100.6, 1.0);
        assert_eq!(r.value(), Some(5.0), "99.5, 100.2 and 100.5 only");
        // Nothing at 100: the lines at 99 to 101.
        let mut r = Reading::default();
        r.after_pod(98.0, 9.0);
        r.after_pod(99.0, 7.0);
        r.after_pod(101.4, 3.0);
        r.after_pod(102.0, 1.0);
        assert_eq!(r.value(), Some(5.0));
    }

    #[test]
    fn interpolation_reads_between_two_pods() {
        assert_eq!(interpolate((99.0, 4.0), (101.0, 6.0), 100.0), 5.0);
        assert_eq!(interpolate((100.0, 4.0), (100.0, 6.0), 100.0), 6.0);
    }
}
