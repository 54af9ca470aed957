//! Pods in HAMi's, KAI-Scheduler's and Volcano's words (five or more per project, in the
//! shapes of each project's documented examples, written here afresh) through the
//! webhook's translation and then Tessera's DRA driver, on a simulated node with the
//! real manager: the DRA route of docs/dropin.md.
//!
//! On a DRA node a translated pod's `tessera.dev/vgpu: N` is served through the
//! DeviceClass's `extendedResourceName`: kube-scheduler writes a ResourceClaim of N
//! devices of the class for the pod, allocates it, and reserves it for the pod. This
//! test writes that claim as the scheduler would (N slices of one GPU, reserved for the
//! pod, no config of its own) into a fake API server beside the translated pod, and
//! drives the real DRA plugin as the kubelet does. Each claim becomes one allocation
//! whose memory and compute share are the pod's ask (exactly, where the ask is less
//! than whole slices: `tessera.dev/dropin-limits`), with the policy and priority the
//! translation wrote on the pod; a process started with the claim's CDI edits sees
//! exactly that memory in `cuMemGetInfo` and in NVML, gets all of it, and is refused
//! the next byte.

// The manager and the client roles; this file defines its own `role` test.
mod dra_support;
mod dropin_support;
#[allow(unused_macros, unused_imports)]
mod manager_support;

use std::time::Duration;

use dra_support::{NODE, Plugin, plugin_args, probe_with_claim};
use dropin_support::*;
use manager_support::*;
use serde_json::{Value, json};
use tessera_dra_plugin::DRIVER_NAME;
use tessera_dra_plugin::names::slice_device;
use tessera_dra_plugin::testing::{FakeApiServer, register};
use tessera_proto::dra::v1 as dra;
use tessera_proto::manager::v1 as mgr;

const T: Duration = Duration::from_secs(15);

dra_role_test!();

/// The claim kube-scheduler writes for a pod's extended resource served by DRA: one
/// request of `slices` devices of the class, allocated here on one GPU (the test's
/// choice of devices: the plugin must serve whichever it is given), reserved for the
/// pod, with no config of its own.
fn scheduler_claim(name: &str, uid: &str, gpu: &str, slices: u32, pod: (&str, &str)) -> Value {
    let results: Vec<Value> = (0..slices)
        .map(|i| json!({"request": "container-0-request-0", "driver": DRIVER_NAME, "pool": NODE, "device": slice_device(gpu, i)}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team", "uid": uid,
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount", "count": slices}}]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod.0, "uid": pod.1}],
        },
    })
}

/// `f` on a thread of its own: the manager helpers run a runtime of their own.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("helper thread"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_dialects_pods_get_exactly_their_ask_through_the_dra_driver() {
    let n = sim_node(0xd40d);
    let m = ManagerProc::on(&n);
    let gpu = off_runtime(|| node_status(&m.socket)).gpus[0].uuid.clone();
    let api = FakeApiServer::start().await.expect("API server");
    let dir = n.dir.path();
    api.write_kubeconfig(&dir.join("kubeconfig"))
        .expect("kubeconfig");
    std::fs::write(dir.join("config.yaml"), CONFIG).expect("config");
    let plugin = Plugin::start(&plugin_args(dir, &m.socket), &dir.join("plugin.log"));
    let (_, mut kubelet) = match register(&dir.join("registry"), DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };

    let cases = pods();
    for (i, (original, want)) in cases.iter().enumerate() {
        let name = original["metadata"]["name"].as_str().expect("a name");
        let translated = tessera_webhook::admission::mutate_pod(original)
            .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        let (_, slices) = slices_of(&translated);
        // The pod as the API server holds it after admission, with its uid.
        let pod_uid = format!("{i:08x}-0000-4000-8000-00000000beef");
        let mut stored = as_stored(&translated);
        stored["metadata"]["uid"] = json!(pod_uid);
        api.put(&format!("/api/v1/namespaces/team/pods/{name}"), stored);
        let uid = format!("{i:08x}-0000-4000-8000-00000000c1a1");
        let claim_name = format!("{name}-extended-resources-abcde");
        api.put_claim(scheduler_claim(
            &claim_name,
            &uid,
            &gpu,
            slices,
            (name, &pod_uid),
        ));
        let claim = dra::Claim {
            namespace: "team".into(),
            uid: uid.clone(),
            name: claim_name,
        };

        let r = kubelet
            .node_prepare_resources(dra::NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            })
            .await
            .expect("NodePrepareResources")
            .into_inner();
        let prepared = &r.claims[&uid];
        assert_eq!(prepared.error, "", "{name}: {}", plugin.log());
        assert_eq!(prepared.devices.len(), slices as usize, "{name}");

        // The allocation is the ask, with the translation's policy and priority.
        let st = off_runtime(|| node_status(&m.socket));
        let a = st
            .allocations
            .iter()
            .find(|a| {
                a.allocation
                    .as_ref()
                    .is_some_and(|a| a.id == format!("dra-{uid}"))
            })
            .unwrap_or_else(|| panic!("{name}: no allocation in {st:?}"));
        let alloc = a.allocation.as_ref().expect("allocation");
        assert_eq!(alloc.devices.len(), 1, "{name}: one GPU");
        assert_eq!(alloc.devices[0].memory_limit_bytes, want.memory, "{name}");
        assert_eq!(
            alloc.devices[0].compute_share_ppm, want.compute_ppm,
            "{name}"
        );
        let policy = if want.guaranteed {
            mgr::ComputePolicy::Guaranteed
        } else {
            // The node's own policy (the built-in default).
            mgr::ComputePolicy::Burst
        };
        assert_eq!(alloc.policy(), policy, "{name}");
        assert_eq!(alloc.priority, want.priority, "{name}");

        // A process of the pod sees its memory, both ways, gets all of it and no more.
        let mut p = probe_with_claim(&n, &dir.join("cdi"), &prepared.devices[0].cdi_device_ids[0]);
        assert_pod_holds_exactly(&n, &mut p, want.memory, name);
        p.finish();

        let gone = kubelet
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                claims: vec![claim],
            })
            .await
            .expect("NodeUnprepareResources")
            .into_inner();
        assert_eq!(gone.claims[&uid].error, "", "{name}");
    }
    assert_eq!(cases.len(), 23);
}
