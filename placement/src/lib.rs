//! Tessera's placement engine: a pure function of a cluster's state and a
//! request → a node and the GPUs on it, per policy. No I/O, no async: the
//! scheduler extender, `tessera simulate` and the device plugin's in-node
//! choice all call it.
//!
//! - [`cluster`]: the state (nodes, GPUs) and the request types.
//! - [`frag`]: the task mix a cluster expects and the fragmentation measure
//!   over it (the FGD paper's definition).
//! - [`policy`]: the policies and how each scores a candidate.
//! - [`slices`]: GPUs cut into slices and requests for slices, as the engine
//!   sees them (the extender's and the device plugin's one adapter).
//! - [`in_node`]: the choice among one node's GPUs for a request of slices,
//!   one GPU or several (the device plugin's GetPreferredAllocation).
//! - [`engine`]: the index (per kind of request, the nodes in rank order) and
//!   the decision over it.

pub mod cluster;
pub mod engine;
pub mod frag;
pub mod in_node;
pub mod policy;
pub mod slices;

pub use cluster::{Choice, Gpu, GpuNeed, MemoryNeed, Node, Request};
pub use engine::{Engine, PlaceError, Rank};
pub use frag::{MixEntry, TaskMix, TaskType};
pub use policy::{DefragParts, Policy, PolicyError};
