//! The node manager. Filled by issues 4 and 5.
