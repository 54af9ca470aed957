//! The device plugin driven by a fake kubelet over real unix sockets:
//! registration (and again after a kubelet restart), the device list and
//! its updates, GetPreferredAllocation, and Allocate against the real
//! manager (in-process, over a scripted driver).

mod device_plugin_support;

use std::time::Duration;

use device_plugin_support::*;
use tessera_device_plugin::allocate::host_env;
use tessera_device_plugin::passes::Pass;
use tessera_manager::gpu::GpuEvent;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tonic::Code;

#[tokio::test]
async fn registers_and_registers_again_after_a_kubelet_restart() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 80 * GI, 1, 0)]),
        "default:\n  slice: {slicesPerGpu: 4}\n",
    )
    .await;
    let regs = node
        .kubelet
        .wait_registrations(1, WAIT)
        .await
        .expect("plugin registers");
    let r = &regs[0];
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.endpoint, "tessera.sock");
    assert_eq!(r.resource_name, "tessera.dev/vgpu");
    let opts = r.options.expect("options");
    assert!(opts.get_preferred_allocation_available);
    assert!(!opts.pre_start_required);
    node.wait_devices("8 slices after registration", |d| d.len() == 8)
        .await;

    // The kubelet restarts: every socket in its dir goes, a new kubelet.sock
    // comes. The plugin must serve again and register again.
    node.kubelet.restart().expect("restart");
    assert!(!node.path("dp/tessera.sock").exists());
    let regs = node
        .kubelet
        .wait_registrations(2, WAIT)
        .await
        .expect("plugin registers again after the kubelet restart");
    assert_eq!(regs[1].resource_name, "tessera.dev/vgpu");
    assert!(node.path("dp/tessera.sock").exists(), "serving again");
    let mut c = node.client().await;
    let o = c
        .get_device_plugin_options(dp::Empty {})
        .await
        .expect("new socket answers")
        .into_inner();
    assert!(o.get_preferred_allocation_available);
    let list = c
        .list_and_watch(dp::Empty {})
        .await
        .expect("list")
        .into_inner()
        .message()
        .await
        .expect("stream")
        .expect("a first list at once");
    assert_eq!(list.devices.len(), 8);

    // A second restart, to show it is not a one-off.
    node.kubelet.restart().expect("restart");
    node.kubelet
        .wait_registrations(3, WAIT)
        .await
        .expect("third registration");
    node.stop().await;
}

#[tokio::test]
async fn registers_once_a_late_kubelet_appears() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0)]),
        "default:\n  slice: {slicesPerGpu: 2}\n",
    )
    .await;
    node.kubelet
        .wait_registrations(1, WAIT)
        .await
        .expect("registered");
    // The kubelet goes away for a while (socket gone), then comes back.
    std::fs::remove_file(node.path("dp/kubelet.sock")).expect("rm");
    // The plugin has looked at the missing socket, twice: no registration
    // without a kubelet.
    node.pass(Pass::Kubelet).await;
    node.pass(Pass::Kubelet).await;
    assert_eq!(node.kubelet.registrations().len(), 1);
    node.kubelet.restart().expect("restart");
    node.kubelet
        .wait_registrations(2, WAIT)
        .await
        .expect("registered with the returning kubelet");
    node.stop().await;
}

