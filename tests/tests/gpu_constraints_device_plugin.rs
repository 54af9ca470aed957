//! A pod's own GPU constraint held at the device plugin, without the scheduler
//! extender: HAMi's model and UUID lists as the webhook translates them
//! (`tessera.dev/gpu-models`, `tessera.dev/gpu-uuids-exclude`) and Tessera's vendor
//! annotation. The pods are the real webhook's output, served by a fake API server
//! speaking the real JSON; the real device plugin reads them (through kube) at
//! GetPreferredAllocation and Allocate over real gRPC, and the real manager makes the
//! allocation. On a node of an A100, an L4 and an AMD MI210, each pod is offered and
//! given only slices its constraint lets through, and an Allocate of slices that break
//! it is refused, naming the annotation.

mod device_plugin_support;

use std::sync::Arc;

use device_plugin_support::*;
use serde_json::{Value, json};
use tessera_dra_plugin::testing::FakeApiServer;
use tessera_manager::gpu::GpuInfo;
use tessera_manager::gpu::fake::{FakeGpu, test_amd_gpu};
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_webhook::dropin::{Config, SliceShape};

/// Four 20 GiB slices of each 80 GiB GPU.
const CONFIG: &str =
    "default:\n  slice: {slicesPerGpu: 4}\n  deviceListStrategy: envvar\n  placement: binpack\n";
const A100: &str = "GPU-a100";
const L4: &str = "GPU-l4";

fn nvidia(i: u32, uuid: &str, name: &str) -> GpuInfo {
    GpuInfo {
        index: i,
        uuid: uuid.into(),
        vendor: tessera_contract::Vendor::Nvidia,
        name: name.into(),
        memory_total_bytes: 80 * GI,
        sm_count: 108,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
        numa_node: 0,
        compute_capability: (8, 0),
    }
}

/// The webhook as the cluster runs it: 20 GiB slices, 4 per GPU, and the models its
/// nodes have.
fn webhook() -> Config {
    Config {
        slice: SliceShape {
            memory_mib: 20480,
            per_gpu: 4,
        },
        gpu_models: vec![
            "NVIDIA A100-SXM4-80GB".into(),
            "NVIDIA L4".into(),
            "AMD Instinct MI210".into(),
        ],
        ..Config::default()
    }
}

/// A pod as written (`limits` on its one container, `annotations`), already bound to
/// node-1 and pending, as the API server holds it once scheduled.
fn written(name: &str, limits: Value, annotations: Value) -> Value {
    bound_pod(
        name,
        annotations,
        json!({"limits": limits}),
        json!({"phase": "Pending"}),
    )
}

/// The webhook's answer for `pod`: the pod as admitted.
fn admit(pod: &Value) -> Value {
    tessera_webhook::admission::mutate_pod_with(pod, &webhook())
        .map(|(p, _)| p)
        .unwrap_or_else(|e| panic!("refused: {e}"))
}

fn ids_of(gpu: &str) -> Vec<String> {
    (0..4).map(|s| format!("{gpu}::{s}")).collect()
}

fn gpu_of(id: &str) -> &str {
    id.rsplit_once("::").expect("device id").0
}

async fn start(api: &FakeApiServer, amd: &GpuInfo) -> Node {
    let gpus = FakeGpu::with_devices(vec![
        nvidia(0, A100, "NVIDIA A100-SXM4-80GB"),
        nvidia(1, L4, "NVIDIA L4"),
        amd.clone(),
    ]);
    let mut node = Node::start_on_api(api, Arc::new(gpus), CONFIG).await;
    node.wait_devices("12 healthy slices", |d| d.len() == 12 && healthy(d) == 12)
        .await;
    node
}

async fn prefer(node: &Node, available: Vec<String>, size: i32) -> Vec<String> {
    let mut r = node
        .client()
        .await
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
        .await
        .expect("preferred")
        .into_inner();
    r.container_responses.remove(0).device_i_ds
}

async fn allocate(node: &Node, ids: Vec<String>) -> Result<(), tonic::Status> {
    node.client()
        .await
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }],
        })
        .await
        .map(|_| ())
}

fn all_ids(amd: &str) -> Vec<String> {
    [A100, L4, amd].iter().flat_map(|g| ids_of(g)).collect()
}

