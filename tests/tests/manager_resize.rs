//! Live resize (`tessera resize`, the manager's ResizeAllocation) against
//! the simulated node: a process under the shim sees a raised limit at its
//! next call and can use it; capacity is checked as for a create; a limit
//! below what is held is refused with the figure and changes nothing; a
//! share moves in and out of arbitration. The simulated driver's
//! per-process memory is the ground truth.

mod manager_support;

use std::time::{Duration, Instant};

use clap::Parser;
use manager_support::*;
use tessera_e2e::SimNode;
use tessera_proto::manager::v1 as pb;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(10);

role_test!();

fn node() -> SimNode {
    SimNode::e2e(1, 0x4e5)
}

/// ResizeAllocation over the API: memory and share of the one GPU (0: as is).
fn resize_api(
    socket: &std::path::Path,
    id: &str,
    uuid: &str,
    mem: u64,
    ppm: u32,
) -> Result<pb::Allocation, tonic::Status> {
    let req = pb::ResizeAllocationRequest {
        id: id.into(),
        devices: vec![pb::DeviceRequest {
            gpu_uuid: uuid.into(),
            memory_limit_bytes: mem,
            compute_share_ppm: ppm,
            slices: 0,
        }],
        priority: None,
    };
    with_client(socket, async |c| c.resize_allocation(req).await).map(|r| r.into_inner())
}

/// `tessera resize` as the binary runs it (in this process: the client
/// makes its own runtime).
fn resize_cli(socket: &std::path::Path, argv: &[&str]) -> Result<(), String> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: tessera_client::resize::ResizeArgs,
    }
    let mut all = vec!["resize", "--socket", socket.to_str().unwrap()];
    all.extend_from_slice(argv);
    let cli = Cli::try_parse_from(all).map_err(|e| e.to_string())?;
    tessera_client::resize::resize(&cli.args).map_err(|e| e.to_string())
}

fn total(line: &tessera_e2e::probe::Line) -> u64 {
    line.u64("total")
}

#[test]
fn a_running_process_sees_a_resize_and_capacity_holds() {
    let n = node();
    let m = ManagerProc::on(&n);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "grow", &uuid, 2 * GI, 300_000);
    create(&m.socket, "other", &uuid, 8 * GI, 500_000);
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", &format!("alloc {GI}")] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    assert_eq!(total(&w.cmd("meminfo", T)), 2 * GI);
    let over = w.cmd(&format!("alloc {}", 3 * GI), T);
    assert_eq!(over.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));

    // Raised through the CLI: the next call of the running process sees
    // it (the shim reads the limit from the control file on every call).
    let t0 = Instant::now();
    resize_cli(&m.socket, &["grow", "--memory", "5Gi"]).unwrap();
    let seen = total(&w.cmd("meminfo", T));
    let cli_took = t0.elapsed();
    assert_eq!(seen, 5 * GI);
    // And over the API alone.
    let t0 = Instant::now();
    resize_api(&m.socket, "grow", &uuid, 4 * GI, 0).unwrap();
    let api_rpc = t0.elapsed();
    let seen = total(&w.cmd("meminfo", T));
    let api_took = t0.elapsed();
    assert_eq!(seen, 4 * GI);
    println!(
        "resize to effect: CLI (connect, status, resize) + the next call {cli_took:?}; \
         API call {api_rpc:?}, + the next call {api_took:?}"
    );
    let big = w.cmd(&format!("alloc {}", 3 * GI), T);
    assert!(big.ok, "the raised limit is usable: {}", big.raw);
    let one = w.cmd("alloc 1", T);
    assert_eq!(one.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    let truth = n.node().process(w.pid()).unwrap().memory[0];
    assert_eq!(truth, 4 * GI, "ground truth");

    // Capacity as for a create: 16 GiB less the other's 8 GiB leaves 8.
    let e = resize_api(&m.socket, "grow", &uuid, 9 * GI, 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let e = resize_api(&m.socket, "grow", &uuid, 17 * GI, 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = resize_api(&m.socket, "grow", &uuid, 0, 600_000).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let e = resize_api(&m.socket, "nope", &uuid, GI, 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = resize_api(&m.socket, "grow", "GPU-elsewhere", GI, 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Below what is held: refused with the figure, nothing changed.
    let e = resize_api(&m.socket, "grow", &uuid, 2 * GI, 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("holds 4Gi"), "{}", e.message());
    let e = resize_cli(&m.socket, &["grow", "--memory", "3Gi"]).unwrap_err();
    assert!(e.contains("holds 4Gi (4294967296 bytes)"), "{e}");
    assert_eq!(total(&w.cmd("meminfo", T)), 4 * GI);
    let grow = status_of(&m.socket, "grow");
    assert_eq!(grow.devices[0].memory_limit_bytes, 4 * GI);
    assert_eq!(grow.devices[0].compute_share_ppm, 300_000);

    // Freed first, the limit can come down to what is held.
    let h = big.u64("h");
    assert!(w.cmd(&format!("free {h}"), T).ok);
    let down = resize_api(&m.socket, "grow", &uuid, GI, 500_000).unwrap();
    assert_eq!(down.devices[0].memory_limit_bytes, GI);
    assert_eq!(down.devices[0].compute_share_ppm, 500_000);
    assert_eq!(total(&w.cmd("meminfo", T)), GI);
    let one = w.cmd("alloc 1", T);
    assert_eq!(one.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    // The record on disk follows (a restarted manager keeps the new size).
    m.stop();
    let m = ManagerProc::on(&n);
    let grow = status_of(&m.socket, "grow");
    assert_eq!(grow.devices[0].memory_limit_bytes, GI);
    assert_eq!(grow.devices[0].compute_share_ppm, 500_000);
    w.kill();
    m.stop();
}

#[test]
fn a_share_moves_in_and_out_of_arbitration() {
    let n = node();
    let m = ManagerProc::on(&n);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "whole", &uuid, GI, 1_000_000);
    let control = tessera_shm::Control::open(std::path::Path::new(&a.control_path)).unwrap();
    let open = || tessera_shm::layout::grant::may_submit(control.grant_word(0));
    assert!(open(), "a whole GPU's gate is open");
    // Down to 40 %: arbitrated; with no process asking, the gate is shut.
    resize_api(&m.socket, "whole", &uuid, 0, 400_000).unwrap();
    assert_eq!(control.compute_share_ppm(0), 400_000);
    assert!(
        eventually(DEADLINE, || !open()).is_some(),
        "the gate stayed open after the share went down to 40%"
    );
    // Back to the whole GPU: out of arbitration, the gate open at once.
    resize_api(&m.socket, "whole", &uuid, 0, 1_000_000).unwrap();
    assert!(open(), "the gate is not open after going back to 100%");

    // A priority, through the CLI, alone: in the control file (the
    // arbiter's), the status and the metrics; limits unchanged.
    resize_cli(&m.socket, &["whole", "--priority", "-7"]).unwrap();
    assert_eq!(control.priority(), -7);
    let st = node_status(&m.socket);
    let al = st.allocations[0].allocation.as_ref().unwrap();
    assert_eq!(al.priority, -7);
    assert_eq!(al.devices[0].memory_limit_bytes, GI);
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(
        e.get("tessera_allocation_priority", &[("allocation", "whole")]),
        Some(-7.0)
    );
    let bad = pb::ResizeAllocationRequest {
        id: "whole".into(),
        devices: vec![],
        priority: Some(5000),
    };
    let e = with_client(&m.socket, async |c| c.resize_allocation(bad).await).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(control.priority(), -7);
    m.stop();
}