#[tokio::test]
async fn device_list_follows_health_and_config_reloads() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 40 * GI, 1, 0)]),
        "default:\n  slice: {memory: 20Gi}\n",
    )
    .await;
    // Memory slices: 4 on the 80 GiB GPU, 2 on the 40 GiB one.
    let d = node.wait_devices("6 slices", |d| d.len() == 6).await;
    assert_eq!(
        ids(&d),
        strings(&[
            "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1"
        ])
    );
    assert_eq!(healthy(&d), 6);
    let numa = |dev: &dp::Device| dev.topology.as_ref().map(|t| t.nodes[0].id);
    assert_eq!(numa(&d[0]), Some(0));
    assert_eq!(numa(&d[5]), Some(1));

    // Health flip: GPU-b stops answering the manager; its slices turn
    // Unhealthy, then recover when it answers again.
    node.gpu.set_lost("GPU-b", true);
    let d = node
        .wait_devices("GPU-b unhealthy", |d| d.len() == 6 && healthy(d) == 4)
        .await;
    assert!(
        d.iter()
            .filter(|x| x.id.starts_with("GPU-b"))
            .all(|x| x.health == dp::UNHEALTHY)
    );
    node.gpu.set_lost("GPU-b", false);
    node.wait_devices("GPU-b healthy again", |d| healthy(d) == 6)
        .await;

    // Config reload: the count is the tightest of memory and slicesPerGpu.
    node.write_config("default:\n  slice: {memory: 20Gi, slicesPerGpu: 3}\n");
    let d = node.wait_devices("3 + 2 slices", |d| d.len() == 5).await;
    assert_eq!(ids(&d)[3], "GPU-b::0");

    // A bad file keeps the config in force: each is read by a whole reload
    // pass...
    let lists_before = node.kubelet.lists().len();
    for bad in [
        "default:\n  slice: {slicesPerGpu: 0}\n",
        "default:\n  slice: {memory: 4 gigs}\n",
        "",
    ] {
        node.write_config(bad);
        node.pass(Pass::Config).await;
    }
    // ...and the next good one is taken.
    node.write_config("default:\n  slice: {compute: 50%}\n");
    node.wait_devices("2 + 2 slices", |d| d.len() == 4).await;
    // The lists sent in between, in order: had a bad file been put in force
    // its list would come before the good one's.
    let between: Vec<usize> = node.kubelet.lists()[lists_before..]
        .iter()
        .map(Vec::len)
        .collect();
    assert!(
        between.iter().all(|&n| n == 5 || n == 4) && between.last() == Some(&4),
        "bad configs were put in force: device counts {between:?}"
    );
    node.stop().await;
}

#[tokio::test]
async fn devices_turn_unhealthy_while_the_manager_is_gone() {
    let mut node = Node::start_with(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0)]),
        "default:\n  slice: {slicesPerGpu: 2}\n",
        |o| o.manager_grace = Duration::from_millis(300),
    )
    .await;
    node.wait_devices("healthy", |d| d.len() == 2 && healthy(d) == 2)
        .await;
    node.stop_manager().await;
    node.wait_devices("unhealthy without a manager", |d| {
        d.len() == 2 && healthy(d) == 0
    })
    .await;
    let mut c = node.client().await;
    let e = c
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: strings(&["GPU-a::0"]),
            }],
        })
        .await
        .expect_err("no allocation without a manager");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("manager is unreachable"),
        "{}",
        e.message()
    );
    // A new manager on the same socket: the plugin picks it up again.
    node.start_manager().await;
    node.wait_devices("healthy again", |d| healthy(d) == 2)
        .await;
    node.stop().await;
}

async fn preferred(node: &Node, available: &[&str], must: &[&str], size: i32) -> Vec<String> {
    let mut c = node.client().await;
    let r = c
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: strings(available),
                must_include_device_i_ds: strings(must),
                allocation_size: size,
            }],
        })
        .await
        .expect("preferred allocation")
        .into_inner();
    r.container_responses[0].device_i_ds.clone()
}

