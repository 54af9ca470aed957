//! `libtessera.so`, the LD_PRELOAD shim. Filled by issue 3.
