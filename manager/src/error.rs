//! Why the manager could not start, or stopped.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::alloc::AllocError;
use crate::config::ConfigError;
use crate::gpu::GpuError;

/// Why the manager could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the GPU inventory: {0}")]
    Gpu(GpuError),
    #[error(
        "state directory {path}: {error} (the manager must be able to write there, usually as \
         root; choose another with --state-dir)"
    )]
    StateDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("another manager is running on state directory {0} (it holds manager.lock)")]
    Locked(PathBuf),
    #[error("another manager is already serving on {0}; stop it first or choose another --socket")]
    SocketInUse(PathBuf),
    #[error("cannot listen on {path}: {error}{hint}")]
    Socket {
        path: PathBuf,
        error: std::io::Error,
        hint: &'static str,
    },
    #[error("socket group {0:?} does not exist")]
    NoSuchGroup(String),
    #[error("cannot serve metrics on {addr}: {error} (choose another --metrics-addr, or off)")]
    Metrics {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("loading allocations: {0}")]
    Alloc(AllocError),
    #[error("gRPC server: {0}")]
    Serve(String),
    #[error("compute arbiter: {0}")]
    Arbiter(String),
}

impl From<GpuError> for ManagerError {
    fn from(e: GpuError) -> Self {
        ManagerError::Gpu(e)
    }
}

impl From<AllocError> for ManagerError {
    fn from(e: AllocError) -> Self {
        ManagerError::Alloc(e)
    }
}
