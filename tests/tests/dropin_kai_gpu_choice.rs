//! KAI-Scheduler's own GPU choice honoured (docs/dropin.md, "Who picks the GPU"): a pod
//! in KAI's words goes through the webhook's translation with `kaiGpuChoice` on (KAI's
//! words stay on it), KAI's binder is played by the test (its reservation pod and the
//! group label, written into a fake API server speaking the real JSON), and the real
//! device plugin, run with `--kai-reservations` against a fake kubelet over real gRPC
//! and the real manager, serves it:
//!
//! - the reservation pod gets its `nvidia.com/gpu` device: exactly its one GPU named,
//!   nothing of Tessera's (no allocation, no shim), while a tenant's pod asking for
//!   `nvidia.com/gpu` outside KAI's namespace is refused; the GPU preferred for it is
//!   the one whose slices Tessera's allocations hold fewest of;
//! - the KAI pod whose group's reservation holds GPU-b gets slices of GPU-b, not of
//!   GPU-a (preferred, then allocated), with its fraction's limits;
//! - a request on another GPU is refused with a message naming the reservation, and a
//!   pod whose group has no reservation is refused, never served elsewhere.

mod device_plugin_support;

use device_plugin_support::*;
use serde_json::{Value, json};
use tessera_dra_plugin::testing::FakeApiServer;
use tessera_proto::deviceplugin::v1beta1 as dp;

/// The webhook's default slice: 4 GiB and 12.5 % each, 8 to a 32 GiB GPU.
const CONFIG: &str =
    "default:\n  slice: {memory: 4Gi, slicesPerGpu: 8}\n  deviceListStrategy: envvar\n";
const KAI_NS: &str = "kai-resource-reservation";

fn pod_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods/{name}")
}

/// A pod in KAI's words as its docs show one (a fraction, KAI's scheduler), with the
/// env KAI's admission adds, through the webhook with KAI picking the GPU.
fn translated(name: &str, words: Value) -> Value {
    let from = |key: &str| json!({"configMapKeyRef": {"name": format!("{name}-runai-sh-gpu-0"), "key": key}});
    let mut annotations = words;
    annotations["runai/shared-gpu-configmap"] = json!(format!("{name}-runai-sh-gpu"));
    let original = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "annotations": annotations,
                     "labels": {"runai/queue": "test"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{
            "name": "main", "image": "ghcr.io/example/train:1",
            "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": from("NVIDIA_VISIBLE_DEVICES")},
                {"name": "GPU_PORTION", "valueFrom": from("GPU_PORTION")}
            ]
        }]}
    });
    let config = tessera_webhook::dropin::Config {
        kai_gpu_choice: true,
        ..Default::default()
    };
    let (pod, _) = tessera_webhook::admission::mutate_pod_with(&original, &config)
        .unwrap_or_else(|e| panic!("{name}: refused: {e:?}"));
    pod
}

/// The translated pod as the API holds it once KAI's binder labelled it with its GPU
/// group and bound it to node-1, still pending.
fn bound(mut pod: Value, group: &str) -> Value {
    let name = pod["metadata"]["name"].as_str().expect("name").to_owned();
    pod["metadata"]["labels"]["runai-gpu-group"] = json!(group);
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["resourceVersion"] = json!("7");
    pod["metadata"]["creationTimestamp"] = json!("2026-12-02T03:00:00Z");
    pod["spec"]["nodeName"] = json!("node-1");
    pod["status"] = json!({"phase": "Pending"});
    pod
}

/// A pod asking for one `nvidia.com/gpu` in `ns`: KAI's reservation pod of `group`
/// (which writes the UUID it sees into its annotation once running), or a tenant's.
fn gpu_pod(ns: &str, name: &str, group: &str, phase: &str, reserved: Option<&str>) -> Value {
    let mut annotations = json!({});
    if let Some(uuid) = reserved {
        annotations["run.ai/reserve_for_gpu_index"] = json!(uuid);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                     "resourceVersion": "3", "creationTimestamp": "2026-12-02T02:00:00Z",
                     "labels": {"runai-gpu-group": group}, "annotations": annotations},
        "spec": {"nodeName": "node-1", "containers": [{
            "name": "resource-reservation", "image": "kai/resource-reservation:v1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": phase}
    })
}

fn slices(gpu: &str) -> Vec<String> {
    (0..8).map(|i| format!("{gpu}::{i}")).collect()
}

