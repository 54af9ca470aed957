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
//!
//! A pod of two containers with exact asks gets one claim for both, with a request per
//! container, and the pod's `status.extendedResourceClaimStatus` maps each container to
//! its request, as kube-scheduler writes them: the driver makes an allocation per
//! request, and each container's process sees exactly its own ask.
//!
//! A KAI pod is never seen by kube-scheduler: KAI-Scheduler (v0.17+) allocates its claim
//! and so picks the GPU. Its claim, as KAI's binder writes it, on the second GPU of a
//! two-GPU node, is prepared on that GPU and no other.

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

/// The claim kube-scheduler writes for a pod's extended resource served by DRA, and
/// the pod's `status.extendedResourceClaimStatus` that goes with it: one request per
/// container that asks (`container-<i>-request-0`, `i` its index among the pod's
/// containers) of its `slices` devices of the class, allocated here on one GPU, one
/// container after the other (the test's choice of devices: the plugin must serve
/// whichever it is given), reserved for the pod, with no config of its own; the status
/// names the claim and maps each container to its request.
fn scheduler_claim(
    name: &str,
    uid: &str,
    gpu: &str,
    containers: &[(usize, &str, u32)],
    pod: (&str, &str),
) -> (Value, Value) {
    let request = |index: usize| format!("container-{index}-request-0");
    let mut next = 0;
    let mut results = Vec::new();
    for &(index, _, slices) in containers {
        for _ in 0..slices {
            results.push(json!({"request": request(index), "driver": DRIVER_NAME, "pool": NODE, "device": slice_device(gpu, next)}));
            next += 1;
        }
    }
    let requests: Vec<Value> = containers
        .iter()
        .map(|&(index, _, slices)| {
            json!({"name": request(index), "exactly": {
            "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount", "count": slices}})
        })
        .collect();
    let mappings: Vec<Value> = containers
        .iter()
        .map(|&(index, container, _)| {
            json!({"containerName": container,
            "resourceName": "tessera.dev/vgpu", "requestName": request(index)})
        })
        .collect();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team", "uid": uid,
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod.0, "uid": pod.1}],
        },
    });
    let status = json!({"resourceClaimName": name, "requestMappings": mappings});
    (claim, status)
}

/// Each container of a translated pod that has slices: (its index, its name, its slices).
fn containers_with_slices(translated: &Value) -> Vec<(usize, String, u32)> {
    translated["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let n = c["resources"]["limits"]["tessera.dev/vgpu"].as_str()?;
            Some((
                i,
                c["name"].as_str().expect("a name").to_owned(),
                n.parse().expect("a count"),
            ))
        })
        .collect()
}

/// The manager, the fake API server and the real DRA plugin on a simulated node, the
/// plugin registered with a fake kubelet.
struct Rig {
    n: tessera_e2e::SimNode,
    m: ManagerProc,
    gpu: String,
    api: FakeApiServer,
    plugin: Plugin,
    kubelet: tessera_proto::dra::v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
}

async fn rig(seed: u64) -> Rig {
    rig_on(sim_node(seed)).await
}

/// [`rig`] on the simulated node `n`.
async fn rig_on(n: tessera_e2e::SimNode) -> Rig {
    let m = ManagerProc::on(&n);
    let gpu = off_runtime(|| node_status(&m.socket)).gpus[0].uuid.clone();
    let api = FakeApiServer::start().await.expect("API server");
    let dir = n.dir.path();
    api.write_kubeconfig(&dir.join("kubeconfig"))
        .expect("kubeconfig");
    std::fs::write(dir.join("config.yaml"), CONFIG).expect("config");
    let plugin = Plugin::start(&plugin_args(dir, &m.socket), &dir.join("plugin.log"));
    let (_, kubelet) = match register(&dir.join("registry"), DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };
    Rig {
        n,
        m,
        gpu,
        api,
        plugin,
        kubelet,
    }
}

/// A translated pod as kube-scheduler leaves it: its name and uid, and the claim it
/// writes for the pod's extended resources (`claim_name`, `uid`) over the containers
/// `with` (`containers_with_slices`).
struct Scheduled<'a> {
    name: &'a str,
    pod_uid: &'a str,
    uid: &'a str,
    claim_name: String,
    with: &'a [(usize, &'a str, u32)],
}

