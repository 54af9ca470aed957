//! What the daemons call the node they run on.

/// The node's name, set by the chart from the pod's `spec.nodeName` for the
/// manager (metrics, status) and the device plugin (its node's labels).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The kernel's hostname, trimmed (empty if it has none): the node's name
/// when [`NODE_NAME_ENV`] is not set. The manager falls back to `localhost`
/// when it cannot be read; the device plugin refuses to start.
pub fn kernel_hostname() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned())
}
