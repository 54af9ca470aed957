//! What one ResourceClaim asks of this node, worked out from the claim's
//! allocation (written by the kube-scheduler) and the node's GPUs, with no
//! I/O: the devices allocated to this driver on this node, the limits they
//! give on each GPU, the claim's opaque config. Every reason a claim cannot
//! be prepared is a [`ClaimError`] that names the claim's own mistake.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde::Deserialize;
use tessera_node::config::{FULL_COMPUTE_PPM, SliceLayout};
use tessera_proto::manager::v1 as mgr;

use crate::names::{self, DeviceName};
use crate::quantity;

/// Capacity names a device publishes and a claim consumes.
pub const CAPACITY_MEMORY: &str = "memory";
/// Percent of the GPU's time.
pub const CAPACITY_COMPUTE: &str = "compute";
/// `apiVersion` of the driver's opaque config.
pub const CONFIG_API_VERSION: &str = "vgpu.tessera.dev/v1alpha1";
/// `kind` of the driver's opaque config.
pub const CONFIG_KIND: &str = "VgpuConfig";

/// One GPU of this node, as prepare needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGpu {
    pub uuid: String,
    pub index: u32,
    pub memory_total_bytes: u64,
    pub healthy: bool,
    pub unhealthy_reason: String,
    /// Its slices under the node config in force (the `slices` layout).
    pub slices: SliceLayout,
    /// `nvidia`, `amd`, `hygon`, and its product name: what a pod's GPU constraint
    /// (`tessera_contract::gpu_filter`) is matched against.
    pub vendor: String,
    pub name: String,
}

/// The claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One allocated device this plugin serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub gpu_uuid: String,
    /// The allocation result's `shareID` (a share of a device allocated
    /// once per share); None for slices and exclusive allocations.
    pub share_id: Option<String>,
}

/// What preparing the claim makes: one manager allocation over its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimPlan {
    /// In the order of the claim's results.
    pub devices: Vec<PlannedDevice>,
    /// One entry per GPU, in GPU index order.
    pub limits: Vec<mgr::DeviceRequest>,
    pub policy: mgr::ComputePolicy,
    pub priority: Option<i32>,
}

/// Why a claim cannot be prepared on this node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClaimError {
    #[error("claim uid {0:?} is not a Kubernetes uid")]
    BadUid(String),
    #[error("resource claim {0} not found")]
    NotFound(String),
    #[error(
        "resource claim {claim} has uid {have}, the kubelet asked for {want} (deleted and created again?)"
    )]
    UidMismatch {
        claim: String,
        have: String,
        want: String,
    },
    #[error("resource claim {0} is not allocated")]
    NotAllocated(String),
    #[error(
        "resource claim {claim}: no device of driver {driver} on node {node} is allocated to it"
    )]
    NoResultForNode {
        claim: String,
        driver: String,
        node: String,
    },
    #[error("resource claim {claim}: device {device:?} is not a device of this node")]
    UnknownDevice { claim: String, device: String },
    #[error("resource claim {claim}: device {device:?} is allocated twice")]
    DeviceTwice { claim: String, device: String },
    #[error("resource claim {claim}: GPU {gpu} is unhealthy{reason}")]
    Unhealthy {
        claim: String,
        gpu: String,
        reason: String,
    },
    #[error("resource claim {claim}: {what} on GPU {gpu} is more than the GPU has ({have})")]
    BeyondGpu {
        claim: String,
        gpu: String,
        what: String,
        have: String,
    },
    #[error("resource claim {claim}: device {device}: consumed capacity {name}: {reason}")]
    BadCapacity {
        claim: String,
        device: String,
        name: String,
        reason: String,
    },
    #[error("resource claim {claim}: opaque config of driver {driver} is malformed: {reason}")]
    BadConfig {
        claim: String,
        driver: String,
        reason: String,
    },
}

/// Longest claim uid taken: `dra-<uid>` must be an allocation id (63
/// characters at most). Kubernetes uids are 36.
pub const MAX_UID_LEN: usize = 59;

/// A Kubernetes uid as the kubelet sends it: it becomes part of file and
/// allocation names, so nothing but `[A-Za-z0-9-]` gets through.
pub fn check_uid(uid: &str) -> Result<(), ClaimError> {
    let ok = !uid.is_empty()
        && uid.len() <= MAX_UID_LEN
        && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ClaimError::BadUid(uid.to_owned()))
    }
}

/// The driver's opaque config (`parameters` of an opaque config entry whose
/// driver is this one). Unknown fields are refused: a typo must not pass
/// silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VgpuConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    compute_policy: Option<String>,
    #[serde(default)]
    priority: Option<i32>,
}

