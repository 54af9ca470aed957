//! Tessera's mutating admission webhook: the decision, its certificates and the HTTPS
//! server around it. (Its deployment is the Helm chart, deploy/helm/tessera.)

pub mod admission;
pub mod certs;
pub mod cluster;
pub mod dropin;
pub mod rotate;
pub mod run;
pub mod server;

pub use admission::{mutate, review};
