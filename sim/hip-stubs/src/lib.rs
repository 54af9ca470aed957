//! Stubs of the ROCm libraries CuPy-ROCm's modules link besides the HIP runtime: hipBLAS,
//! rocBLAS, rocSOLVER, rocFFT, hipFFT, hipSPARSE, hipRAND, RCCL and roctx. The simulated
//! AMD node computes nothing, so these exist only so that `import cupy` loads: every
//! function the wheel references is here and returns 1, each library's first failure
//! status (`*GetErrorString` returns a message instead). The list of functions is
//! generated from the wheel (`regen.sh`); one library serves every soname (installed
//! under each of `tessera_sim::libs::HIP_STUB_NAMES`), which the dynamic loader maps once.

#![allow(non_snake_case)]

/// What every stub returns: a failure in each of these libraries' status enums.
pub const STUB_STATUS: std::ffi::c_int = 1;

/// What the `*GetErrorString` stubs return.
pub static NOT_AVAILABLE: &std::ffi::CStr =
    c"not available on the simulated AMD node (tessera-sim-hip-stubs)";

include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
