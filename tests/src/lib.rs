//! Helpers shared by the end-to-end tests: paths of the built libraries, child processes.
