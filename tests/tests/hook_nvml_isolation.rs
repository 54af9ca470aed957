//! NVML inside an allocation shows only the allocation: its GPUs (numbered
//! as CUDA numbers them, no phantom zero-memory GPU for the others, which
//! no lookup by index, UUID or PCI bus id reaches), only its processes in
//! every process list, and its own memory view; outside, NVML is the
//! node's own.

mod hook_support;

use hook_support::*;
use tessera_e2e::Mode;

const LIMIT: u64 = 64 * MI;
const PHYSICAL: u64 = 512 * MI;

/// `pid:bytes` pairs of a process-list line.
fn pids(l: &Line) -> Vec<u32> {
    let s = l.str("pids");
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.split(':').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn nvml_shows_only_the_allocation() {
    // A node of three GPUs; the allocation holds only the node's GPU 1.
    let sim = Sim::new(3, PHYSICAL);
    sim.allocate_with(&[(1, LIMIT)], 0);
    let (u0, u1, u2) = (sim.uuid(0), sim.uuid(1), sim.uuid(2));
    let bus = |i: u32| sim.node.node().device_info(i).unwrap().pci_bus_id();
    // As `tessera run` and the device plugin set it.
    let visible = |c: &mut std::process::Command| {
        c.env("CUDA_VISIBLE_DEVICES", &u1);
    };

    // A process of the allocation holding 8 MiB on its GPU.
    let mut cmd = sim.command(memclient(), true);
    visible(&mut cmd);
    let mut holder = Conv::start(cmd);
    ok(&mut holder, "init");
    let holder_pid = holder.pid();
    ok(&mut holder, &format!("alloc {}", 8 * MI));
    // Neighbours, ungoverned (another tenant's), on GPU 1 and on GPU 0.
    let mut n1 = sim.client_init(false);
    ok(&mut n1, "ctx 1");
    ok(&mut n1, &format!("alloc {}", 100 * MI));
    let mut n0 = sim.client_init(false);
    ok(&mut n0, &format!("alloc {}", 50 * MI));

    for cvd in [true, false] {
        // A monitor inside the allocation (it need not join).
        let mut cmd = sim.command(memclient(), true);
        if cvd {
            visible(&mut cmd);
        }
        let mut m = Conv::start(cmd);
        ok(&mut m, "nvml-init");
        assert_eq!(ok(&mut m, "nvml-count").u64("n"), 1, "cvd={cvd}");
        let d0 = ok(&mut m, "nvml-index 0");
        assert_eq!(d0.str("uuid"), u1);
        assert_eq!(d0.u64("index"), 0);
        refused(&mut m, "nvml-index 1", "NVML_ERROR_INVALID_ARGUMENT");
        // No name reaches a GPU outside the allocation.
        refused(&mut m, &format!("nvml-uuid {u0}"), "NVML_ERROR_NOT_FOUND");
        refused(&mut m, &format!("nvml-uuid {u2}"), "NVML_ERROR_NOT_FOUND");
        refused(
            &mut m,
            &format!("nvml-pci {}", bus(0)),
            "NVML_ERROR_NOT_FOUND",
        );
        assert_eq!(ok(&mut m, &format!("nvml-uuid {u1}")).u64("index"), 0);
        assert_eq!(ok(&mut m, &format!("nvml-pci {}", bus(1))).str("uuid"), u1);
        // Every process-list flavour lists the holder, not the neighbour.
        for v in [1, 2, 3] {
            let l = ok(&mut m, &format!("nvml-procs 0 {v}"));
            assert_eq!(pids(&l), vec![holder_pid], "v{v}: {}", l.raw);
        }
        assert_eq!(ok(&mut m, "nvml-gprocs 0 3").u64("n"), 0);
        let u = ok(&mut m, "nvml-util 0");
        assert!(u.u64("gpu") <= 100 && u.u64("memory") <= 100, "{}", u.raw);
        assert!(m.finish().success());
    }

    // The probe's own NVML view, all three client styles: memory is the
    // allocation's.
    for mode in Mode::ALL {
        let mut c = sim.probe(mode, true);
        visible(&mut c);
        c.args(["nvml-init", "nvml-count", "nvml-meminfo", "nvml-procs"]);
        let o = tessera_e2e::ProbeOutput::from_output(c.output().unwrap());
        o.expect_ok();
        assert_eq!(o.get("nvml-count").u64("n"), 1);
        assert_eq!(o.get("nvml-meminfo").u64("total"), LIMIT);
        assert_eq!(o.get("nvml-meminfo").u64("used"), 8 * MI);
        assert_eq!(pids(o.get("nvml-procs")), vec![holder_pid], "{}", o.stdout);
    }

    // Outside the allocation NVML is the node's: three GPUs, every process.
    let mut m = sim.client(false);
    ok(&mut m, "nvml-init");
    assert_eq!(ok(&mut m, "nvml-count").u64("n"), 3);
    let l = ok(&mut m, "nvml-procs 1 3");
    let mut all = pids(&l);
    all.sort();
    let mut want = vec![holder_pid, n1.pid()];
    want.sort();
    assert_eq!(all, want, "{}", l.raw);
    assert!(m.finish().success());
    for c in [holder, n1, n0] {
        assert!(c.finish().success());
    }
}
