//! The scheduler extender API's JSON (`k8s.io/kube-scheduler/extender/v1`):
//! what kube-scheduler sends to the filter, prioritize and bind verbs and
//! what it reads back. Field names are the API's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};

/// The highest score an extender may give a node (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// A `v1.NodeList` as the scheduler sends it: only `items` matters (the
/// scheduler leaves the list's own metadata empty).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<Node>,
}

/// The body of a filter or prioritize call (`ExtenderArgs`). With
/// `nodeCacheCapable: true` in the scheduler's config it sends `nodenames`,
/// otherwise the whole `nodes`.
#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderArgs {
    pub pod: Pod,
    #[serde(default)]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub nodenames: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, whichever form they came in.
    pub fn names(&self) -> Vec<String> {
        match (&self.nodenames, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(list)) => list
                .items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The answer to a filter call (`ExtenderFilterResult`): the nodes that
/// passed, in the form they came in, and why each other one failed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtenderFilterResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
    /// Nodes that do not fit now (preemption might help).
    #[serde(
        rename = "failedNodes",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that cannot fit whatever is preempted.
    #[serde(
        rename = "failedAndUnresolvableNodes",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

/// One node's score (`HostPriority`); a prioritize call answers a list of
/// them (`HostPriorityList`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// The body of a bind call (`ExtenderBindingArgs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "podName")]
    pub pod_name: String,
    #[serde(rename = "podNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub node: String,
}

/// The answer to a bind call (`ExtenderBindingResult`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExtenderBindingResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}
