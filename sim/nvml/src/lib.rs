//! The simulated `libnvidia-ml.so.1`. Filled by issue 2.
