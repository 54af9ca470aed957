//! The chart and the device plugin agree: the node config the chart ships parses with the
//! device plugin's own parser and means what its comments say, and the names the webhook
//! relies on are the plugin's.

use std::collections::BTreeMap;

use tessera_device_plugin::config::{ComputePolicy, Config, Placement};
use tessera_webhook::manifests::{self, RenderOptions};

fn shipped_config() -> Config {
    let out = manifests::render(&RenderOptions::default()).expect("render");
    let cm = serde_yaml::Deserializer::from_str(&out)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("yaml"))
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the node ConfigMap");
    let text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
    Config::parse(text)
        .unwrap_or_else(|e| panic!("the chart's node config is refused: {e}\n{text}"))
}

#[test]
fn shipped_node_config_parses_and_resolves_as_documented() {
    let c = shipped_config();
    let plain = c.resolve("gpu-node-1", &BTreeMap::new());
    assert_eq!(plain.slice.memory_bytes, Some(4 << 30));
    assert_eq!(plain.slice.slices_per_gpu, Some(8));
    assert_eq!(plain.compute_policy, ComputePolicy::Burst);
    assert_eq!(plain.placement, Placement::Binpack);
    assert_eq!(plain.shared_threshold, 0.2);

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
fn a_bad_override_of_the_node_config_is_caught_by_the_plugin() {
    let opts = RenderOptions {
        set: vec!["nodeConfig.default.placement=scatter".into()],
        ..RenderOptions::default()
    };
    let out = manifests::render(&opts).expect("render");
    let cm = serde_yaml::Deserializer::from_str(&out)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("yaml"))
        .find(|d| d["kind"] == "ConfigMap")
        .expect("cm");
    let e = Config::parse(cm["data"]["config.yaml"].as_str().expect("text"))
        .expect_err("refused")
        .to_string();
    assert!(e.contains("scatter"), "{e}");
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
