//! Environment variables that cross a boundary: set by the device plugin,
//! the webhook or `tessera run`, read by the shim or a client.

/// Path of the allocation's control file (the shim reads it).
pub const CONTROL: &str = "TESSERA_CONTROL";
/// Path of the allocation's state file (the shim reads it).
pub const STATE: &str = "TESSERA_STATE";
/// The allocation's id, for humans and tools inside the container.
pub const ALLOCATION: &str = "TESSERA_ALLOCATION";
/// The compute policy a pod asked for (the webhook sets it from the pod's
/// annotation; the device plugin cannot see annotations without the API).
pub const COMPUTE_POLICY: &str = "TESSERA_COMPUTE_POLICY";
/// The shim's log level.
pub const LOG: &str = "TESSERA_LOG";
/// The shim's log file.
pub const LOG_FILE: &str = "TESSERA_LOG_FILE";
/// The manager's socket, for the manager and its clients.
pub const SOCKET: &str = "TESSERA_SOCKET";
/// The dynamic loader's preload list: the shim goes first.
pub const LD_PRELOAD: &str = "LD_PRELOAD";
/// What the NVIDIA container runtime reads to decide which GPUs a container sees.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// The value of [`NVIDIA_VISIBLE_DEVICES`] that means "no GPU, but keep the
/// runtime hooks off".
pub const NO_GPUS: &str = "void";

/// Variables only Tessera may set in a governed container: a pod that sets
/// them itself is refused by the webhook.
pub const RESERVED: [&str; 3] = [CONTROL, STATE, ALLOCATION];
