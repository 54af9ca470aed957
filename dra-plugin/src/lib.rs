//! Tessera's kubelet DRA plugin, driver `vgpu.tessera.dev`: registers with
//! the kubelet's plugin watcher, and prepares each ResourceClaim allocated
//! to it on this node as one manager allocation with the limits the claim
//! was given (one per request for a pod's extended-resource claim whose
//! containers have exact limits of their own), and a CDI spec that puts a
//! container under it; publishes the
//! node's GPUs as ResourceSlices (`slices` or `shared` layout). See
//! `docs/dra.md`.
//!
//! Pure logic (device names, quantities, what a claim asks, which
//! allocations a claim is prepared as, what slices the node has) lives in modules
//! without I/O; tonic and kube stay at the edges (`service`, `registration`,
//! `driver`, `plugin`).

pub mod args;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod driver;
pub mod names;
pub mod plugin;
pub mod publish;
pub mod quantity;
pub mod registration;
mod service;
pub mod slices;
pub mod split;
/// Test doubles (an API server speaking `resource.k8s.io/v1` JSON, the
/// kubelet's plugin watcher): built for tests only.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use args::{DRIVER_NAME, DraPluginArgs};
pub use plugin::{DRA_SOCKET, Error, Options, run};
