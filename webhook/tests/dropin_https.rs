//! Pods written for HAMi, KAI-Scheduler and Volcano's vGPU, in the shape of each
//! project's documented examples (written afresh here), admitted over real HTTPS: each
//! comes out asking for Tessera slices with the shim injected and its original words in
//! an annotation, or is refused with a message naming the field. A second pass changes
//! nothing.

mod common;

use serde_json::{Value, json};
use tessera_contract::dropin::{ANNOTATION_EXACT_MEMORY_PERCENT, ANNOTATION_ORIGINAL, Dialect};
use tessera_webhook::admission::HOOK_PATH;
use tessera_webhook::dropin::Config;

use common::{Outcome, Server, server_with};

fn container(name: &str, limits: Value) -> Value {
    json!({
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "resources": { "limits": limits },
    })
}

fn pod(containers: Vec<Value>, annotations: Value, scheduler: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "gpu-pod", "namespace": "ml", "annotations": annotations },
        "spec": {
            "containers": containers,
            "restartPolicy": "Never",
            "schedulerName": scheduler,
        },
    })
}

fn review_of(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f5d0a1e-0000-4000-8000-000000000001",
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "resource": { "group": "", "version": "v1", "resource": "pods" },
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": { "username": "alice" },
            "object": pod,
        }
    })
}

async fn admit_on(s: &Server, pod: &Value) -> Outcome {
    common::admit_on(s, pod, &review_of(pod)).await
}

/// Admits under the default config (every dialect); a second pass must change nothing.
async fn admitted(pod: &Value) -> (Value, Vec<String>) {
    common::admitted(Config::default(), review_of, pod).await
}

async fn denied(pod: &Value) -> String {
    common::denied(Config::default(), review_of, pod).await
}

/// The translated container: its limits hold only Tessera's slices (and what else it had),
/// the shim is first in LD_PRELOAD.
fn assert_slices(pod: &Value, index: usize, slices: &str) {
    let c = &pod["spec"]["containers"][index];
    let limits = c["resources"]["limits"].as_object().expect("limits");
    assert_eq!(limits["tessera.dev/vgpu"], slices, "{c:#}");
    for name in limits.keys() {
        assert!(
            !name.starts_with("nvidia.com/") && !name.starts_with("volcano.sh/"),
            "{name} left on {c:#}"
        );
    }
    assert_eq!(
        c["env"][0],
        json!({"name": "LD_PRELOAD", "value": HOOK_PATH}),
        "{c:#}"
    );
}

fn original(pod: &Value) -> Value {
    let text = pod["metadata"]["annotations"][ANNOTATION_ORIGINAL]
        .as_str()
        .unwrap_or_else(|| panic!("no {ANNOTATION_ORIGINAL}: {pod:#}"));
    serde_json::from_str(text).expect("json")
}

// ---------------------------------------------------------------- HAMi

#[tokio::test(start_paused = true)]
async fn hami_examples_become_slices() {
    // (limits, slices, rounded)
    let table = [
        // HAMi's README shape: one vGPU, 3000 MiB, 30% of the cores.
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
            "3",
            true,
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}),
            "2",
            false,
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
            "4",
            false,
        ),
        // Only gpucores: HAMi's default memory is the whole card.
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}),
            "8",
            false,
        ),
        // Two whole cards.
        (
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"}),
            "16",
            false,
        ),
    ];
    for (limits, slices, rounded) in table {
        let p = pod(
            vec![container("cuda", limits.clone())],
            json!({}),
            "hami-scheduler",
        );
        let (out, warnings) = admitted(&p).await;
        assert_slices(&out, 0, slices);
        // HAMi's gpucores is a cap: Tessera's guaranteed policy, carried to the shim.
        let capped = limits.get("nvidia.com/gpucores").is_some();
        let env = &out["spec"]["containers"][0]["env"];
        assert_eq!(
            env.as_array()
                .expect("env")
                .contains(&json!({"name": "TESSERA_COMPUTE_POLICY", "value": "guaranteed"})),
            capped,
            "{env}"
        );
        assert_eq!(
            out["metadata"]["annotations"]["tessera.dev/compute-policy"] == "guaranteed",
            capped
        );
        assert_eq!(original(&out)["dialect"], "hami");
        assert_eq!(original(&out)["containers"]["cuda"], limits);
        assert_eq!(
            warnings.iter().any(|w| w.contains("rounded up")),
            rounded,
            "{warnings:?}"
        );
    }

    // 30% of the card's memory: three slices (37.5%), and the share for the node to lay
    // over them on the GPU it gets; the second pass (inside `admitted`) takes the
    // annotation for the webhook's own.
    let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "30"});
    let (out, warnings) = admitted(&pod(
        vec![container("cuda", limits)],
        json!({}),
        "hami-scheduler",
    ))
    .await;
    assert_slices(&out, 0, "3");
    assert!(
        warnings.iter().any(|w| w.contains("rounded up")),
        "{warnings:?}"
    );
    let share = out["metadata"]["annotations"][ANNOTATION_EXACT_MEMORY_PERCENT]
        .as_str()
        .unwrap_or_else(|| panic!("no {ANNOTATION_EXACT_MEMORY_PERCENT}: {out:#}"));
    assert_eq!(
        serde_json::from_str::<Value>(share).expect("json"),
        json!({"cuda": {"slices": 3, "percent": 30}})
    );
}

