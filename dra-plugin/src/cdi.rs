//! The CDI spec of one prepared claim: kind `vgpu.tessera.dev/claim`, one
//! device named by the claim's uid (never reused, so a runtime can never
//! confuse two claims), whose edits put a container under the claim's
//! allocation (a claim prepared as one allocation per request, `crate::split`,
//! has one device per request instead, `<uid>_<k>`, each under its own
//! allocation, in the same file): the shim preloaded, the allocation's control (read-only) and
//! state (read-write) files and the hook mounted, the `TESSERA_*`
//! environment. The GPU itself reaches the container the way the node's
//! device-list strategy says: `NVIDIA_VISIBLE_DEVICES` in these edits, or
//! NVIDIA's own CDI device `nvidia.com/gpu=<uuid>` beside this one.
//! The spec is built and written by `tessera_node::cdi`, the one CDI writer
//! the device plugin uses too.

use std::path::{Path, PathBuf};

use tessera_node::cdi::{
    CdiError, Device, HostPaths, KIND_NVIDIA, Spec, qualified_name, remove_spec, write_spec,
};
use tessera_node::config::DeviceListStrategy;
use tessera_node::edits::{EditOptions, EditsError, allocation_edits};
use tessera_proto::manager::v1 as mgr;

/// CDI kind (vendor/class) of the claims' devices.
pub const KIND: &str = "vgpu.tessera.dev/claim";

/// The spec file name of claim `uid` in the CDI dir.
fn file_name(uid: &str) -> String {
    format!("vgpu.tessera.dev-claim_{uid}.json")
}

/// The spec file of claim `uid` in the CDI dir.
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(file_name(uid))
}

/// The fully qualified CDI device of claim `uid`.
pub fn device_id(uid: &str) -> String {
    qualified_name(KIND, uid)
}

/// The NVIDIA CDI device of a GPU.
pub fn nvidia_device_id(gpu_uuid: &str) -> String {
    qualified_name(KIND_NVIDIA, gpu_uuid)
}

/// The spec of a claim with these devices (one per allocation the claim
/// was prepared as: [`part_name`]).
pub fn spec_of(devices: Vec<Device>) -> Spec {
    Spec {
        kind: KIND.to_owned(),
        devices,
    }
}

/// The CDI device of claim part `k` (1-based) of claim `uid`, for a claim
/// prepared as one allocation per request (`crate::split`): `<uid>_<k>`.
/// `_` is in no uid ([`crate::claim::check_uid`]), so no claim's own device
/// name is ever another claim's part.
pub fn part_name(uid: &str, k: usize) -> String {
    format!("{uid}_{k}")
}

/// The claim uid a device name of this kind belongs to: its spec is
/// [`spec_path`] of it.
pub fn claim_of(device: &str) -> &str {
    device.split_once('_').map_or(device, |(uid, _)| uid)
}

/// One device named `name` (a claim's uid, or its [`part_name`]), putting a
/// container under `alloc`, the manager's answer: its edits are
/// [`allocation_edits`]'s (the device plugin's Allocate answers are built by
/// the same function), with `LD_PRELOAD` set to the hook (DRA pods never pass
/// the webhook). `visible_devices`: set `NVIDIA_VISIBLE_DEVICES` to the
/// allocation's GPUs (the `envvar` strategy); otherwise the GPUs come as
/// NVIDIA CDI devices. `host`: the hook library, and the preload file mounted
/// at `/etc/ld.so.preload` when `ld_so_preload` (the node config's
/// `ldSoPreload`), as the device plugin mounts it: a program that clears
/// `LD_PRELOAD` still loads the shim. A claim's spec is [`spec_of`] its
/// devices.
pub fn device(
    name: &str,
    alloc: &mgr::Allocation,
    host: &HostPaths,
    ld_so_preload: bool,
    visible_devices: bool,
) -> Result<Device, EditsError> {
    let edits = allocation_edits(
        alloc,
        EditOptions {
            host,
            gpus: DeviceListStrategy {
                envvar: visible_devices,
                volume_mounts: false,
                cdi: !visible_devices,
            },
            // A claim's spec is all a container names besides NVIDIA's.
            shim_files: true,
            ld_so_preload,
            ld_preload: true,
        },
    )?;
    Ok(Device {
        name: name.to_owned(),
        edits,
    })
}

/// Writes the spec of claim `uid` (atomically and durably, so a runtime
/// never reads half a spec); its path.
pub fn write(dir: &Path, uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
    write_spec(dir, &file_name(uid), spec)?;
    Ok(spec_path(dir, uid))
}

