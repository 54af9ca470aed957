//! A translated pod's exact limits (`tessera.dev/dropin-limits`) laid at Allocate, so
//! that its process never starts above its ask: the real device plugin reads the pods
//! bound to its node from a fake API server speaking the real JSON (through kube), the
//! fake kubelet's Allocate goes over real gRPC, and the real manager makes the
//! allocation. Asserted on the allocation as Allocate made it, before any PodResources
//! pass: a lone pending pod's exact limits are in it; two pending pods of the same size
//! with different asks (the kubelet names devices, not pods) leave it at its slices,
//! for the pass to lower; a tenant's raise is no raise. A share of the card's memory
//! (`tessera.dev/dropin-memory-percent`, HAMi's `gpumem-percentage: 30`) is that share of
//! the GPU the slices are on: 24 GiB of an 80 GiB GPU; a KAI fraction's `0.3` is that
//! share of its compute too, 300,000 ppm, where its two slices give 500,000.

mod device_plugin_support;

use device_plugin_support::*;
use serde_json::{Value, json};
use tessera_dra_plugin::testing::FakeApiServer;
use tessera_proto::deviceplugin::v1beta1 as dp;

/// Four slices of each 80 GiB GPU: 20 GiB and 25 % each.
const CONFIG: &str = "default:\n  slice: {slicesPerGpu: 4}\n  deviceListStrategy: envvar\n";
const EXACT: &str = "tessera.dev/dropin-limits";
const SHARE: &str = "tessera.dev/dropin-memory-percent";

/// A translated pod bound to node-1 and still pending, its container `main` asking for
/// one slice, with exact limits `exact` (the webhook's JSON) if any.
fn pod(name: &str, exact: Option<&str>) -> Value {
    let mut annotations = json!({"tessera.dev/dropin-original": "{}"});
    if let Some(e) = exact {
        annotations[EXACT] = json!(e);
    }
    bound_pod(
        name,
        annotations,
        json!({"limits": {"tessera.dev/vgpu": "1"}}),
        json!({"phase": "Pending"}),
    )
}

/// A translated pod bound to node-1 and pending, `main` asking for `slices` slices, with
/// a share of the card's memory `share` (the webhook's JSON).
fn share_pod(name: &str, slices: u32, share: &str) -> Value {
    bound_pod(
        name,
        json!({"tessera.dev/dropin-original": "{}", SHARE: share}),
        json!({"limits": {"tessera.dev/vgpu": slices.to_string()}}),
        json!({"phase": "Pending"}),
    )
}

async fn allocate(node: &Node, id: &str) -> dp::ContainerAllocateResponse {
    allocate_all(node, &[id]).await
}

async fn allocate_all(node: &Node, ids: &[&str]) -> dp::ContainerAllocateResponse {
    let mut r = node
        .client()
        .await
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|&i| i.to_owned()).collect(),
            }],
        })
        .await
        .expect("allocate")
        .into_inner();
    r.container_responses.remove(0)
}

/// The allocation the manager holds for device `id`: (memory bytes, compute ppm).
fn limits_of(node: &Node, id: &str) -> (u64, u32) {
    limits_of_all(node, &[id])
}

/// The allocation the manager holds for devices `ids` (sorted): (memory bytes, ppm).
fn limits_of_all(node: &Node, ids: &[&str]) -> (u64, u32) {
    let all = node.allocations();
    let a = all
        .iter()
        .find(|a| a.device_ids == ids)
        .unwrap_or_else(|| panic!("no allocation of {ids:?}: {all:?}"));
    (
        a.devices[0].memory_limit_bytes,
        a.devices[0].compute_share_ppm,
    )
}

#[tokio::test]
async fn exact_limits_are_laid_at_allocate_when_the_pod_is_certain() {
    let api = FakeApiServer::start().await.expect("API server");
    let mut node = Node::start_on_api(
        &api,
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0), ("GPU-b", 80 * GI, 0, 0)]),
        CONFIG,
    )
    .await;
    node.wait_devices("8 healthy slices", |d| d.len() == 8 && healthy(d) == 8)
        .await;

    // One pending pod of one slice: its 3000 MiB and 10 % from the start.
    api.put(
        &pod_path("lone"),
        pod(
            "lone",
            Some(r#"{"main":{"slices":1,"memoryMiB":3000,"computePercent":10}}"#),
        ),
    );
    allocate(&node, "GPU-a::0").await;
    assert_eq!(limits_of(&node, "GPU-a::0"), (3000 << 20, 100_000));

    // Two pending pods of one slice asking differently: Allocate cannot tell which this
    // is, so neither's words are laid (the PodResources pass lowers it for its owner).
    api.remove(&pod_path("lone"));
    api.put(
        &pod_path("first"),
        pod("first", Some(r#"{"main":{"slices":1,"memoryMiB":3000}}"#)),
    );
    api.put(&pod_path("second"), pod("second", None));
    allocate(&node, "GPU-a::1").await;
    assert_eq!(limits_of(&node, "GPU-a::1"), (20 * GI, 250_000));

    // A tenant who wrote the whole card into its exact limits gets its slice.
    api.remove(&pod_path("first"));
    api.remove(&pod_path("second"));
    api.put(
        &pod_path("greedy"),
        pod(
            "greedy",
            Some(r#"{"main":{"slices":1,"memoryMiB":81920,"computePercent":100}}"#),
        ),
    );
    allocate(&node, "GPU-a::2").await;
    assert_eq!(limits_of(&node, "GPU-a::2"), (20 * GI, 250_000));

    // HAMi's `gpumem-percentage: 30`: two slices (50 %), limited to 30 % of the 80 GiB
    // GPU they are on, 24 GiB, from the start; the compute is the slices'.
    api.remove(&pod_path("greedy"));
    api.put(
        &pod_path("share"),
        share_pod("share", 2, r#"{"main":{"slices":2,"percent":30}}"#),
    );
    allocate_all(&node, &["GPU-b::0", "GPU-b::1"]).await;
    assert_eq!(
        limits_of_all(&node, &["GPU-b::0", "GPU-b::1"]),
        (24 * GI, 500_000)
    );

    // KAI's `gpu-fraction: 0.3`: two slices, limited to 30 % of the GPU's memory and
    // 30 % of its compute, from the start.
    api.remove(&pod_path("share"));
    api.put(
        &pod_path("fraction"),
        share_pod(
            "fraction",
            2,
            r#"{"main":{"slices":2,"percent":30,"computePercent":30}}"#,
        ),
    );
    allocate_all(&node, &["GPU-b::2", "GPU-b::3"]).await;
    assert_eq!(
        limits_of_all(&node, &["GPU-b::2", "GPU-b::3"]),
        (24 * GI, 300_000)
    );

    // A tenant who wrote the whole card as its share, memory and compute, gets its slice.
    api.remove(&pod_path("fraction"));
    api.put(
        &pod_path("greedy-share"),
        share_pod(
            "greedy-share",
            1,
            r#"{"main":{"slices":1,"percent":100,"computePercent":100}}"#,
        ),
    );
    allocate(&node, "GPU-a::3").await;
    assert_eq!(limits_of(&node, "GPU-a::3"), (20 * GI, 250_000));
    node.stop().await;
}
