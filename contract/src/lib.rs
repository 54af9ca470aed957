//! The contract every part of Tessera shares: the paths inside a container,
//! the labels an allocation carries, compute policies and their names, and
//! the one syntax for sizes, shares and durations. The shim links this crate,
//! so it stays synchronous with no dependency beyond `thiserror`.

pub mod labels;
pub mod paths;
pub mod policy;
pub mod units;

pub use policy::Policy;
