//! Which allocations a claim is prepared as, and whose exact limits each gets
//! (pure, no I/O).
//!
//! A pod that asks for `tessera.dev/vgpu` on a DRA node gets one claim for
//! all its containers, written by kube-scheduler (`DRAExtendedResource`):
//! one device request per container and extended resource, and the pod's
//! `status.extendedResourceClaimStatus` names the claim and maps each
//! container to its request. The kubelet gives each container the CDI
//! devices of its own request(s). So when a translated pod has exact limits
//! (`tessera_node::exact`) and that claim has several requests here, each
//! request is prepared as an allocation of its own, with the exact limits
//! of the container the mapping names laid over its slices; otherwise the
//! claim is one allocation, as it always was.
//!
//! The mapping is the pod's word, a hint and never identity: it only decides
//! which container's limits go on which request, and those limits only ever
//! lower a request's slices ([`tessera_node::exact::cap`]). A mapping that
//! cannot be the scheduler's (a request the claim does not have, two
//! containers for one request) fails the prepare, naming the pod and the
//! field: laid on a guess, a container could get another's limits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus;
use tessera_node::exact::{ANNOTATION_EXACT_LIMITS, ANNOTATION_EXACT_MEMORY_PERCENT, ExactLimit};

/// The pod's field that maps containers to the claim's requests, as errors name it.
pub const FIELD: &str = "status.extendedResourceClaimStatus.requestMappings";

/// How a claim is prepared.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// One allocation for the whole claim, with these exact limits laid over
    /// its slices, if any (every claim but the one below).
    Whole(Option<ExactLimit>),
    /// One allocation per request this node serves, in this order.
    PerRequest(Vec<Part>),
}

/// One request of a claim prepared on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The request's name in the claim.
    pub request: String,
    /// The container the pod's mapping names for it, if one.
    pub container: Option<String>,
    /// That container's exact limits, if it has any (else the request keeps
    /// its slices' limits).
    pub exact: Option<ExactLimit>,
}

