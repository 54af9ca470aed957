//! The node manager: the one process per GPU node that owns the truth about
//! which GPUs exist, which allocations hold which parts of them and what each
//! allocation's processes use.
//!
//! - [`config`]: configuration from flags, environment and a YAML file.
//! - [`gpu`], [`nvml`], [`cuda_info`]: the GPU inventory behind a small
//!   trait, over NVML (and the CUDA driver for SM counts).
//! - [`health`]: XID events and lost devices → healthy or not, and back.
//! - [`alloc`]: allocation requests, their validation and their records on disk.
//! - [`procfs`]: host pids of the allocations' processes, from `/proc`.
//! - [`backstop`]: NVML's view of GPU processes against the allocations.
//! - [`metrics`]: the Prometheus exposition and its HTTP responder.
//! - [`daemon`], [`service`]: the running manager and its gRPC API.
//! - [`client`], [`cli`]: the client side (`tessera status`, `top`, `run`).

pub mod alloc;
pub mod arbiter;
pub mod arbitration;
pub mod backstop;
pub mod cli;
pub mod client;
pub mod config;
pub mod cuda_info;
pub mod daemon;
pub mod gpu;
pub mod health;
pub mod metrics;
pub mod nvml;
pub mod procfs;
pub mod service;
pub mod units;

pub use config::{Config, ConfigError, ManagerArgs};
pub use daemon::{Manager, ManagerError};