#[tokio::test]
async fn hami_model_and_uuid_lists_and_the_vendor_hold_at_the_device_plugin() {
    let api = FakeApiServer::start().await.expect("API server");
    let amd = test_amd_gpu(2, 80 * GI);
    let amd_uuid = amd.uuid.clone();
    let node = start(&api, &amd).await;
    let all = all_ids(&amd_uuid);

    // Unconstrained, binpack on an empty node takes the first GPU: the A100. That is
    // the choice each constraint below must overrule.
    let free = admit(&written(
        "free",
        json!({"nvidia.com/gpumem": "20480"}),
        json!({}),
    ));
    api.put(&pod_path("free"), free);
    let chosen = prefer(&node, all.clone(), 1).await;
    assert_eq!(gpu_of(&chosen[0]), A100, "{chosen:?}");
    api.remove(&pod_path("free"));

    // HAMi's use-gputype: translated, with node affinity on the L4's label.
    let l4 = admit(&written(
        "l4",
        json!({"nvidia.com/gpumem": "20480"}),
        json!({"nvidia.com/use-gputype": "l4"}),
    ));
    let ann = &l4["metadata"]["annotations"];
    assert_eq!(ann["tessera.dev/gpu-models"], "l4", "{l4:#}");
    assert_eq!(
        l4["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "gpu-product.tessera.dev/NVIDIA-L4", "operator": "Exists"}
        ]}]),
        "{l4:#}"
    );
    assert_eq!(
        l4["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/vgpu"],
        "1"
    );
    api.put(&pod_path("l4"), l4);
    let chosen = prefer(&node, all.clone(), 1).await;
    assert_eq!(chosen.len(), 1);
    assert_eq!(gpu_of(&chosen[0]), L4, "{chosen:?}");
    // The kubelet sending the A100's slice instead: refused, naming the annotation.
    let e = allocate(&node, vec![format!("{A100}::0")])
        .await
        .expect_err("an A100 for an L4 pod");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("tessera.dev/gpu-models") && e.message().contains("team-a/l4"),
        "{}",
        e.message()
    );
    allocate(&node, chosen.clone())
        .await
        .expect("the L4's slice");
    let allocs = node.allocations();
    assert_eq!(allocs.len(), 1, "the refused one made none: {allocs:?}");
    assert_eq!(allocs[0].devices[0].gpu_uuid, L4);
    api.remove(&pod_path("l4"));

    // HAMi's nouse-gpuuuid: the A100 is out; with only it and the L4 left, the L4.
    let no_a = admit(&written(
        "no-a100",
        json!({"nvidia.com/gpumem": "40960"}),
        json!({"nvidia.com/nouse-gpuuuid": A100}),
    ));
    assert_eq!(
        no_a["metadata"]["annotations"]["tessera.dev/gpu-uuids-exclude"],
        A100
    );
    api.put(&pod_path("no-a100"), no_a);
    let nv: Vec<String> = ids_of(A100).into_iter().chain(ids_of(L4)).collect();
    let chosen = prefer(&node, nv, 2).await;
    assert!(
        chosen.len() == 2 && chosen.iter().all(|id| gpu_of(id) == L4),
        "{chosen:?}"
    );
    let e = allocate(&node, vec![format!("{A100}::1"), format!("{A100}::2")])
        .await
        .expect_err("the excluded GPU");
    assert!(
        e.message().contains("tessera.dev/gpu-uuids-exclude"),
        "{}",
        e.message()
    );
    api.remove(&pod_path("no-a100"));

    // Tessera's vendor annotation on a mixed node, no extender: AMD slices only.
    let on_amd = admit(&written(
        "on-amd",
        json!({"tessera.dev/vgpu": "2"}),
        json!({"tessera.dev/gpu-vendor": "amd"}),
    ));
    api.put(&pod_path("on-amd"), on_amd);
    let chosen = prefer(&node, all.clone(), 2).await;
    assert!(
        chosen.len() == 2 && chosen.iter().all(|id| gpu_of(id) == amd_uuid),
        "{chosen:?}"
    );
    let e = allocate(&node, vec![format!("{A100}::1"), format!("{A100}::2")])
        .await
        .expect_err("NVIDIA slices for an AMD pod");
    assert!(
        e.message().contains("tessera.dev/gpu-vendor"),
        "{}",
        e.message()
    );
    allocate(&node, chosen).await.expect("the AMD slices");
    let allocs = node.allocations();
    assert!(
        allocs
            .iter()
            .any(|a| a.devices[0].gpu_uuid == amd_uuid && a.device_ids.len() == 2),
        "{allocs:?}"
    );
    node.stop().await;
}

#[test]
fn a_model_list_no_node_has_is_refused_at_admission_in_the_pods_words() {
    let e = tessera_webhook::admission::mutate_pod_with(
        &written(
            "h100",
            json!({"nvidia.com/gpumem": "20480"}),
            json!({"nvidia.com/use-gputype": "H100,B200"}),
        ),
        &webhook(),
    )
    .expect_err("no H100 or B200 in this cluster")
    .to_string();
    assert!(
        e.contains("nvidia.com/use-gputype") && e.contains("\"H100,B200\""),
        "{e}"
    );
}
