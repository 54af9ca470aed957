//! CUDA inside an allocation shows only the allocation's GPUs, whatever the
//! process does to its own `CUDA_VISIBLE_DEVICES` (the environment is the
//! tenant's): the shim takes the GPUs from the control file and pins the
//! variable at `cuInit`, and refuses a context on any other GPU. On a node
//! of two GPUs whose allocation holds the node's GPU 1, a client that drops
//! or rewrites the variable before `cuInit` sees one device, the allocated
//! one (by UUID), cannot reach the other by ordinal, raw handle, PCI bus id
//! or any of the three routes in, and the other GPU holds nothing.

mod hook_support;

use hook_support::*;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;
/// What a context holds on the simulated GPU.
const CONTEXT: u64 = 16 * MI;

#[test]
fn a_process_sees_only_its_allocations_gpu_whatever_its_environment_says() {
    let sim = Sim::new(2, PHYSICAL);
    sim.node.node().set_context_memory(CONTEXT);
    sim.allocate_with(&[(1, LIMIT)], 0);
    let (other, mine) = (sim.uuid(0), sim.uuid(1));
    let bus = |i: u32| sim.node.node().device_info(i).unwrap().pci_bus_id();

    // The node really has two GPUs: an ungoverned client without the
    // variable sees both.
    let mut bare = sim.client(false);
    ok(&mut bare, "env-unset CUDA_VISIBLE_DEVICES");
    ok(&mut bare, "cu-init");
    assert_eq!(ok(&mut bare, "dev-count").u64("n"), 2);
    ok(&mut bare, "retain 0 link");
    assert_eq!(sim.used(0), CONTEXT, "a context costs memory there");
    assert!(bare.finish().success());

    let rewrites = [
        "env-unset CUDA_VISIBLE_DEVICES".to_string(),
        "env-set CUDA_VISIBLE_DEVICES 0,1".to_string(),
        "env-set CUDA_VISIBLE_DEVICES 0".to_string(),
        format!("env-set CUDA_VISIBLE_DEVICES {other}"),
        format!("env-set CUDA_VISIBLE_DEVICES {other},{mine}"),
    ];
    for rewrite in &rewrites {
        // Started as `tessera run` starts it, then the tenant's rewrite.
        let mut cmd = sim.command(memclient(), true);
        cmd.env("CUDA_VISIBLE_DEVICES", &mine);
        let mut c = Conv::start(cmd);
        ok(&mut c, rewrite);
        ok(&mut c, "cu-init");
        assert_eq!(ok(&mut c, "dev-count").u64("n"), 1, "{rewrite}");
        let d0 = ok(&mut c, "dev-get 0");
        assert!(
            d0.str("uuid").eq_ignore_ascii_case(&mine),
            "{rewrite}: device 0 is {}, the allocation's GPU is {mine}",
            d0.str("uuid")
        );
        assert!(!ask(&mut c, "dev-get 1").ok, "{rewrite}: a second ordinal");
        assert!(!ask(&mut c, "dev-uuid 1").ok, "{rewrite}: a raw handle");
        assert!(
            !ask(&mut c, &format!("dev-pci {}", bus(0))).ok,
            "{rewrite}: the other GPU's bus id"
        );
        assert_eq!(
            ok(&mut c, &format!("dev-pci {}", bus(1))).u64("d"),
            d0.u64("d")
        );
        // No context on the other GPU, by any route in.
        for route in ["link", "dlsym", "procaddr"] {
            for what in ["retain", "create"] {
                let l = ask(&mut c, &format!("{what} 1 {route}"));
                assert!(!l.ok, "{rewrite}: {what} via {route}: {}", l.raw);
            }
        }
        // The allocation's own GPU works, through every route.
        for route in ["link", "dlsym", "procaddr"] {
            ok(&mut c, &format!("retain {} {route}", d0.u64("d")));
        }
        ok(&mut c, &format!("create {} link", d0.u64("d")));
        // NVML agrees.
        ok(&mut c, "nvml-init");
        assert_eq!(ok(&mut c, "nvml-count").u64("n"), 1, "{rewrite}");
        // Ground truth: the other GPU holds nothing, while the client lives
        // with its contexts on its own GPU.
        assert_eq!(sim.used(0), 0, "{rewrite}: memory on the other GPU");
        assert!(sim.used(1) > 0, "{rewrite}: the contexts are on GPU 1");
        assert!(c.finish().success());
        // It exited holding its contexts' charge: the manager (here one pass of its
        // stand-in) returns it once the driver has let the process go.
        assert_eq!(reclaim_released(&sim, &sim.state()), 1, "{rewrite}");
    }
}
