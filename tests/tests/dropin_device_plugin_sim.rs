//! The drop-in pods (five or more per project, `dropin_support`) through the webhook's
//! translation and the real device plugin, on a simulated node with the real manager:
//! the device-plugin route of docs/dropin.md, down to the processes.
//!
//! The plugin runs in-process between a fake kubelet (registration, device list,
//! GetPreferredAllocation, Allocate, PodResources) and the manager in a child process
//! over the simulated driver. For each pod: the translation's slices are allocated as
//! the kubelet would; the kubelet's PodResources then names the pod as their owner and
//! the pod's annotations (from the translation) are what the API would show, so the
//! plugin's next pass gives the allocation the pod's policy and priority, and lowers it
//! to the pod's exact limits where its ask is below its slices (never raises it to a
//! tenant's edit of them: `RAISED`). A process
//! started with the Allocate answer's env (and the `LD_PRELOAD` the webhook injects)
//! sees exactly the pod's memory in `cuMemGetInfo` and in NVML, gets all of it and is
//! refused the next byte. Then the pod goes, and so does its allocation.

// The manager role; this file defines its own `role` test.
mod dropin_support;
#[allow(unused_macros, unused_imports)]
mod manager_support;

use std::collections::BTreeMap;
use std::time::Duration;

use dropin_support::*;
use manager_support::*;
use serde_json::Value;
use tessera_device_plugin::allocate::host_env;
use tessera_device_plugin::passes::Pass;
use tessera_device_plugin::testing::{FakeKubelet, FakePodResources, FakePods};
use tessera_device_plugin::{Options, run_with_pods};
use tessera_e2e::kubelet::{allocate, preferred};
use tessera_e2e::{Mode, ProbeChild};
use tessera_proto::manager::v1 as mgr;

const T: Duration = Duration::from_secs(15);
const RESOURCE: &str = "tessera.dev/vgpu";

#[test]
#[ignore = "helper: the manager process the other tests start"]
fn role() {
    role_main();
}

/// `f` on a thread of its own: the manager helpers run a runtime of their own.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("helper thread"))
}

fn allocations(socket: &std::path::Path) -> Vec<mgr::Allocation> {
    off_runtime(|| node_status(socket))
        .allocations
        .into_iter()
        .filter_map(|a| a.allocation)
        .collect()
}

/// The pod's annotations as the API server would show them after admission.
fn annotations(translated: &Value) -> Vec<(String, String)> {
    translated["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_dialects_pods_get_exactly_their_ask_through_the_device_plugin_on_a_simulated_node() {
    let n = sim_node(0xd0d9);
    let m = ManagerProc::on(&n);
    let dir = n.dir.path();
    let dp_dir = dir.join("dp");
    std::fs::create_dir_all(&dp_dir).expect("mkdir");
    let mut kubelet = FakeKubelet::start(&dp_dir).expect("kubelet");
    let pod_resources =
        FakePodResources::start(&dir.join("pod-resources.sock")).expect("pod resources");
    let api_pods = FakePods::default();
    std::fs::write(dir.join("config.yaml"), CONFIG).expect("config");
    let mut opts = Options::new("node-1");
    opts.device_plugin_dir = dp_dir;
    opts.manager_socket = m.socket.clone();
    opts.pod_resources_socket = Some(dir.join("pod-resources.sock"));
    opts.config_path = Some(dir.join("config.yaml"));
    opts.pod_resources_interval = Duration::from_millis(50);
    // A pod gone from PodResources loses its allocation at the next pass.
    opts.orphan_grace = Duration::ZERO;
    opts.host.hook_library = hook();
    opts.host.preload_file = dir.join("ld.so.preload");
    let passes = opts.passes.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(run_with_pods(opts, Some(api_pods.clone()), async {
        let _ = stopped.await;
    }));
    let every: Vec<String> = match kubelet.wait_devices(T, |d| d.len() == 8).await {
        Some(d) => d.into_iter().map(|d| d.id).collect(),
        None => panic!("8 slices: {:?}", kubelet.devices()),
    };
    let mut c = kubelet.plugin("tessera.sock").await.expect("dial plugin");

    let cases = pods();
    for (original, want) in &cases {
        let name = original["metadata"]["name"].as_str().expect("a name");
        let translated = tessera_webhook::admission::mutate_pod(original)
            .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        let (container, slices) = slices_of(&translated);

        let chosen = preferred(&mut c, every.clone(), slices).await;
        // The kubelet lists the pod as the slices' owner (set before Allocate: with no
        // orphan grace, a pass between the two would take the allocation for an orphan);
        // the API has the translated pod's annotations.
        let notes = annotations(&as_stored(&translated));
        let notes: Vec<(&str, &str)> = notes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        api_pods.set("team", name, &notes);
        pod_resources.set_pods(&[("team", name, &container, RESOURCE, chosen.clone())]);
        let answer = allocate(&mut c, chosen.clone()).await;

        let policy = if want.guaranteed {
            mgr::ComputePolicy::Guaranteed
        } else {
            // The node's own policy (the built-in default): the pod asked for none.
            mgr::ComputePolicy::Burst
        };
        let mut owned = None;
        for _ in 0..20 {
            passes
                .next_complete(Pass::PodResources, T)
                .await
                .expect("a PodResources pass");
            let all = allocations(&m.socket);
            assert_eq!(all.len(), 1, "{name}: one allocation: {all:?}");
            // The exact limits too: the kubelet's Allocate names slices, not the pod,
            // so a pod's ask below its slices is applied once the pass knows the owner.
            if all[0].pod == name
                && all[0].priority == want.priority
                && all[0].policy() == policy
                && all[0].devices[0].memory_limit_bytes == want.memory
                && all[0].devices[0].compute_share_ppm == want.compute_ppm
            {
                owned = Some(all.into_iter().next().expect("one"));
                break;
            }
        }
        let a = owned.unwrap_or_else(|| {
            panic!(
                "{name}: the pod's owner, policy {policy:?}, priority {} and limits ({} bytes, {} ppm) never reached its allocation: {:?}",
                want.priority,
                want.memory,
                want.compute_ppm,
                allocations(&m.socket)
            )
        });
        assert_eq!(a.devices.len(), 1, "{name}: one GPU");
        assert_eq!(a.devices[0].memory_limit_bytes, want.memory, "{name}");
        assert_eq!(a.devices[0].compute_share_ppm, want.compute_ppm, "{name}");

        // A process of the pod: the Allocate answer's env, and the webhook's LD_PRELOAD.
        let env: BTreeMap<String, String> = host_env(&answer);
        let mut cmd = n.probe(Mode::Dlopen, &[]);
        cmd.envs(&env).env("LD_PRELOAD", hook());
        let mut p = ProbeChild::start(cmd);
        assert_pod_holds_exactly(&n, &mut p, want.memory, name);
        p.finish();

        // The pod ends: its allocation goes at a following pass.
        pod_resources.set_pods(&[]);
        let mut gone = false;
        for _ in 0..20 {
            passes
                .next_complete(Pass::PodResources, T)
                .await
                .expect("a PodResources pass");
            if allocations(&m.socket).is_empty() {
                gone = true;
                break;
            }
        }
        assert!(gone, "{name}: its allocation outlived the pod");
    }
    assert_eq!(cases.len(), 23);
    let _ = stop.send(());
    tokio::time::timeout(T, plugin)
        .await
        .expect("plugin stops")
        .expect("join")
        .expect("plugin ran cleanly");
}
