//! The node manager: the one process per GPU node that owns the truth about
//! which GPUs exist, which allocations hold which parts of them and what each
//! allocation's processes use.
//!
//! - [`config`]: configuration from flags, environment and a YAML file.
//! - [`gpu`], [`nvml`], [`cuda_info`], [`rocm_smi`], [`vendors`]: the GPU
//!   inventory behind a small trait (the vendor seam), over NVML (and the
//!   CUDA driver for SM counts) and ROCm SMI, both on a mixed node.
//! - [`health`]: XID events and lost devices → healthy or not, and back.
//! - [`alloc`]: allocation requests and their validation; [`store`]: their
//!   records on disk and the open files of the ones served; [`wire`]: their
//!   form in the API.
//! - [`arbiter`]: compute-time slices, behind the [`arbiter::Arbitration`]
//!   trait it owns (it knows allocations only as their files).
//! - [`core`]: the shared state and the allocation operations;
//!   [`report`]: node status and metrics from it.
//! - [`reaper`] (with [`procfs`]): host pids of the allocations' processes,
//!   dead ones reclaimed; [`sampler`] (with [`enforce`]): samples, health
//!   and NVML's view of GPU processes against the allocations they are
//!   proven to be in ([`identity`], from `/proc`, never the state file),
//!   judged by the pure [`backstop`].
//! - [`listeners`] (gRPC socket, [`metrics`] over HTTP), [`service`] (the
//!   gRPC API) and [`daemon`] (start, serve, stop; [`idle`]: the private
//!   manager's exit when idle) put it together.
//!
//! The client side (`tessera status`, `top`, `run`) is the `tessera-client`
//! crate; what every part shares is `tessera-contract`.
//!
//! Modules depend downwards only (no cycle): daemon → listeners →
//! {service, metrics} → report → core; reaper, sampler → enforce → core
//! (enforce → {backstop, identity}, both of which import nothing of it); core →
//! {store, wire, arbiter} → alloc → {gpu, config}. The arbiter imports
//! nothing of the manager (config holds its `ArbiterConfig`).

pub mod alloc;
pub mod arbiter;
pub mod backstop;
pub mod config;
pub mod core;
pub mod cuda_info;
pub mod daemon;
pub mod enforce;
pub mod error;
pub mod gpu;
pub mod health;
pub mod identity;
pub mod idle;
pub mod listeners;
pub mod metrics;
pub mod nvml;
pub mod procfs;
pub mod reaper;
pub mod report;
pub mod rocm_smi;
pub mod sampler;
pub mod service;
pub mod store;
pub mod vendors;
pub mod wire;

pub use config::{Config, ConfigError, ManagerArgs};
pub use daemon::Manager;
pub use error::ManagerError;