#[tokio::test(start_paused = true)]
async fn hami_priority_becomes_the_pods_and_hami_core_variables_are_warned_about() {
    let mut c = container(
        "cuda",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/priority": "0"}),
    );
    c["env"] = json!([
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}
    ]);
    let (out, warnings) = admitted(&pod(
        vec![c],
        json!({"hami.io/node-scheduler-policy": "binpack"}),
        "hami-scheduler",
    ))
    .await;
    assert_eq!(
        out["metadata"]["annotations"]["tessera.dev/priority"],
        "100"
    );
    // Kept on the pod, and said to be the cluster's to decide (the second pass inside
    // `admitted` finds nothing to change with it still there).
    assert_eq!(
        out["metadata"]["annotations"]["hami.io/node-scheduler-policy"],
        "binpack"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("hami.io/node-scheduler-policy")),
        "{warnings:?}"
    );
    // The variables stay (the shim reads neither) but the user is told.
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/vgpu"],
        "1"
    );
    for name in ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"] {
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(name) && w.contains("ignores")),
            "{name}: {warnings:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn hami_requests_tessera_cannot_honour_are_refused_naming_the_field() {
    let table = [
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
            json!({}),
            "nvidia.com/gpucores: \"150\"",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000"}),
            json!({}),
            "nvidia.com/gpumem: \"100000\"",
        ),
        (
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000"}),
            json!({}),
            "nvidia.com/gpu: \"2\"",
        ),
        (
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
            // A model list that names nothing (one no node has: the webhook's unit tests,
            // with the cluster's models configured).
            json!({"nvidia.com/use-gputype": " , "}),
            "nvidia.com/use-gputype: \" , \"",
        ),
    ];
    for (limits, annotations, field) in table {
        let msg = denied(&pod(
            vec![container("cuda", limits)],
            annotations,
            "hami-scheduler",
        ))
        .await;
        assert!(msg.starts_with("Tessera refused this pod: "), "{msg}");
        assert!(msg.contains(field), "{msg:?} lacks {field:?}");
    }
}

// ---------------------------------------------------------------- KAI-Scheduler

#[tokio::test(start_paused = true)]
async fn kai_examples_become_slices_on_the_right_container() {
    // (annotations, container index, slices, rounded)
    let table = [
        // KAI's gpu-sharing example: half a GPU.
        (json!({"gpu-fraction": "0.5"}), 0, "4", false),
        // KAI's gpu-memory example: 2000 MiB.
        (json!({"gpu-memory": "2000"}), 0, "1", true),
        (json!({"gpu-fraction": "0.75"}), 0, "6", false),
        // The non-default-container example.
        (
            json!({"gpu-fraction": "0.25", "gpu-fraction-container-name": "second"}),
            1,
            "2",
            false,
        ),
        (
            json!({"gpu-fraction": "1", "gpu-fraction-num-devices": "2"}),
            0,
            "16",
            false,
        ),
    ];
    for (annotations, index, slices, rounded) in table {
        let p = pod(
            vec![
                container("first", json!({})),
                container("second", json!({})),
            ],
            annotations.clone(),
            "kai-scheduler",
        );
        let (out, warnings) = admitted(&p).await;
        assert_slices(&out, index, slices);
        // The other container sees no GPU.
        let other = &out["spec"]["containers"][1 - index];
        assert_eq!(
            other["env"],
            json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])
        );
        // KAI's words are off the pod (KAI would reserve a whole GPU for them) and in ours.
        let ann = out["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        assert!(
            !ann.contains_key("gpu-fraction") && !ann.contains_key("gpu-memory"),
            "{ann:?}"
        );
        assert_eq!(original(&out)["annotations"], annotations);
        assert_eq!(
            warnings.iter().any(|w| w.contains("rounded up")),
            rounded,
            "{warnings:?}"
        );
    }

    // A third of a GPU, as KAI's users write it: three slices (37.5%), and the fraction
    // of the card's memory and compute for the node to lay over them (a fraction of a
    // percent, which dropin-limits' whole percent cannot hold); the second pass (inside
    // `admitted`) keeps it.
    let (out, _) = admitted(&pod(
        vec![container("main", json!({}))],
        json!({"gpu-fraction": "0.333"}),
        "kai-scheduler",
    ))
    .await;
    assert_slices(&out, 0, "3");
    let share = out["metadata"]["annotations"][ANNOTATION_EXACT_MEMORY_PERCENT]
        .as_str()
        .unwrap_or_else(|| panic!("no {ANNOTATION_EXACT_MEMORY_PERCENT}: {out:#}"));
    assert_eq!(
        serde_json::from_str::<Value>(share).expect("json"),
        json!({"main": {"slices": 3, "percent": 33.3, "computePercent": 33.3}})
    );
}

