//! The Kubernetes device plugin: advertises GPU slices as `tessera.dev/vgpu`
//! devices (`<gpu-uuid>::<n>`), places requests on GPUs, and turns each
//! Allocate into a manager allocation. See `docs/device-plugin.md`.
//!
//! The node config, the CDI spec writer and the manager client are
//! `tessera-node`'s, shared with the DRA plugin. Pure logic (placement,
//! allocation plans, PodResources decisions) lives in modules with no I/O;
//! tonic and kube stay at the edges (`edge`: the Kubernetes and PodResources
//! adapters; `service`, `registration`, `plugin`).

pub mod allocate;
pub mod args;
pub mod assignment;
pub mod cdi;
pub mod constraints;
pub mod device_id;
mod edge;
pub mod gpu_report;
pub mod grpc;
pub mod inventory;
pub mod kai;
pub mod node_labels;
pub mod passes;
pub mod placement;
pub mod plugin;
pub mod pod_resources;
pub mod refusal;
pub mod registration;
mod service;
pub mod slices_file;
pub mod state;
mod stream;
/// Test doubles (kubelet, PodResources, manager, pods) on real unix sockets:
/// built for tests only, never into the release binary.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use plugin::{Error, Options, RESOURCE_NAME, SOCKET_NAME, run, run_with_pods};
pub use service::plugin_options;