fn all(gpu: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{gpu}::{i}")).collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn preferred_allocation_packs_binpacks_spreads_and_avoids_busy_gpus() {
    // A is nearly idle, B 90% busy (idle 0.1, under the 0.2 threshold), C half.
    // The node's policy is shared-threshold: binpack among the GPUs that
    // are not busy while one fits (the engine's rule; the others ignore
    // the threshold).
    let mut node = Node::start(
        fake_gpus(&[
            ("GPU-a", 80 * GI, 0, 10),
            ("GPU-b", 80 * GI, 0, 90),
            ("GPU-c", 80 * GI, 1, 50),
        ]),
        "default:\n  slice: {slicesPerGpu: 4}\n  placement: shared-threshold\n",
    )
    .await;
    node.wait_devices("12 slices", |d| d.len() == 12).await;
    let everything: Vec<String> = [all("GPU-a", 4), all("GPU-b", 4), all("GPU-c", 4)].concat();

    // Pack onto one GPU: 3 slices, all from one GPU (A: first non-busy).
    let r = preferred(&node, &refs(&everything), &[], 3).await;
    assert_eq!(r, strings(&["GPU-a::0", "GPU-a::1", "GPU-a::2"]));

    // Binpack: C has 3 free, A 4: C is the fullest fitting non-busy GPU.
    let avail = [
        "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::0", "GPU-b::1", "GPU-c::1",
        "GPU-c::2", "GPU-c::3",
    ];
    let r = preferred(&node, &avail, &[], 2).await;
    assert_eq!(r, strings(&["GPU-c::1", "GPU-c::2"]));

    // Shared threshold: B (2 free) would be the binpack choice but is busy.
    let avail_ab = [
        "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::2", "GPU-b::3",
    ];
    let r = preferred(&node, &avail_ab, &[], 2).await;
    assert_eq!(r, strings(&["GPU-a::0", "GPU-a::1"]));

    // A request no single GPU can hold: the fewest GPUs (B 3 + A 2).
    let r = preferred(
        &node,
        &[
            "GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1", "GPU-b::2", "GPU-c::0",
        ],
        &[],
        5,
    )
    .await;
    assert_eq!(
        r,
        strings(&["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1", "GPU-b::2"])
    );

    // must_include is honoured and its GPU filled first.
    let r = preferred(&node, &refs(&everything), &["GPU-c::3"], 2).await;
    assert_eq!(r, strings(&["GPU-c::3", "GPU-c::0"]));

    // Threshold 0: the busy GPU is fair game, binpack takes B.
    node.write_config(
        "default:\n  slice: {slicesPerGpu: 4}\n  placement: shared-threshold\n  sharedThreshold: 0\n",
    );
    node.pass(Pass::Config).await;
    let r = preferred(&node, &avail_ab, &[], 2).await;
    assert_eq!(r, strings(&["GPU-b::2", "GPU-b::3"]), "threshold 0 applied");

    // Spread: the least utilized GPU that fits.
    node.write_config("default:\n  slice: {slicesPerGpu: 4}\n  placement: spread\n");
    node.pass(Pass::Config).await;
    // Under binpack, C (3 free) wins here; under spread, A (10%).
    let r = preferred(&node, &avail, &[], 2).await;
    assert_eq!(r, strings(&["GPU-a::0", "GPU-a::1"]), "spread applied");
    // A has one slice left: C (50%) is next; B (90%) is busy anyway.
    let r = preferred(
        &node,
        &[
            "GPU-a::3", "GPU-b::0", "GPU-b::1", "GPU-b::2", "GPU-c::0", "GPU-c::1",
        ],
        &[],
        2,
    )
    .await;
    assert_eq!(r, strings(&["GPU-c::0", "GPU-c::1"]));

    let mut c = node.client().await;
    let e = c
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: strings(&["GPU-a::0"]),
                must_include_device_i_ds: vec![],
                allocation_size: -1,
            }],
        })
        .await
        .expect_err("negative size");
    assert_eq!(e.code(), Code::InvalidArgument);
    node.stop().await;
}

fn allocate_req(ids: &[&str]) -> dp::AllocateRequest {
    dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: strings(ids),
        }],
    }
}