#[tokio::test(start_paused = true)]
async fn kai_requests_tessera_cannot_honour_are_refused_naming_the_field() {
    let table = [
        (json!({"gpu-fraction": "0"}), "gpu-fraction: \"0\""),
        (json!({"gpu-fraction": "1.5"}), "gpu-fraction: \"1.5\""),
        (json!({"gpu-memory": "200000"}), "gpu-memory"),
        (
            json!({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}),
            "gpu-fraction-num-devices",
        ),
    ];
    for (annotations, field) in table {
        let msg = denied(&pod(
            vec![container("c", json!({}))],
            annotations,
            "kai-scheduler",
        ))
        .await;
        assert!(msg.contains(field), "{msg:?} lacks {field:?}");
    }
}

// ---------------------------------------------------------------- Volcano

#[tokio::test(start_paused = true)]
async fn volcano_examples_become_slices() {
    let table = [
        // Volcano's default vGPU example: one vGPU of 1024 MiB.
        (
            json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024"}),
            "1",
            true,
        ),
        (
            json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8192", "volcano.sh/vgpu-cores": "50"}),
            "4",
            false,
        ),
        (
            json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "50"}),
            "4",
            false,
        ),
        (
            json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "25"}),
            "8",
            false,
        ),
        (json!({"volcano.sh/vgpu-number": "2"}), "16", false),
    ];
    for (limits, slices, rounded) in table {
        let p = pod(vec![container("c", limits.clone())], json!({}), "volcano");
        let (out, warnings) = admitted(&p).await;
        assert_slices(&out, 0, slices);
        assert_eq!(original(&out)["dialect"], "volcano");
        assert_eq!(original(&out)["containers"]["c"], limits);
        assert_eq!(
            warnings.iter().any(|w| w.contains("rounded up")),
            rounded,
            "{warnings:?}"
        );
    }
    let msg = denied(&pod(
        vec![container(
            "c",
            json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "101"}),
        )],
        json!({}),
        "volcano",
    ))
    .await;
    assert!(msg.contains("volcano.sh/vgpu-cores: \"101\""), "{msg}");
}

// ---------------------------------------------------------------- the chart's choice

#[tokio::test(start_paused = true)]
async fn a_dialect_the_cluster_does_not_accept_is_left_as_it_came() {
    let only_kai = server_with(Config {
        dialects: [Dialect::Kai].into_iter().collect(),
        ..Config::default()
    })
    .await;
    let hami = pod(
        vec![container(
            "c",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
        )],
        json!({}),
        "hami-scheduler",
    );
    match admit_on(&only_kai, &hami).await {
        Outcome::Allowed { patched, .. } => assert!(!patched, "a HAMi pod was changed"),
        Outcome::Denied(m) => panic!("denied: {m}"),
    }
    let kai = pod(
        vec![container("c", json!({}))],
        json!({"gpu-fraction": "0.5"}),
        "kai-scheduler",
    );
    match admit_on(&only_kai, &kai).await {
        Outcome::Allowed { pod, patched, .. } => {
            assert!(patched);
            assert_slices(&pod, 0, "4");
        }
        Outcome::Denied(m) => panic!("denied: {m}"),
    }
}

/// KAI's own admission may run before Tessera's: the pod then also carries its ConfigMap
/// annotation and NVIDIA_VISIBLE_DEVICES from KAI's ConfigMap. Those come off (Tessera's
/// device plugin names the GPU), and the pod is admitted with its slices.
#[tokio::test(start_paused = true)]
async fn a_kai_pod_after_kais_own_admission_is_translated_too() {
    let mut c = container("c", json!({}));
    c["env"] = json!([
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef":
            {"name": "gpu-pod-x1-runai-sh-gpu-0", "key": "RUNAI-VISIBLE-DEVICES"}}},
        {"name": "GPU_PORTION", "valueFrom": {"configMapKeyRef":
            {"name": "gpu-pod-x1-runai-sh-gpu-0", "key": "GPU_PORTION"}}}
    ]);
    let p = pod(
        vec![c],
        json!({"gpu-fraction": "0.5", "runai/shared-gpu-configmap": "gpu-pod-x1-runai-sh-gpu"}),
        "kai-scheduler",
    );
    let (out, _) = admitted(&p).await;
    assert_slices(&out, 0, "4");
    assert_eq!(
        out["spec"]["containers"][0]["env"],
        json!([{"name": "LD_PRELOAD", "value": HOOK_PATH}])
    );
    assert!(
        out["metadata"]["annotations"]
            .get("runai/shared-gpu-configmap")
            .is_none()
    );
}
