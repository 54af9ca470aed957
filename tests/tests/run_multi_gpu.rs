//! `tessera run` over several GPUs, end to end on a simulated node with two
//! devices: one allocation with a limit and a share per GPU, the command
//! sees the GPUs in `--gpu`'s order, each limit holds by ground truth (the
//! simulated driver's per-process memory), and the allocation goes when the
//! command ends.

mod manager_support;

use manager_support::*;
use tessera_e2e::SimNode;

const GI: u64 = 1 << 30;

role_test!();

fn node() -> SimNode {
    SimNode::e2e(2, 0x3a1)
}

fn ok_lines<'a>(text: &'a str, cmd: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.split_ascii_whitespace().nth(1) == Some(cmd))
        .collect()
}

#[test]
fn one_run_on_two_gpus_holds_each_limit_by_ground_truth() {
    let n = node();
    let m = ManagerProc::on(&n);
    let sock = m.socket.to_str().unwrap().to_owned();
    let st = node_status(&m.socket);
    let uuid = |i: usize| st.gpus[i].uuid.clone();
    let probe = probe_path().display().to_string();
    let half = (GI / 2).to_string();
    // GPU 1 first: the command's device 0 is the node's GPU 1 (2 GiB, 50 %),
    // its device 1 the node's GPU 0 (1 GiB, 30 %).
    let script = [
        "init",
        "count",
        "device 0",
        "uuid",
        "ctx",
        "meminfo",
        &format!("alloc {GI}"),
        &format!("alloc {GI}"),
        "alloc 1",
        "device 1",
        "uuid",
        "ctx",
        "meminfo",
        &format!("alloc {half}"),
        &format!("alloc {half}"),
        "alloc 1",
        "pid",
        "sleep 60000",
    ];
    let run_args = [
        "run",
        "--socket",
        &sock,
        "--gpu",
        "1,0",
        "--memory",
        "2Gi,1Gi",
        "--compute",
        "50%,30%",
        "--priority",
        "4",
        "--",
        &probe,
    ];
    let mut run = client_spawn(&n, &[&run_args[..], &script[..]].concat());
    let mut out = lines(&mut run);
    let mut text = String::new();
    let pid_line = loop {
        let l = read_until(&mut out, |_| true);
        text.push_str(&l);
        text.push('\n');
        if l.starts_with("ok pid") {
            break l;
        }
    };
    let pid: u32 = field(&pid_line, "pid").unwrap().parse().unwrap();

    // The command sees exactly the two GPUs, in --gpu's order.
    assert_eq!(
        field(ok_lines(&text, "count")[0], "n").as_deref(),
        Some("2"),
        "{text}"
    );
    let uuids: Vec<String> = ok_lines(&text, "uuid")
        .iter()
        .map(|l| field(l, "uuid").unwrap())
        .collect();
    assert_eq!(uuids, [uuid(1), uuid(0)], "{text}");
    // Each device shows its own limit as its total.
    let totals: Vec<u64> = ok_lines(&text, "meminfo")
        .iter()
        .map(|l| field(l, "total").unwrap().parse().unwrap())
        .collect();
    assert_eq!(totals, [2 * GI, GI], "{text}");
    // Up to each limit is granted, one byte past it is refused, on each GPU.
    let allocs: Vec<&str> = text.lines().filter(|l| l.contains(" alloc")).collect();
    assert_eq!(allocs.len(), 6, "{text}");
    for (i, l) in allocs.iter().enumerate() {
        if i % 3 == 2 {
            assert!(l.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
        } else {
            assert!(l.starts_with("ok alloc"), "{text}");
        }
    }
    // Ground truth: what the simulated driver holds for the process, by the
    // node's own device index.
    let truth = n.node().process(pid).expect("the probe on the node");
    assert_eq!(truth.memory[0], GI, "GPU 0 holds {:?}", truth.memory);
    assert_eq!(truth.memory[1], 2 * GI, "GPU 1 holds {:?}", truth.memory);

    // One allocation across both GPUs, each with its limit and share, and
    // the manager sees the same use.
    let st = node_status(&m.socket);
    assert_eq!(st.allocations.len(), 1);
    let a = &st.allocations[0];
    let alloc = a.allocation.as_ref().unwrap();
    let devs: Vec<(String, u64, u32)> = alloc
        .devices
        .iter()
        .map(|d| {
            (
                d.gpu_uuid.clone(),
                d.memory_limit_bytes,
                d.compute_share_ppm,
            )
        })
        .collect();
    assert_eq!(
        devs,
        [(uuid(1), 2 * GI, 500_000), (uuid(0), GI, 300_000)],
        "{alloc:?}"
    );
    assert_eq!(alloc.priority, 4, "tessera run --priority");
    let used_of = |u: &str| {
        a.devices
            .iter()
            .find(|d| d.gpu_uuid == u)
            .map(|d| d.memory_used_bytes)
    };
    assert_eq!(used_of(&uuid(1)), Some(2 * GI), "{a:?}");
    assert_eq!(used_of(&uuid(0)), Some(GI), "{a:?}");

    // The command ends (killed): the run's status is the command's (it is
    // the same process), the allocation goes and the capacity of both GPUs
    // is free again.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(run.wait().unwrap().signal(), Some(9));
    assert!(
        eventually(DEADLINE, || node_status(&m.socket).allocations.is_empty()).is_some(),
        "allocation left behind"
    );
    m.stop();
}

#[test]
fn several_gpus_are_checked_like_one() {
    let n = node();
    let m = ManagerProc::on(&n);
    let sock = m.socket.to_str().unwrap().to_owned();
    let run = |gpu: &str, mem: &str, compute: &str| {
        client(
            &n,
            &[
                "run",
                "--socket",
                &sock,
                "--gpu",
                gpu,
                "--memory",
                mem,
                "--compute",
                compute,
                "--",
                "true",
            ],
        )
    };
    // A list that does not pair with the GPUs, before the manager is asked.
    let o = run("0,1", "1Gi,2Gi,3Gi", "10%");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--memory has 3 values for 2 GPUs"),
        "{}",
        stderr(&o)
    );
    // The same GPU twice.
    let o = run("0,0", "1Gi", "10%");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("named twice"), "{}", stderr(&o));
    // Capacity per GPU: 17 GiB does not fit on GPU 1 even though GPU 0's
    // 1 GiB does; nothing is created.
    let o = run("0,1", "1Gi,17Gi", "10%");
    assert!(!o.status.success());
    assert!(node_status(&m.socket).allocations.is_empty());
    // One value for both GPUs, and the command's exit code comes back.
    let o = client(
        &n,
        &[
            "run", "--socket", &sock, "--gpu", "0,1", "--memory", "1Gi", "--", "sh", "-c", "exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    m.all_reaped();
    m.stop();
}
