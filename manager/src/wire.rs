//! The wire form of allocations, in both directions, and nowhere else:
//! requests decoded into domain types once, at the edge (a create into the
//! [`AllocationRecord`] it asks for, a policy into [`Policy`]), which the
//! manager then validates ([`crate::alloc::validate`]); and what the API hands a
//! caller so it can start the allocation's processes (paths, mounts and
//! environment).

use std::collections::HashMap;
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

/// The record a create request asks for, decoded and not yet checked
/// against the node ([`crate::alloc::validate`] does that). `id` replaces an empty
/// request id; an unspecified policy is `default_policy`. Only an unknown
/// policy number fails here: every other field has a domain form.
pub fn create_record(
    req: &pb::CreateAllocationRequest,
    id: String,
    default_policy: Policy,
    now_unix_ms: i64,
) -> Result<AllocationRecord, AllocError> {
    Ok(AllocationRecord {
        id,
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
        policy: policy_from_pb(req.policy)?.unwrap_or(default_policy),
        device_ids: req.device_ids.clone(),
        labels: req.labels.clone().into_iter().collect(),
        namespace: String::new(),
        pod: String::new(),
        container: String::new(),
        created_unix_ms: now_unix_ms,
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
        let rec = create_record(&req, "a1".into(), Policy::Guaranteed, 42).unwrap();
        assert_eq!(rec.id, "a1", "the id given replaces an empty one");
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
        let rec = create_record(&req, "a1".into(), Policy::Guaranteed, 42).unwrap();
        assert_eq!(rec.policy, Policy::Burst);
        assert_eq!(device_requests(&rec.devices), req.devices, "round trip");
    }

    #[test]
    fn an_unknown_policy_number_is_refused_naming_the_choices() {
        let mut req = pb::CreateAllocationRequest::one_device("a1", "GPU-x", 5, 7);
        req.policy = 9;
        let e = create_record(&req, "a1".into(), Policy::Burst, 0).unwrap_err();
        assert!(matches!(e, AllocError::Invalid(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("unknown compute policy 9") && msg.contains("GUARANTEED (1)"));
        assert!(policy_from_pb(-1).is_err());
        assert_eq!(policy_from_pb(0).unwrap(), None);
        for p in [Policy::Guaranteed, Policy::Burst] {
            assert_eq!(policy_from_pb(policy_to_pb(p) as i32).unwrap(), Some(p));
        }
    }
}
