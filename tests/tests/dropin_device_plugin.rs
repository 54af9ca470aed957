//! Pods in HAMi's, KAI-Scheduler's and Volcano's words through the webhook's
//! translation and then the device plugin, as the kubelet drives it: each becomes one
//! manager allocation on one GPU whose memory limit and compute share are what the pod
//! asked for (asks that are whole slices here: a 32 GiB GPU cut into 8 slices of 4 GiB
//! and 12.5%).

mod device_plugin_support;

use device_plugin_support::*;
use serde_json::{Value, json};
use tessera_e2e::kubelet::{allocate, preferred};

const CONFIG: &str = "default:\n  slice: {memory: 4Gi, slicesPerGpu: 8}\n  placement: binpack\n";

fn pod(limits: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}
    })
}

/// The slices the webhook (default config: 4 GiB slices, 8 per GPU) gives the pod.
fn translated_slices(p: &Value) -> u32 {
    let out = tessera_webhook::admission::mutate_pod(p).unwrap_or_else(|e| panic!("{e}"));
    let n = out["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/vgpu"]
        .as_str()
        .unwrap_or_else(|| panic!("no slices: {out:#}"));
    n.parse().expect("a count")
}

#[tokio::test]
async fn each_dialect_gets_exactly_its_memory_and_compute_through_the_device_plugin() {
    // (pod, memory it asked for, compute share it gets in ppm)
    let cases = [
        // HAMi: 8 GiB, 25% of the cores.
        (
            pod(
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "25"}),
                json!({}),
            ),
            8 * GI,
            250_000,
        ),
        // HAMi: half the card's memory.
        (
            pod(json!({"nvidia.com/gpumem-percentage": "50"}), json!({})),
            16 * GI,
            500_000,
        ),
        // KAI: a quarter of a GPU.
        (
            pod(json!({}), json!({"gpu-fraction": "0.25"})),
            8 * GI,
            250_000,
        ),
        // KAI: 12 GiB.
        (
            pod(json!({}), json!({"gpu-memory": "12288"})),
            12 * GI,
            375_000,
        ),
        // Volcano: one slice, 4 GiB.
        (
            pod(
                json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4096"}),
                json!({}),
            ),
            4 * GI,
            125_000,
        ),
        // Volcano: the whole card.
        (
            pod(json!({"volcano.sh/vgpu-number": "1"}), json!({})),
            32 * GI,
            1_000_000,
        ),
    ];
    for (p, memory, compute_ppm) in cases {
        let slices = translated_slices(&p);
        let mut node = Node::start(fake_gpus(&[("GPU-a", 32 * GI, 0, 0)]), CONFIG).await;
        node.wait_devices("8 slices", |d| d.len() == 8).await;
        let mut c = node.client().await;
        let every: Vec<String> = (0..8).map(|i| format!("GPU-a::{i}")).collect();
        let chosen = preferred(&mut c, every, slices).await;
        allocate(&mut c, chosen).await;
        let allocs = node.allocations();
        assert_eq!(allocs.len(), 1, "{p}");
        let d = &allocs[0].devices;
        assert_eq!(d.len(), 1, "one GPU: {p}");
        assert_eq!(d[0].slices, slices, "{p}");
        assert_eq!(d[0].memory_limit_bytes, memory, "{p}");
        assert_eq!(d[0].compute_share_ppm, compute_ppm, "{p}");
        node.stop().await;
    }
}
