//! Names on Kubernetes objects (the extended resource, pod annotations,
//! node labels) and the labels an allocation carries in the manager.

use std::collections::BTreeMap;

/// The extended resource a container requests: a count of slices.
pub const RESOURCE: &str = "tessera.dev/vgpu";

/// A slice count of [`RESOURCE`]: a plain positive decimal integer. The API
/// server hands quantities over in canonical form, so `2000m` arrives as
/// `2`, while `500m` or `1.5` stay fractional (and are refused).
pub fn parse_slices(q: &str) -> Option<u32> {
    let q = q.trim();
    if q.is_empty() || !q.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    q.parse::<u32>().ok().filter(|&n| n > 0)
}
/// Pod annotation: the compute policy the pod asks for (`guaranteed` | `burst`).
pub const ANNOTATION_COMPUTE_POLICY: &str = "tessera.dev/compute-policy";
/// Pod annotation: the allocation's priority for burst time, an integer in
/// [`PRIORITY_MIN`]`..=`[`PRIORITY_MAX`] (higher first; 0 when unset). The
/// device plugin applies it, and a later change of it, with the manager's
/// ResizeAllocation.
pub const ANNOTATION_PRIORITY: &str = "tessera.dev/priority";
/// The lowest priority the manager accepts.
pub const PRIORITY_MIN: i32 = -1000;
/// The highest priority the manager accepts.
pub const PRIORITY_MAX: i32 = 1000;
/// Pod annotation: the GPU class the pod must run on.
pub const ANNOTATION_GPU_CLASS: &str = "tessera.dev/gpu-class";
/// Pod annotation: the vendor whose GPUs the pod's slices must be on (`nvidia`,
/// `amd`, `hygon`); the webhook sets it when it translates a vendor's own words
/// (HAMi's `amd.com/gpumem`, ...), and a user may set it.
pub const ANNOTATION_GPU_VENDOR: &str = "tessera.dev/gpu-vendor";
/// Annotation naming a container's allocation (for the runtime and humans).
pub const ANNOTATION_ALLOCATION: &str = "tessera.dev/allocation";
/// Node label: the node's GPU class.
pub const NODE_GPU_CLASS: &str = "tessera.dev/gpu-class";
/// Node label: the GPU product name.
pub const NODE_GPU_PRODUCT: &str = "tessera.dev/gpu-product";
/// Node label: the GPU memory.
pub const NODE_GPU_MEMORY: &str = "tessera.dev/gpu-memory";
/// Node label: how many slices each GPU is cut into.
pub const NODE_SLICES_PER_GPU: &str = "tessera.dev/slices-per-gpu";
/// Node labels, one per GPU model on the node (a mixed node has several):
/// this prefix and the model's name as a label value
/// (`gpu-product.tessera.dev/AMD-Instinct-MI210`), the value how many GPUs
/// of it the node has. [`NODE_GPU_PRODUCT`] and the others above describe
/// GPU 0 only.
pub const NODE_GPU_MODEL_PREFIX: &str = "gpu-product.tessera.dev/";
/// The label value a GPU model's name becomes in [`NODE_GPU_MODEL_PREFIX`]'s labels:
/// `NVIDIA A100-SXM4-80GB` → `NVIDIA-A100-SXM4-80GB` (anything but letters, digits, `-`,
/// `_` and `.` becomes `-`, ends trimmed to a letter or digit, at most 63 characters).
pub fn model_label_value(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut: String = trimmed.chars().take(63).collect();
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}
/// Node labels, one per GPU model on the node: this prefix and the model's
/// name, the value its memory in MiB (the smallest of its GPUs').
pub const NODE_GPU_MODEL_MEMORY_PREFIX: &str = "gpu-memory.tessera.dev/";

/// Node annotation: the node's GPUs as its device plugin last reported them
/// (JSON, `tessera_node::scheduling::NodeReport`), for the scheduler extender.
pub const NODE_GPU_REPORT: &str = "tessera.dev/gpu-report";
/// Pod annotation: the GPUs the scheduler extender chose for each container
/// (JSON, `tessera_node::scheduling::Assignment`). Only the extender writes
/// it; the webhook refuses a pod created with it.
pub const ANNOTATION_GPU_ASSIGNMENT: &str = "tessera.dev/gpu-assignment";
/// Pod annotation: the containers (comma-separated names) whose assignment
/// the device plugin has served, so that the next Allocate of the same size
/// goes to the next pod. Only the device plugin writes it.
pub const ANNOTATION_GPU_ALLOCATED: &str = "tessera.dev/gpu-allocated";

