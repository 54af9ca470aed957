//! The shim's core: whether and how this process is governed, and its use
//! of its allocation. It names nothing above it: what it needs from the
//! CUDA wrappers and the compute gate (the gate's set-up at join, the IPC
//! settlement, the driver's pool queries) it is handed as [`Hooks`] when
//! it is set up.
//!
//! One module per job, from the bottom up:
//! - `files`: the allocation's two files, open;
//! - `governed`: the [`Governed`] object, the [`Hooks`] it is handed, and
//!   which allocation device a context or stream is on;
//! - `join`: the membership, the join, the fail-closed line;
//! - `quota`: one reservation or release on the state file;
//! - `pools`: pool and graph-memory accounting;
//! - `admission`: reserve (trimming own pools over the limit) and settle;
//! - `fork`: what fork and exit do to the governor;
//! - `process`: the configuration, the files and the governor of this
//!   process, the entry points (`cuInit`, the launch path's decision) and
//!   the fork and exit handlers.

mod admission;
mod files;
mod fork;
mod governed;
mod join;
mod pools;
mod process;
mod quota;
#[cfg(test)]
pub(crate) mod tests;

pub use files::Files;
pub use governed::{Contexts, Governed, Hooks, PoolDriver, Primary};
pub use join::CUDA_REFUSED;
pub use process::{Launch, config, cuda_entry, cuda_init, files, for_launch, governed};
