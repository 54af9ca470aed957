//! gRPC over unix sockets: client channels and listeners.

use std::path::Path;

// The client channels are tessera-proto's, shared with every other client.
pub use tessera_proto::unix::{channel as unix_channel, channel_lazy as unix_channel_lazy};

/// Binds a unix socket, replacing a stale socket file left by an earlier run.
pub fn bind_unix(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    tokio::net::UnixListener::bind(path)
}
