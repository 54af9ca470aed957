//! The ResourceSlices this node should have, worked out with no I/O from the
//! manager's node status and the node config in force: one pool named after
//! the node, its devices in the layout the config's `dra.layout` picks.
//!
//! - `slices`: each healthy GPU's slices (the config's `slice`) are devices
//!   `gpu-<uuid>-s<n>`, capacities `memory` (bytes) and `compute` (percent).
//! - `shared`: one device `gpu-<uuid>` per healthy GPU that allows multiple
//!   allocations, capacities `memory` (request policy: the config's
//!   `dra.memoryMinimum` and `dra.memoryStep`) and `compute` (1 to 100).
//!
//! Every device carries the attributes `uuid`, `index`, `productName`, `vendor`,
//! `computeCapability` (NVIDIA's GPUs only), `driverVersion` and, when a `gpuClasses` entry names
//! the product, `class`. An unhealthy GPU publishes no device, so the
//! scheduler places nothing new on it; it comes back when it is healthy.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_node::config::{Config, DraLayout, FULL_COMPUTE_PPM, NodeConfig};
use tessera_proto::manager::v1 as mgr;

use crate::claim::{CAPACITY_COMPUTE, CAPACITY_MEMORY};
use crate::names;

/// The most devices one ResourceSlice may hold (the API's limit in
/// `resource.k8s.io/v1`); a pool with more is cut into several slices.
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Attribute names (in the driver's domain: a CEL expression reads
/// `device.attributes["vgpu.tessera.dev"].uuid`, a constraint names
/// `vgpu.tessera.dev/uuid`).
pub const ATTR_UUID: &str = "uuid";
pub const ATTR_INDEX: &str = "index";
pub const ATTR_PRODUCT: &str = "productName";
pub const ATTR_CLASS: &str = "class";
/// `nvidia`, `amd`, `hygon`: a CEL selector picks one vendor's GPUs by it.
pub const ATTR_VENDOR: &str = "vendor";
pub const ATTR_COMPUTE_CAPABILITY: &str = "computeCapability";
pub const ATTR_DRIVER_VERSION: &str = "driverVersion";
/// `slices` layout: the slice's number on its GPU.
pub const ATTR_SLICE: &str = "slice";

/// The name of the `i`th slice of `driver` on `node`: stable, so a restart
/// replaces its own slices instead of adding more.
pub fn slice_name(node: &str, driver: &str, i: usize) -> String {
    format!("{node}-{driver}-{i}")
}

/// A quantity in the API server's canonical form for whole numbers of
/// bytes: the largest binary suffix that divides it (`4Gi`), else the
/// number. Written that way, what is read back compares equal.
pub fn bytes_quantity(b: u64) -> Quantity {
    for (shift, suffix) in [(50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return Quantity(format!("{}{suffix}", b >> shift));
        }
    }
    Quantity(b.to_string())
}

/// A share of the GPU's time in percent: `30`, or in thousandths (`33333m`)
/// when it is not a whole percent.
pub fn percent_quantity(ppm: u32) -> Quantity {
    if ppm.is_multiple_of(10_000) {
        Quantity((ppm / 10_000).to_string())
    } else {
        Quantity(format!("{}m", ppm / 10))
    }
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

fn attributes(
    g: &mgr::GpuStatus,
    driver_version: &str,
    config: &Config,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::from([
        (ATTR_UUID.to_owned(), string(&g.uuid)),
        (ATTR_INDEX.to_owned(), int(i64::from(g.index))),
        (ATTR_PRODUCT.to_owned(), string(&g.name)),
        (
            ATTR_COMPUTE_CAPABILITY.to_owned(),
            // A version attribute is semver: 8.0 is 8.0.0.
            DeviceAttribute {
                version: Some(format!(
                    "{}.{}.0",
                    g.compute_capability_major, g.compute_capability_minor
                )),
                ..Default::default()
            },
        ),
    ]);
    // Driver versions (535.104.05) are not semver: a string.
    if !driver_version.is_empty() {
        a.insert(ATTR_DRIVER_VERSION.to_owned(), string(driver_version));
    }
    let vendor = if g.vendor.is_empty() {
        "nvidia"
    } else {
        &g.vendor
    };
    a.insert(ATTR_VENDOR.to_owned(), string(vendor));
    // CUDA's compute capability means nothing on another vendor's GPU (the
    // manager reports 0.0 there): left out rather than published as 0.0.0.
    if vendor != "nvidia" {
        a.remove(ATTR_COMPUTE_CAPABILITY);
    }
    if let Some(class) = config.classify_vendor(&g.vendor, &g.name) {
        a.insert(ATTR_CLASS.to_owned(), string(class));
    }
    a
}

fn capacity(value: Quantity, policy: Option<CapacityRequestPolicy>) -> DeviceCapacity {
    DeviceCapacity {
        value,
        request_policy: policy,
    }
}

/// The devices of this node in the layout `node.dra.layout` says, GPUs in
/// index order.
pub fn devices(status: &mgr::NodeStatus, config: &Config, node: &NodeConfig) -> Vec<Device> {
    let mut gpus: Vec<&mgr::GpuStatus> = status.gpus.iter().filter(|g| g.healthy).collect();
    gpus.sort_by_key(|g| g.index);
    let mut out = Vec::new();
    for g in gpus {
        let attrs = attributes(g, &status.driver_version, config);
        match node.dra.layout {
            DraLayout::Slices => {
                let layout = node.slice.layout(g.memory_total_bytes);
                for n in 0..layout.slices {
                    let mut attrs = attrs.clone();
                    attrs.insert(ATTR_SLICE.to_owned(), int(i64::from(n)));
                    out.push(Device {
                        name: names::slice_device(&g.uuid, n),
                        attributes: Some(attrs),
                        capacity: Some(BTreeMap::from([
                            (
                                CAPACITY_MEMORY.to_owned(),
                                capacity(bytes_quantity(layout.memory_bytes), None),
                            ),
                            (
                                CAPACITY_COMPUTE.to_owned(),
                                capacity(percent_quantity(layout.compute_ppm), None),
                            ),
                        ])),
                        ..Default::default()
                    });
                }
            }
            DraLayout::Shared => {
                let minimum = node.dra.memory_minimum.min(g.memory_total_bytes);
                // A claim that names no compute gets one slice's share of
                // the GPU's time, as a slice of the same node would.
                let slice_pct = (node.slice.layout(g.memory_total_bytes).compute_ppm / 10_000)
                    .clamp(1, FULL_COMPUTE_PPM / 10_000);
                out.push(Device {
                    name: names::gpu_device(&g.uuid),
                    attributes: Some(attrs),
                    allow_multiple_allocations: Some(true),
                    capacity: Some(BTreeMap::from([
                        (
                            CAPACITY_MEMORY.to_owned(),
                            capacity(
                                bytes_quantity(g.memory_total_bytes),
                                Some(CapacityRequestPolicy {
                                    default: Some(bytes_quantity(minimum)),
                                    valid_range: Some(CapacityRequestPolicyRange {
                                        min: bytes_quantity(minimum),
                                        max: None,
                                        step: Some(bytes_quantity(node.dra.memory_step)),
                                    }),
                                    valid_values: None,
                                }),
                            ),
                        ),
                        (
                            CAPACITY_COMPUTE.to_owned(),
                            capacity(
                                Quantity("100".to_owned()),
                                Some(CapacityRequestPolicy {
                                    default: Some(Quantity(slice_pct.to_string())),
                                    valid_range: Some(CapacityRequestPolicyRange {
                                        min: Quantity("1".to_owned()),
                                        max: Some(Quantity("100".to_owned())),
                                        step: Some(Quantity("1".to_owned())),
                                    }),
                                    valid_values: None,
                                }),
                            ),
                        ),
                    ])),
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// The slices of `driver` on `node` holding `devices`, at pool generation
/// `generation`: at most [`MAX_DEVICES_PER_SLICE`] devices each, and one
/// empty slice when there is no device (the pool says so).
pub fn slices(
    driver: &str,
    node: &str,
    devices: Vec<Device>,
    generation: i64,
) -> Vec<ResourceSlice> {
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(MAX_DEVICES_PER_SLICE)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, driver, i)),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_owned(),
                node_name: Some(node.to_owned()),
                pool: ResourcePool {
                    name: node.to_owned(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn gpu(index: u32, uuid: &str, healthy: bool) -> mgr::GpuStatus {
        mgr::GpuStatus {
            index,
            uuid: uuid.to_owned(),
            name: "NVIDIA A100-SXM4-80GB".to_owned(),
            memory_total_bytes: 16 * GI,
            compute_capability_major: 8,
            compute_capability_minor: 0,
            healthy,
            ..Default::default()
        }
    }

    fn status() -> mgr::NodeStatus {
        mgr::NodeStatus {
            driver_version: "535.104.05".to_owned(),
            gpus: vec![gpu(1, "GPU-bbbb", true), gpu(0, "GPU-aaaa", true)],
            ..Default::default()
        }
    }

    fn config(text: &str) -> (Config, NodeConfig) {
        let c = Config::parse(text).expect("config");
        let n = c.resolve("n", &BTreeMap::new());
        (c, n)
    }

    #[test]
    fn an_amd_gpu_is_published_with_its_vendor_and_its_vendors_class() {
        let (c, n) = config(
            "default:\n  slice: {slicesPerGpu: 2}\ngpuClasses:\n  - {name: instinct, vendors: [amd], products: ['*']}\n",
        );
        let mut st = status();
        st.gpus[0] = mgr::GpuStatus {
            vendor: "amd".into(),
            name: "AMD Instinct MI210".into(),
            compute_capability_major: 0,
            compute_capability_minor: 0,
            ..gpu(1, "GPU-0123456789abcdef", true)
        };
        let d = devices(&st, &c, &n);
        let a = d[0].attributes.as_ref().expect("attributes");
        assert_eq!(a[ATTR_VENDOR].string.as_deref(), Some("nvidia"));
        assert!(
            a.get(ATTR_CLASS).is_none(),
            "the class takes AMD's GPUs only"
        );
        let a = d[2].attributes.as_ref().expect("attributes");
        assert_eq!(a[ATTR_UUID].string.as_deref(), Some("GPU-0123456789abcdef"));
        assert_eq!(a[ATTR_VENDOR].string.as_deref(), Some("amd"));
        assert_eq!(a[ATTR_CLASS].string.as_deref(), Some("instinct"));
        assert!(a.get(ATTR_COMPUTE_CAPABILITY).is_none());
    }

    #[test]
    fn slices_layout_publishes_each_slice_with_its_capacities_and_attributes() {
        let (c, n) = config(
            "default:\n  slice: {slicesPerGpu: 4}\ngpuClasses:\n  - {name: high-performance, products: ['*A100*']}\n",
        );
        let d = devices(&status(), &c, &n);
        assert_eq!(d.len(), 8);
        // GPU index order, whatever the status's order.
        assert_eq!(d[0].name, "gpu-aaaa-s0");
        assert_eq!(d[7].name, "gpu-bbbb-s3");
        let cap = d[0].capacity.as_ref().expect("capacity");
        assert_eq!(cap[CAPACITY_MEMORY].value.0, "4Gi");
        assert_eq!(cap[CAPACITY_COMPUTE].value.0, "25");
        assert!(cap[CAPACITY_MEMORY].request_policy.is_none());
        assert_eq!(d[0].allow_multiple_allocations, None);
        let a = d[5].attributes.as_ref().expect("attributes");
        assert_eq!(a[ATTR_UUID].string.as_deref(), Some("GPU-bbbb"));
        assert_eq!(a[ATTR_INDEX].int, Some(1));
        assert_eq!(a[ATTR_SLICE].int, Some(1));
        assert_eq!(a[ATTR_CLASS].string.as_deref(), Some("high-performance"));
        assert_eq!(a[ATTR_VENDOR].string.as_deref(), Some("nvidia"));
        assert_eq!(a[ATTR_COMPUTE_CAPABILITY].version.as_deref(), Some("8.0.0"));
        assert_eq!(a[ATTR_DRIVER_VERSION].string.as_deref(), Some("535.104.05"));
        assert_eq!(
            a[ATTR_PRODUCT].string.as_deref(),
            Some("NVIDIA A100-SXM4-80GB")
        );
    }

    #[test]
    fn shared_layout_publishes_one_multi_allocatable_device_per_gpu() {
        let (c, n) = config(
            "default:\n  slice: {slicesPerGpu: 4}\n  dra: {layout: shared, memoryMinimum: 512Mi, memoryStep: 128Mi}\n",
        );
        let d = devices(&status(), &c, &n);
        assert_eq!(
            d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["gpu-aaaa", "gpu-bbbb"]
        );
        assert_eq!(d[0].allow_multiple_allocations, Some(true));
        let cap = d[0].capacity.as_ref().expect("capacity");
        assert_eq!(cap[CAPACITY_MEMORY].value.0, "16Gi");
        let p = cap[CAPACITY_MEMORY]
            .request_policy
            .as_ref()
            .expect("policy");
        let r = p.valid_range.as_ref().expect("range");
        assert_eq!(r.min.0, "512Mi");
        assert_eq!(r.step.as_ref().map(|q| q.0.as_str()), Some("128Mi"));
        assert_eq!(p.default.as_ref().map(|q| q.0.as_str()), Some("512Mi"));
        let p = cap[CAPACITY_COMPUTE]
            .request_policy
            .as_ref()
            .expect("policy");
        assert_eq!(cap[CAPACITY_COMPUTE].value.0, "100");
        assert_eq!(p.default.as_ref().map(|q| q.0.as_str()), Some("25"));
        let a = d[0].attributes.as_ref().expect("attributes");
        assert!(!a.contains_key(ATTR_SLICE) && !a.contains_key(ATTR_CLASS));
    }

    #[test]
    fn an_unhealthy_gpu_publishes_nothing_and_many_devices_split_into_slices() {
        let (c, n) = config("default:\n  slice: {slicesPerGpu: 100}\n");
        let mut s = status();
        s.gpus[0].healthy = false;
        let d = devices(&s, &c, &n);
        assert_eq!(d.len(), 100);
        assert!(d.iter().all(|d| d.name.starts_with("gpu-aaaa-")));

        s.gpus[0].healthy = true;
        let d = devices(&s, &c, &n);
        let out = slices("vgpu.tessera.dev", "node-1", d, 7);
        assert_eq!(out.len(), 2);
        assert_eq!(
            out.iter()
                .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                .collect::<Vec<_>>(),
            [128, 72]
        );
        for (i, s) in out.iter().enumerate() {
            assert_eq!(
                s.metadata.name.as_deref(),
                Some(format!("node-1-vgpu.tessera.dev-{i}").as_str())
            );
            assert_eq!(s.spec.pool.name, "node-1");
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.resource_slice_count, 2);
            assert_eq!(s.spec.node_name.as_deref(), Some("node-1"));
        }
        let none = slices("d", "n", Vec::new(), 1);
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].spec.devices.as_deref(), Some(&[][..]));
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(bytes_quantity(4 * GI).0, "4Gi");
        assert_eq!(bytes_quantity(1536 << 20).0, "1536Mi");
        assert_eq!(bytes_quantity(1000).0, "1000");
        assert_eq!(bytes_quantity(0).0, "0");
        assert_eq!(percent_quantity(300_000).0, "30");
        assert_eq!(percent_quantity(333_333).0, "33333m");
        for q in ["4Gi", "1536Mi", "33333m"] {
            assert!(crate::quantity::parse(q).is_ok(), "{q}");
        }
    }
}

/// The example of what the plugin publishes, `deploy/examples/dra/published-slices.yaml`
/// (validated against the Kubernetes schemas in CI): checked equal to what
/// [`slices`] makes of the node it describes.
#[cfg(test)]
mod published_example {
    use super::*;

    const GI: u64 = 1 << 30;
    const CONFIG: &str = "default:\n  slice: {slicesPerGpu: 4}\n\
        overrides:\n  - nodeNames: [node-shared]\n    dra: {layout: shared, memoryMinimum: 1Gi, memoryStep: 256Mi}\n\
        gpuClasses:\n  - {name: high-performance, products: ['*A100*', '*H100*']}\n";

    fn expected() -> Vec<serde_json::Value> {
        let c = Config::parse(CONFIG).expect("config");
        let status = mgr::NodeStatus {
            driver_version: "550.54.15".to_owned(),
            gpus: [
                "GPU-8f3c2a10-1b2c-4d5e-8f90-0123456789ab",
                "GPU-2b7d9e44-5a6b-4c7d-9e0f-a1b2c3d4e5f6",
            ]
            .iter()
            .enumerate()
            .map(|(i, u)| mgr::GpuStatus {
                index: i as u32,
                uuid: (*u).to_owned(),
                name: "NVIDIA A100-SXM4-80GB".to_owned(),
                memory_total_bytes: 80 * GI,
                compute_capability_major: 8,
                compute_capability_minor: 0,
                healthy: true,
                ..Default::default()
            })
            .collect(),
            ..Default::default()
        };
        ["node-slices", "node-shared"]
            .iter()
            .flat_map(|node| {
                let n = c.resolve(node, &BTreeMap::new());
                slices("vgpu.tessera.dev", node, devices(&status, &c, &n), 1)
            })
            .map(|s| {
                let mut v = serde_json::to_value(&s).expect("JSON");
                v["apiVersion"] = "resource.k8s.io/v1".into();
                v["kind"] = "ResourceSlice".into();
                v
            })
            .collect()
    }

    #[test]
    fn the_example_is_what_the_plugin_publishes() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/examples/dra/published-slices.yaml");
        let want = expected();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let have = crate::testing::yaml_documents(&text).expect("YAML");
        let pretty: Vec<String> = want
            .iter()
            .map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
            .collect();
        assert!(
            have == want,
            "{} differs from what the plugin publishes; it should hold:\n{}",
            path.display(),
            pretty.join("\n---\n")
        );
    }
}
