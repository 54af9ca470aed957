//! Where an allocation's files appear inside a container (the device plugin
//! and `tessera run` mount or hand them there; the shim looks there first),
//! and the defaults of the files on the node that go with them.

/// The shim inside a container.
pub const CONTAINER_HOOK_LIBRARY: &str = "/usr/local/lib/tessera/libtessera.so";
/// The allocation's control file inside a container (read-only mount).
pub const CONTAINER_CONTROL: &str = "/run/tessera/alloc/control";
/// The allocation's state file inside a container.
pub const CONTAINER_STATE: &str = "/run/tessera/alloc/state";
/// The loader's preload list inside a container, when the device plugin
/// mounts one naming the shim.
pub const CONTAINER_PRELOAD: &str = "/etc/ld.so.preload";

/// The shim on the node (the chart installs it there): the default of the
/// manager's and the device plugin's hook library.
pub const HOST_HOOK_LIBRARY: &str = "/var/lib/tessera/lib/libtessera.so";
/// The node's `ld.so.preload` file that the device plugin mounts at
/// [`CONTAINER_PRELOAD`] (default).
pub const HOST_PRELOAD_FILE: &str = "/run/tessera/ld.so.preload";

/// The slice count of each GPU on a node, as the device plugin resolves its node
/// config (`{"gpus": {"<uuid>": <slices>}}`): written by the plugin next to the
/// manager's socket, read by the manager for its slice metrics and status, so the
/// node's one slice count reaches both.
pub const SLICES_FILE: &str = "slices.json";
