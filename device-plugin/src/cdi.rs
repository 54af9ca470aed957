//! The CDI spec the plugin writes for the node's GPUs, for the `cdi` device-list
//! strategy: kind `tessera.dev/gpu`, one device per GPU UUID, whose edits mount
//! the node-wide files every container under Tessera needs (the hook, and the
//! `ld.so.preload` list when the node config asks for it). The GPU itself (device
//! nodes, driver libraries) comes from the NVIDIA container toolkit's own spec,
//! `nvidia.com/gpu=<uuid>` (`nvidia-ctk cdi generate`); the per-allocation files
//! stay in the Allocate response's mounts (a spec is node-wide, they are not).
//! Format: the Container Device Interface specification, `cdiVersion` 0.6.0.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::allocate::{CDI_KIND_TESSERA as KIND, CONTAINER_HOOK, CONTAINER_PRELOAD, HostPaths};
use crate::state::PluginState;

/// The spec's file name in the CDI spec dir.
pub const SPEC_FILE: &str = "tessera.dev-gpu.json";
/// The spec version written (the oldest that has everything used here).
pub const CDI_VERSION: &str = "0.6.0";

/// The spec for these GPUs.
pub fn spec(uuids: &[&str], host: &HostPaths, ld_so_preload: bool) -> serde_json::Value {
    let mount = |host: &Path, container: &str| {
        serde_json::json!({
            "hostPath": host.display().to_string(),
            "containerPath": container,
            "options": ["ro", "nosuid", "nodev", "bind"],
        })
    };
    let mut mounts = vec![mount(&host.hook_library, CONTAINER_HOOK)];
    if ld_so_preload {
        mounts.push(mount(&host.preload_file, CONTAINER_PRELOAD));
    }
    // The same edits on every device: CDI refuses a device without edits, and a
    // container holding two GPUs gets each mount once (a later mount at the same
    // container path replaces the earlier).
    let devices: Vec<serde_json::Value> = uuids
        .iter()
        .map(|u| serde_json::json!({"name": u, "containerEdits": {"mounts": mounts}}))
        .collect();
    serde_json::json!({"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices})
}

/// Writes `spec` to `dir/SPEC_FILE` unless it already holds exactly that:
/// temp file then rename, so a runtime never reads half a spec.
pub fn write_spec(dir: &Path, spec: &serde_json::Value) -> std::io::Result<bool> {
    let path = dir.join(SPEC_FILE);
    let text = serde_json::to_string_pretty(spec).map_err(std::io::Error::other)? + "\n";
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{SPEC_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(true)
}

/// Keeps the spec in `dir` matching the node's GPUs while the node config's
/// strategy includes `cdi`; removes it when the strategy drops `cdi`.
pub(crate) async fn spec_loop(state: Arc<PluginState>, host: HostPaths, dir: PathBuf) {
    let mut rx = state.subscribe();
    let mut failed = false;
    loop {
        let snap = rx.borrow_and_update().clone();
        let result = if snap.node.device_list_strategy.cdi {
            let uuids: Vec<&str> = snap.gpus.iter().map(|g| g.gpu.uuid.as_str()).collect();
            write_spec(&dir, &spec(&uuids, &host, snap.node.ld_so_preload)).map(|written| {
                if written {
                    tracing::info!(dir = %dir.display(), gpus = uuids.len(), "CDI spec written");
                }
            })
        } else {
            match std::fs::remove_file(dir.join(SPEC_FILE)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        };
        match result {
            Ok(()) => failed = false,
            Err(e) if !failed => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot write the CDI spec");
                failed = true;
            }
            Err(_) => {}
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_names_each_gpu_and_mounts_the_hook() {
        let host = HostPaths::default();
        let s = spec(&["GPU-a", "GPU-b"], &host, true);
        assert_eq!(s["cdiVersion"], "0.6.0");
        assert_eq!(s["kind"], "tessera.dev/gpu");
        let names: Vec<&str> = s["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["GPU-a", "GPU-b"]);
        let mounts = &s["devices"][1]["containerEdits"]["mounts"];
        assert_eq!(mounts[0]["hostPath"], "/var/lib/tessera/lib/libtessera.so");
        assert_eq!(mounts[0]["containerPath"], CONTAINER_HOOK);
        assert_eq!(mounts[1]["containerPath"], "/etc/ld.so.preload");
        let without = spec(&["GPU-a"], &host, false);
        assert_eq!(
            without["devices"][0]["containerEdits"]["mounts"]
                .as_array()
                .expect("mounts")
                .len(),
            1
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("cdi");
        assert!(write_spec(&d, &s).expect("write"));
        assert!(
            !write_spec(&d, &s).expect("same spec"),
            "unchanged: not rewritten"
        );
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(SPEC_FILE)).expect("read"))
                .expect("json");
        assert_eq!(back, s);
        assert!(write_spec(&d, &without).expect("changed"));
    }
}
