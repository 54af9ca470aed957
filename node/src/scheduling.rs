//! What a node and the scheduler extender tell each other through the
//! Kubernetes API: the node's GPU report (a node annotation the device
//! plugin writes) and a pod's GPU assignment (a pod annotation the extender
//! writes at bind and the device plugin serves). Both are JSON; parsing
//! checks every field, since anyone able to write the object wrote them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The version of both formats; a reader refuses another.
pub const FORMAT_VERSION: u32 = 1;

/// A node's GPUs as its device plugin last saw them
/// (annotation `tessera.dev/gpu-report`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeReport {
    pub version: u32,
    /// When it was written, seconds since the Unix epoch: a report older
    /// than the extender's deadline makes the node unknown, not empty.
    pub at: u64,
    pub gpus: Vec<GpuReport>,
}

impl GpuReport {
    /// The GPU's vendor: NVIDIA's when the report names none; `None` for a name
    /// this build does not know (such a GPU matches no vendor a pod asks for).
    pub fn vendor(&self) -> Option<tessera_contract::Vendor> {
        if self.vendor.is_empty() {
            return Some(tessera_contract::Vendor::Nvidia);
        }
        self.vendor.parse().ok()
    }
}

/// One GPU in a [`NodeReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuReport {
    pub uuid: String,
    /// Product name (`NVIDIA A100-SXM4-80GB`).
    pub model: String,
    /// `amd` or `hygon`; empty (and left out of the JSON, so an extender older than
    /// vendors still reads an all-NVIDIA node's report) for NVIDIA's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    /// The GPU class from the node config; empty if none.
    #[serde(default)]
    pub class: String,
    pub memory_mib: u64,
    /// Slices it is cut into under the config in force.
    pub slices: u32,
    /// Slices held by allocations on the node when the report was written.
    pub used_slices: u32,
    /// The part of `used_slices` held by known pods, by `namespace/name`:
    /// a reader adds the slices of pods bound since (which the report
    /// cannot count yet) without counting twice the ones it already does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pods: BTreeMap<String, u32>,
    /// Mean utilization (0..=1) lately; absent before a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// False while the GPU (or the node's manager) is unhealthy.
    pub healthy: bool,
}

/// The GPUs the extender chose for a pod (annotation
/// `tessera.dev/gpu-assignment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    pub version: u32,
    /// The node it was chosen on; it holds only while the pod is bound there.
    pub node: String,
    pub containers: Vec<ContainerAssignment>,
}

/// One container's GPUs in an [`Assignment`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerAssignment {
    pub name: String,
    pub gpus: Vec<GpuTake>,
}

/// Slices of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuTake {
    pub uuid: String,
    pub slices: u32,
}

impl ContainerAssignment {
    /// Slices over all its GPUs.
    pub fn slices(&self) -> u32 {
        self.gpus.iter().map(|g| g.slices).sum()
    }
}

/// A report or an assignment that is not one.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("not valid JSON of the expected shape: {0}")]
    Json(String),
    #[error("format version {0}, this build reads {FORMAT_VERSION}")]
    Version(u32),
    #[error("{0}")]
    Invalid(String),
}