/// The device results of the claim's allocation (none while it is not
/// allocated), every driver's and node's.
pub fn results(claim: &ResourceClaim) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
}

/// The request a result is for: `<request>/<subrequest>` (a `firstAvailable`
/// request's choice) is its request's.
pub fn main_request(result_request: &str) -> &str {
    result_request
        .split_once('/')
        .map_or(result_request, |(main, _)| main)
}

/// The requests of the claim this node serves for `driver` (main names), in
/// the order their first device appears in the allocation: the same order on
/// every read of the same claim (an allocation is never changed), so the
/// names derived from it are stable across retries.
pub fn served_requests(claim: &ResourceClaim, driver: &str, node: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in results(claim) {
        if r.driver == driver && r.pool == node {
            let main = main_request(&r.request);
            if !out.iter().any(|o| o == main) {
                out.push(main.to_owned());
            }
        }
    }
    out
}

/// The names of the requests in the claim's spec.
pub fn spec_requests(claim: &ResourceClaim) -> Vec<String> {
    claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect()
}

/// Works out the plan for `claim` (as read from the API server) on this
/// node, for the kubelet's `want`: of the whole claim, or (`only`) of one of
/// its requests alone (its main name, as [`served_requests`] gives it): the
/// devices allocated for it, their limits, and the config that applies to
/// it. A claim split per container (`crate::split`) makes one allocation of
/// each request.
pub fn plan(
    claim: &ResourceClaim,
    want: &ClaimRef,
    driver: &str,
    node: &str,
    gpus: &[NodeGpu],
    default_policy: mgr::ComputePolicy,
    only: Option<&str>,
) -> Result<ClaimPlan, ClaimError> {
    let name = want.to_string();
    let have_uid = claim.metadata.uid.clone().unwrap_or_default();
    if have_uid != want.uid {
        return Err(ClaimError::UidMismatch {
            claim: name,
            have: have_uid,
            want: want.uid.clone(),
        });
    }
    let Some(devices) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(ClaimError::NotAllocated(name));
    };
    let mine: Vec<_> = devices
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == driver && r.pool == node)
        .filter(|r| only.is_none_or(|o| main_request(&r.request) == o))
        .collect();
    if mine.is_empty() {
        return Err(ClaimError::NoResultForNode {
            claim: name,
            driver: driver.to_owned(),
            node: node.to_owned(),
        });
    }

    // Per GPU (by index in `gpus`): memory and compute summed over its devices.
    let mut per_gpu: BTreeMap<usize, (u128, u128, u32)> = BTreeMap::new();
    let mut planned = Vec::with_capacity(mine.len());
    let mut seen_slices = std::collections::BTreeSet::new();
    let mut seen_shares = std::collections::BTreeSet::new();
    for r in &mine {
        let unknown = || ClaimError::UnknownDevice {
            claim: name.clone(),
            device: r.device.clone(),
        };
        let parsed = names::parse(&r.device).ok_or_else(unknown)?;
        let gi = gpus
            .iter()
            .position(|g| names::gpu_key(&g.uuid) == parsed.gpu_key())
            .ok_or_else(unknown)?;
        let g = &gpus[gi];
        let (memory, compute) = match parsed {
            DeviceName::Slice(_, n) => {
                if n >= g.slices.slices {
                    return Err(unknown());
                }
                if !seen_slices.insert(r.device.clone()) {
                    return Err(ClaimError::DeviceTwice {
                        claim: name,
                        device: r.device.clone(),
                    });
                }
                (
                    u128::from(g.slices.memory_bytes),
                    u128::from(g.slices.compute_ppm),
                )
            }
            DeviceName::Gpu(_) => {
                // A shared device is allocated once per share (shareID):
                // two shares add up; the same share twice is a broken
                // allocation, not twice the memory.
                let share = (r.device.clone(), r.share_id.clone().unwrap_or_default());
                if !seen_shares.insert(share) {
                    return Err(ClaimError::DeviceTwice {
                        claim: name,
                        device: r.device.clone(),
                    });
                }
                let consumed = r.consumed_capacity.as_ref();
                let read = |cap: &str| -> Result<Option<u64>, ClaimError> {
                    consumed
                        .and_then(|c| c.get(cap))
                        .map(|q| {
                            quantity::parse(&q.0).map_err(|e| ClaimError::BadCapacity {
                                claim: name.clone(),
                                device: r.device.clone(),
                                name: cap.to_owned(),
                                reason: e.to_string(),
                            })
                        })
                        .transpose()
                };
                // Without consumed capacity (an exclusive allocation, or a
                // cluster without DRAConsumableCapacity) the claim has the GPU.
                let memory = read(CAPACITY_MEMORY)?.unwrap_or(g.memory_total_bytes);
                let compute = match read(CAPACITY_COMPUTE)? {
                    Some(pct) => u128::from(pct) * 10_000,
                    None => u128::from(FULL_COMPUTE_PPM),
                };
                (u128::from(memory), compute)
            }
        };
        let e = per_gpu.entry(gi).or_default();
        e.0 += memory;
        e.1 += compute;
        if matches!(parsed, DeviceName::Slice(..)) {
            e.2 += 1;
        }
        planned.push(PlannedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            gpu_uuid: g.uuid.clone(),
            share_id: r.share_id.clone(),
        });
    }

    let mut limits = Vec::with_capacity(per_gpu.len());
    for (gi, (memory, compute, slices)) in per_gpu {
        let g = &gpus[gi];
        if !g.healthy {
            return Err(ClaimError::Unhealthy {
                claim: name,
                gpu: g.uuid.clone(),
                reason: if g.unhealthy_reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", g.unhealthy_reason)
                },
            });
        }
        if memory > u128::from(g.memory_total_bytes) {
            return Err(ClaimError::BeyondGpu {
                claim: name,
                gpu: g.uuid.clone(),
                what: format!("memory {memory} bytes"),
                have: format!("{} bytes", g.memory_total_bytes),
            });
        }
        if compute > u128::from(FULL_COMPUTE_PPM) {
            return Err(ClaimError::BeyondGpu {
                claim: name,
                gpu: g.uuid.clone(),
                what: format!("compute {}%", compute / 10_000),
                have: "100%".to_owned(),
            });
        }
        if memory == 0 {
            return Err(ClaimError::BadCapacity {
                claim: name,
                device: names::gpu_device(&g.uuid),
                name: CAPACITY_MEMORY.to_owned(),
                reason: "zero bytes".to_owned(),
            });
        }
        limits.push(mgr::DeviceRequest {
            gpu_uuid: g.uuid.clone(),
            // Both were checked against the GPU's own figures above.
            memory_limit_bytes: u64::try_from(memory).unwrap_or(u64::MAX),
            compute_share_ppm: u32::try_from(compute).unwrap_or(FULL_COMPUTE_PPM),
            slices,
        });
    }
    limits.sort_by_key(|d| {
        gpus.iter()
            .find(|g| g.uuid == d.gpu_uuid)
            .map_or(u32::MAX, |g| g.index)
    });

    let (policy, priority) = opaque_config(claim, driver, &name, &mine, default_policy)?;
    Ok(ClaimPlan {
        devices: planned,
        limits,
        policy,
        priority,
    })
}

