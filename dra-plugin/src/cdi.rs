//! The CDI spec of one prepared claim: kind `vgpu.tessera.dev/claim`, one
//! device named by the claim's uid (never reused, so a runtime can never
//! confuse two claims), whose edits put a container under the claim's
//! allocation: the shim preloaded, the allocation's control (read-only) and
//! state (read-write) files and the hook mounted, the `TESSERA_*`
//! environment. The GPU itself reaches the container the way the node's
//! device-list strategy says: `NVIDIA_VISIBLE_DEVICES` in these edits, or
//! NVIDIA's own CDI device `nvidia.com/gpu=<uuid>` beside this one.
//! Format: the Container Device Interface specification, `cdiVersion` 0.6.0.

use std::path::{Path, PathBuf};

use tessera_contract::env;
use tessera_contract::paths::{CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY, CONTAINER_STATE};
use tessera_proto::manager::v1 as mgr;

/// CDI kind (vendor/class) of the claims' devices.
pub const KIND: &str = "vgpu.tessera.dev/claim";
/// CDI kind of the NVIDIA container toolkit's GPUs (`nvidia-ctk cdi generate`).
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
/// The spec version written.
pub const CDI_VERSION: &str = "0.6.0";

/// The spec file of claim `uid` in the CDI dir.
pub fn spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("vgpu.tessera.dev-claim_{uid}.json"))
}

/// The fully qualified CDI device of claim `uid`.
pub fn device_id(uid: &str) -> String {
    format!("{KIND}={uid}")
}

/// The NVIDIA CDI device of a GPU.
pub fn nvidia_device_id(gpu_uuid: &str) -> String {
    format!("{NVIDIA_KIND}={gpu_uuid}")
}

/// The spec for claim `uid` under `alloc`. `visible_devices`: set
/// `NVIDIA_VISIBLE_DEVICES` to the allocation's GPUs (the `envvar`
/// strategy); otherwise the GPUs come as NVIDIA CDI devices.
pub fn spec(
    uid: &str,
    alloc: &mgr::Allocation,
    hook_library: &Path,
    visible_devices: bool,
) -> serde_json::Value {
    let mut envs = vec![
        format!("{}={CONTAINER_HOOK_LIBRARY}", env::LD_PRELOAD),
        format!("{}={CONTAINER_CONTROL}", env::CONTROL),
        format!("{}={CONTAINER_STATE}", env::STATE),
        format!("{}={}", env::ALLOCATION, alloc.id),
    ];
    if visible_devices {
        let uuids: Vec<&str> = alloc.devices.iter().map(|d| d.gpu_uuid.as_str()).collect();
        envs.push(format!(
            "{}={}",
            env::NVIDIA_VISIBLE_DEVICES,
            uuids.join(",")
        ));
    }
    let mount = |host: &str, container: &str, ro: bool| {
        serde_json::json!({
            "hostPath": host,
            "containerPath": container,
            "options": [if ro { "ro" } else { "rw" }, "nosuid", "nodev", "bind"],
        })
    };
    let mounts = vec![
        mount(
            &hook_library.display().to_string(),
            CONTAINER_HOOK_LIBRARY,
            true,
        ),
        mount(&alloc.control_path, CONTAINER_CONTROL, true),
        mount(&alloc.state_path, CONTAINER_STATE, false),
    ];
    serde_json::json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": uid, "containerEdits": {"env": envs, "mounts": mounts}}],
    })
}

/// Writes the spec of claim `uid`: temp file, fsync, rename, so a runtime
/// never reads half a spec.
pub fn write(dir: &Path, uid: &str, spec: &serde_json::Value) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = spec_path(dir, uid);
    let text = serde_json::to_string_pretty(spec).map_err(std::io::Error::other)? + "\n";
    crate::checkpoint::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Removes the spec of claim `uid`; one that is not there is fine.
pub fn remove(dir: &Path, uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(spec_path(dir, uid)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
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

    #[test]
    fn spec_carries_the_shim_and_the_allocation() {
        let alloc = mgr::Allocation {
            id: "dra-u1".into(),
            devices: vec![mgr::DeviceRequest {
                gpu_uuid: "GPU-a".into(),
                ..Default::default()
            }],
            control_path: "/s/dra-u1/control".into(),
            state_path: "/s/dra-u1/state".into(),
            ..Default::default()
        };
        let s = spec("u1", &alloc, Path::new("/lib/libtessera.so"), true);
        assert_eq!(s["kind"], KIND);
        assert_eq!(s["devices"][0]["name"], "u1");
        let env = host_env(&s, "u1").expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("LD_PRELOAD"), Some("/lib/libtessera.so"));
        assert_eq!(get("TESSERA_CONTROL"), Some("/s/dra-u1/control"));
        assert_eq!(get("TESSERA_STATE"), Some("/s/dra-u1/state"));
        assert_eq!(get("TESSERA_ALLOCATION"), Some("dra-u1"));
        assert_eq!(get("NVIDIA_VISIBLE_DEVICES"), Some("GPU-a"));
        let m = &s["devices"][0]["containerEdits"]["mounts"];
        assert_eq!(m[1]["options"][0], "ro", "control is read-only");
        assert_eq!(m[2]["options"][0], "rw", "state is the process's to write");
        let cdi = spec("u1", &alloc, Path::new("/lib/libtessera.so"), false);
        assert!(
            host_env(&cdi, "u1")
                .unwrap()
                .iter()
                .all(|(k, _)| k != "NVIDIA_VISIBLE_DEVICES")
        );
        assert_eq!(device_id("u1"), "vgpu.tessera.dev/claim=u1");

        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "u1", &s).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, s);
        remove(dir.path(), "u1").unwrap();
        assert!(!p.exists());
        remove(dir.path(), "u1").expect("removing twice is fine");
    }
}
