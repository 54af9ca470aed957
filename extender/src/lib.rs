//! Tessera's kube-scheduler extender (`tessera scheduler-extender`): the
//! scheduler's filter, prioritize and bind verbs answered by the placement
//! engine, over a view of the cluster built from what the nodes publish.
//!
//! - [`wire`]: the extender API's JSON.
//! - [`view`]: the decisions, pure: node reports and pod assignments into
//!   the engine's state, a pod's slices into requests, filter, prioritize,
//!   the GPUs chosen at bind.
//! - [`service`]: the verbs over the API server (what they read, what bind
//!   writes).
//! - [`server`]: the HTTP front.
//! - [`mod@run`]: the subcommand's flags and the daemon.

pub mod run;
pub mod server;
pub mod service;
pub mod view;
pub mod wire;

pub use run::{RunError, SchedulerExtenderArgs, run};