/// Stores the pod and its claim as the API server holds them after admission and
/// scheduling (the pod's uid, and its status mapping each container to the claim's
/// request), has the kubelet prepare the claim, and returns the claim and the plugin's
/// answer for it, checked to be no error.
async fn prepare_scheduled(
    api: &FakeApiServer,
    kubelet: &mut tessera_proto::dra::v1::dra_plugin_client::DraPluginClient<
        tonic::transport::Channel,
    >,
    plugin: &Plugin,
    gpu: &str,
    translated: &Value,
    s: Scheduled<'_>,
) -> (dra::Claim, dra::NodePrepareResourceResponse) {
    let (claim_json, status) =
        scheduler_claim(&s.claim_name, s.uid, gpu, s.with, (s.name, s.pod_uid));
    let (claim, prepared) = prepare_stored(
        api,
        kubelet,
        translated,
        (s.name, s.pod_uid),
        claim_json,
        status,
    )
    .await;
    assert_eq!(prepared.error, "", "{}: {}", s.name, plugin.log());
    (claim, prepared)
}

/// Stores the translated pod (`pod`: its name and uid, with `status` as its
/// `status.extendedResourceClaimStatus`) and the claim `claim_json` as the API server
/// holds them after scheduling, has the kubelet prepare the claim, and returns the claim
/// and the plugin's answer for it, error or not.
async fn prepare_stored(
    api: &FakeApiServer,
    kubelet: &mut tessera_proto::dra::v1::dra_plugin_client::DraPluginClient<
        tonic::transport::Channel,
    >,
    translated: &Value,
    pod: (&str, &str),
    claim_json: Value,
    status: Value,
) -> (dra::Claim, dra::NodePrepareResourceResponse) {
    let mut stored = as_stored(translated);
    stored["metadata"]["uid"] = json!(pod.1);
    stored["status"] = json!({"extendedResourceClaimStatus": status});
    api.put(&format!("/api/v1/namespaces/team/pods/{}", pod.0), stored);
    let claim = dra::Claim {
        namespace: "team".into(),
        uid: claim_json["metadata"]["uid"]
            .as_str()
            .expect("a uid")
            .to_owned(),
        name: claim_json["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_owned(),
    };
    api.put_claim(claim_json);
    let mut r = kubelet
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let prepared = r
        .claims
        .remove(&claim.uid)
        .expect("an answer for the claim");
    (claim, prepared)
}

/// Has the kubelet unprepare `claim`, checked to be no error.
async fn unprepare(
    kubelet: &mut tessera_proto::dra::v1::dra_plugin_client::DraPluginClient<
        tonic::transport::Channel,
    >,
    claim: dra::Claim,
    name: &str,
) {
    let uid = claim.uid.clone();
    let gone = kubelet
        .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    assert_eq!(gone.claims[&uid].error, "", "{name}");
}

/// The manager's allocation `id`, if it has one.
fn allocation(m: &ManagerProc, id: &str) -> Option<mgr::Allocation> {
    off_runtime(|| node_status(&m.socket))
        .allocations
        .into_iter()
        .filter_map(|a| a.allocation)
        .find(|a| a.id == id)
}

/// `f` on a thread of its own: the manager helpers run a runtime of their own.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("helper thread"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_dialects_pods_get_exactly_their_ask_through_the_dra_driver() {
    let Rig {
        n,
        m,
        gpu,
        api,
        plugin,
        mut kubelet,
    } = rig(0xd40d).await;
    let dir = n.dir.path();

    let cases = pods();
    for (i, (original, want)) in cases.iter().enumerate() {
        let name = original["metadata"]["name"].as_str().expect("a name");
        let translated = tessera_webhook::admission::mutate_pod(original)
            .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        let (_, slices) = slices_of(&translated);
        let with = containers_with_slices(&translated);
        let with: Vec<(usize, &str, u32)> =
            with.iter().map(|(i, c, n)| (*i, c.as_str(), *n)).collect();
        // The pod as the API server holds it after admission and scheduling, with its
        // uid and the scheduler's mapping of its container to the claim's request.
        let pod_uid = format!("{i:08x}-0000-4000-8000-00000000beef");
        let uid = format!("{i:08x}-0000-4000-8000-00000000c1a1");
        let claim_name = format!("{name}-extended-resources-abcde");
        let scheduled = Scheduled {
            name,
            pod_uid: &pod_uid,
            uid: &uid,
            claim_name,
            with: &with,
        };
        let (claim, prepared) =
            prepare_scheduled(&api, &mut kubelet, &plugin, &gpu, &translated, scheduled).await;
        let prepared = &prepared;
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

        unprepare(&mut kubelet, claim, name).await;
    }
    assert_eq!(cases.len(), 23);
}

