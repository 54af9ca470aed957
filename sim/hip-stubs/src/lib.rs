//! Stubs of the ROCm libraries CuPy-ROCm's modules link besides the HIP runtime: hipBLAS,
//! rocBLAS, rocSOLVER, rocFFT, hipFFT, hipSPARSE, hipRAND, RCCL and roctx. The simulated
//! AMD node computes nothing, so these exist only so that `import cupy` loads: every
//! function the wheel references is here and returns 1, each library's first failure
//! status (`*GetErrorString` returns a message instead). The list of functions is
//! generated from the wheel (`regen.sh`); one library serves every soname (the test
//! scripts install it under each name), which the dynamic loader maps once.

#![allow(non_snake_case)]

/// What every stub returns: a failure in each of these libraries' status enums.
pub const STUB_STATUS: std::ffi::c_int = 1;

/// What the `*GetErrorString` stubs return.
pub static NOT_AVAILABLE: &std::ffi::CStr =
    c"not available on the simulated AMD node (tessera-sim-hip-stubs)";

include!(concat!(env!("OUT_DIR"), "/stubs.rs"));

/// The sonames this library stands for, as CuPy-ROCm 13.3's modules name them.
pub const SONAMES: &[&str] = &[
    "libhipblas.so.0",
    "librocblas.so.0",
    "librocsolver.so.0",
    "librocfft.so.0",
    "libhipfft.so",
    "libhipsparse.so.0",
    "libhiprand.so.1",
    "librccl.so.1",
    "libroctx64.so.1",
];
