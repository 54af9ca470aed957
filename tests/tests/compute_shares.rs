//! Compute-time slices end to end, with the bounds: workload
//! processes under the shim keep a simulated GPU busy, an in-process arbiter
//! slices its time, and each allocation's share is judged by the node's
//! ground truth (its engine timeline).
//!
//! Each test runs its scenario with 50 µs, 1 ms and 20 ms kernels at once,
//! on three devices of one node (the arbiter runs one thread per GPU), for
//! 10 s. The tests measure time, so they run one at a time.

use std::sync::Mutex;
use std::time::Duration;

use tessera_e2e::SimNode;
use tessera_e2e::bench::compute::{AllocSpec, Launch, Outcome, Scenario, run_scenario};
use tessera_manager::arbiter::{Arbiter, ArbiterConfig};

static SERIAL: Mutex<()> = Mutex::new(());

const MEASURE: Duration = Duration::from_secs(10);

/// Runs one scenario per (device, scenario) pair at once on a fresh node.
fn run_parallel(scenarios: Vec<Scenario>) -> Vec<Outcome> {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let node = SimNode::builder().devices(scenarios.len() as u32).build();
    let arbiter = Arbiter::new(ArbiterConfig::default()).expect("default configuration");
    let outcomes = std::thread::scope(|s| {
        let runs: Vec<_> = scenarios
            .iter()
            .enumerate()
            .map(|(dev, sc)| {
                let (node, arbiter) = (&node, &arbiter);
                s.spawn(move || run_scenario(node, arbiter, dev as u32, sc))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("scenario thread"))
            .collect::<Vec<_>>()
    });
    for o in &outcomes {
        eprintln!(
            "{}: achieved {:?} (held {:?}), GPU busy {:.2}%, hand-over p50 {:?} ns",
            o.name, o.achieved, o.held, o.gpu_busy, o.handover_p50
        );
        assert!(o.failures.is_empty(), "{}: {:?}", o.name, o.failures);
        assert_eq!(o.drain_timeouts, 0, "{}: drains timed out", o.name);
    }
    outcomes
}

fn kernels(make: impl Fn(Duration) -> Scenario) -> Vec<Scenario> {
    [
        Duration::from_micros(50),
        Duration::from_millis(1),
        Duration::from_millis(20),
    ]
    .into_iter()
    .map(make)
    .collect()
}

fn within(o: &Outcome, what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{}: {what} {got:.2}% is not within {tol} pp of {want}% (achieved {:?}, held {:?})",
        o.name,
        o.achieved,
        o.held
    );
}

#[test]
fn three_guaranteed_allocations_get_their_shares() {
    let outcomes = run_parallel(kernels(|k| {
        Scenario::new(
            &format!("guaranteed 20/30/50, {} us kernels", k.as_micros()),
            vec![
                AllocSpec::guaranteed(20),
                AllocSpec::guaranteed(30),
                AllocSpec::guaranteed(50),
            ],
            k,
            MEASURE,
        )
    }));
    for o in &outcomes {
        for (i, want) in [20.0, 30.0, 50.0].into_iter().enumerate() {
            within(o, &format!("allocation {i}"), o.achieved[i], want, 1.0);
        }
    }
}

#[test]
fn a_guaranteed_allocation_alone_is_held_to_its_share() {
    let outcomes = run_parallel(kernels(|k| {
        Scenario::new(
            &format!("guaranteed 30 alone, {} us kernels", k.as_micros()),
            vec![AllocSpec::guaranteed(30)],
            k,
            MEASURE,
        )
    }));
    for o in &outcomes {
        within(o, "the allocation", o.achieved[0], 30.0, 1.0);
        // Nothing else ran: the GPU idled the rest of the time.
        within(o, "the GPU", o.gpu_busy, 30.0, 1.0);
    }
}

#[test]
fn two_burst_allocations_fill_the_gpu_evenly() {
    let outcomes = run_parallel(kernels(|k| {
        Scenario::new(
            &format!("burst 25+25, {} us kernels", k.as_micros()),
            vec![AllocSpec::burst(25), AllocSpec::burst(25)],
            k,
            MEASURE,
        )
    }));
    for o in &outcomes {
        assert!(
            o.gpu_busy >= 95.0,
            "{}: GPU busy {:.2}%",
            o.name,
            o.gpu_busy
        );
        let total: f64 = o.achieved.iter().sum();
        within(o, "the split", o.achieved[0] / total * 100.0, 50.0, 2.0);
    }
}

/// Kernels launched as `cuLaunchKernelEx`, cooperative kernels and CUDA
/// graphs are held to the share as plain launches are.
#[test]
fn every_way_of_launching_is_gated() {
    let outcomes = run_parallel(
        [Launch::Ex, Launch::Coop, Launch::Graph]
            .into_iter()
            .map(|how| {
                let mut sc = Scenario::new(
                    &format!("guaranteed 30 alone, {} launches", how.name()),
                    vec![AllocSpec::guaranteed(30)],
                    Duration::from_millis(1),
                    Duration::from_secs(3),
                );
                sc.launch = how;
                sc
            })
            .collect(),
    );
    for o in &outcomes {
        within(o, "the allocation", o.achieved[0], 30.0, 2.0);
    }
}