/// Removes the spec of claim `uid`; one that is not there is fine.
pub fn remove(dir: &Path, uid: &str) -> Result<(), CdiError> {
    remove_spec(dir, &file_name(uid)).map(|_| ())
}

/// A container's environment as a runtime applying these edits gives it,
/// with every value that names a mounted container path turned into the
/// host path behind it: what a process on the host needs to see what the
/// container would (tests and tools without a container runtime).
pub fn host_env(spec: &serde_json::Value, device: &str) -> Option<Vec<(String, String)>> {
    let d = spec["devices"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == device)?;
    let edits = &d["containerEdits"];
    let mounts = edits["mounts"].as_array().cloned().unwrap_or_default();
    edits["env"]
        .as_array()?
        .iter()
        .map(|e| {
            let (k, v) = e.as_str()?.split_once('=')?;
            let v = mounts
                .iter()
                .find(|m| m["containerPath"] == v)
                .and_then(|m| m["hostPath"].as_str())
                .unwrap_or(v);
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn spec_carries_the_shim_and_the_allocation() {
        use tessera_node::manager::ManagerApi;
        let m = tessera_node::testing::FakeManager::default();
        let alloc = m
            .create_allocation(mgr::CreateAllocationRequest {
                id: "dra-u1".into(),
                devices: vec![mgr::DeviceRequest {
                    gpu_uuid: "GPU-a".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .expect("create");
        let host = HostPaths {
            hook_library: "/lib/libtessera.so".into(),
            preload_file: "/host/ld.so.preload".into(),
        };
        // Built as the driver builds it: a device per allocation, then the
        // spec of them.
        let spec = |ld_so_preload: bool, visible_devices: bool| {
            spec_of(vec![
                device("u1", &alloc, &host, ld_so_preload, visible_devices).expect("device"),
            ])
        };
        let typed = spec(false, true);
        let s = typed.to_json();
        assert_eq!(s["kind"], KIND);
        assert_eq!(s["devices"][0]["name"], "u1");
        let env = host_env(&s, "u1").expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("LD_PRELOAD"), Some("/lib/libtessera.so"));
        assert_eq!(
            get("TESSERA_CONTROL"),
            Some("/fake/allocations/dra-u1/control")
        );
        assert_eq!(get("TESSERA_STATE"), Some("/fake/allocations/dra-u1/state"));
        assert_eq!(get("TESSERA_ALLOCATION"), Some("dra-u1"));
        assert_eq!(get("NVIDIA_VISIBLE_DEVICES"), Some("GPU-a"));
        let m = &s["devices"][0]["containerEdits"]["mounts"];
        let at = |path: &str| {
            m.as_array()
                .and_then(|all| all.iter().find(|x| x["containerPath"] == path))
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(
            at("/run/tessera/alloc/control")["options"][0],
            "ro",
            "control is read-only"
        );
        assert_eq!(
            at("/run/tessera/alloc/state")["options"][0],
            "rw",
            "state is the process's to write"
        );
        assert_eq!(
            at("/usr/local/lib/tessera/libtessera.so")["hostPath"],
            "/lib/libtessera.so",
            "the node's hook"
        );
        assert_eq!(m.as_array().map(Vec::len), Some(3), "no preload file: {m}");
        let cdi = spec(false, false).to_json();
        assert!(
            host_env(&cdi, "u1")
                .unwrap()
                .iter()
                .all(|(k, _)| k != "NVIDIA_VISIBLE_DEVICES")
        );
        assert_eq!(device_id("u1"), "vgpu.tessera.dev/claim=u1");
        assert_eq!(part_name("u1", 2), "u1_2");
        assert_eq!(claim_of(&part_name("u1-x", 2)), "u1-x");
        assert_eq!(claim_of("u1-x"), "u1-x");

        // ldSoPreload: the host's preload file at /etc/ld.so.preload,
        // read-only, as the device plugin mounts it.
        let pre = spec(true, true).to_json();
        let m = pre["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let p = m
            .iter()
            .find(|m| m["containerPath"] == "/etc/ld.so.preload")
            .expect("the preload mount");
        assert_eq!(p["hostPath"], "/host/ld.so.preload");
        assert_eq!(p["options"][0], "ro");

        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "u1", &typed).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, s);
        remove(dir.path(), "u1").unwrap();
        assert!(!p.exists());
        remove(dir.path(), "u1").expect("removing twice is fine");
    }
}
