//! The shared-memory contract between the hook and the manager (control and state files). Filled by issue 3.
