//! The manager API as the plugin uses it: a crate-private trait, so plugin
//! logic is tested against a fake, and its tonic implementation.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use tessera_proto::manager::v1 as mgr;
use tessera_proto::manager::v1::manager_client::ManagerClient;
use tonic::Status;
use tonic::transport::Channel;

/// A stream of node statuses.
pub(crate) type StatusStream = Pin<Box<dyn Stream<Item = Result<mgr::NodeStatus, Status>> + Send>>;

/// What the plugin asks of the manager.
pub(crate) trait ManagerApi: Send + Sync + 'static {
    fn create_allocation(
        &self,
        req: mgr::CreateAllocationRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    fn list_allocations(&self)
    -> impl Future<Output = Result<Vec<mgr::Allocation>, Status>> + Send;
    fn delete_allocation(&self, id: String) -> impl Future<Output = Result<(), Status>> + Send;
    fn set_allocation_owner(
        &self,
        req: mgr::SetAllocationOwnerRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    /// ResizeAllocation; the plugin sends a priority only (a pod's memory
    /// and compute come from its slice count).
    fn resize_allocation(
        &self,
        req: mgr::ResizeAllocationRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    fn watch_node_status(
        &self,
        interval_ms: u32,
    ) -> impl Future<Output = Result<StatusStream, Status>> + Send;
}

/// The manager over gRPC on its unix socket.
#[derive(Clone)]
pub(crate) struct GrpcManager {
    client: ManagerClient<Channel>,
}

impl GrpcManager {
    /// Connects lazily: the manager may start after the plugin.
    pub(crate) fn new(socket: &Path) -> Result<Self, tonic::transport::Error> {
        Ok(Self {
            client: ManagerClient::new(crate::grpc::unix_channel_lazy(socket)?),
        })
    }
}

impl ManagerApi for GrpcManager {
    async fn create_allocation(
        &self,
        req: mgr::CreateAllocationRequest,
    ) -> Result<mgr::Allocation, Status> {
        Ok(self
            .client
            .clone()
            .create_allocation(req)
            .await?
            .into_inner())
    }

    async fn list_allocations(&self) -> Result<Vec<mgr::Allocation>, Status> {
        Ok(self
            .client
            .clone()
            .list_allocations(mgr::ListAllocationsRequest {})
            .await?
            .into_inner()
            .allocations)
    }

    async fn delete_allocation(&self, id: String) -> Result<(), Status> {
        self.client
            .clone()
            .delete_allocation(mgr::DeleteAllocationRequest { id })
            .await?;
        Ok(())
    }

    async fn set_allocation_owner(
        &self,
        req: mgr::SetAllocationOwnerRequest,
    ) -> Result<mgr::Allocation, Status> {
        Ok(self
            .client
            .clone()
            .set_allocation_owner(req)
            .await?
            .into_inner())
    }

    async fn resize_allocation(
        &self,
        req: mgr::ResizeAllocationRequest,
    ) -> Result<mgr::Allocation, Status> {
        Ok(self
            .client
            .clone()
            .resize_allocation(req)
            .await?
            .into_inner())
    }

    async fn watch_node_status(&self, interval_ms: u32) -> Result<StatusStream, Status> {
        let stream = self
            .client
            .clone()
            .watch_node_status(mgr::WatchNodeStatusRequest { interval_ms })
            .await?
            .into_inner();
        Ok(stream.boxed())
    }
}
