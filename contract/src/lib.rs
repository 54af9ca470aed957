//! The contract every part of Tessera shares, in one place so the parts
//! cannot drift apart: the paths inside a container ([`paths`]), the
//! environment variables that cross a boundary ([`env`](mod@env)), names on
//! other GPU-sharing projects' pod specs that the webhook translates
//! ([`dropin`]), names on
//! Kubernetes objects and allocation labels ([`labels`]), the node's name
//! ([`node`]), compute policies
//! ([`policy`]), GPU vendors and an AMD GPU's UUID ([`vendor`]), the one rule for which GPUs a pod may have ([`gpu_filter`]), the one
//! syntax for sizes, percentages and durations ([`units`]), the spelling of
//! GPU UUIDs ([`uuid`]), the one running estimate lengths are learned with
//! ([`estimate`]) and the one way a file is replaced atomically and durably ([`file`](mod@file)). The shim links this
//! crate, so it stays synchronous with no dependency beyond `thiserror`; the
//! daemons' YAML config reading (module `yaml`, behind the feature `yaml`) is
//! the one optional part.

pub mod dropin;
pub mod env;
pub mod estimate;
pub mod file;
pub mod gpu_filter;
pub mod labels;
pub mod node;
pub mod paths;
pub mod policy;
pub mod units;
pub mod uuid;
pub mod vendor;
#[cfg(feature = "yaml")]
pub mod yaml;

pub use estimate::quarter_average;
pub use policy::Policy;
pub use uuid::format_uuid;
pub use vendor::Vendor;