#[tokio::test]
async fn allocate_creates_a_manager_allocation_and_returns_env_and_mounts() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 40 * GI, 1, 0)]),
        "default:\n  slice: {memory: 10Gi}\n  computePolicy: guaranteed\n  placement: binpack\n",
    )
    .await;
    node.wait_devices("8 + 4 slices", |d| d.len() == 12).await;
    let mut c = node.client().await;

    // What the kubelet does: ask for a preferred set, then allocate it.
    let every: Vec<String> = node
        .kubelet
        .devices()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let chosen = preferred(&node, &refs(&every), &[], 3).await;
    assert_eq!(
        chosen,
        strings(&["GPU-b::0", "GPU-b::1", "GPU-b::2"]),
        "binpack: the smaller GPU"
    );
    let resp = c
        .allocate(allocate_req(&refs(&chosen)))
        .await
        .expect("allocate")
        .into_inner();
    let r = &resp.container_responses[0];

    let allocs = node.allocations();
    assert_eq!(allocs.len(), 1);
    let a = &allocs[0];
    assert_eq!(a.devices.len(), 1);
    assert_eq!(a.devices[0].gpu_uuid, "GPU-b");
    assert_eq!(a.devices[0].slices, 3);
    assert_eq!(a.devices[0].memory_limit_bytes, 30 * GI, "3 slices x 10Gi");
    // GPU-b holds 4 slices of 10Gi: each is 25% of its time.
    assert_eq!(a.devices[0].compute_share_ppm, 750_000);
    assert_eq!(
        a.policy,
        tessera_proto::manager::v1::ComputePolicy::Guaranteed as i32
    );
    assert_eq!(a.device_ids, chosen);
    assert_eq!(
        a.labels.get("source").map(String::as_str),
        Some("device-plugin")
    );

    assert_eq!(r.envs["TESSERA_ALLOCATION"], a.id);
    assert_eq!(r.envs["TESSERA_CONTROL"], "/run/tessera/alloc/control");
    assert_eq!(r.envs["TESSERA_STATE"], "/run/tessera/alloc/state");
    // The default device-list strategy: volume mounts, as docs/install.md sets up
    // the NVIDIA container toolkit.
    assert_eq!(
        r.envs["NVIDIA_VISIBLE_DEVICES"],
        "/var/run/nvidia-container-devices"
    );
    assert!(r.cdi_devices.is_empty());
    assert!(
        !r.envs.contains_key("LD_PRELOAD"),
        "the webhook owns LD_PRELOAD"
    );
    let mount = |cp: &str| {
        r.mounts
            .iter()
            .find(|m| m.container_path == cp)
            .unwrap_or_else(|| panic!("no mount at {cp}: {:?}", r.mounts))
    };
    let control = mount("/run/tessera/alloc/control");
    assert_eq!(control.host_path, a.control_path);
    assert!(control.read_only);
    let state = mount("/run/tessera/alloc/state");
    assert_eq!(state.host_path, a.state_path);
    assert!(!state.read_only);
    let hook = mount("/usr/local/lib/tessera/libtessera.so");
    assert_eq!(
        hook.host_path,
        node.opts.host.hook_library.display().to_string()
    );
    assert!(hook.read_only);
    let gpu = mount("/var/run/nvidia-container-devices/GPU-b");
    assert_eq!(gpu.host_path, "/dev/null");
    assert!(
        r.mounts
            .iter()
            .all(|m| m.container_path != "/etc/ld.so.preload")
    );
    assert!(exists(&control.host_path) && exists(&state.host_path));
    // What a process outside a container would be given.
    let env = host_env(r);
    assert_eq!(env["TESSERA_CONTROL"], a.control_path);
    assert_eq!(env["TESSERA_STATE"], a.state_path);

    // A kubelet retry of the same Allocate is the same allocation.
    let again = c
        .allocate(allocate_req(&["GPU-b::2", "GPU-b::0", "GPU-b::1"]))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(
        again.container_responses[0].envs["TESSERA_ALLOCATION"],
        a.id
    );
    assert_eq!(node.allocations().len(), 1);

    // Across two GPUs: one allocation with a part of each.
    let resp = c
        .allocate(allocate_req(&["GPU-a::0", "GPU-a::1", "GPU-b::3"]))
        .await
        .expect("allocate")
        .into_inner();
    let gpus: Vec<&str> = resp.container_responses[0]
        .mounts
        .iter()
        .filter_map(|m| {
            m.container_path
                .strip_prefix("/var/run/nvidia-container-devices/")
        })
        .collect();
    assert_eq!(gpus, ["GPU-a", "GPU-b"]);
    let id = &resp.container_responses[0].envs["TESSERA_ALLOCATION"];
    let two = node
        .allocations()
        .into_iter()
        .find(|x| &x.id == id)
        .expect("allocation");
    assert_eq!(two.devices.len(), 2);
    assert_eq!(
        (
            two.devices[0].memory_limit_bytes,
            two.devices[0].compute_share_ppm
        ),
        (20 * GI, 250_000)
    );
    assert_eq!(
        (
            two.devices[1].memory_limit_bytes,
            two.devices[1].compute_share_ppm
        ),
        (10 * GI, 250_000)
    );

    // Bad IDs are clear errors and create nothing.
    let before = node.allocations();
    let e = c
        .allocate(allocate_req(&["GPU-zz::0"]))
        .await
        .expect_err("unknown GPU");
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("GPU-zz::0"), "{}", e.message());
    let e = c
        .allocate(allocate_req(&["GPU-b::4"]))
        .await
        .expect_err("no such slice");
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("only 4 slices"), "{}", e.message());
    let e = c
        .allocate(allocate_req(&["garbage"]))
        .await
        .expect_err("malformed");
    assert_eq!(e.code(), Code::InvalidArgument);
    node.gpu.push_event(GpuEvent::Xid {
        uuid: "GPU-a".into(),
        xid: 48,
    });
    node.wait_devices("GPU-a unhealthy", |d| healthy(d) == 4)
        .await;
    let e = c
        .allocate(allocate_req(&["GPU-a::5"]))
        .await
        .expect_err("unhealthy");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("XID 48"), "{}", e.message());
    assert_eq!(node.allocations(), before, "refusals create nothing");
    node.stop().await;
}

