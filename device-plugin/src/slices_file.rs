//! The node's slice count per GPU, published for the manager: the plugin
//! resolves the node config (overrides by node name and labels, the slice
//! size against each GPU's memory), so it is the one that knows; it writes
//! `{"gpus": {"<uuid>": <slices>}}` to [`SLICES_FILE`] beside the manager's
//! socket, and the manager's slice metrics read it. One count, set in one
//! place (the node config), no manager flag to keep in sync.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use tessera_contract::paths::SLICES_FILE;

use crate::state::{PluginState, Snapshot};

/// Where the file goes for a manager on `manager_socket`.
pub fn path_for(manager_socket: &Path) -> PathBuf {
    manager_socket.with_file_name(SLICES_FILE)
}

/// The file's contents for a snapshot.
pub fn contents(snap: &Snapshot) -> serde_json::Value {
    let gpus: BTreeMap<&str, u32> = snap
        .gpus
        .iter()
        .map(|g| (g.gpu.uuid.as_str(), g.layout.slices))
        .collect();
    serde_json::json!({ "gpus": gpus })
}

/// Keeps the file in step with the config and the GPUs; temp file then
/// rename, so the manager never reads half of it.
pub(crate) async fn publish_loop(state: Arc<PluginState>, path: PathBuf) {
    let mut rx = state.subscribe();
    let mut last = None;
    let mut failed = false;
    loop {
        let snap = rx.borrow_and_update().clone();
        let text = contents(&snap).to_string();
        if !snap.gpus.is_empty() && last.as_ref() != Some(&text) {
            match tessera_contract::file::write_durably(&path, text.as_bytes(), 0o644) {
                Ok(()) => {
                    failed = false;
                    last = Some(text);
                }
                Err(e) if !failed => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot publish the slice counts for the manager");
                    failed = true;
                }
                Err(_) => {}
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
