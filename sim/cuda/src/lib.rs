//! The simulated `libcuda.so.1`. Filled by issue 2.
