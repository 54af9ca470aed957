//! Allocate: device IDs → per-GPU slice counts → a manager allocation →
//! the env and mounts a container needs to run under it.
//!
//! The allocation id is derived from the sorted device IDs, so a kubelet
//! retry of the same Allocate finds the allocation it already made.

use std::collections::{BTreeMap, BTreeSet};

use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::manager::v1 as mgr;
use tonic::{Code, Status};

use tessera_node::cdi::{HostPaths, KIND_NVIDIA, KIND_TESSERA};
use tessera_node::config::{ComputePolicy, DeviceListStrategy, FULL_COMPUTE_PPM};
use tessera_node::edits::{EditOptions, EditsError, allocation_edits};

use crate::device_id::{DeviceId, DeviceIdError};
use crate::state::Snapshot;
use tessera_node::manager::ManagerApi;

/// The env var the NVIDIA container toolkit reads the device list from.
pub use tessera_contract::env::NVIDIA_VISIBLE_DEVICES;
/// Annotation naming the allocation, for the container runtime and humans.
pub use tessera_contract::labels::ANNOTATION_ALLOCATION as ALLOCATION_ANNOTATION;
/// Label the plugin puts on its allocations, and its value there; only
/// those are garbage-collected.
pub use tessera_contract::labels::{SOURCE as SOURCE_LABEL, SOURCE_DEVICE_PLUGIN};
/// Container path of the preload list (read-only mount, when enabled).
pub use tessera_contract::paths::CONTAINER_PRELOAD;
/// Container paths of the control file (read-only mount), the state file
/// (read-write mount) and the hook library (read-only mount).
pub use tessera_contract::paths::{
    CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY as CONTAINER_HOOK, CONTAINER_STATE,
};
/// Where the `volume-mounts` strategy puts one (empty) mount per GPU, and the
/// host side of those mounts.
pub use tessera_node::edits::{VOLUME_MOUNTS_HOST, VOLUME_MOUNTS_ROOT};

/// Why an Allocate request cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocateError {
    #[error("no device ids in the request")]
    Empty,
    #[error(transparent)]
    BadId(#[from] DeviceIdError),
    #[error("device id {0:?} appears twice in the request")]
    Duplicate(String),
    #[error("device id {id:?} names GPU {gpu:?}, which this node does not have")]
    UnknownGpu { id: String, gpu: String },
    #[error("device id {id:?}: GPU {gpu} has only {slices} slices under the config in force")]
    UnknownSlice {
        id: String,
        gpu: String,
        slices: u32,
    },
    #[error("device id {id:?}: GPU {gpu} is unhealthy{reason}")]
    Unhealthy {
        id: String,
        gpu: String,
        reason: String,
    },
}

impl From<AllocateError> for Status {
    fn from(e: AllocateError) -> Self {
        let code = match e {
            AllocateError::Empty | AllocateError::BadId(_) | AllocateError::Duplicate(_) => {
                Code::InvalidArgument
            }
            AllocateError::UnknownGpu { .. } | AllocateError::UnknownSlice { .. } => Code::NotFound,
            AllocateError::Unhealthy { .. } => Code::FailedPrecondition,
        };
        Status::new(code, e.to_string())
    }
}

/// What one container gets: checked against the snapshot, not yet created.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub id: String,
    /// Per GPU, in GPU index order.
    pub devices: Vec<mgr::DeviceRequest>,
    /// Sorted.
    pub device_ids: Vec<String>,
    pub policy: ComputePolicy,
}

impl Plan {
    /// The manager request for this plan.
    pub fn request(&self) -> mgr::CreateAllocationRequest {
        mgr::CreateAllocationRequest {
            id: self.id.clone(),
            devices: self.devices.clone(),
            policy: policy_to_proto(self.policy) as i32,
            device_ids: self.device_ids.clone(),
            labels: [(SOURCE_LABEL.to_owned(), SOURCE_DEVICE_PLUGIN.to_owned())].into(),
        }
    }
}

/// The proto value of a compute policy.
pub fn policy_to_proto(p: ComputePolicy) -> mgr::ComputePolicy {
    match p {
        ComputePolicy::Guaranteed => mgr::ComputePolicy::Guaranteed,
        ComputePolicy::Burst => mgr::ComputePolicy::Burst,
    }
}

