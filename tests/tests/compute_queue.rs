//! The queue bound (hook/src/pace.rs) end to end: a governed workload that
//! tries to keep 64 kernels in flight never has more than two launches'
//! work queued on the simulated GPU, so a revoked grant drains in at most
//! the running kernel and the one behind it. The bound is a count the shim
//! enforces by waiting on its own markers, so it holds whatever the CPU
//! load; with the bound turned off (`TESSERA_QUEUE_BUDGET=0`) the same
//! workload's queue grows far beyond it, which is what shows the check can
//! fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_e2e::bench::compute::{AllocSpec, Scenario, Workload, create_allocation};
use tessera_e2e::sim::SimNode;
use tessera_manager::arbiter::{Arbiter, ArbiterConfig, OpenFiles};

const KERNEL: Duration = Duration::from_millis(5);

/// How long the sampling may go on before `enough` decides: a hang guard,
/// never a measure. A loaded box may take many seconds to get the workload
/// launching at depth; the samples end as soon as they decide.
const SAMPLING_LIMIT: Duration = Duration::from_secs(90);

/// Runs the deep-queue workload alone in a burst allocation (it keeps the
/// GPU) with `budget` as `TESSERA_QUEUE_BUDGET`, and samples the engine's
/// queued work (its free time minus now) until `enough` says the samples
/// decide, or [`SAMPLING_LIMIT`]. Returns the largest queue seen, in ns, and
/// the samples.
fn largest_queue(budget: &str, enough: impl Fn(u64, usize) -> bool) -> (u64, usize) {
    let node = SimNode::builder().devices(1).build();
    let arbiter = Arbiter::new(ArbiterConfig::default()).expect("arbiter");
    let files = create_allocation(&node, 0, "queue", AllocSpec::burst(50));
    let opened = OpenFiles::open(&files.control, &files.state).expect("open");
    arbiter.add_allocation(Arc::new(opened), 0).expect("add");
    let mut sc = Scenario::new("queue", vec![files.spec], KERNEL, Duration::from_secs(8));
    sc.depth = 64;
    // The workload outlives the sampling (it is killed when dropped below).
    let lifetime = SAMPLING_LIMIT.as_secs_f64() + 30.0;
    let mut w = Workload::spawn_with(&node, &files, 0, &sc, lifetime, |c| {
        c.env("TESSERA_QUEUE_BUDGET", budget);
    });
    assert!(
        w.wait_line("ready", Duration::from_secs(30)).is_some(),
        "workload did not start: {:?}",
        w.seen
    );
    let n = node.node();
    let deadline = Instant::now() + SAMPLING_LIMIT;
    let (mut largest, mut samples) = (0u64, 0usize);
    while Instant::now() < deadline && !enough(largest, samples) {
        let until = n.device_usage(0).expect("usage").busy_until_ns;
        let now = tessera_sim::clock::now_ns();
        largest = largest.max(until.saturating_sub(now));
        samples += 1;
        std::thread::sleep(Duration::from_micros(500));
    }
    drop(w);
    arbiter.shutdown();
    (largest, samples)
}

#[test]
fn a_governed_process_never_queues_more_than_two_launches() {
    // Two launches in flight at most: the running kernel and the one
    // behind it, each followed by the device's kernel gap.
    let bound = 2 * (KERNEL.as_nanos() as u64 + 1_000);
    // Samples over at least 2 s of the workload's life (after its first
    // launches), so many revocation-free renewals and learned lengths pass.
    let (largest, samples) = largest_queue("250us", |_, s| s >= 2_000);
    eprintln!("paced: largest queue {largest} ns over {samples} samples");
    assert!(samples > 0);
    assert!(
        largest <= bound,
        "{largest} ns queued, more than two launches ({bound} ns)"
    );
    assert!(largest > 0, "the workload ran no work");
}

#[test]
fn without_the_bound_the_same_workload_queues_deeper() {
    let bound = 2 * (KERNEL.as_nanos() as u64 + 1_000);
    let (largest, samples) = largest_queue("0", |l, _| l > 3 * bound);
    eprintln!("unpaced: largest queue {largest} ns over {samples} samples");
    assert!(
        largest > 3 * bound,
        "only {largest} ns queued without the bound: the check above proves nothing"
    );
}
