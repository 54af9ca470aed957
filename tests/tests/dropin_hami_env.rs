//! A pod written for HAMi may still set HAMi-core's variables itself
//! (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`, ...). The shim reads none of
//! them: a process that sets them to ask for a whole GPU sees and gets exactly its
//! allocation's limit, and is refused past it, whichever way it reaches the driver.

mod hook_support;

use hook_support::*;
use tessera_contract::dropin::HAMI_CORE_ENV;
use tessera_e2e::Mode;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;

#[test]
fn hami_core_variables_set_by_the_pod_raise_nothing() {
    let sim = Sim::new(1, PHYSICAL);
    sim.allocate(LIMIT);
    let mut refused = 0;
    for mode in Mode::ALL {
        let mut c = sim.probe(mode, true);
        // What HAMi's device plugin would have set for a whole card, and the
        // switches that turn HAMi-core's own limits off.
        for (name, value) in HAMI_CORE_ENV.iter().zip(["512m", "100", "true", "disable"]) {
            c.env(name, value);
        }
        c.env("CUDA_DEVICE_MEMORY_LIMIT_0", "512m").args([
            "init",
            "ctx",
            "meminfo",
            "nvml-init",
            "nvml-meminfo",
            &format!("alloc {}", LIMIT / 2),
            &format!("alloc {}", LIMIT),
        ]);
        let o = tessera_e2e::ProbeOutput::from_output(c.output().expect("probe"));
        let ctx = format!("{mode:?}:\n{}{}", o.stdout, o.stderr);
        assert_eq!(o.get("meminfo").u64("total"), LIMIT, "{ctx}");
        assert_eq!(o.get("nvml-meminfo").u64("total"), LIMIT, "{ctx}");
        let allocs = o.all("alloc");
        assert!(allocs[0].ok, "{ctx}");
        assert_eq!(
            allocs[1].error.as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "past the limit: {ctx}"
        );
        refused += 1;
        assert_eq!(sim.state().oom_refused(0), refused, "{ctx}");
        // It exited holding LIMIT / 2: the manager (here one pass of its stand-in)
        // returns it once the driver has let the process go.
        assert_eq!(reclaim_released(&sim, &sim.state()), 1, "{ctx}");
    }
}