async fn allocate(
    c: &mut tessera_e2e::kubelet::PluginClient,
    ids: &[String],
) -> Result<dp::ContainerAllocateResponse, tonic::Status> {
    c.allocate(dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    })
    .await
    .map(|r| r.into_inner().container_responses.remove(0))
}

#[tokio::test]
async fn kai_pods_get_slices_of_the_gpu_their_group_reserved() {
    let api = FakeApiServer::start().await.expect("API server");
    api.put(
        "/api/v1/nodes/node-1",
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-1", "resourceVersion": "1", "labels": {}}}),
    );
    let url = format!("http://{}", api.addr);
    let gpus = fake_gpus(&[("GPU-a", 32 * GI, 0, 0), ("GPU-b", 32 * GI, 0, 0)]);
    let mut node = Node::start_with(gpus, CONFIG, |o| {
        o.use_kube = true;
        o.kube_url = Some(url);
        o.kai_reservations = true;
    })
    .await;
    node.wait_devices("16 healthy slices", |d| d.len() == 16 && healthy(d) == 16)
        .await;

    // The reservation resource: nvidia.com/gpu, one device per GPU, its UUID.
    let regs = node
        .kubelet
        .wait_registrations(2, WAIT)
        .await
        .expect("two resources registered");
    let kai_reg = regs
        .iter()
        .find(|r| r.resource_name == "nvidia.com/gpu")
        .expect("nvidia.com/gpu registered");
    assert_eq!(kai_reg.endpoint, "tessera-kai.sock");
    let mut kai = node
        .kubelet
        .plugin("tessera-kai.sock")
        .await
        .expect("dial the reservation plugin");
    let mut lists = kai
        .list_and_watch(dp::Empty {})
        .await
        .expect("list and watch")
        .into_inner();
    let devices = tokio::time::timeout(WAIT, async {
        while let Some(msg) = lists.message().await.expect("list") {
            let d = msg.devices;
            if d.len() == 2 {
                return d;
            }
        }
        panic!("the reservation list ended");
    })
    .await
    .expect("two GPUs listed");
    assert_eq!(ids(&devices), ["GPU-a", "GPU-b"]);
    assert_eq!(healthy(&devices), 2);

    // A tenant's pod asking for nvidia.com/gpu outside KAI's namespace: the kubelet
    // cannot say which pod a request is for, so none is served while it is pending.
    api.put(
        &pod_path("team", "sneaky"),
        gpu_pod("team", "sneaky", "g1", "Pending", None),
    );
    api.put(
        &pod_path(KAI_NS, "gpu-reservation-g1"),
        gpu_pod(KAI_NS, "gpu-reservation-g1", "g1", "Pending", None),
    );
    let e = allocate(&mut kai, &strings(&["GPU-b"]))
        .await
        .expect_err("refused beside a tenant's pod");
    assert!(e.message().contains("team/sneaky"), "{}", e.message());
    api.remove(&pod_path("team", "sneaky"));

    // A plain Tessera pod holds a slice of GPU-a: the reservation prefers GPU-b, where
    // KAI's fractions (which KAI counts without Tessera's other pods) more likely fit.
    api.put(
        &pod_path("team", "plain"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "plain", "namespace": "team", "uid": "uid-plain",
                            "resourceVersion": "2", "creationTimestamp": "2026-12-02T01:00:00Z"},
               "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "cuda:12",
                        "resources": {"limits": {"tessera.dev/vgpu": "1"}}}]},
               "status": {"phase": "Pending"}}),
    );
    let mut plugin = node.client().await;
    allocate(&mut plugin, &strings(&["GPU-a::7"]))
        .await
        .expect("a plain pod's slice");
    api.remove(&pod_path("team", "plain"));
    let held = node.allocations().len();
    let prefer = kai
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: strings(&["GPU-a", "GPU-b"]),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .expect("preferred")
        .into_inner();
    assert_eq!(prefer.container_responses[0].device_i_ds, ["GPU-b"]);

    // KAI's reservation pod gets its one GPU, named the node's way, and nothing of
    // Tessera's: no allocation to refuse its NVML query, no shim.
    let r = allocate(&mut kai, &strings(&["GPU-b"]))
        .await
        .expect("the reservation pod is served");
    assert_eq!(
        r.envs,
        [("NVIDIA_VISIBLE_DEVICES".to_owned(), "GPU-b".to_owned())].into()
    );
    assert!(r.mounts.is_empty() && r.devices.is_empty() && r.cdi_devices.is_empty());
    assert_eq!(node.allocations().len(), held, "no allocation for it");
    // It reads the UUID it sees and writes it on itself.
    api.put(
        &pod_path(KAI_NS, "gpu-reservation-g1"),
        gpu_pod(KAI_NS, "gpu-reservation-g1", "g1", "Running", Some("GPU-b")),
    );

    // A half-GPU KAI pod of group g1: KAI's words stay, its GPU env does not.
    let half = translated("half", json!({"gpu-fraction": "0.5"}));
    assert_eq!(half["metadata"]["annotations"]["gpu-fraction"], "0.5");
    let env = half["spec"]["containers"][0]["env"].to_string();
    assert!(
        !env.contains("\"NVIDIA_VISIBLE_DEVICES\"") && env.contains("GPU_PORTION"),
        "{env}"
    );
    assert_eq!(
        half["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/vgpu"],
        "4"
    );
    api.put(&pod_path("team", "half"), bound(half, "g1"));
    let mut available = slices("GPU-a");
    available.extend(slices("GPU-b"));
    let chosen = tessera_e2e::kubelet::preferred(&mut plugin, available, 4).await;
    assert_eq!(chosen, slices("GPU-b")[..4].to_vec(), "GPU-b, not GPU-a");
    allocate(&mut plugin, &chosen).await.expect("allocated");
    let all = node.allocations();
    let a = all
        .iter()
        .find(|a| a.device_ids == chosen)
        .unwrap_or_else(|| panic!("no allocation of {chosen:?}: {all:?}"));
    assert_eq!(a.devices.len(), 1);
    assert_eq!(a.devices[0].gpu_uuid, "GPU-b");
    assert_eq!(a.devices[0].memory_limit_bytes, 16 * GI);
    assert_eq!(a.devices[0].compute_share_ppm, 500_000);
    let stored = api.get(&pod_path("team", "half")).expect("pod");
    assert_eq!(
        stored["metadata"]["annotations"]["tessera.dev/gpu-allocated"], "main",
        "marked served"
    );

    // A 7000 MiB KAI pod of the same group: two slices; on GPU-a it is refused, naming
    // KAI's reservation, and nothing is made.
    let mem = translated("mem", json!({"gpu-memory": "7000"}));
    api.put(&pod_path("team", "mem"), bound(mem, "g1"));
    let before = node.allocations().len();
    let e = allocate(&mut plugin, &strings(&["GPU-a::0", "GPU-a::1"]))
        .await
        .expect_err("another GPU is refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains(
            "KAI-Scheduler reserved GPU-b×2 (GPU group g1, reservation pod gpu-reservation-g1)"
        ) && e.message().contains("GPU-a::0,GPU-a::1"),
        "{}",
        e.message()
    );
    assert_eq!(node.allocations().len(), before);
    // On GPU-b it is served, with exactly its words (the pod is known).
    let ids_b = strings(&["GPU-b::4", "GPU-b::5"]);
    allocate(&mut plugin, &ids_b)
        .await
        .expect("served on GPU-b");
    let all = node.allocations();
    let a = all
        .iter()
        .find(|a| a.device_ids == ids_b)
        .expect("allocation on GPU-b");
    assert_eq!(a.devices[0].memory_limit_bytes, 7000 << 20);

    // A pod whose group has no reservation on this node: refused, never placed.
    let lost = translated("lost", json!({"gpu-fraction": "0.125"}));
    api.put(&pod_path("team", "lost"), bound(lost, "g9"));
    let e = allocate(&mut plugin, &strings(&["GPU-a::0"]))
        .await
        .expect_err("no reservation");
    assert!(
        e.message().contains("GPU group \"g9\"") && e.message().contains("no reservation pod"),
        "{}",
        e.message()
    );
    // Its reservation in a tenant's namespace is no reservation.
    api.put(
        &pod_path("team", "fake-reservation"),
        gpu_pod("team", "fake-reservation", "g9", "Running", Some("GPU-a")),
    );
    let e = allocate(&mut plugin, &strings(&["GPU-a::0"]))
        .await
        .expect_err("a tenant's reservation is none");
    assert!(e.message().contains(KAI_NS), "{}", e.message());
    node.stop().await;
}
