//! gRPC over unix sockets: client channels and listeners.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// A channel to a unix socket that connects on first use and reconnects
/// after the peer restarts.
pub fn unix_channel_lazy(path: &Path) -> Result<Channel, tonic::transport::Error> {
    Ok(endpoint(path)?.connect_lazy())
}

/// A channel to a unix socket, connected now.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    endpoint(path)?.connect().await
}

fn endpoint(path: &Path) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect_timeout(Duration::from_secs(5)))
}

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
