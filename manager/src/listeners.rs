//! The manager's listeners: the gRPC API on a unix socket (bound so that a
//! live manager's socket is never stolen) and the metrics endpoint.

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use tessera_proto::manager::v1 as pb;

use crate::core::Core;
use crate::error::ManagerError;
use crate::metrics;
use crate::service::ManagerService;

fn socket_err(path: &Path, error: std::io::Error) -> ManagerError {
    let hint = if error.kind() == std::io::ErrorKind::PermissionDenied {
        " (run the manager as root, or choose a --socket in a directory you can write)"
    } else {
        ""
    };
    ManagerError::Socket {
        path: path.to_owned(),
        error,
        hint,
    }
}

/// Binds the gRPC socket, refusing to steal one a live manager serves.
pub(crate) fn bind_socket(
    path: &Path,
    group: Option<&str>,
) -> Result<(tokio::net::UnixListener, u64), ManagerError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(socket_err(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket",
                ),
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ManagerError::SocketInUse(path.to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                // Left by a manager that died: nobody listens.
                std::fs::remove_file(path).map_err(|e| socket_err(path, e))?;
            }
            Err(e) => return Err(socket_err(path, e)),
        }
    }
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).map_err(|e| socket_err(path, e))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| socket_err(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| socket_err(path, e))?;
    if let Some(name) = group {
        let g = nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .ok_or_else(|| ManagerError::NoSuchGroup(name.to_owned()))?;
        nix::unistd::chown(path, None, Some(g.gid))
            .map_err(|e| socket_err(path, std::io::Error::from(e)))?;
    }
    let ino = std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0);
    Ok((listener, ino))
}

/// Whether `path` is still the socket [`bind_socket`] made (inode `ino`):
/// not removed, and not replaced by a successor's.
pub(crate) fn socket_is_ours(path: &Path, ino: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.ino() == ino)
}

/// Binds the metrics listener; returns it with the address really bound
/// (the port chosen when 0 was asked for).
pub(crate) async fn bind_metrics(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, Option<SocketAddr>), ManagerError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| ManagerError::Metrics { addr, error })?;
    let bound = l.local_addr().ok();
    Ok((l, bound))
}

/// Serves metrics from `core` on `listener` until `stop` turns true.
pub(crate) fn serve_metrics(
    listener: tokio::net::TcpListener,
    core: Arc<Core>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(metrics::serve(listener, move || core.metrics_text(), stop))
}

/// Serves the manager API from `core` on `listener` until `stop` turns true.
pub(crate) fn serve_grpc(
    listener: tokio::net::UnixListener,
    core: Arc<Core>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    let service = ManagerService::new(core, stop.clone());
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let mut stop_for_grpc = stop;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::manager_server::ManagerServer::new(service))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_for_grpc.wait_for(|s| *s).await;
            }),
    )
}
