//! AMD GPUs through the device plugin as the kubelet drives it: a mixed node's AMD GPU
//! is advertised as slices beside the NVIDIA one, and a pod written for HAMi on AMD
//! (`amd.com/gpumem`, `amd.com/gpucores`), translated by the webhook, gets exactly the
//! memory and compute it asked for on the AMD GPU.

mod device_plugin_support;

use std::sync::Arc;

use device_plugin_support::*;
use serde_json::json;
use tessera_e2e::kubelet::{allocate, preferred};
use tessera_manager::gpu::fake::{FakeGpu, test_amd_gpu, test_gpu};

const CONFIG: &str = "default:\n  slice: {memory: 4Gi, slicesPerGpu: 8}\n  placement: binpack\n";

#[tokio::test]
async fn a_pod_asking_amd_gpumem_gets_that_limit_on_the_amd_gpu() {
    let p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": "12288", "amd.com/gpucores": "25"
        }}}]}
    });
    let out = tessera_webhook::admission::mutate_pod(&p).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        out["metadata"]["annotations"]["tessera.dev/gpu-vendor"], "amd",
        "{out:#}"
    );
    // Scheduled only where the device plugin labels AMD GPUs present.
    let terms = &out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"][0],
        json!({"key": "tessera.dev/gpu-vendor-amd", "operator": "Exists"}),
        "{out:#}"
    );
    let limits = &out["spec"]["containers"][0]["resources"]["limits"];
    assert!(limits["amd.com/gpumem"].is_null(), "{out:#}");
    // 12 GiB of 4 GiB slices: 3 (its 25% fits in 3 slices' 37.5%).
    assert_eq!(limits["tessera.dev/vgpu"], "3", "{out:#}");

    // A 32 GiB NVIDIA GPU and a 32 GiB AMD GPU: both advertised, 8 slices each.
    let nv = test_gpu(0, 32 * GI);
    let amd = test_amd_gpu(1, 32 * GI);
    let amd_uuid = amd.uuid.clone();
    let mut node = Node::start(Arc::new(FakeGpu::with_devices(vec![nv, amd])), CONFIG).await;
    let devices = node.wait_devices("16 slices", |d| d.len() == 16).await;
    let on_amd: Vec<String> = devices
        .iter()
        .map(|d| d.id.clone())
        .filter(|id| id.starts_with(&format!("{amd_uuid}::")))
        .collect();
    assert_eq!(on_amd.len(), 8, "{devices:?}");

    // The kubelet asks for the pod's 3 slices among the AMD GPU's (the scheduler
    // extender's assignment narrows it so on a mixed node) and allocates them.
    let mut c = node.client().await;
    let chosen = preferred(&mut c, on_amd, 3).await;
    allocate(&mut c, chosen).await;
    let allocs = node.allocations();
    assert_eq!(allocs.len(), 1);
    let d = &allocs[0].devices;
    assert_eq!(d.len(), 1, "one GPU");
    assert_eq!(d[0].gpu_uuid, amd_uuid);
    assert_eq!(d[0].memory_limit_bytes, 12 * GI, "the pod's amd.com/gpumem");
    assert_eq!(d[0].compute_share_ppm, 375_000);
    node.stop().await;
}
