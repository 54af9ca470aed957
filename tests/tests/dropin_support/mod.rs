//! Pods in HAMi's, KAI-Scheduler's and Volcano's words, five per project, in the
//! shapes of each project's documented examples (written here afresh), and what each
//! must get on a node of 4 GiB slices, 8 to a GPU: the drop-in tests of both routes
//! (`dropin_dra`, `dropin_device_plugin`) run the same pods.
#![allow(dead_code)] // each test binary uses a different part

use serde_json::{Value, json};

pub const GI: u64 = 1 << 30;

/// The webhook's default slice (chart `webhook.dropin.slice`), kept equal to the
/// node's, as docs/dropin.md asks: 4 GiB and 12.5 % each, 8 to a GPU.
pub const CONFIG: &str = "default:\n  slice: {memory: 4Gi, slicesPerGpu: 8}\n";

/// A simulated GPU of 40 GiB: more than its slices (32 GiB), so "the whole card" is the
/// slices and a process can hold all of them beside its context.
pub fn sim_node(seed: u64) -> tessera_e2e::SimNode {
    tessera_e2e::SimNode::builder()
        .config(tessera_sim::NodeConfig {
            devices: 1,
            memory_per_device: 40 * GI,
            sms: 100,
            cc_major: 8,
            cc_minor: 6,
            name: "E2E Simulated GPU".into(),
            seed,
            ..Default::default()
        })
        .build()
}

/// A pod as its project documents it: `containers` are (name, limits); `spec` extra
/// fields (KAI's `schedulerName`).
pub fn pod(name: &str, annotations: Value, containers: &[(&str, Value)], spec: Value) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(n, limits)| json!({"name": n, "image": "ghcr.io/example/train:1", "resources": {"limits": limits}}))
        .collect();
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "annotations": annotations},
        "spec": {"containers": containers}
    });
    if let Value::Object(extra) = spec {
        for (k, v) in extra {
            p["spec"][k] = v;
        }
    }
    p
}

/// What a translated pod must get: memory per GPU, compute share, policy, priority.
pub struct Want {
    pub memory: u64,
    pub compute_ppm: u32,
    pub guaranteed: bool,
    pub priority: i32,
}

pub fn want(memory: u64, compute_ppm: u32, guaranteed: bool, priority: i32) -> Want {
    Want {
        memory,
        compute_ppm,
        guaranteed,
        priority,
    }
}

pub const MI: u64 = 1 << 20;

/// The pod whose tenant, after admission, edits its exact limits
/// (`tessera.dev/dropin-limits`) to ask for the whole card: see [`as_stored`].
pub const RAISED: &str = "hami-3000m-raised";

/// The pod whose tenant, after admission, edits its share of the card's memory
/// (`tessera.dev/dropin-memory-percent`) to all of it: see [`as_stored`].
pub const RAISED_SHARE: &str = "kai-0.3-raised";

/// 30 % of the card's memory, as the node works it out on these GPUs: the card is the
/// eight 4 GiB slices (32 GiB, the GPU's other 8 GiB are no slice's), 30 % of it is
/// 9830.4 MiB, rounded down to whole 2 MiB pages.
pub const THIRTY_PERCENT: u64 = 9830 * MI;

/// KAI's `0.333` of the card's memory on these GPUs: 10911.7 MiB of the 32 GiB, in
/// whole 2 MiB pages.
pub const A_THIRD: u64 = 10910 * MI;

