//! The chart and the plugins agree: the node config the chart ships (its
//! values.yaml `nodeConfig`, which the ConfigMap's config.yaml is, through `toYaml`)
//! parses with the plugins' own parser (`tessera-node`) and means what its
//! comments say, and the names the webhook relies on are the device plugin's.
//! (Helm itself renders the chart in CI: .ci/chart.)

use std::collections::BTreeMap;

use serde_json::Value;

use tessera_node::config::{ComputePolicy, Config, DeviceListStrategy, DraLayout, Placement};

fn shipped_node_config() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/helm/tessera/values.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the chart's values.yaml");
    let values: Value = serde_saphyr::from_str(&text).expect("values.yaml is YAML");
    values["nodeConfig"].clone()
}

fn parse(v: &Value) -> Result<Config, String> {
    let text = serde_saphyr::to_string(v).expect("to yaml");
    Config::parse(&text).map_err(|e| e.to_string())
}

#[test]
fn shipped_node_config_parses_and_resolves_as_documented() {
    let c = parse(&shipped_node_config())
        .unwrap_or_else(|e| panic!("the chart's node config is refused: {e}"));
    let plain = c.resolve("gpu-node-1", &BTreeMap::new());
    assert_eq!(plain.slice.memory_bytes, Some(4 << 30));
    assert_eq!(plain.slice.slices_per_gpu, Some(8));
    assert_eq!(plain.compute_policy, ComputePolicy::Burst);
    assert_eq!(plain.placement, Placement::Defrag);
    assert_eq!(plain.shared_threshold, 0.2);
    // What docs/install.md sets the NVIDIA container toolkit up for.
    assert_eq!(plain.device_list_strategy, DeviceListStrategy::DEFAULT);
    assert_eq!(plain.device_list_strategy.names(), ["volume-mounts"]);
    // The DRA plugin's layout (docs/dra.md): slices, on any 1.34+ cluster.
    assert_eq!(plain.dra.layout, DraLayout::Slices);

    let labels = BTreeMap::from([("pool".to_string(), "inference".to_string())]);
    let inference = c.resolve("gpu-node-2", &labels);
    assert_eq!(inference.slice.compute_ppm, Some(100_000));
    assert_eq!(inference.compute_policy, ComputePolicy::Guaranteed);
    assert_eq!(inference.placement, Placement::Spread);

    assert_eq!(
        c.classify("NVIDIA H100 80GB HBM3"),
        Some("high-performance")
    );
    assert_eq!(
        c.classify("NVIDIA A100-SXM4-40GB"),
        Some("high-performance")
    );
    assert_eq!(c.classify("Tesla T4"), Some("general-purpose"));
}

#[test]
fn a_bad_value_in_the_node_config_is_caught_by_the_plugin() {
    let mut v = shipped_node_config();
    v["default"]["placement"] = Value::from("scatter");
    let e = parse(&v).expect_err("refused");
    assert!(
        e.contains("default.placement") && e.contains("scatter"),
        "{e}"
    );
}

#[test]
fn webhook_and_device_plugin_use_the_same_names() {
    assert_eq!(
        tessera_webhook::admission::RESOURCE,
        tessera_device_plugin::RESOURCE_NAME
    );
    assert_eq!(
        tessera_webhook::admission::HOOK_PATH,
        tessera_device_plugin::allocate::CONTAINER_HOOK
    );
}

/// The drop-in translation counts in `webhook.dropin.slice`; the nodes cut GPUs by
/// `nodeConfig.default.slice`. Shipped apart, they must say the same, or every
/// translated pod would get a different amount than the webhook told it.
#[test]
fn the_dropin_slice_is_the_node_configs_default_slice() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/helm/tessera/values.yaml"
    );
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("values.yaml")).expect("yaml");
    let dropin = &values["webhook"]["dropin"]["slice"];
    let node = parse(&shipped_node_config()).expect("node config");
    let plain = node.resolve("gpu-node-1", &BTreeMap::new());
    let memory = tessera_contract::units::parse_size(dropin["memory"].as_str().expect("memory"))
        .expect("a size");
    assert_eq!(Some(memory), plain.slice.memory_bytes);
    assert_eq!(
        dropin["slicesPerGpu"].as_u64().map(|n| n as u32),
        plain.slice.slices_per_gpu
    );
    assert_eq!(
        values["webhook"]["dropin"]["dialects"],
        serde_json::json!(["hami", "kai", "volcano"]),
        "the default is all three"
    );
}
