//! The plugin's adapters to the outside world, and nothing else: the
//! Kubernetes API (the node's labels, pods' annotations) through `kube`, and
//! the kubelet's PodResources API through tonic. The modules they serve
//! (`node_labels`, `pod_resources`) hold the traits and the decisions, with
//! no I/O of their own, and are tested against doubles of these traits.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::Status;
use tonic::transport::Channel;

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

/// A Kubernetes client from the in-cluster config or a kubeconfig.
pub(crate) async fn kube_client() -> Result<kube::Client, NodeApiError> {
    // kube's TLS client takes the process-wide rustls provider; name it,
    // so that a second provider compiled into the binary is no ambiguity.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(kube::Client::try_default().await?)
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