/// The layout of claim `claim` (its name), whose spec has `claim_requests`
/// and of which this node serves `served` (main request names, in a stable
/// order: `crate::claim::served_requests`), reserved for pod `pod`
/// (`namespace/name`, for messages) with exact limits `exact` (by container)
/// and extended-resource status `status`.
pub fn layout(
    pod: &str,
    claim: &str,
    claim_requests: &[String],
    served: &[String],
    exact: &BTreeMap<String, ExactLimit>,
    status: Option<&PodExtendedResourceClaimStatus>,
) -> Result<Layout, String> {
    if exact.is_empty() {
        return Ok(Layout::Whole(None));
    }
    let special = status.filter(|s| s.resource_claim_name == claim);
    let Some(status) = special.filter(|_| served.len() > 1) else {
        // One request (or a claim that is not the pod's extended-resource
        // claim): the claim is one allocation, and only a pod that names one
        // container says what its limits are.
        if exact.len() == 1 {
            return Ok(Layout::Whole(exact.values().next().copied()));
        }
        tracing::warn!(%pod, %claim, "annotations {ANNOTATION_EXACT_LIMITS} / {ANNOTATION_EXACT_MEMORY_PERCENT}: {} containers have exact limits and the claim is not the pod's extended-resource claim with a request per container (its {FIELD} does not name it, or it has one request here); it keeps its slices' limits", exact.len());
        return Ok(Layout::Whole(None));
    };

    // Request → the container mapped to it; every request named must be the
    // claim's, and none may serve two containers.
    let mut by_request: BTreeMap<&str, &str> = BTreeMap::new();
    for m in &status.request_mappings {
        if !claim_requests.contains(&m.request_name) {
            return Err(format!(
                "pod {pod}: {FIELD}: container {:?} ({}) is mapped to request {:?}, which resource claim {claim} does not have",
                m.container_name, m.resource_name, m.request_name
            ));
        }
        if let Some(other) = by_request.insert(&m.request_name, &m.container_name)
            && other != m.container_name
        {
            return Err(format!(
                "pod {pod}: {FIELD}: containers {other:?} and {:?} are both mapped to request {:?} of resource claim {claim}",
                m.container_name, m.request_name
            ));
        }
    }
    let parts: Vec<Part> = served
        .iter()
        .map(|request| {
            let container = by_request.get(request.as_str()).copied();
            let exact = match container {
                None => {
                    tracing::warn!(%pod, %claim, %request, "{FIELD} maps no container to this request; it keeps its slices' limits");
                    None
                }
                Some(c) => {
                    let mine = served
                        .iter()
                        .filter(|q| by_request.get(q.as_str()) == Some(&c))
                        .count();
                    if mine > 1 {
                        // The exact limits are for the container's slices, not
                        // for each of several requests.
                        tracing::warn!(%pod, %claim, container = %c, "{FIELD} maps {mine} of the claim's requests to one container; they keep their slices' limits");
                        None
                    } else {
                        exact.get(c).copied()
                    }
                }
            };
            Part {
                request: request.clone(),
                container: container.map(str::to_owned),
                exact,
            }
        })
        .collect();
    if parts.iter().all(|p| p.exact.is_none()) {
        // No request has limits of its own: nothing to split for.
        return Ok(Layout::Whole(None));
    }
    Ok(Layout::PerRequest(parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerExtendedResourceRequest;

    fn limit(slices: u32, mib: u64) -> ExactLimit {
        ExactLimit {
            slices,
            memory_mib: Some(mib),
            compute_percent: None,
            memory_ppm: None,
            compute_ppm: None,
        }
    }

    fn status(claim: &str, maps: &[(&str, &str)]) -> PodExtendedResourceClaimStatus {
        PodExtendedResourceClaimStatus {
            resource_claim_name: claim.into(),
            request_mappings: maps
                .iter()
                .map(|(c, r)| ContainerExtendedResourceRequest {
                    container_name: (*c).into(),
                    resource_name: "tessera.dev/vgpu".into(),
                    request_name: (*r).into(),
                })
                .collect(),
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    const R0: &str = "container-0-request-0";
    const R1: &str = "container-1-request-0";

    fn two() -> BTreeMap<String, ExactLimit> {
        BTreeMap::from([("a".into(), limit(1, 3000)), ("b".into(), limit(2, 5000))])
    }

    fn run(
        exact: &BTreeMap<String, ExactLimit>,
        served: &[&str],
        st: Option<&PodExtendedResourceClaimStatus>,
    ) -> Result<Layout, String> {
        layout(
            "team/p",
            "p-claim",
            &names(&[R0, R1]),
            &names(served),
            exact,
            st,
        )
    }

    #[test]
    fn each_request_gets_its_containers_limits() {
        let st = status("p-claim", &[("a", R0), ("b", R1)]);
        assert_eq!(
            run(&two(), &[R0, R1], Some(&st)),
            Ok(Layout::PerRequest(vec![
                Part {
                    request: R0.into(),
                    container: Some("a".into()),
                    exact: Some(limit(1, 3000)),
                },
                Part {
                    request: R1.into(),
                    container: Some("b".into()),
                    exact: Some(limit(2, 5000)),
                },
            ]))
        );
        // Swapped containers swap the limits: the mapping, not the order, decides.
        let swapped = status("p-claim", &[("b", R0), ("a", R1)]);
        let Ok(Layout::PerRequest(p)) = run(&two(), &[R0, R1], Some(&swapped)) else {
            panic!("per request");
        };
        assert_eq!(p[0].exact, Some(limit(2, 5000)));
        assert_eq!(p[1].exact, Some(limit(1, 3000)));
        // One container with limits: the other's request keeps its slices, still
        // an allocation of its own (sharing one would cap both by one's words).
        let one = BTreeMap::from([("b".into(), limit(2, 5000))]);
        let Ok(Layout::PerRequest(p)) = run(&one, &[R0, R1], Some(&st)) else {
            panic!("per request");
        };
        assert_eq!((p[0].exact, p[1].exact), (None, Some(limit(2, 5000))));
        // A request no container is mapped to keeps its slices.
        let half = status("p-claim", &[("b", R1)]);
        let Ok(Layout::PerRequest(p)) = run(&two(), &[R0, R1], Some(&half)) else {
            panic!("per request");
        };
        assert_eq!(p[0].container, None);
        assert_eq!(p[0].exact, None);
        // Other resources' requests may be mapped too (another driver's): fine.
        let more = status("p-claim", &[("a", R0), ("b", R1), ("b", R1)]);
        assert!(matches!(
            run(&two(), &[R0, R1], Some(&more)),
            Ok(Layout::PerRequest(_))
        ));
    }

    #[test]
    fn a_mapping_that_cannot_be_the_schedulers_fails_naming_pod_and_field() {
        let unknown = status("p-claim", &[("a", R0), ("b", "container-7-request-0")]);
        let e = run(&two(), &[R0, R1], Some(&unknown)).expect_err("unknown request");
        assert!(
            e.contains("team/p") && e.contains(FIELD) && e.contains("container-7-request-0"),
            "{e}"
        );
        let twice = status("p-claim", &[("a", R0), ("b", R0)]);
        let e = run(&two(), &[R0, R1], Some(&twice)).expect_err("two containers, one request");
        assert!(
            e.contains("team/p") && e.contains(FIELD) && e.contains("\"a\" and \"b\""),
            "{e}"
        );
    }

    #[test]
    fn one_request_no_status_or_another_claim_keep_one_allocation() {
        let st = status("p-claim", &[("a", R0), ("b", R1)]);
        // One request here: today's path, whatever the mapping says (even a bad one).
        let one = BTreeMap::from([("a".into(), limit(1, 3000))]);
        assert_eq!(
            run(&one, &[R0], Some(&st)),
            Ok(Layout::Whole(Some(limit(1, 3000))))
        );
        let bad = status("p-claim", &[("a", R0), ("b", R0)]);
        assert_eq!(
            run(&one, &[R0], Some(&bad)),
            Ok(Layout::Whole(Some(limit(1, 3000))))
        );
        // No status, or a status naming another claim: two containers' limits
        // cannot be told apart; the slices' limits stay.
        assert_eq!(run(&two(), &[R0, R1], None), Ok(Layout::Whole(None)));
        let other = status("q-claim", &[("a", R0), ("b", R1)]);
        assert_eq!(
            run(&two(), &[R0, R1], Some(&other)),
            Ok(Layout::Whole(None))
        );
        // No exact limits: nothing to split, nothing checked.
        assert_eq!(
            run(&BTreeMap::new(), &[R0, R1], Some(&bad)),
            Ok(Layout::Whole(None))
        );
        // Limits for containers the mapping does not name: one allocation.
        let strangers = BTreeMap::from([("x".into(), limit(1, 3000))]);
        assert_eq!(
            run(&strangers, &[R0, R1], Some(&st)),
            Ok(Layout::Whole(None))
        );
        // One container mapped to both requests: its limits are for its slices,
        // not for each request; both keep theirs.
        let both = status("p-claim", &[("a", R0), ("a", R1)]);
        assert_eq!(run(&two(), &[R0, R1], Some(&both)), Ok(Layout::Whole(None)));
    }
}
