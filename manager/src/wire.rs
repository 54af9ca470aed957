//! The wire form of an allocation: what the API hands a caller so it can
//! start the allocation's processes (paths, mounts and environment).

use std::collections::HashMap;
use std::path::Path;

use tessera_contract::env;
use tessera_contract::paths::{CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY, CONTAINER_STATE};
use tessera_proto::manager::v1 as pb;

use crate::alloc;
use crate::store::LiveAllocation;

/// The wire form of an allocation's devices, as a create asks for them.
pub fn device_requests(devices: &[alloc::DeviceRecord]) -> Vec<pb::DeviceRequest> {
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
        policy: alloc::policy_to_pb(rec.policy) as i32,
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