/// The claim's opaque config for this driver (class config first, then the
/// claim's own: the later wins), applying to the requests this node serves.
fn opaque_config(
    claim: &ResourceClaim,
    driver: &str,
    name: &str,
    mine: &[&k8s_openapi::api::resource::v1::DeviceRequestAllocationResult],
    default_policy: mgr::ComputePolicy,
) -> Result<(mgr::ComputePolicy, Option<i32>), ClaimError> {
    let bad = |reason: String| ClaimError::BadConfig {
        claim: name.to_owned(),
        driver: driver.to_owned(),
        reason,
    };
    let mut policy = default_policy;
    let mut priority = None;
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    let mut ordered: Vec<_> = configs.into_iter().flatten().collect();
    ordered.sort_by_key(|c| c.source != "FromClass");
    for c in ordered {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let applies = c
            .requests
            .as_ref()
            .is_none_or(|rs| rs.is_empty() || mine.iter().any(|m| rs.contains(&m.request)));
        if !applies {
            continue;
        }
        let v: VgpuConfig =
            serde_json::from_value(o.parameters.0.clone()).map_err(|e| bad(e.to_string()))?;
        if v.api_version != CONFIG_API_VERSION || v.kind != CONFIG_KIND {
            return Err(bad(format!(
                "apiVersion/kind is {}/{}, want {CONFIG_API_VERSION}/{CONFIG_KIND}",
                v.api_version, v.kind
            )));
        }
        if let Some(p) = v.compute_policy {
            policy = match p.as_str() {
                "guaranteed" => mgr::ComputePolicy::Guaranteed,
                "burst" => mgr::ComputePolicy::Burst,
                other => {
                    return Err(bad(format!(
                        "computePolicy {other:?} is neither guaranteed nor burst"
                    )));
                }
            };
        }
        if let Some(p) = v.priority {
            let (lo, hi) = (
                tessera_contract::labels::PRIORITY_MIN,
                tessera_contract::labels::PRIORITY_MAX,
            );
            if !(lo..=hi).contains(&p) {
                return Err(bad(format!("priority {p} is outside {lo}..={hi}")));
            }
            priority = Some(p);
        }
    }
    Ok((policy, priority))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn gpus() -> Vec<NodeGpu> {
        let layout = SliceLayout {
            slices: 4,
            memory_bytes: 4 * GI,
            compute_ppm: 250_000,
            capped: false,
        };
        ["GPU-aaaa", "GPU-bbbb"]
            .iter()
            .enumerate()
            .map(|(i, u)| NodeGpu {
                uuid: (*u).to_owned(),
                index: u32::try_from(i).unwrap(),
                memory_total_bytes: 16 * GI,
                healthy: true,
                unhealthy_reason: String::new(),
                slices: layout,
                vendor: "nvidia".into(),
                name: "NVIDIA A100-SXM4-80GB".into(),
            })
            .collect()
    }

    fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.tessera.dev"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
        .expect("claim JSON")
    }

    fn want() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u-1".into(),
        }
    }

    fn result(device: &str, consumed: Option<serde_json::Value>) -> serde_json::Value {
        let mut r = serde_json::json!({"request": "gpu", "driver": "vgpu.tessera.dev", "pool": "node-1", "device": device});
        if let Some(c) = consumed {
            r["consumedCapacity"] = c;
        }
        r
    }

    fn run(c: &ResourceClaim) -> Result<ClaimPlan, ClaimError> {
        plan(
            c,
            &want(),
            "vgpu.tessera.dev",
            "node-1",
            &gpus(),
            mgr::ComputePolicy::Guaranteed,
            None,
        )
    }

    #[test]
    fn shares_of_one_shared_device_add_up_and_one_share_twice_is_refused() {
        let share = |id: &str, mem: &str| {
            let mut r = result(
                "gpu-aaaa",
                Some(serde_json::json!({"memory": mem, "compute": "10"})),
            );
            r["shareID"] = id.into();
            r
        };
        let p = run(&claim(
            serde_json::json!([
                share("0f0e0d0c-0000-4000-8000-000000000001", "2Gi"),
                share("0f0e0d0c-0000-4000-8000-000000000002", "3Gi")
            ]),
            serde_json::json!([]),
        ))
        .expect("two shares");
        assert_eq!(p.limits.len(), 1);
        assert_eq!(p.limits[0].memory_limit_bytes, 5 * GI);
        assert_eq!(p.limits[0].compute_share_ppm, 200_000);
        assert_eq!(p.devices.len(), 2);
        let e = run(&claim(
            serde_json::json!([
                share("0f0e0d0c-0000-4000-8000-000000000001", "2Gi"),
                share("0f0e0d0c-0000-4000-8000-000000000001", "2Gi")
            ]),
            serde_json::json!([]),
        ))
        .expect_err("one share twice");
        assert!(matches!(e, ClaimError::DeviceTwice { .. }), "{e}");
    }

    #[test]
    fn slices_add_up_per_gpu() {
        let c = claim(
            serde_json::json!([
                result("gpu-aaaa-s0", None),
                result("gpu-aaaa-s3", None),
                result("gpu-bbbb-s1", None)
            ]),
            serde_json::json!([]),
        );
        let p = run(&c).expect("plan");
        assert_eq!(p.devices.len(), 3);
        assert_eq!(p.limits.len(), 2);
        assert_eq!(p.limits[0].gpu_uuid, "GPU-aaaa");
        assert_eq!(p.limits[0].memory_limit_bytes, 8 * GI);
        assert_eq!(p.limits[0].compute_share_ppm, 500_000);
        assert_eq!(p.limits[0].slices, 2);
        assert_eq!(p.limits[1].memory_limit_bytes, 4 * GI);
    }

    #[test]
    fn shared_device_takes_the_consumed_capacity() {
        let c = claim(
            serde_json::json!([result(
                "gpu-bbbb",
                Some(serde_json::json!({"memory": "5Gi", "compute": "30"}))
            )]),
            serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "vgpu.tessera.dev", "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "computePolicy": "burst", "priority": 5}}}]),
        );
        let p = run(&c).expect("plan");
        assert_eq!(p.limits.len(), 1);
        assert_eq!(p.limits[0].gpu_uuid, "GPU-bbbb");
        assert_eq!(p.limits[0].memory_limit_bytes, 5 * GI);
        assert_eq!(p.limits[0].compute_share_ppm, 300_000);
        assert_eq!(p.policy, mgr::ComputePolicy::Burst);
        assert_eq!(p.priority, Some(5));
        // Without consumed capacity: the whole GPU.
        let c = claim(
            serde_json::json!([result("gpu-bbbb", None)]),
            serde_json::json!([]),
        );
        let p = run(&c).expect("plan");
        assert_eq!(p.limits[0].memory_limit_bytes, 16 * GI);
        assert_eq!(p.limits[0].compute_share_ppm, FULL_COMPUTE_PPM);
    }

    #[test]
    fn each_mistake_is_named() {
        let no_cfg = serde_json::json!([]);
        let mut c = claim(
            serde_json::json!([result("gpu-aaaa-s0", None)]),
            no_cfg.clone(),
        );
        c.metadata.uid = Some("other".into());
        assert!(matches!(run(&c), Err(ClaimError::UidMismatch { .. })));
        let mut c = claim(serde_json::json!([]), no_cfg.clone());
        c.status = None;
        assert!(matches!(run(&c), Err(ClaimError::NotAllocated(_))));
        let mut other_node = result("gpu-aaaa-s0", None);
        other_node["pool"] = "node-2".into();
        let c = claim(serde_json::json!([other_node]), no_cfg.clone());
        assert!(matches!(run(&c), Err(ClaimError::NoResultForNode { .. })));
        for dev in ["gpu-cccc-s0", "gpu-aaaa-s4", "nvidia-0", "gpu-cccc"] {
            let c = claim(serde_json::json!([result(dev, None)]), no_cfg.clone());
            assert!(
                matches!(run(&c), Err(ClaimError::UnknownDevice { .. })),
                "{dev}"
            );
        }
        let c = claim(
            serde_json::json!([result("gpu-aaaa-s1", None), result("gpu-aaaa-s1", None)]),
            no_cfg.clone(),
        );
        assert!(matches!(run(&c), Err(ClaimError::DeviceTwice { .. })));
        let c = claim(
            serde_json::json!([result(
                "gpu-aaaa",
                Some(serde_json::json!({"memory": "17Gi"}))
            )]),
            no_cfg.clone(),
        );
        let e = run(&c).unwrap_err();
        assert!(matches!(e, ClaimError::BeyondGpu { .. }), "{e}");
        // Two shares of the shared device, 110 % together.
        let mut r1 = result("gpu-aaaa", Some(serde_json::json!({"compute": "60"})));
        r1["shareID"] = "0f0e0d0c-0000-4000-8000-000000000001".into();
        let mut r2 = result("gpu-aaaa", Some(serde_json::json!({"compute": "50"})));
        r2["shareID"] = "0f0e0d0c-0000-4000-8000-000000000002".into();
        let c = claim(serde_json::json!([r1, r2]), no_cfg.clone());
        assert!(matches!(run(&c), Err(ClaimError::BeyondGpu { .. })));
        let c = claim(
            serde_json::json!([result(
                "gpu-aaaa",
                Some(serde_json::json!({"memory": "lots"}))
            )]),
            no_cfg.clone(),
        );
        assert!(matches!(run(&c), Err(ClaimError::BadCapacity { .. })));
        for params in [
            serde_json::json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "computePolicy": "greedy"}),
            serde_json::json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "memroy": "1Gi"}),
            serde_json::json!({"apiVersion": "v9", "kind": CONFIG_KIND}),
            serde_json::json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "priority": 5000}),
            serde_json::json!("text"),
        ] {
            let c = claim(
                serde_json::json!([result("gpu-aaaa-s0", None)]),
                serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "vgpu.tessera.dev", "parameters": params}}]),
            );
            assert!(
                matches!(run(&c), Err(ClaimError::BadConfig { .. })),
                "{params}"
            );
        }
        // Another driver's config is not ours to judge.
        let c = claim(
            serde_json::json!([result("gpu-aaaa-s0", None)]),
            serde_json::json!([{"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"x": 1}}}]),
        );
        assert!(run(&c).is_ok());
        let mut g = gpus();
        g[0].healthy = false;
        let c = claim(serde_json::json!([result("gpu-aaaa-s0", None)]), no_cfg);
        assert!(matches!(
            plan(
                &c,
                &want(),
                "vgpu.tessera.dev",
                "node-1",
                &g,
                mgr::ComputePolicy::Guaranteed,
                None,
            ),
            Err(ClaimError::Unhealthy { .. })
        ));
        assert!(check_uid("0f1e-AB").is_ok());
        assert!(check_uid("../x").is_err());
        assert!(check_uid("").is_err());
    }
}