impl NodeReport {
    /// Parses and checks a report.
    pub fn parse(s: &str) -> Result<NodeReport, FormatError> {
        let r: NodeReport =
            serde_json::from_str(s).map_err(|e| FormatError::Json(e.to_string()))?;
        if r.version != FORMAT_VERSION {
            return Err(FormatError::Version(r.version));
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &r.gpus {
            let bad = |why: &str| FormatError::Invalid(format!("GPU {:?}: {why}", g.uuid));
            if g.uuid.is_empty() || !seen.insert(g.uuid.as_str()) {
                return Err(bad("empty or repeated UUID"));
            }
            if g.slices == 0 || g.used_slices > g.slices {
                return Err(bad("no slices, or more used than it has"));
            }
            if g.pods.values().map(|&n| u64::from(n)).sum::<u64>() > u64::from(g.used_slices) {
                return Err(bad("its pods hold more slices than it has used"));
            }
            if g.utilization.is_some_and(|u| !(0.0..=1.0).contains(&u)) {
                return Err(bad("utilization outside 0..1"));
            }
        }
        Ok(r)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }
}

impl Assignment {
    /// Parses and checks an assignment.
    pub fn parse(s: &str) -> Result<Assignment, FormatError> {
        let a: Assignment =
            serde_json::from_str(s).map_err(|e| FormatError::Json(e.to_string()))?;
        if a.version != FORMAT_VERSION {
            return Err(FormatError::Version(a.version));
        }
        for c in &a.containers {
            let mut seen = std::collections::BTreeSet::new();
            for g in &c.gpus {
                if g.slices == 0 || g.uuid.is_empty() || !seen.insert(g.uuid.as_str()) {
                    return Err(FormatError::Invalid(format!(
                        "container {:?}: GPU {:?} with no slices, no UUID, or twice",
                        c.name, g.uuid
                    )));
                }
            }
        }
        Ok(a)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an assignment serializes")
    }

    /// The container's part, by name.
    pub fn container(&self, name: &str) -> Option<&ContainerAssignment> {
        self.containers.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, slices: u32, used: u32) -> GpuReport {
        GpuReport {
            uuid: uuid.into(),
            model: "T4".into(),
            vendor: String::new(),
            class: String::new(),
            memory_mib: 15360,
            slices,
            used_slices: used,
            pods: BTreeMap::new(),
            utilization: Some(0.5),
            healthy: true,
        }
    }

    #[test]
    fn a_report_round_trips_and_bad_ones_are_refused() {
        let r = NodeReport {
            version: FORMAT_VERSION,
            at: 1_700_000_000,
            gpus: vec![gpu("GPU-a", 4, 1), gpu("GPU-b", 4, 0)],
        };
        assert_eq!(NodeReport::parse(&r.to_json()), Ok(r.clone()));
        let mut over = r.clone();
        over.gpus[0].used_slices = 5;
        assert!(matches!(
            NodeReport::parse(&over.to_json()),
            Err(FormatError::Invalid(_))
        ));
        let mut pods = r.clone();
        pods.gpus[0].pods.insert("ns/p".into(), 2);
        assert!(NodeReport::parse(&pods.to_json()).is_err());
        pods.gpus[0].pods.insert("ns/p".into(), 1);
        assert_eq!(NodeReport::parse(&pods.to_json()), Ok(pods));
        let mut twice = r.clone();
        twice.gpus[1].uuid = "GPU-a".into();
        assert!(NodeReport::parse(&twice.to_json()).is_err());
        let mut v2 = r;
        v2.version = 2;
        assert_eq!(
            NodeReport::parse(&v2.to_json()),
            Err(FormatError::Version(2))
        );
        assert!(matches!(
            NodeReport::parse(r#"{"version":1,"at":1,"gpus":[],"extra":1}"#),
            Err(FormatError::Json(_))
        ));
    }

    #[test]
    fn an_assignment_round_trips_and_bad_ones_are_refused() {
        let a = Assignment {
            version: FORMAT_VERSION,
            node: "n1".into(),
            containers: vec![ContainerAssignment {
                name: "main".into(),
                gpus: vec![GpuTake {
                    uuid: "GPU-a".into(),
                    slices: 2,
                }],
            }],
        };
        let back = Assignment::parse(&a.to_json()).unwrap();
        assert_eq!(back.container("main").map(|c| c.slices()), Some(2));
        let mut zero = a;
        zero.containers[0].gpus[0].slices = 0;
        assert!(matches!(
            Assignment::parse(&zero.to_json()),
            Err(FormatError::Invalid(_))
        ));
        assert!(Assignment::parse("not json").is_err());
    }
}