/// Allocation label: who created the allocation.
pub const SOURCE: &str = "source";
/// The value of [`SOURCE`] for `tessera run`.
pub const SOURCE_CLI: &str = "cli";
/// The value of [`SOURCE`] for the device plugin (only those are its to
/// garbage-collect).
pub const SOURCE_DEVICE_PLUGIN: &str = "device-plugin";
/// The value of [`SOURCE`] for `tessera demo`.
pub const SOURCE_DEMO: &str = "demo";
/// The `tessera run` process's pid.
pub const CLI_PID: &str = "cli-pid";
/// The inode of its pid namespace.
pub const CLI_PIDNS: &str = "cli-pidns";
/// Its start time (clock ticks since boot), so a reused pid is not mistaken.
pub const CLI_START: &str = "cli-start";

/// Set by the manager alone (a request's own value is dropped): the
/// allocation's `cli-*` labels name the process the kernel says created it
/// (the peer of the connection), never what the request said, and the
/// manager deletes the allocation once that process and the allocation's
/// own processes are gone. `tessera run` execs its command only when the
/// answer carries it; otherwise it waits and deletes the allocation itself.
pub const CLI_TRACKED: &str = "cli-tracked";

/// The `tessera run` process behind an allocation, from its labels, so
/// the manager can delete the allocation should that process die without
/// doing so itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOwner {
    pub pid: u32,
    pub pidns: u64,
    pub start_time: u64,
}

impl RunOwner {
    /// Labels: `source=cli`, `cli-pid`, `cli-pidns`, `cli-start`.
    pub fn labels(&self) -> [(String, String); 4] {
        [
            (SOURCE.into(), SOURCE_CLI.into()),
            (CLI_PID.into(), self.pid.to_string()),
            (CLI_PIDNS.into(), self.pidns.to_string()),
            (CLI_START.into(), self.start_time.to_string()),
        ]
    }

    /// The owner, when the labels are a `tessera run`'s and well formed.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<Self> {
        if labels.get(SOURCE).map(String::as_str) != Some(SOURCE_CLI) {
            return None;
        }
        Some(RunOwner {
            pid: labels.get(CLI_PID)?.parse().ok()?,
            pidns: labels.get(CLI_PIDNS)?.parse().ok()?,
            start_time: labels.get(CLI_START)?.parse().ok()?,
        })
    }
}

/// The priority a [`ANNOTATION_PRIORITY`] value names; the error is one
/// line naming the value and what is accepted.
pub fn parse_priority(value: &str) -> Result<i32, String> {
    value
        .parse::<i32>()
        .ok()
        .filter(|p| (PRIORITY_MIN..=PRIORITY_MAX).contains(p))
        .ok_or_else(|| {
            format!(
                "annotation {ANNOTATION_PRIORITY}={value:?} is not a priority; use a whole number in {PRIORITY_MIN}..={PRIORITY_MAX}, like \"10\""
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_owner_round_trips_and_ignores_other_sources() {
        let me = RunOwner {
            pid: 42,
            pidns: 4026531836,
            start_time: 777,
        };
        let labels: BTreeMap<String, String> = me.labels().into_iter().collect();
        assert_eq!(RunOwner::from_labels(&labels), Some(me));
        let mut other = labels.clone();
        other.insert(SOURCE.into(), "kubelet".into());
        assert_eq!(RunOwner::from_labels(&other), None);
        let mut broken = labels;
        broken.insert(CLI_PID.into(), "x".into());
        assert_eq!(RunOwner::from_labels(&broken), None);
    }

    #[test]
    fn priorities_parse_within_the_managers_range_only() {
        assert_eq!(parse_priority("10"), Ok(10));
        assert_eq!(parse_priority("-1000"), Ok(-1000));
        assert_eq!(parse_priority("1000"), Ok(1000));
        for bad in ["1001", "-1001", "high", "", "1.5", " 5", "99999999999"] {
            let e = parse_priority(bad).expect_err(bad);
            assert!(e.contains("-1000..=1000"), "{e}");
        }
    }
}
