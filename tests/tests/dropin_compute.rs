//! The compute shares drop-in pods ask for, delivered: the guaranteed shares that
//! HAMi's `gpucores` and Volcano's `vgpu-cores` pods of `dropin_support` translate to
//! (and that `dropin_dra` and `dropin_device_plugin_sim` show their allocations get)
//! run under the real arbiter on the simulated GPU, in the bench's scenarios
//! (`tessera_e2e::bench::dropin`).
//!
//! Asserted is what the arbiter guarantees whatever the CPU load: a guaranteed
//! allocation never runs above its cap (plus the bound derived from the measurement,
//! `cap_slack_pp`), nothing runs that the arbiter did not charge, and none with work
//! starves. How close each comes to its share (the 1 pp) depends on the
//! workloads getting the CPU to feed the GPU: that is the bench's row
//! (`tessera-bench dropin`), printed here too.

mod dropin_support;

use std::time::Duration;

use dropin_support::pods;
use tessera_e2e::bench::compute::AllocSpec;
use tessera_e2e::bench::dropin::{cap_slack_pp, run, scenarios, share_pp};
use tessera_shm::Policy;

const MEASURE: Duration = Duration::from_secs(10);

/// Every share the bench's scenarios run is one a drop-in pod of the tests is
/// translated to, with the same words: the bench measures those pods' shares.
#[test]
fn the_scenarios_run_the_guaranteed_shares_of_the_dropin_pods() {
    let asked: Vec<(String, AllocSpec)> = pods()
        .into_iter()
        .filter(|(_, w)| w.guaranteed)
        .map(|(p, w)| {
            let limits = p["spec"]["containers"][0]["resources"]["limits"].clone();
            let words = limits
                .as_object()
                .expect("limits")
                .iter()
                .filter(|(k, _)| !k.ends_with("gpu") && !k.ends_with("vgpu-number"))
                .filter(|(k, _)| !k.ends_with("priority"))
                .map(|(k, v)| format!("{k}={}", v.as_str().expect("a string")))
                .collect::<Vec<_>>()
                .join(",");
            (
                words,
                AllocSpec {
                    share_ppm: w.compute_ppm,
                    policy: Policy::Guaranteed,
                },
            )
        })
        .collect();
    for (_, allocs) in scenarios(MEASURE) {
        for a in allocs {
            let (project_key, rest) = a.words.split_once(": ").expect("key: values");
            let memory = rest.split(',').next().expect("memory");
            let cores = a.words.rsplit(": ").next().expect("cores");
            let found = asked.iter().any(|(words, spec)| {
                *spec == a.spec
                    && words.contains(&format!("{project_key}={memory}"))
                    && words.contains(&format!("cores={cores}"))
            });
            assert!(found, "{:?} is no drop-in pod's share: {asked:?}", a.words);
        }
    }
}

#[test]
fn the_dropin_pods_guaranteed_shares_are_never_exceeded() {
    for (o, allocs) in run(MEASURE).expect("the scenarios run") {
        assert!(o.failures.is_empty(), "{}: {:?}", o.name, o.failures);
        assert_eq!(o.drain_timeouts, 0, "{}: drains timed out", o.name);
        for (i, a) in allocs.iter().enumerate() {
            let (cap, slack) = (share_pp(&o, i), cap_slack_pp(&o, i));
            // The accuracy figure, for the log (never asserted: it depends on the CPU).
            eprintln!(
                "{} / {}: guaranteed {cap}%, achieved {:.2}% ({:+.2} pp), held {:.2}%, bound +{slack:.2} pp",
                o.name,
                a.words,
                o.achieved[i],
                o.achieved[i] - cap,
                o.held[i]
            );
            assert_eq!(o.allocs[i].policy, Policy::Guaranteed);
            assert!(
                o.achieved[i] <= cap + slack,
                "{}: {} ran {:.2}% of the GPU, above its {cap}% cap (+{slack:.2} pp)",
                o.name,
                a.words,
                o.achieved[i]
            );
            assert!(
                o.held[i] <= cap + slack,
                "{}: {} was granted {:.2}%, above its {cap}% cap (+{slack:.2} pp)",
                o.name,
                a.words,
                o.held[i]
            );
            // Nothing ran outside its grants (give or take a hold cut by each end).
            let ran = o.achieved[i] / 100.0 * o.window.as_secs_f64();
            let charged = o.held[i] / 100.0 * o.measured.as_secs_f64();
            let hold = 2.0 * o.longest_hold[i].as_secs_f64();
            assert!(
                ran <= charged + hold,
                "{}: {} ran {ran:.3} s but was charged {charged:.3} s (+{hold:.3} s)",
                o.name,
                a.words
            );
            assert!(
                o.held[i] > 0.0 && o.achieved[i] > 0.0,
                "{}: {} starved",
                o.name,
                a.words
            );
        }
    }
}
