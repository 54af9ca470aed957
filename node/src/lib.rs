//! What Tessera's kubelet plugins share on a node: the device plugin
//! (`tessera-device-plugin`) and the DRA plugin both read the same node
//! config, write CDI specs that carry the shim, and talk to the same manager.
//!
//! - [`args`]: the command-line flags both plugins take for the node (its
//!   name, config file, manager socket, the shim's host paths, CDI dir).
//! - [`config`]: the node config file (`default`, `overrides` chosen by node
//!   name and labels, `gpuClasses`), parsed and validated with errors that
//!   name the field, and resolved for one node ([`config::Config::resolve`]).
//! - [`selector`]: the Kubernetes label selectors of the config's overrides.
//! - [`cdi`]: Container Device Interface specs: any set of named devices with
//!   their container edits, written atomically to a spec directory.
//! - [`edits`]: a container's environment and mounts for one allocation,
//!   from the manager's answer (both plugins' one way to build them).
//! - [`reload`]: the node config file read again when it changes (both
//!   plugins' one hot-reload, one set of rules).
//! - [`kube`]: the Kubernetes client both plugins build, one way.
//! - [`manager`]: the manager API as a plugin uses it ([`manager::ManagerApi`],
//!   a trait so logic can be tested against a fake) and its gRPC client
//!   ([`manager::GrpcManager`]).
//! - [`scheduling`]: the node's GPU report and a pod's GPU assignment, the
//!   JSON the device plugin and the scheduler extender exchange.
//!
//! `config`, `selector` and the spec building in `cdi` do no I/O but
//! [`config::Config::load`] and the spec file functions.

pub mod args;
pub mod cdi;
pub mod config;
pub mod edits;
pub mod kube;
pub mod manager;
pub mod reload;
pub mod scheduling;
pub mod selector;
/// A fake manager for the plugins' tests (fault injection): built for
/// tests only, never into the release binary.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
