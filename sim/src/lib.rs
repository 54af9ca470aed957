//! The simulated GPU node: node state in a shared-memory file and a Rust API over it.
//!
//! Every process of a simulated node maps one state file (`TESSERA_SIM_STATE`, see
//! [`node::state_path_from_env`]). It holds the devices' configuration, each device's
//! execution-engine timeline and busy history, each process's memory and busy time, and
//! XID events. The simulated `libcuda.so.1` and `libnvidia-ml.so.1` (crates
//! `tessera-sim-cuda`, `tessera-sim-nvml`) work on its NVIDIA devices, the simulated
//! `libamdhip64.so.5` (`tessera-sim-hip`) on its AMD ones ([`Vendor`]); tests,
//! benchmarks and the demo read it through [`Node`] as ground truth. See
//! `docs/simulator.md`.

pub mod clock;
pub mod config;
pub mod costs;
pub mod image;
pub mod layout;
pub mod libs;
pub mod module;
pub mod node;
pub mod process;

pub use config::{ConfigError, GpuModel, GpuSpec, NodeConfig, Vendor};
pub use costs::DriverCosts;
pub use libs::{LibDir, LibError, install_hip_lib_dir, install_lib_dir};
pub use node::{
    DeviceInfo, DeviceUsage, Node, NodeError, ProcessUsage, XidEvent, default_state_path,
    state_path_from_env,
};

/// Exports one C function under several ABI names (`cuCtxDestroy` and `cuCtxDestroy_v2`,
/// `nvmlInit` and `nvmlInit_v2`): one body and one set of docs, and still a function of
/// its own per name, as the real libraries have (the tests of `cuGetProcAddress` tell
/// the entries apart by address).
///
/// ```ignore
/// tessera_sim::exports! {
///     /// `cuCtxDestroy`, `cuCtxDestroy_v2`.
///     ///
///     /// # Safety
///     /// Any handle value is accepted; unknown ones are reported.
///     fn [cuCtxDestroy, cuCtxDestroy_v2](ctx: CUcontext) -> CUresult {
///         guard(|| ctx_destroy(ctx))
///     }
/// }
/// ```
#[macro_export]
macro_rules! exports {
    ($($(#[$attr:meta])* fn [$($name:ident),+] $params:tt -> $ret:ty $body:block)*) => {
        $($crate::exports!(@each [$(#[$attr])*] [$($name),+] $params $ret $body);)*
    };
    (@each $attrs:tt [$($name:ident),+] $params:tt $ret:ty $body:block) => {
        $($crate::exports!(@one $attrs $name $params $ret $body);)+
    };
    (@one [$(#[$attr:meta])*] $name:ident $params:tt $ret:ty $body:block) => {
        $(#[$attr])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name $params -> $ret $body
    };
}
