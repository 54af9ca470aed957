//! Why a request for a chosen GPU is refused: the scheduler extender's choice
//! (`assignment`) or KAI-Scheduler's (`kai`). The two are one family: a KAI
//! pod's GPU is checked as an assignment is ([`KaiError::Gpu`]), and the
//! service refuses either through one error ([`AssignmentError::Kai`]). Kept
//! below both modules so that neither names the other for it.

use tonic::{Code, Status};

/// Why an Allocate is refused for an assigned pod. Nothing is served then.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssignmentError {
    #[error(
        "cannot read the pods of node {node} to find the GPUs the scheduler extender chose: {reason}"
    )]
    Lookup { node: String, reason: String },
    #[error(
        "pod {pod} container {container:?} was assigned {assigned} by the scheduler extender, \
         but the kubelet allocated {got}"
    )]
    Disagree {
        pod: String,
        container: String,
        assigned: String,
        got: String,
    },
    #[error("pod {pod} was assigned GPU {gpu}, which this node does not have")]
    UnknownGpu { pod: String, gpu: String },
    #[error("pod {pod} was assigned {slices} slices of GPU {gpu}, which has {has}")]
    TooManySlices {
        pod: String,
        gpu: String,
        slices: u32,
        has: u32,
    },
    #[error("pod {pod} was assigned GPU {gpu}, which is unhealthy")]
    Unhealthy { pod: String, gpu: String },
    #[error("cannot mark pod {pod} allocated: {reason}")]
    Mark { pod: String, reason: String },
    #[error(transparent)]
    Kai(Box<KaiError>),
}

impl From<AssignmentError> for Status {
    fn from(e: AssignmentError) -> Self {
        let code = match e {
            AssignmentError::Lookup { .. } | AssignmentError::Mark { .. } => Code::Unavailable,
            _ => Code::FailedPrecondition,
        };
        Status::new(code, e.to_string())
    }
}

/// Why a KAI pod's Allocate is refused. Nothing is served then.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KaiError {
    #[error(
        "pod {pod} container {container:?}: KAI-Scheduler reserved {reserved} for it, but the \
         kubelet allocated {got}; refused rather than run on a GPU KAI did not choose (are \
         {slices} slices of that GPU free? KAI counts the fraction, Tessera whole slices)"
    )]
    Disagree {
        pod: String,
        container: String,
        reserved: String,
        got: String,
        slices: u64,
    },
    #[error(
        "pod {pod} is in KAI-Scheduler's GPU group {group:?}, but {why}; refused rather than \
         run on a GPU KAI did not choose"
    )]
    Unresolved {
        pod: String,
        group: String,
        why: String,
    },
    #[error("KAI-Scheduler's choice: {0}")]
    Gpu(AssignmentError),
}

impl From<KaiError> for Status {
    fn from(e: KaiError) -> Self {
        Status::failed_precondition(e.to_string())
    }
}
