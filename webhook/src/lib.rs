//! The mutating admission webhook. Filled by issue 7.
