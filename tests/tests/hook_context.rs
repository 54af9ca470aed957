//! Contexts are charged what the driver really holds for them, measured
//! per process (NVML's per-process memory less what the shim charges this
//! process otherwise), whatever the control file's configured estimate:
//! with the simulated device holding 16 MiB per context, a tenant at its
//! limit plus its contexts stays within its slice by ground truth.

mod hook_support;

use hook_support::*;

const PHYSICAL: u64 = 512 * MI;
const CONTEXT: u64 = 16 * MI;
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

fn sim(limit: u64, configured: u64) -> Sim {
    let sim = Sim::new(1, PHYSICAL);
    sim.node.node().set_context_memory(CONTEXT);
    sim.allocate_with(&[(0, limit)], configured);
    sim
}

#[test]
fn a_context_is_charged_what_the_driver_holds_for_it() {
    // Configured 0 (the old default) and configured too much: both end up
    // charged what the device really holds.
    for configured in [0, 40 * MI] {
        let sim = sim(64 * MI, configured);
        let mut c = sim.client_init(true);
        assert_eq!(sim.used(0), CONTEXT);
        assert_eq!(sim.state().reserved(0), CONTEXT, "configured {configured}");
        ok(&mut c, &format!("alloc {}", 48 * MI));
        refused(&mut c, &format!("alloc {}", MI), OOM);
        assert_eq!(sim.used(0), 64 * MI);
        // A second context of its own is charged too, and returned when
        // destroyed.
        refused(&mut c, "ctx-create 0", OOM);
        assert_eq!(sim.used(0), 64 * MI, "the refused context was undone");
        ok(&mut c, "free 0");
        ok(&mut c, "ctx-create 0");
        assert_eq!(sim.state().reserved(0), 2 * CONTEXT);
        assert_eq!(sim.used(0), 2 * CONTEXT);
        ok(&mut c, "ctx-destroy 0");
        assert_eq!(sim.state().reserved(0), CONTEXT);
        assert!(c.finish().success());
        let state = sim.state();
        state.reclaim_dead(&tessera_shm::LocalLiveness::thorough(), None);
        assert_eq!(state.reserved(0), 0);
    }
}

#[test]
fn a_context_that_does_not_fit_is_refused() {
    let sim = sim(8 * MI, 0);
    let mut c = sim.client(true);
    refused(&mut c, "init", OOM);
    assert_eq!(sim.used(0), 0);
    assert_eq!(sim.state().reserved(0), 0);
    assert!(c.finish().success());
}
