//! The kubelet device plugin. Filled by issue 6.