/// Twenty-three pods, six or more per project, each with what it must get: exactly its
/// ask. Most ask for whole slices (a 4 GiB multiple, an eighth of the card); a HAMi
/// pod of 3000 MiB, a Volcano one of 5000 MiB capped at 30 % and a KAI one of 7000 MiB
/// are scheduled as whole slices (1, 3, 2) and limited to exactly their words; so are
/// 30 % of the card's memory in each project's words (three slices, 37.5 %, limited to
/// [`THIRTY_PERCENT`]), and KAI's fractions `0.3` and `0.333` in compute too (300,000
/// and 333,000 ppm of the GPU, not the slices' 375,000); one more 3000 MiB pod's tenant
/// raises its limits on the pod after admission and gets no more than its slices
/// ([`RAISED`]), and so does a KAI `0.3` whose tenant raises its share, memory and
/// compute, to the whole card ([`RAISED_SHARE`]).
pub fn pods() -> Vec<(Value, Want)> {
    let none = json!({});
    vec![
        // HAMi: one vGPU, 8 GiB and 25 % of the cores (a cap: guaranteed).
        (
            pod(
                "hami-8g-25",
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "25"}),
                )],
                none.clone(),
            ),
            want(8 * GI, 250_000, true, 0),
        ),
        // HAMi: half the card's memory by percentage.
        (
            pod(
                "hami-half",
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
                )],
                none.clone(),
            ),
            want(16 * GI, 500_000, false, 0),
        ),
        // HAMi: 30 % of the card's memory: three slices (37.5 %), limited to 30 %.
        (
            pod(
                "hami-30pct",
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "30"}),
                )],
                none.clone(),
            ),
            want(THIRTY_PERCENT, 375_000, false, 0),
        ),
        // HAMi: 16 GiB, 50 % of the cores, high priority (0 in HAMi's words).
        (
            pod(
                "hami-16g-50-high",
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16384", "nvidia.com/gpucores": "50", "nvidia.com/priority": "0"}),
                )],
                none.clone(),
            ),
            want(16 * GI, 500_000, true, 100),
        ),
        // HAMi: 12 GiB at low priority (1), beside a sidecar with no GPU.
        (
            pod(
                "hami-12g-low",
                none.clone(),
                &[
                    ("log", json!({"cpu": "100m"})),
                    (
                        "cuda",
                        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288", "nvidia.com/priority": "1"}),
                    ),
                ],
                none.clone(),
            ),
            want(12 * GI, 375_000, false, 0),
        ),
        // HAMi: 3000 MiB, not whole slices: scheduled as one (4 GiB), limited to 3000 MiB.
        (
            pod(
                "hami-3000m",
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
                )],
                none.clone(),
            ),
            want(3000 * MI, 125_000, false, 0),
        ),
        // The same, whose tenant then writes the whole card into its exact limits: the
        // node holds it to its one slice.
        (
            pod(
                RAISED,
                none.clone(),
                &[(
                    "cuda",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
                )],
                none.clone(),
            ),
            want(4 * GI, 125_000, false, 0),
        ),
        // KAI: half a GPU.
        (
            pod(
                "kai-half",
                json!({"gpu-fraction": "0.5"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(16 * GI, 500_000, false, 0),
        ),
        // KAI: a quarter.
        (
            pod(
                "kai-quarter",
                json!({"gpu-fraction": "0.25"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(8 * GI, 250_000, false, 0),
        ),
        // KAI: 4 GiB by memory.
        (
            pod(
                "kai-4g",
                json!({"gpu-memory": "4096"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(4 * GI, 125_000, false, 0),
        ),
        // KAI: 7000 MiB: two slices, limited to 7000 MiB.
        (
            pod(
                "kai-7000m",
                json!({"gpu-memory": "7000"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(7000 * MI, 250_000, false, 0),
        ),
        // KAI: 0.3 of a GPU: three slices (37.5 %), limited to 30 % of the card, its
        // memory and its compute.
        (
            pod(
                "kai-0.3",
                json!({"gpu-fraction": "0.3"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(THIRTY_PERCENT, 300_000, false, 0),
        ),
        // KAI: a third of a GPU written as `0.333`: three slices, limited to 33.3 %
        // of the card (a share no whole percent or whole slice count gives).
        (
            pod(
                "kai-0.333",
                json!({"gpu-fraction": "0.333"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(A_THIRD, 333_000, false, 0),
        ),
        // The same, whose tenant then writes the whole card as its share (memory and
        // compute): its slices.
        (
            pod(
                RAISED_SHARE,
                json!({"gpu-fraction": "0.3"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(12 * GI, 375_000, false, 0),
        ),
        // KAI: 20 GiB, for the named container of two.
        (
            pod(
                "kai-20g-named",
                json!({"gpu-memory": "20480", "gpu-fraction-container-name": "trainer"}),
                &[("proxy", none.clone()), ("trainer", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(20 * GI, 625_000, false, 0),
        ),
        // KAI: a whole GPU as a fraction of one device.
        (
            pod(
                "kai-whole",
                json!({"gpu-fraction": "1", "gpu-fraction-num-devices": "1"}),
                &[("main", none.clone())],
                json!({"schedulerName": "kai-scheduler"}),
            ),
            want(32 * GI, 1_000_000, false, 0),
        ),
        // Volcano: one vGPU of 4 GiB.
        (
            pod(
                "volcano-4g",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4096"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(4 * GI, 125_000, false, 0),
        ),
        // Volcano: a quarter of the memory by percentage.
        (
            pod(
                "volcano-quarter",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "25"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(8 * GI, 250_000, false, 0),
        ),
        // Volcano: 30 % of the memory capped at 20 % of the cores: three slices, both
        // exact.
        (
            pod(
                "volcano-30pct-20",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "30", "volcano.sh/vgpu-cores": "20"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(THIRTY_PERCENT, 200_000, true, 0),
        ),
        // Volcano: 8 GiB capped at 25 %.
        (
            pod(
                "volcano-8g-25",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8192", "volcano.sh/vgpu-cores": "25"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(8 * GI, 250_000, true, 0),
        ),
        // Volcano: 24 GiB capped at 75 %.
        (
            pod(
                "volcano-24g-75",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "24576", "volcano.sh/vgpu-cores": "75"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(24 * GI, 750_000, true, 0),
        ),
        // Volcano: 5000 MiB capped at 30 %: three slices for the compute (37.5 %),
        // limited to exactly 5000 MiB and 30 %.
        (
            pod(
                "volcano-5000m-30",
                none.clone(),
                &[(
                    "cuda",
                    json!({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "5000", "volcano.sh/vgpu-cores": "30"}),
                )],
                json!({"schedulerName": "volcano"}),
            ),
            want(5000 * MI, 300_000, true, 0),
        ),
        // Volcano: one vGPU and nothing else, the whole card.
        (
            pod(
                "volcano-whole",
                none.clone(),
                &[("cuda", json!({"volcano.sh/vgpu-number": "1"}))],
                json!({"schedulerName": "volcano"}),
            ),
            want(32 * GI, 1_000_000, false, 0),
        ),
    ]
}

/// The translated pod's one container with slices, and their count.
pub fn slices_of(translated: &Value) -> (String, u32) {
    let with: Vec<(String, u32)> = translated["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| {
            let n = c["resources"]["limits"]["tessera.dev/vgpu"].as_str()?;
            Some((
                c["name"].as_str().expect("a name").to_owned(),
                n.parse().expect("a count"),
            ))
        })
        .collect();
    assert_eq!(with.len(), 1, "one container with slices: {translated:#}");
    with.into_iter().next().expect("one")
}

/// The translated pod as the API server holds it when the node reads it: as admitted,
/// except [`RAISED`] and [`RAISED_SHARE`], whose tenants have since rewritten their
/// exact limits to the whole card (a pod's annotations can be edited after admission,
/// where no webhook looks).
pub fn as_stored(translated: &Value) -> Value {
    let mut stored = translated.clone();
    if translated["metadata"]["name"] == RAISED_SHARE {
        let key = tessera_contract::dropin::ANNOTATION_EXACT_MEMORY_PERCENT;
        assert!(
            stored["metadata"]["annotations"][key].is_string(),
            "the webhook wrote a share of the card: {translated:#}"
        );
        stored["metadata"]["annotations"][key] =
            json!(r#"{"main":{"slices":3,"percent":100,"computePercent":100}}"#);
    }
    if translated["metadata"]["name"] == RAISED {
        let key = tessera_contract::dropin::ANNOTATION_EXACT_LIMITS;
        assert!(
            stored["metadata"]["annotations"][key].is_string(),
            "the webhook wrote exact limits: {translated:#}"
        );
        stored["metadata"]["annotations"][key] =
            json!(r#"{"cuda":{"slices":1,"memoryMiB":32768,"computePercent":100}}"#);
    }
    stored
}

/// A process of a drop-in pod, started by either route, sees its ask as its memory both
/// ways (CUDA and NVML), gets all of it and not a byte more, and the node's ground truth
/// holds exactly that for it.
pub fn assert_pod_holds_exactly(
    n: &tessera_e2e::SimNode,
    p: &mut tessera_e2e::ProbeChild,
    memory: u64,
    name: &str,
) {
    assert_pod_holds_exactly_on(n, p, memory, 0, name);
}

/// [`assert_pod_holds_exactly`] on the node's GPU `gpu` (its index): the ground truth
/// has the process's memory there and nothing on any other GPU.
pub fn assert_pod_holds_exactly_on(
    n: &tessera_e2e::SimNode,
    p: &mut tessera_e2e::ProbeChild,
    memory: u64,
    gpu: usize,
    name: &str,
) {
    const T: std::time::Duration = std::time::Duration::from_secs(15);
    for step in ["init", "ctx", "nvml-init"] {
        let l = p.cmd(step, T);
        assert!(l.ok, "{name}: {}", l.raw);
    }
    assert_eq!(p.cmd("meminfo", T).u64("total"), memory, "{name}");
    assert_eq!(p.cmd("nvml-meminfo", T).u64("total"), memory, "{name}");
    let all = p.cmd(&format!("alloc {memory}"), T);
    assert!(all.ok, "{name}: the whole ask is usable: {}", all.raw);
    let one = p.cmd("alloc 1", T);
    assert_eq!(
        one.error.as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY"),
        "{name}: {}",
        one.raw
    );
    let truth = n.node().process(p.pid()).expect("probe on the node").memory;
    for (i, held) in truth.iter().enumerate() {
        let want = if i == gpu { memory } else { 0 };
        assert_eq!(*held, want, "{name}: ground truth on GPU {i}: {truth:?}");
    }
}