/// Allocation id for a set of device IDs: `dp-` and 16 hex digits of a
/// 64-bit FNV-1a hash of the sorted IDs joined by `,` (stable across runs
/// and builds, unlike `std`'s hasher).
pub fn allocation_id(sorted_ids: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, id) in sorted_ids.iter().enumerate() {
        if i > 0 {
            h = fnv_step(h, b',');
        }
        for &b in id.as_bytes() {
            h = fnv_step(h, b);
        }
    }
    format!("dp-{h:016x}")
}

fn fnv_step(h: u64, b: u8) -> u64 {
    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
}

/// Checks the IDs against the snapshot and works out the limits: on each
/// GPU, slices × slice memory and slices × slice compute share.
pub fn plan(ids: &[String], snap: &Snapshot) -> Result<Plan, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty);
    }
    let mut seen = BTreeSet::new();
    let mut per_gpu: BTreeMap<String, u32> = BTreeMap::new();
    for id in ids {
        let d = DeviceId::parse(id)?;
        if !seen.insert(id.clone()) {
            return Err(AllocateError::Duplicate(id.clone()));
        }
        let Some(g) = snap.gpu(&d.gpu_uuid) else {
            return Err(AllocateError::UnknownGpu {
                id: id.clone(),
                gpu: d.gpu_uuid,
            });
        };
        if d.slice >= g.layout.slices {
            return Err(AllocateError::UnknownSlice {
                id: id.clone(),
                gpu: d.gpu_uuid,
                slices: g.layout.slices,
            });
        }
        if !g.healthy {
            let reason = if !snap.manager_up {
                " (the manager is unreachable)".to_owned()
            } else if g.gpu.unhealthy_reason.is_empty() {
                String::new()
            } else {
                format!(": {}", g.gpu.unhealthy_reason)
            };
            return Err(AllocateError::Unhealthy {
                id: id.clone(),
                gpu: d.gpu_uuid,
                reason,
            });
        }
        *per_gpu.entry(d.gpu_uuid).or_default() += 1;
    }
    let mut devices = Vec::with_capacity(per_gpu.len());
    for g in &snap.gpus {
        if let Some(&k) = per_gpu.get(&g.gpu.uuid) {
            let memory = (u64::from(k) * g.layout.memory_bytes).min(g.gpu.memory_total_bytes);
            let compute =
                (u64::from(k) * u64::from(g.layout.compute_ppm)).min(u64::from(FULL_COMPUTE_PPM));
            devices.push(mgr::DeviceRequest {
                gpu_uuid: g.gpu.uuid.clone(),
                memory_limit_bytes: memory,
                compute_share_ppm: u32::try_from(compute).unwrap_or(FULL_COMPUTE_PPM),
                slices: k,
            });
        }
    }
    let device_ids: Vec<String> = seen.into_iter().collect();
    Ok(Plan {
        id: allocation_id(&device_ids),
        devices,
        device_ids,
        policy: snap.node.compute_policy,
    })
}

/// Creates the plan's allocation, or finds the one a retry already made.
///
/// The kubelet never gives the same slices to two live containers, so an
/// existing allocation with this id and other limits is a leftover of an
/// earlier container on the same slices (made under an older config): it is
/// replaced.
pub(crate) async fn create<M: ManagerApi>(
    manager: &M,
    plan: &Plan,
) -> Result<mgr::Allocation, Status> {
    match manager.create_allocation(plan.request()).await {
        Ok(a) => Ok(a),
        Err(s) if s.code() == Code::AlreadyExists => {
            let existing = manager
                .list_allocations()
                .await?
                .into_iter()
                .find(|a| a.id == plan.id);
            match existing {
                Some(a) if same_limits(&a, plan) => Ok(a),
                _ => {
                    tracing::info!(id = %plan.id, "replacing a leftover allocation on the same slices");
                    match manager.delete_allocation(plan.id.clone()).await {
                        Ok(()) => {}
                        Err(s) if s.code() == Code::NotFound => {}
                        Err(s) => return Err(s),
                    }
                    manager.create_allocation(plan.request()).await
                }
            }
        }
        Err(s) => Err(s),
    }
}

