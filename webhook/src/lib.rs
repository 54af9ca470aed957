//! Tessera's mutating admission webhook: the decision, its certificates, the HTTPS server
//! around it, and the deployment manifests it ships with.

pub mod admission;
pub mod certs;
pub mod cluster;
pub mod manifests;
pub mod rotate;
pub mod run;
pub mod server;
pub mod template;

pub use admission::{mutate, review};
