//! Tessera's kube-scheduler extender (`tessera scheduler-extender`): the
//! scheduler's filter, prioritize and bind verbs answered by the placement
//! engine, over a view of the cluster built from what the nodes publish.
//!
//! - [`wire`]: the extender API's JSON.
//! - [`view`]: the decisions, pure: node reports and pod assignments into
//!   the engine's state, a pod's slices into requests, filter, prioritize,
//!   the GPUs chosen at bind.
//! - [`dra`]: the decisions for pods with ResourceClaims, pure: the
//!   driver's ResourceSlices and allocated claims into the engine's state.
//! - [`cache`]: the watched view of the cluster and how fresh it is.
//! - [`service`]: the verbs over the view (what they read, what bind
//!   writes).
//! - [`server`]: the HTTP front.
//! - [`mod@run`]: the subcommand's flags and the daemon.

pub mod cache;
pub mod dra;
pub mod run;
pub mod server;
pub mod service;
pub mod view;
pub mod wire;

pub use run::{RunError, SchedulerExtenderArgs, run};