/// A HAMi pod of two containers, 3000 MiB and 5000 MiB (one 4 GiB slice and two), gets
/// one claim from kube-scheduler with a request per container: the driver makes an
/// allocation per request with that container's exact limit, and each container's
/// process, started with its own request's CDI device, sees exactly its own ask in
/// `cuMemGetInfo` and NVML, allocates all of it and is refused the next byte, both at
/// once on the one GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_containers_of_one_pod_each_get_exactly_their_own_ask_through_one_claim() {
    let Rig {
        n,
        m,
        gpu,
        api,
        plugin,
        mut kubelet,
    } = rig(0xd40e).await;
    let dir = n.dir.path();
    let name = "hami-two-containers";
    let original = pod(
        name,
        json!({}),
        &[
            (
                "trainer",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
            ),
            (
                "evaluator",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}),
            ),
        ],
        json!({}),
    );
    let translated = tessera_webhook::admission::mutate_pod(&original)
        .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
    let with = containers_with_slices(&translated);
    let with: Vec<(usize, &str, u32)> = with.iter().map(|(i, c, n)| (*i, c.as_str(), *n)).collect();
    assert_eq!(
        with,
        [(0, "trainer", 1), (1, "evaluator", 2)],
        "{translated:#}"
    );

    let pod_uid = "00000001-0000-4000-8000-00000000beef";
    let uid = "00000001-0000-4000-8000-00000000c1a1";
    let claim_name = format!("{name}-extended-resources-fghij");
    let scheduled = Scheduled {
        name,
        pod_uid,
        uid,
        claim_name,
        with: &with,
    };
    let (claim, prepared) =
        prepare_scheduled(&api, &mut kubelet, &plugin, &gpu, &translated, scheduled).await;
    let prepared = &prepared;
    assert_eq!(prepared.devices.len(), 3);

    // An allocation per container's request, each its container's ask.
    let per_request = [
        ("container-0-request-0", 1, 3000 * MI),
        ("container-1-request-0", 2, 5000 * MI),
    ];
    let mut probes = Vec::new();
    for (k, (request, slices, memory)) in per_request.into_iter().enumerate() {
        let a = allocation(&m, &format!("dra-{uid}-{}", k + 1))
            .unwrap_or_else(|| panic!("{request}: no allocation"));
        assert_eq!(a.devices.len(), 1, "{request}: one GPU");
        assert_eq!(a.devices[0].slices, slices, "{request}");
        assert_eq!(a.devices[0].memory_limit_bytes, memory, "{request}");
        // The kubelet gives a container the CDI devices of its own request's devices.
        let ids: Vec<&String> = prepared
            .devices
            .iter()
            .filter(|d| d.request_names == [request])
            .flat_map(|d| &d.cdi_device_ids)
            .collect();
        assert_eq!(ids.len(), 1, "{request}: {ids:?}");
        probes.push((
            request,
            memory,
            probe_with_claim(&n, &dir.join("cdi"), ids[0]),
        ));
    }
    assert!(
        allocation(&m, &format!("dra-{uid}")).is_none(),
        "no allocation of the whole claim"
    );
    // Both at once: each holds all of its own ask while the other holds its.
    for (request, memory, p) in &mut probes {
        assert_pod_holds_exactly(&n, p, *memory, request);
    }
    for (_, _, p) in probes {
        p.finish();
    }

    unprepare(&mut kubelet, claim, name).await;
    assert!(
        off_runtime(|| node_status(&m.socket))
            .allocations
            .is_empty(),
        "every allocation of the claim is gone"
    );
    assert!(
        std::fs::read_dir(dir.join("cdi"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "its spec is gone"
    );
}

/// The claim KAI-Scheduler's binder writes for a pod that asks for an extended resource
/// a DeviceClass serves (KAI v0.17+, `pkg/binder/plugins/k8s-plugins/dynamicresources`):
/// `<pod>-extended-resources-<suffix>`, the extended-resource annotation, the pod as its
/// controlling owner, one request of `devices.len()` devices for the pod's first
/// container, allocated the devices KAI's scheduler chose (`devices`, this node's pool)
/// and reserved for the pod; and the pod's `status.extendedResourceClaimStatus` that the
/// binder writes with it.
fn kai_claim(uid: &str, devices: &[String], pod: (&str, &str), container: &str) -> (Value, Value) {
    let name = format!("{}-extended-resources-kq7zt", pod.0);
    let request = "container-0-request-0";
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": request, "driver": DRIVER_NAME, "pool": NODE, "device": d}))
        .collect();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name, "generateName": format!("{}-extended-resources-", pod.0),
            "namespace": "team", "uid": uid,
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.0, "uid": pod.1,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount",
            "count": devices.len()}}]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod.0, "uid": pod.1}],
        },
    });
    let status = json!({"resourceClaimName": name, "requestMappings": [
        {"containerName": container, "resourceName": "tessera.dev/vgpu", "requestName": request}]});
    (claim, status)
}

