//! The plugin's adapters to the outside world, and nothing else: the
//! Kubernetes API (the node's labels, pods' annotations, the pods bound to
//! the node and their GPU assignments) through `kube`, and
//! the kubelet's PodResources API through tonic. The modules they serve
//! (`node_labels`, `pod_resources`) hold the traits and the decisions, with
//! no I/O of their own, and are tested against doubles of these traits.

use std::collections::BTreeMap;
use std::path::Path;
use tessera_node::kube::KubeSource;

use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::Status;
use tonic::transport::Channel;

use crate::assignment::{ANNOTATION_GPU_ALLOCATED, PodInfo, PodsOnNode};
use crate::gpu_report::ReportApi;
use crate::node_labels::{NodeApi, NodeApiError};
use crate::pod_resources::{PodApi, PodResourcesApi};

/// The node through the Kubernetes API (in-cluster config or kubeconfig).
pub(crate) struct KubeNodeApi {
    nodes: kube::Api<k8s_openapi::api::core::v1::Node>,
}

impl KubeNodeApi {
    pub(crate) fn with_client(client: kube::Client) -> Self {
        Self {
            nodes: kube::Api::all(client),
        }
    }
}

/// The Kubernetes client: [`tessera_node::kube::client`] (the DRA plugin's
/// construction), at `url` (plain HTTP, no credentials: tests) when given.
pub(crate) async fn kube_client(url: Option<&str>) -> Result<kube::Client, NodeApiError> {
    let source = url.map_or(KubeSource::Infer, |u| KubeSource::Url(u.to_owned()));
    tessera_node::kube::client(&source)
        .await
        .map_err(|e| NodeApiError::Config(e.to_string()))
}

impl KubeNodeApi {
    /// A JSON merge patch of the node's metadata: what is named is set
    /// (`null` removes it), the rest is untouched.
    async fn merge_metadata(
        &self,
        node: &str,
        metadata: serde_json::Value,
    ) -> Result<(), NodeApiError> {
        let patch = serde_json::json!({ "metadata": metadata });
        self.nodes
            .patch(
                node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }
}

impl NodeApi for KubeNodeApi {
    async fn labels(&self, node: &str) -> Result<BTreeMap<String, String>, NodeApiError> {
        let n = self.nodes.get(node).await?;
        Ok(n.metadata.labels.unwrap_or_default())
    }

    async fn patch_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, Option<String>>,
    ) -> Result<(), NodeApiError> {
        self.merge_metadata(node, serde_json::json!({ "labels": labels }))
            .await
    }
}

impl ReportApi for KubeNodeApi {
    async fn annotate(&self, node: &str, key: &str, value: &str) -> Result<(), NodeApiError> {
        self.merge_metadata(node, serde_json::json!({ "annotations": { key: value } }))
            .await
    }
}

/// Pods through the Kubernetes API (in-cluster config or kubeconfig).
pub(crate) struct KubePodApi {
    client: kube::Client,
}

impl KubePodApi {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl PodApi for KubePodApi {
    async fn annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<BTreeMap<String, String>, NodeApiError> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), namespace);
        Ok(pods
            .get(pod)
            .await?
            .metadata
            .annotations
            .unwrap_or_default())
    }
}

impl PodsOnNode for KubePodApi {
    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodInfo>, NodeApiError> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(self.client.clone());
        let list = pods
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        Ok(list.items.into_iter().map(pod_info).collect())
    }

    async fn mark_allocated(
        &self,
        namespace: &str,
        pod: &str,
        containers: &str,
    ) -> Result<(), NodeApiError> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({
            "metadata": { "annotations": { ANNOTATION_GPU_ALLOCATED: containers } }
        });
        pods.patch(
            pod,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }
}

/// What [`PodsOnNode`] needs of a pod object.
fn pod_info(p: k8s_openapi::api::core::v1::Pod) -> PodInfo {
    let spec = p.spec.unwrap_or_default();
    let status = p.status.unwrap_or_default();
    let resource = crate::RESOURCE_NAME;
    let bound_at_ms = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_millisecond());
    PodInfo {
        namespace: p.metadata.namespace.unwrap_or_default(),
        name: p.metadata.name.unwrap_or_default(),
        node: spec.node_name.unwrap_or_default(),
        phase: status.phase.unwrap_or_default(),
        bound_at_ms,
        created_at_ms: p.metadata.creation_timestamp.map(|t| t.0.as_millisecond()),
        containers: spec
            .containers
            .iter()
            .map(|c| {
                // Limits, else requests, as the extender reads them; a
                // count that is not a whole number of slices counts as none
                // (the extender refuses such a pod).
                let r = c.resources.as_ref();
                let limit = r
                    .and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get(resource))
                    .or_else(|| {
                        r.and_then(|r| r.requests.as_ref())
                            .and_then(|l| l.get(resource))
                    })
                    .and_then(|q| q.0.parse::<u64>().ok())
                    .unwrap_or(0);
                (c.name.clone(), limit)
            })
            .collect(),
        // Limits, else requests, as for the slices: KAI's reservation pods and anything
        // else asking for the resource Tessera serves them (`kai`).
        nvidia_gpus: spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| {
                let r = c.resources.as_ref()?;
                r.limits
                    .as_ref()
                    .and_then(|l| l.get(crate::kai::RESOURCE))
                    .or_else(|| {
                        r.requests
                            .as_ref()
                            .and_then(|l| l.get(crate::kai::RESOURCE))
                    })
                    // Not a whole number: still an ask, counted as one.
                    .map(|q| q.0.parse::<u64>().unwrap_or(1))
            })
            .sum(),
        labels: p.metadata.labels.unwrap_or_default(),
        annotations: p.metadata.annotations.unwrap_or_default(),
    }
}

/// PodResources over gRPC on the kubelet's socket.
pub(crate) struct GrpcPodResources {
    client: PodResourcesListerClient<Channel>,
}

impl GrpcPodResources {
    pub(crate) fn new(socket: &Path) -> Result<Self, tonic::transport::Error> {
        Ok(Self {
            client: PodResourcesListerClient::new(crate::grpc::unix_channel_lazy(socket)?),
        })
    }
}

impl PodResourcesApi for GrpcPodResources {
    async fn list(&self) -> Result<pr::ListPodResourcesResponse, Status> {
        Ok(self
            .client
            .clone()
            .list(pr::ListPodResourcesRequest {})
            .await?
            .into_inner())
    }
}