fn same_limits(a: &mgr::Allocation, plan: &Plan) -> bool {
    let key = |d: &mgr::DeviceRequest| {
        (
            d.gpu_uuid.clone(),
            d.memory_limit_bytes,
            d.compute_share_ppm,
        )
    };
    let mut have: Vec<_> = a.devices.iter().map(key).collect();
    let mut want: Vec<_> = plan.devices.iter().map(key).collect();
    have.sort();
    want.sort();
    have == want && a.policy == policy_to_proto(plan.policy) as i32
}

/// The container's env, mounts, CDI devices and annotations for an allocation.
///
/// The env and mounts are the manager's answer as [`allocation_edits`] turns
/// it into a container's edits (the DRA plugin's CDI specs are built by the
/// same function): `TESSERA_CONTROL`, `TESSERA_STATE` (container paths),
/// `TESSERA_ALLOCATION`, the allocation's two files, the hook. Never
/// `LD_PRELOAD`: the webhook sets that, prepending the hook to the user's own
/// value. The GPUs, by `strategy`: `envvar` sets `NVIDIA_VISIBLE_DEVICES` to
/// their UUIDs; `volume-mounts` mounts `/dev/null` at
/// `/var/run/nvidia-container-devices/<uuid>` for each and points
/// `NVIDIA_VISIBLE_DEVICES` at that directory (NVIDIA's plugin does the same;
/// the toolkit then ignores the env's value and reads the mounts); `cdi`
/// names `nvidia.com/gpu=<uuid>` and `tessera.dev/gpu=<uuid>`, and the
/// node-wide files (the hook, the preload list) come from the plugin's CDI
/// spec ([`crate::cdi`]) instead of `mounts`.
pub fn container_response(
    alloc: &mgr::Allocation,
    host: &HostPaths,
    ld_so_preload: bool,
    strategy: DeviceListStrategy,
) -> Result<dp::ContainerAllocateResponse, EditsError> {
    let edits = allocation_edits(
        alloc,
        EditOptions {
            host,
            gpus: strategy,
            shim_files: !strategy.cdi,
            ld_so_preload,
            ld_preload: false,
        },
    )?;
    let mut cdi_devices = Vec::new();
    if strategy.cdi {
        for kind in [KIND_NVIDIA, KIND_TESSERA] {
            for d in &alloc.devices {
                cdi_devices.push(dp::CdiDevice {
                    name: tessera_node::cdi::qualified_name(kind, &d.gpu_uuid),
                });
            }
        }
    }
    Ok(dp::ContainerAllocateResponse {
        envs: edits.env.into_iter().collect(),
        mounts: edits
            .mounts
            .into_iter()
            .map(|m| dp::Mount {
                container_path: m.container_path,
                host_path: m.host_path.display().to_string(),
                read_only: m.read_only,
            })
            .collect(),
        devices: Vec::new(),
        annotations: [(ALLOCATION_ANNOTATION.to_owned(), alloc.id.clone())].into(),
        cdi_devices,
    })
}

/// The env a process on the host would need to see what the container sees:
/// every env value that is a mounted container path becomes its host path.
/// For tests and tools that run a workload without a container runtime.
pub fn host_env(resp: &dp::ContainerAllocateResponse) -> BTreeMap<String, String> {
    resp.envs
        .iter()
        .map(|(k, v)| {
            let v = resp
                .mounts
                .iter()
                .find(|m| &m.container_path == v)
                .map_or_else(|| v.clone(), |m| m.host_path.clone());
            (k.clone(), v)
        })
        .collect()
}