/// On a DRA node pool a KAI pod (`schedulerName: kai-scheduler`) is never seen by
/// kube-scheduler: KAI v0.17+ places it and allocates its claim itself, running the
/// structured allocator on the node's ResourceSlices, and its binder writes the claim.
/// So KAI picks the GPU, and Tessera must enforce on exactly that one.
///
/// A half-GPU pod in KAI's words, translated by the webhook (`kaiGpuChoice` off, the
/// default: its fraction comes off, so KAI's guard against fractions on DRA nodes does
/// not hold it back, and KAI still schedules it), on a node of two GPUs: KAI's claim
/// names four slices of the *second* GPU while the first is free. The driver prepares
/// that GPU: the allocation, the CDI spec and the process's memory are on it alone,
/// 16 GiB and 50 %. A claim KAI spread over both GPUs is prepared as the devices it
/// names, two slices on each (docs/dropin.md, "Through DRA": such a claim keeps its
/// slices' limits); one naming a slice the node does not publish, or a GPU it lacks, is
/// refused naming the device, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kai_pod_runs_on_the_gpu_kais_allocator_chose_through_the_dra_driver() {
    let two_gpus = tessera_e2e::SimNode::builder()
        .config(tessera_sim::NodeConfig {
            devices: 2,
            memory_per_device: 40 * GI,
            sms: 100,
            cc_major: 8,
            cc_minor: 6,
            name: "E2E Simulated GPU".into(),
            seed: 0xd40f,
            ..Default::default()
        })
        .build();
    let Rig {
        n,
        m,
        gpu: _,
        api,
        plugin,
        mut kubelet,
    } = rig_on(two_gpus).await;
    let dir = n.dir.path();
    let gpus = off_runtime(|| node_status(&m.socket)).gpus;
    let (first, second) = (gpus[0].uuid.clone(), gpus[1].uuid.clone());

    let name = "kai-half-on-dra";
    let original = pod(
        name,
        json!({"gpu-fraction": "0.5"}),
        &[("main", json!({}))],
        json!({"schedulerName": "kai-scheduler"}),
    );
    let translated = tessera_webhook::admission::mutate_pod(&original)
        .unwrap_or_else(|e| panic!("{name}: refused: {e}"));
    assert_eq!(translated["spec"]["schedulerName"], "kai-scheduler");
    assert!(
        translated["metadata"]["annotations"]
            .get(tessera_contract::dropin::KAI_GPU_FRACTION)
            .is_none(),
        "KAI must not see a fraction on a DRA node: {translated:#}"
    );
    assert_eq!(containers_with_slices(&translated), [(0, "main".into(), 4)]);

    // KAI's choice: slices 4 to 7 of the second GPU; the first GPU is all free.
    let pod_uid = "0000000a-0000-4000-8000-00000000beef";
    let uid = "0000000a-0000-4000-8000-00000000c1a1";
    let chosen: Vec<String> = (4..8).map(|s| slice_device(&second, s)).collect();
    let (claim_json, status) = kai_claim(uid, &chosen, (name, pod_uid), "main");
    let (claim, prepared) = prepare_stored(
        &api,
        &mut kubelet,
        &translated,
        (name, pod_uid),
        claim_json,
        status,
    )
    .await;
    assert_eq!(prepared.error, "", "{name}: {}", plugin.log());
    let named: Vec<&str> = prepared
        .devices
        .iter()
        .map(|d| d.device_name.as_str())
        .collect();
    assert_eq!(named, chosen, "{name}: exactly KAI's devices");
    assert!(prepared.devices.iter().all(|d| d.pool_name == NODE));

    let a = allocation(&m, &format!("dra-{uid}")).expect("the claim's allocation");
    assert_eq!(a.devices.len(), 1, "{name}: one GPU: {a:?}");
    let d = &a.devices[0];
    assert_eq!(d.gpu_uuid, second, "{name}: on the GPU KAI chose");
    assert_eq!(
        (d.slices, d.memory_limit_bytes, d.compute_share_ppm),
        (4, 16 * GI, 500_000),
        "{name}"
    );
    // The container's CDI edits name that GPU, never the other.
    let cdi_id = &prepared.devices[0].cdi_device_ids[0];
    let spec = std::fs::read_to_string(tessera_dra_plugin::cdi::spec_path(&dir.join("cdi"), uid))
        .expect("the claim's CDI spec");
    assert!(
        spec.contains(second.as_str()) && !spec.contains(first.as_str()),
        "{name}: {spec}"
    );
    // Its process holds its 16 GiB on the second GPU, nothing on the first.
    let mut p = probe_with_claim(&n, &dir.join("cdi"), cdi_id);
    assert_pod_holds_exactly_on(&n, &mut p, 16 * GI, 1, name);
    p.finish();
    unprepare(&mut kubelet, claim, name).await;

    // KAI's allocator (no constraint in the claim, as kube-scheduler's) spread the
    // slices over both GPUs: the driver prepares what the claim names, two on each.
    let uid = "0000000b-0000-4000-8000-00000000c1a1";
    let spread = vec![
        slice_device(&first, 0),
        slice_device(&first, 1),
        slice_device(&second, 0),
        slice_device(&second, 1),
    ];
    let (claim_json, status) = kai_claim(uid, &spread, (name, pod_uid), "main");
    let (claim, prepared) = prepare_stored(
        &api,
        &mut kubelet,
        &translated,
        (name, pod_uid),
        claim_json,
        status,
    )
    .await;
    assert_eq!(prepared.error, "", "{name}: {}", plugin.log());
    let a = allocation(&m, &format!("dra-{uid}")).expect("the spread claim's allocation");
    let on: Vec<(&str, u32, u64)> = a
        .devices
        .iter()
        .map(|d| (d.gpu_uuid.as_str(), d.slices, d.memory_limit_bytes))
        .collect();
    assert_eq!(
        on,
        [(first.as_str(), 2, 8 * GI), (second.as_str(), 2, 8 * GI)],
        "{name}: spread"
    );
    unprepare(&mut kubelet, claim, name).await;

    // Devices the node does not publish: a slice past the GPU's eight, a GPU it lacks.
    let absent = [
        slice_device(&second, 8),
        slice_device("GPU-0000ffff-0000-4000-8000-00000000ffff", 0),
    ];
    for (i, device) in absent.iter().enumerate() {
        let uid = format!("{:08x}-0000-4000-8000-00000000c1a1", 0xc + i);
        let mut devices: Vec<String> = (0..3).map(|s| slice_device(&second, s)).collect();
        devices.push(device.clone());
        let (claim_json, status) = kai_claim(&uid, &devices, (name, pod_uid), "main");
        let (_, refused) = prepare_stored(
            &api,
            &mut kubelet,
            &translated,
            (name, pod_uid),
            claim_json,
            status,
        )
        .await;
        assert!(
            refused.error.contains("not a device of this node")
                && refused.error.contains(device.as_str()),
            "{device}: {:?}",
            refused.error
        );
        assert!(refused.devices.is_empty(), "{device}");
        assert!(
            allocation(&m, &format!("dra-{uid}")).is_none(),
            "{device}: no allocation"
        );
    }
    assert!(
        off_runtime(|| node_status(&m.socket))
            .allocations
            .is_empty(),
        "nothing left"
    );
    assert!(
        std::fs::read_dir(dir.join("cdi"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "no spec left"
    );
}