#[tokio::test]
async fn ld_so_preload_is_mounted_when_the_node_config_asks() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0)]),
        "default:\n  slice: {slicesPerGpu: 2}\n  ldSoPreload: true\n",
    )
    .await;
    node.wait_devices("2 slices", |d| d.len() == 2).await;
    let preload = node.opts.host.preload_file.clone();
    let resp = node
        .client()
        .await
        .allocate(allocate_req(&["GPU-a::1"]))
        .await
        .expect("allocate")
        .into_inner();
    let m = resp.container_responses[0]
        .mounts
        .iter()
        .find(|m| m.container_path == "/etc/ld.so.preload")
        .expect("preload mount")
        .clone();
    assert!(m.read_only);
    assert_eq!(m.host_path, preload.display().to_string());
    assert_eq!(
        std::fs::read_to_string(&preload).expect("preload file written"),
        "/usr/local/lib/tessera/libtessera.so\n"
    );
    assert!(!resp.container_responses[0].envs.contains_key("LD_PRELOAD"));
    node.stop().await;
}

/// Each device-list strategy's Allocate answer, over the plugin's real socket,
/// as the kubelet gets it; under `cdi` the plugin's CDI spec is on disk.
#[tokio::test]
async fn each_device_list_strategy_answers_allocate_as_the_toolkit_expects() {
    let gpus = || fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 80 * GI, 1, 0)]);
    let mut answers = Vec::new();
    for strategy in ["envvar", "volume-mounts", "cdi"] {
        let mut node = Node::start_with(
            gpus(),
            &format!("default:\n  slice: {{slicesPerGpu: 2}}\n  deviceListStrategy: {strategy}\n"),
            |o| o.cdi_spec_dir = Some(o.manager_socket.with_file_name("cdi")),
        )
        .await;
        node.wait_devices("2 + 2 slices", |d| d.len() == 4).await;
        let resp = node
            .client()
            .await
            .allocate(allocate_req(&["GPU-b::1", "GPU-a::0"]))
            .await
            .unwrap_or_else(|e| panic!("{strategy}: allocate: {e}"))
            .into_inner();
        let r = resp.container_responses[0].clone();
        let spec_file = node.path("cdi/tessera.dev-gpu.json");
        // The spec follows the GPU list: written soon after the devices appear.
        let deadline = std::time::Instant::now() + WAIT;
        while strategy == "cdi" && !spec_file.exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let spec = std::fs::read_to_string(&spec_file).ok();
        answers.push((strategy, r, spec, node.opts.host.hook_library.clone()));
        node.stop().await;
    }
    let mounts = |r: &dp::ContainerAllocateResponse| -> Vec<(String, String)> {
        let mut v: Vec<_> = r
            .mounts
            .iter()
            .map(|m| (m.container_path.clone(), m.host_path.clone()))
            .collect();
        v.sort();
        v
    };
    let under = |r: &dp::ContainerAllocateResponse, root: &str| -> Vec<String> {
        mounts(r)
            .into_iter()
            .filter(|(c, _)| c.starts_with(root))
            .map(|(c, h)| format!("{c} <- {h}"))
            .collect()
    };

    let (_, envvar, spec, _) = &answers[0];
    assert_eq!(envvar.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    assert!(under(envvar, "/var/run/nvidia-container-devices").is_empty());
    assert!(envvar.cdi_devices.is_empty());
    assert!(spec.is_none(), "no CDI spec unless the strategy asks");

    let (_, vm, spec, _) = &answers[1];
    assert_eq!(
        vm.envs["NVIDIA_VISIBLE_DEVICES"],
        "/var/run/nvidia-container-devices"
    );
    assert_eq!(
        under(vm, "/var/run/nvidia-container-devices"),
        [
            "/var/run/nvidia-container-devices/GPU-a <- /dev/null",
            "/var/run/nvidia-container-devices/GPU-b <- /dev/null"
        ]
    );
    assert!(vm.cdi_devices.is_empty());
    assert!(spec.is_none());

    let (_, cdi, spec, hook) = &answers[2];
    assert!(!cdi.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
    let names: Vec<&str> = cdi.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "nvidia.com/gpu=GPU-a",
            "nvidia.com/gpu=GPU-b",
            "tessera.dev/gpu=GPU-a",
            "tessera.dev/gpu=GPU-b"
        ]
    );
    // The allocation's own files are mounts; the hook comes with the CDI device.
    let paths: Vec<String> = mounts(cdi).into_iter().map(|(c, _)| c).collect();
    assert_eq!(
        paths,
        ["/run/tessera/alloc/control", "/run/tessera/alloc/state"]
    );
    let spec: serde_json::Value =
        serde_json::from_str(spec.as_deref().expect("the CDI spec is written")).expect("json");
    assert_eq!(spec["kind"], "tessera.dev/gpu");
    let devices: Vec<&str> = spec["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["name"].as_str().expect("name"))
        .collect();
    assert_eq!(devices, ["GPU-a", "GPU-b"]);
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"],
        hook.display().to_string()
    );
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"],
        "/usr/local/lib/tessera/libtessera.so"
    );
}

/// The node's one slice count reaches the manager: the plugin publishes what
/// it resolved from the node config, per GPU, beside the manager's socket.
#[tokio::test]
async fn slice_counts_are_published_for_the_manager_and_follow_the_config() {
    let mut node = Node::start(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 40 * GI, 1, 0)]),
        "default:\n  slice: {memory: 10Gi}\n",
    )
    .await;
    node.wait_devices("8 + 4 slices", |d| d.len() == 12).await;
    let file = node.path("slices.json");
    assert_eq!(
        file,
        tessera_device_plugin::slices_file::path_for(&node.opts.manager_socket)
    );
    let read = || -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(&file).ok()?).ok()
    };
    let want = |a: u32, b: u32| serde_json::json!({"gpus": {"GPU-a": a, "GPU-b": b}});
    let deadline = std::time::Instant::now() + WAIT;
    while read() != Some(want(8, 4)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(read(), Some(want(8, 4)));

    node.write_config("default:\n  slice: {slicesPerGpu: 2}\n");
    node.wait_devices("2 + 2 slices", |d| d.len() == 4).await;
    let deadline = std::time::Instant::now() + WAIT;
    while read() != Some(want(2, 2)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(read(), Some(want(2, 2)));
    node.stop().await;
}