// The preload file is shared with the DRA plugin's CDI specs.
pub use tessera_node::cdi::{ensure_preload_file, preload_contents};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::state::PluginState;
    use std::sync::Mutex;
    use tessera_node::config::Config;
    use tessera_proto::manager::v1::{GpuStatus, NodeStatus};
    use tokio::time::Instant;

    const GI: u64 = 1 << 30;

    /// A node of three GPUs (GPU-a 80 GiB, GPU-b 40 GiB, GPU-sick unhealthy)
    /// under the node config `cfg`; the assignment tests use it too.
    pub(crate) fn snapshot(cfg: &str) -> std::sync::Arc<Snapshot> {
        let st = PluginState::new("n", Config::parse(cfg).expect("cfg"), BTreeMap::new());
        st.update_status(
            &NodeStatus {
                gpus: vec![
                    GpuStatus {
                        index: 0,
                        uuid: "GPU-a".into(),
                        memory_total_bytes: 80 * GI,
                        healthy: true,
                        ..Default::default()
                    },
                    GpuStatus {
                        index: 1,
                        uuid: "GPU-b".into(),
                        memory_total_bytes: 40 * GI,
                        healthy: true,
                        ..Default::default()
                    },
                    GpuStatus {
                        index: 2,
                        uuid: "GPU-sick".into(),
                        memory_total_bytes: 40 * GI,
                        healthy: false,
                        unhealthy_reason: "XID 79".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            Instant::now(),
        );
        st.snapshot()
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn limits_are_slices_times_slice_size() {
        let snap = snapshot("default:\n  slice: {memory: 10Gi}\n  computePolicy: guaranteed\n");
        // GPU-a: 8 slices of 10Gi, 12.5% each; GPU-b: 4 slices of 10Gi, 25%.
        let p = plan(
            &ids(&["GPU-b::3", "GPU-a::0", "GPU-a::5", "GPU-a::2"]),
            &snap,
        )
        .expect("plan");
        assert_eq!(
            p.devices,
            vec![
                mgr::DeviceRequest {
                    gpu_uuid: "GPU-a".into(),
                    memory_limit_bytes: 30 * GI,
                    compute_share_ppm: 375_000,
                    slices: 3,
                },
                mgr::DeviceRequest {
                    gpu_uuid: "GPU-b".into(),
                    memory_limit_bytes: 10 * GI,
                    compute_share_ppm: 250_000,
                    slices: 1,
                },
            ]
        );
        assert_eq!(
            p.device_ids,
            ids(&["GPU-a::0", "GPU-a::2", "GPU-a::5", "GPU-b::3"])
        );
        assert_eq!(p.policy, ComputePolicy::Guaranteed);
        let req = p.request();
        assert_eq!(req.policy, mgr::ComputePolicy::Guaranteed as i32);
        assert_eq!(
            req.labels.get("source").map(String::as_str),
            Some("device-plugin")
        );
    }

    #[test]
    fn id_is_deterministic_and_order_free() {
        let snap = snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let a = plan(&ids(&["GPU-a::1", "GPU-a::0"]), &snap).expect("plan");
        let b = plan(&ids(&["GPU-a::0", "GPU-a::1"]), &snap).expect("plan");
        let c = plan(&ids(&["GPU-a::0", "GPU-a::2"]), &snap).expect("plan");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert!(a.id.starts_with("dp-") && a.id.len() == 19);
        // Fixed value: the hash must not change between builds.
        assert_eq!(
            allocation_id(&ids(&["x::0"])),
            allocation_id(&ids(&["x::0"]))
        );
        assert_eq!(allocation_id(&[]), "dp-cbf29ce484222325");
    }

    #[test]
    fn bad_ids_are_clear_errors() {
        let snap = snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let e = |v: &[&str]| plan(&ids(v), &snap).expect_err("error");
        assert_eq!(e(&[]), AllocateError::Empty);
        assert!(matches!(e(&["nonsense"]), AllocateError::BadId(_)));
        assert_eq!(
            e(&["GPU-a::1", "GPU-a::1"]),
            AllocateError::Duplicate("GPU-a::1".into())
        );
        assert_eq!(
            e(&["GPU-zz::0"]),
            AllocateError::UnknownGpu {
                id: "GPU-zz::0".into(),
                gpu: "GPU-zz".into()
            }
        );
        assert_eq!(
            e(&["GPU-a::4"]).to_string(),
            "device id \"GPU-a::4\": GPU GPU-a has only 4 slices under the config in force"
        );
        assert_eq!(
            e(&["GPU-sick::0"]).to_string(),
            "device id \"GPU-sick::0\": GPU GPU-sick is unhealthy: XID 79"
        );
        assert_eq!(Status::from(e(&["x"])).code(), Code::InvalidArgument);
        assert_eq!(Status::from(e(&["GPU-zz::0"])).code(), Code::NotFound);
        assert_eq!(
            Status::from(e(&["GPU-sick::0"])).code(),
            Code::FailedPrecondition
        );
    }

    /// The manager's answer to the plan's request (the fake answers with
    /// the paths, mounts and env the manager gives).
    fn answer(p: &Plan) -> mgr::Allocation {
        let m = tessera_node::testing::FakeManager::default();
        futures::executor::block_on(m.create_allocation(p.request())).expect("create")
    }

    #[test]
    fn response_has_env_and_mounts_but_no_ld_preload() {
        let snap = snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let p = plan(&ids(&["GPU-b::0", "GPU-a::0"]), &snap).expect("plan");
        let alloc = answer(&p);
        let host = HostPaths::default();
        let envvar = DeviceListStrategy {
            envvar: true,
            volume_mounts: false,
            cdi: false,
        };
        let r = container_response(&alloc, &host, false, envvar).expect("edits");
        assert_eq!(
            r.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
            Some("GPU-a,GPU-b")
        );
        assert_eq!(r.envs.get("TESSERA_ALLOCATION"), Some(&p.id));
        assert_eq!(
            r.envs.get("TESSERA_CONTROL").map(String::as_str),
            Some(CONTAINER_CONTROL)
        );
        assert_eq!(
            r.envs.get("TESSERA_STATE").map(String::as_str),
            Some(CONTAINER_STATE)
        );
        assert!(!r.envs.contains_key("LD_PRELOAD"));
        assert_eq!(r.mounts.len(), 3);
        assert!(r.mounts[0].read_only && !r.mounts[1].read_only && r.mounts[2].read_only);
        assert_eq!(r.mounts[2].host_path, "/var/lib/tessera/lib/libtessera.so");
        let with = container_response(&alloc, &host, true, envvar).expect("edits");
        assert_eq!(with.mounts.len(), 4);
        assert_eq!(with.mounts[3].container_path, "/etc/ld.so.preload");
        assert!(with.mounts[3].read_only);

        let dir = tempfile::tempdir().expect("tempdir");
        let preload = dir.path().join("sub/ld.so.preload");
        ensure_preload_file(&preload).expect("write");
        assert_eq!(
            std::fs::read_to_string(&preload).expect("read"),
            "/usr/local/lib/tessera/libtessera.so\n"
        );
        std::fs::write(&preload, "junk").expect("write");
        ensure_preload_file(&preload).expect("rewrite");
        assert_eq!(
            std::fs::read_to_string(&preload).expect("read"),
            preload_contents()
        );

        let env = host_env(&r);
        assert_eq!(
            env["TESSERA_CONTROL"],
            format!("/fake/allocations/{}/control", p.id)
        );
        assert_eq!(
            env["TESSERA_STATE"],
            format!("/fake/allocations/{}/state", p.id)
        );
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    }

    #[test]
    fn each_device_list_strategy_answers_as_nvidias_plugin_does() {
        let snap = snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let p = plan(&ids(&["GPU-b::0", "GPU-a::0"]), &snap).expect("plan");
        let alloc = answer(&p);
        let host = HostPaths::default();
        let paths = |r: &dp::ContainerAllocateResponse| -> Vec<String> {
            r.mounts.iter().map(|m| m.container_path.clone()).collect()
        };

        let vm =
            container_response(&alloc, &host, false, DeviceListStrategy::DEFAULT).expect("edits");
        assert_eq!(
            vm.envs[NVIDIA_VISIBLE_DEVICES],
            "/var/run/nvidia-container-devices"
        );
        let dev: Vec<&dp::Mount> = vm
            .mounts
            .iter()
            .filter(|m| m.container_path.starts_with(VOLUME_MOUNTS_ROOT))
            .collect();
        assert_eq!(
            dev.iter()
                .map(|m| m.container_path.as_str())
                .collect::<Vec<_>>(),
            [
                "/var/run/nvidia-container-devices/GPU-a",
                "/var/run/nvidia-container-devices/GPU-b"
            ]
        );
        assert!(
            dev.iter()
                .all(|m| m.host_path == "/dev/null" && m.read_only)
        );
        assert!(paths(&vm).contains(&CONTAINER_HOOK.to_owned()));
        assert!(vm.cdi_devices.is_empty());

        let cdi = DeviceListStrategy {
            envvar: false,
            volume_mounts: false,
            cdi: true,
        };
        let c = container_response(&alloc, &host, true, cdi).expect("edits");
        assert!(!c.envs.contains_key(NVIDIA_VISIBLE_DEVICES));
        let names: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia.com/gpu=GPU-a",
                "nvidia.com/gpu=GPU-b",
                "tessera.dev/gpu=GPU-a",
                "tessera.dev/gpu=GPU-b"
            ]
        );
        // The node-wide files come from the CDI spec; only the allocation's own stay.
        assert_eq!(paths(&c), [CONTAINER_CONTROL, CONTAINER_STATE]);

        let both = DeviceListStrategy {
            envvar: true,
            volume_mounts: true,
            cdi: false,
        };
        let b = container_response(&alloc, &host, false, both).expect("edits");
        assert_eq!(b.envs[NVIDIA_VISIBLE_DEVICES], "GPU-a,GPU-b");
        assert_eq!(paths(&b).len(), 5);
    }

    /// A manager that refuses duplicate ids, as a strict one would.
    #[derive(Default)]
    struct StrictManager {
        allocs: Mutex<Vec<mgr::Allocation>>,
        creates: Mutex<u32>,
    }

    impl ManagerApi for StrictManager {
        async fn create_allocation(
            &self,
            req: mgr::CreateAllocationRequest,
        ) -> Result<mgr::Allocation, Status> {
            *self.creates.lock().expect("lock") += 1;
            let mut a = self.allocs.lock().expect("lock");
            if a.iter().any(|x| x.id == req.id) {
                return Err(Status::already_exists("exists"));
            }
            let alloc = mgr::Allocation {
                id: req.id,
                devices: req.devices,
                policy: req.policy,
                device_ids: req.device_ids,
                ..Default::default()
            };
            a.push(alloc.clone());
            Ok(alloc)
        }
        async fn list_allocations(&self) -> Result<Vec<mgr::Allocation>, Status> {
            Ok(self.allocs.lock().expect("lock").clone())
        }
        async fn delete_allocation(&self, id: String) -> Result<(), Status> {
            self.allocs.lock().expect("lock").retain(|a| a.id != id);
            Ok(())
        }
        async fn set_allocation_owner(
            &self,
            _req: mgr::SetAllocationOwnerRequest,
        ) -> Result<mgr::Allocation, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn resize_allocation(
            &self,
            _req: mgr::ResizeAllocationRequest,
        ) -> Result<mgr::Allocation, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn node_status(&self) -> Result<mgr::NodeStatus, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn watch_node_status(
            &self,
            _interval_ms: u32,
        ) -> Result<tessera_node::manager::StatusStream, Status> {
            Err(Status::unimplemented("not here"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_reuses_and_stale_allocation_is_replaced() {
        let m = StrictManager::default();
        let snap = snapshot("default:\n  slice: {slicesPerGpu: 4}\n");
        let p = plan(&ids(&["GPU-a::0"]), &snap).expect("plan");
        let first = create(&m, &p).await.expect("create");
        let again = create(&m, &p).await.expect("retry");
        assert_eq!(first, again);
        assert_eq!(m.allocs.lock().expect("lock").len(), 1);

        // Same slices under a new slice size: the leftover is replaced.
        let snap2 = snapshot("default:\n  slice: {slicesPerGpu: 2}\n");
        let p2 = plan(&ids(&["GPU-a::0"]), &snap2).expect("plan");
        assert_eq!(p2.id, p.id);
        let replaced = create(&m, &p2).await.expect("replace");
        assert_eq!(replaced.devices[0].memory_limit_bytes, 40 * GI);
        let all = m.allocs.lock().expect("lock").clone();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].devices[0].memory_limit_bytes, 40 * GI);
        assert_eq!(*m.creates.lock().expect("lock"), 4);
    }
}
