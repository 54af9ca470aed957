//! The device plugin's node-wide CDI spec, for the `cdi` device-list
//! strategy: kind `tessera.dev/gpu`, one device per GPU UUID, whose edits
//! mount the node-wide files every container under Tessera needs (the hook,
//! and the `ld.so.preload` list when the node config asks for it). The
//! per-allocation files stay in the Allocate response's mounts (a spec is
//! node-wide, they are not). Building and writing specs: [`tessera_node::cdi`].

use std::path::PathBuf;
use std::sync::Arc;

use tessera_node::cdi::{self as spec_file, ContainerEdits, Device, HostPaths, KIND_TESSERA, Spec};

use crate::state::PluginState;

/// The spec's file name in the CDI spec dir.
pub const SPEC_FILE: &str = "tessera.dev-gpu.json";

/// The spec for these GPUs.
pub fn spec(uuids: &[&str], host: &HostPaths, ld_so_preload: bool) -> Spec {
    // The same edits on every device: CDI refuses a device without edits, and a
    // container holding two GPUs gets each mount once (a later mount at the same
    // container path replaces the earlier).
    let edits = ContainerEdits {
        env: Default::default(),
        mounts: spec_file::shim_mounts(host, ld_so_preload),
    };
    Spec {
        kind: KIND_TESSERA.to_owned(),
        devices: uuids
            .iter()
            .map(|u| Device {
                name: (*u).to_owned(),
                edits: edits.clone(),
            })
            .collect(),
    }
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
            spec_file::write_spec(
                &dir,
                SPEC_FILE,
                &spec(&uuids, &host, snap.node.ld_so_preload),
            )
            .map(|written| {
                if written {
                    tracing::info!(dir = %dir.display(), gpus = uuids.len(), "CDI spec written");
                }
            })
        } else {
            spec_file::remove_spec(&dir, SPEC_FILE).map(drop)
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
    use tessera_contract::paths::CONTAINER_HOOK_LIBRARY;

    #[test]
    fn spec_names_each_gpu_and_mounts_the_hook() {
        let host = HostPaths::default();
        let s = spec(&["GPU-a", "GPU-b"], &host, true).to_json();
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
        assert_eq!(mounts[0]["containerPath"], CONTAINER_HOOK_LIBRARY);
        assert_eq!(mounts[1]["containerPath"], "/etc/ld.so.preload");
        let without = spec(&["GPU-a"], &host, false).to_json();
        assert_eq!(
            without["devices"][0]["containerEdits"]["mounts"]
                .as_array()
                .expect("mounts")
                .len(),
            1
        );
    }
}
