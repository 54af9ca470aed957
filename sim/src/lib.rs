//! The simulated GPU node: node state in a shared-memory file and a Rust API over it. Filled by issue 2.
