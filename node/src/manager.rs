//! The manager API as a kubelet plugin uses it: [`ManagerApi`], a trait so
//! that plugin logic can be tested against a fake (or the real manager served
//! in-process), and [`GrpcManager`], its implementation over the manager's
//! unix socket.
//!
//! Errors are the manager's own gRPC statuses: `AlreadyExists` for an
//! allocation id in use, `NotFound` for an unknown one, `InvalidArgument` or
//! `FailedPrecondition` for a request it refuses, `Unavailable` while it is
//! not running.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use tessera_proto::manager::v1 as mgr;
use tessera_proto::manager::v1::manager_client::ManagerClient;
use tonic::Status;
use tonic::transport::Channel;

/// A stream of node statuses, as [`ManagerApi::watch_node_status`] gives it.
pub type StatusStream = Pin<Box<dyn Stream<Item = Result<mgr::NodeStatus, Status>> + Send>>;

/// What a plugin asks of the manager; one method per manager RPC it uses.
pub trait ManagerApi: Send + Sync + 'static {
    /// CreateAllocation: the allocation as made (its files' host paths in
    /// `control_path` and `state_path`); `AlreadyExists` if the id is taken.
    fn create_allocation(
        &self,
        req: mgr::CreateAllocationRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    /// ListAllocations: every allocation the manager holds.
    fn list_allocations(&self)
    -> impl Future<Output = Result<Vec<mgr::Allocation>, Status>> + Send;
    /// DeleteAllocation; `NotFound` if there is none with this id.
    fn delete_allocation(&self, id: String) -> impl Future<Output = Result<(), Status>> + Send;
    /// SetAllocationOwner: records the pod and container an allocation serves.
    fn set_allocation_owner(
        &self,
        req: mgr::SetAllocationOwnerRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    /// ResizeAllocation (the device plugin sends a priority only: a pod's
    /// memory and compute come from its slice count).
    fn resize_allocation(
        &self,
        req: mgr::ResizeAllocationRequest,
    ) -> impl Future<Output = Result<mgr::Allocation, Status>> + Send;
    /// GetNodeStatus: the node's GPUs and allocations now, once.
    fn node_status(&self) -> impl Future<Output = Result<mgr::NodeStatus, Status>> + Send;
    /// WatchNodeStatus: the node's GPUs and their health, every
    /// `interval_ms` and on every change.
    fn watch_node_status(
        &self,
        interval_ms: u32,
    ) -> impl Future<Output = Result<StatusStream, Status>> + Send;
}

/// The manager over gRPC on its unix socket.
#[derive(Clone)]
pub struct GrpcManager {
    client: ManagerClient<Channel>,
}

impl GrpcManager {
    /// A client of the manager on `socket`. Connects lazily, on the first
    /// call (the manager may start after the plugin), and again after the
    /// manager restarts.
    pub fn new(socket: &Path) -> Result<Self, tonic::transport::Error> {
        Ok(Self {
            client: ManagerClient::new(tessera_proto::unix::channel_lazy(socket)?),
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

    async fn node_status(&self) -> Result<mgr::NodeStatus, Status> {
        Ok(self
            .client
            .clone()
            .get_node_status(mgr::NodeStatusRequest {})
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
