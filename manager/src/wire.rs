//! The wire form of allocations, in both directions, and nowhere else:
//! requests decoded into domain types once, at the edge (a create into a
//! [`Create`] and then the [`AllocationRecord`] it asks for, a resize into a
//! [`Resize`], an owner into an [`Owner`], a policy into [`Policy`]), which
//! the manager then validates ([`crate::alloc::validate`]) without reading
//! protobuf again; and what the API hands a caller so it can start the
//! allocation's processes (paths, mounts and environment).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tessera_contract::env;
use tessera_contract::paths::{CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY, CONTAINER_STATE};
use tessera_proto::manager::v1 as pb;
use tessera_shm::Policy;

use crate::alloc::{AllocError, AllocationRecord, DeviceRecord};
use crate::store::LiveAllocation;

/// The wire form of a policy.
pub fn policy_to_pb(p: Policy) -> pb::ComputePolicy {
    match p {
        Policy::Guaranteed => pb::ComputePolicy::Guaranteed,
        Policy::Burst => pb::ComputePolicy::Burst,
    }
}

/// A policy from the wire: `Ok(None)` for UNSPECIFIED.
pub fn policy_from_pb(raw: i32) -> Result<Option<Policy>, AllocError> {
    match pb::ComputePolicy::try_from(raw) {
        Ok(pb::ComputePolicy::Unspecified) => Ok(None),
        Ok(pb::ComputePolicy::Guaranteed) => Ok(Some(Policy::Guaranteed)),
        Ok(pb::ComputePolicy::Burst) => Ok(Some(Policy::Burst)),
        Err(_) => Err(AllocError::Invalid(format!(
            "unknown compute policy {raw}: use GUARANTEED (1) or BURST (2)"
        ))),
    }
}

/// A create as the manager takes it: what the request asks for, before the
/// manager names it (an empty id), applies its default policy and binds a
/// `tessera run` to its peer ([`crate::core::Core::bind_run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Create {
    /// None when the request leaves the id to the manager.
    pub id: Option<String>,
    pub devices: Vec<DeviceRecord>,
    /// None: the node's default.
    pub policy: Option<Policy>,
    pub device_ids: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl Create {
    /// The record this create asks for, not yet checked against the node
    /// ([`crate::alloc::validate`] does that).
    pub fn into_record(
        self,
        id: String,
        default_policy: Policy,
        now_unix_ms: i64,
    ) -> AllocationRecord {
        AllocationRecord {
            id,
            devices: self.devices,
            policy: self.policy.unwrap_or(default_policy),
            device_ids: self.device_ids,
            labels: self.labels,
            namespace: String::new(),
            pod: String::new(),
            container: String::new(),
            created_unix_ms: now_unix_ms,
        }
    }
}

/// A create request decoded. Only an unknown policy number fails here:
/// every other field has a domain form, checked by the manager.
pub fn create(req: &pb::CreateAllocationRequest) -> Result<Create, AllocError> {
    Ok(Create {
        id: (!req.id.is_empty()).then(|| req.id.clone()),
        devices: req
            .devices
            .iter()
            .map(|d| DeviceRecord {
                gpu_uuid: d.gpu_uuid.clone(),
                memory_limit_bytes: d.memory_limit_bytes,
                compute_share_ppm: d.compute_share_ppm,
                slices: d.slices,
            })
            .collect(),
        policy: policy_from_pb(req.policy)?,
        device_ids: req.device_ids.clone(),
        labels: req.labels.clone().into_iter().collect(),
    })
}

/// One GPU of a resize: what changes (None: kept as it is; the wire's 0).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceChange {
    pub gpu_uuid: String,
    pub memory_limit_bytes: Option<u64>,
    pub compute_share_ppm: Option<u32>,
}

/// A resize as the manager applies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resize {
    pub id: String,
    pub devices: Vec<DeviceChange>,
    pub priority: Option<i32>,
}

/// A resize request decoded: a zero limit or share means "unchanged".
pub fn resize(req: &pb::ResizeAllocationRequest) -> Resize {
    Resize {
        id: req.id.clone(),
        devices: req
            .devices
            .iter()
            .map(|d| DeviceChange {
                gpu_uuid: d.gpu_uuid.clone(),
                memory_limit_bytes: (d.memory_limit_bytes != 0).then_some(d.memory_limit_bytes),
                compute_share_ppm: (d.compute_share_ppm != 0).then_some(d.compute_share_ppm),
            })
            .collect(),
        priority: req.priority,
    }
}

/// Who owns an allocation, and the policy it may tighten to.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub id: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// None: the policy stays.
    pub policy: Option<Policy>,
}

/// A SetAllocationOwner request decoded.
pub fn owner(req: &pb::SetAllocationOwnerRequest) -> Result<Owner, AllocError> {
    Ok(Owner {
        id: req.id.clone(),
        namespace: req.namespace.clone(),
        pod: req.pod.clone(),
        container: req.container.clone(),
        policy: policy_from_pb(req.policy)?,
    })
}

/// The wire form of an allocation's devices, as a create asks for them.
pub fn device_requests(devices: &[DeviceRecord]) -> Vec<pb::DeviceRequest> {
    devices
        .iter()
        .map(|d| pb::DeviceRequest {
            gpu_uuid: d.gpu_uuid.clone(),
            memory_limit_bytes: d.memory_limit_bytes,
            compute_share_ppm: d.compute_share_ppm,
            slices: d.slices,
        })
        .collect()
}

/// The wire form of an allocation: paths, mounts and environment.
pub fn allocation(live: &LiveAllocation, hook_library: &Path) -> pb::Allocation {
    let rec = live.record();
    let control = live.dir().join("control");
    let state = live.dir().join("state");
    let mount = |host: &Path, container: &str, read_only| pb::Mount {
        host_path: host.display().to_string(),
        container_path: container.to_owned(),
        read_only,
    };
    let mut env = HashMap::new();
    env.insert(env::CONTROL.to_owned(), CONTAINER_CONTROL.to_owned());
    env.insert(env::STATE.to_owned(), CONTAINER_STATE.to_owned());
    env.insert(env::ALLOCATION.to_owned(), rec.id.clone());
    env.insert(
        env::NVIDIA_VISIBLE_DEVICES.to_owned(),
        rec.devices
            .iter()
            .map(|d| d.gpu_uuid.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    pb::Allocation {
        id: rec.id.clone(),
        devices: device_requests(&rec.devices),
        policy: policy_to_pb(rec.policy) as i32,
        priority: live.control().priority(),
        device_ids: rec.device_ids.clone(),
        labels: rec.labels.clone().into_iter().collect(),
        control_path: control.display().to_string(),
        state_path: state.display().to_string(),
        mounts: vec![
            mount(&control, CONTAINER_CONTROL, true),
            mount(&state, CONTAINER_STATE, false),
            mount(hook_library, CONTAINER_HOOK_LIBRARY, true),
        ],
        env,
        namespace: rec.namespace.clone(),
        pod: rec.pod.clone(),
        container: rec.container.clone(),
        created_unix_ms: rec.created_unix_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_decodes_to_the_record_it_asks_for() {
        let mut req = pb::CreateAllocationRequest::one_device("", "GPU-x", 5, 7);
        req.devices[0].slices = 2;
        req.device_ids = vec!["GPU-x::0".into()];
        req.labels.insert("source".into(), "cli".into());
        let c = create(&req).unwrap();
        assert_eq!(c.id, None, "an empty id is the manager's to give");
        let rec = c.into_record("a1".into(), Policy::Guaranteed, 42);
        assert_eq!(rec.id, "a1");
        assert_eq!(
            rec.devices,
            [DeviceRecord {
                gpu_uuid: "GPU-x".into(),
                memory_limit_bytes: 5,
                compute_share_ppm: 7,
                slices: 2
            }]
        );
        assert_eq!(rec.policy, Policy::Guaranteed, "unspecified: the default");
        assert_eq!(rec.device_ids, ["GPU-x::0"]);
        assert_eq!(rec.labels["source"], "cli");
        assert_eq!(rec.created_unix_ms, 42);
        req.policy = pb::ComputePolicy::Burst as i32;
        req.id = "b2".into();
        let c = create(&req).unwrap();
        assert_eq!(c.id.as_deref(), Some("b2"));
        let rec = c.into_record("b2".into(), Policy::Guaranteed, 42);
        assert_eq!(rec.policy, Policy::Burst);
        assert_eq!(device_requests(&rec.devices), req.devices, "round trip");
    }

    #[test]
    fn an_unknown_policy_number_is_refused_naming_the_choices() {
        let mut req = pb::CreateAllocationRequest::one_device("a1", "GPU-x", 5, 7);
        req.policy = 9;
        let e = create(&req).unwrap_err();
        assert!(matches!(e, AllocError::Invalid(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("unknown compute policy 9") && msg.contains("GUARANTEED (1)"));
        let mut own = pb::SetAllocationOwnerRequest {
            id: "a1".into(),
            policy: 9,
            ..Default::default()
        };
        assert!(
            owner(&own).is_err(),
            "an owner's policy is decoded the same way"
        );
        own.policy = 0;
        assert_eq!(owner(&own).unwrap().policy, None);
        assert!(policy_from_pb(-1).is_err());
        assert_eq!(policy_from_pb(0).unwrap(), None);
        for p in [Policy::Guaranteed, Policy::Burst] {
            assert_eq!(policy_from_pb(policy_to_pb(p) as i32).unwrap(), Some(p));
        }
    }

    #[test]
    fn a_resize_reads_zero_as_unchanged() {
        let req = pb::ResizeAllocationRequest {
            id: "a1".into(),
            devices: vec![
                pb::DeviceRequest {
                    gpu_uuid: "GPU-x".into(),
                    memory_limit_bytes: 0,
                    compute_share_ppm: 250_000,
                    slices: 0,
                },
                pb::DeviceRequest {
                    gpu_uuid: "GPU-y".into(),
                    memory_limit_bytes: 1 << 30,
                    compute_share_ppm: 0,
                    slices: 0,
                },
            ],
            priority: Some(3),
        };
        let r = resize(&req);
        assert_eq!(r.id, "a1");
        assert_eq!(r.priority, Some(3));
        assert_eq!(
            r.devices,
            [
                DeviceChange {
                    gpu_uuid: "GPU-x".into(),
                    memory_limit_bytes: None,
                    compute_share_ppm: Some(250_000)
                },
                DeviceChange {
                    gpu_uuid: "GPU-y".into(),
                    memory_limit_bytes: Some(1 << 30),
                    compute_share_ppm: None
                }
            ]
        );
    }
}
