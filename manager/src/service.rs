//! The gRPC face of the manager (`tessera.manager.v1.Manager`): thin
//! wrappers over [`Core`], with blocking work moved off the async workers.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tessera_proto::manager::v1 as pb;
use tonic::{Request, Response, Status};

use crate::alloc::AllocError;
use crate::core::Core;

/// Default and smallest refresh of WatchNodeStatus.
const WATCH_DEFAULT: Duration = Duration::from_secs(1);
const WATCH_MIN: Duration = Duration::from_millis(100);

/// Serves the manager API over a [`Core`].
#[derive(Debug, Clone)]
pub struct ManagerService {
    core: Arc<Core>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl ManagerService {
    pub fn new(core: Arc<Core>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        ManagerService { core, stop }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Core) -> Result<T, AllocError> + Send + 'static,
    ) -> Result<T, Status> {
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || f(&core))
            .await
            .map_err(|e| Status::internal(format!("manager task failed: {e}")))?
            .map_err(Status::from)
    }
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<pb::NodeStatus, Status>> + Send>>;

#[tonic::async_trait]
impl pb::manager_server::Manager for ManagerService {
    async fn create_allocation(
        &self,
        req: Request<pb::CreateAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        // Who asked, from the kernel (SO_PEERCRED): a non-root `tessera run`
        // user gets the allocation's state file as its own, private, and a
        // run's allocation is bound to the process that connected.
        let cred = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|i| i.peer_cred);
        let peer = crate::core::Peer {
            uid: cred.map(|c| c.uid()),
            pid: cred
                .and_then(|c| c.pid())
                .and_then(|p| u32::try_from(p).ok()),
        };
        let req = crate::wire::create(&req.into_inner()).map_err(Status::from)?;
        self.blocking(move |c| c.create_for(req, peer))
            .await
            .map(Response::new)
    }

    async fn delete_allocation(
        &self,
        req: Request<pb::DeleteAllocationRequest>,
    ) -> Result<Response<pb::DeleteAllocationResponse>, Status> {
        let id = req.into_inner().id;
        self.blocking(move |c| c.delete(&id))
            .await
            .map(|()| Response::new(pb::DeleteAllocationResponse {}))
    }

    async fn list_allocations(
        &self,
        _req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::ListAllocationsResponse>, Status> {
        self.blocking(|c| Ok(c.list()))
            .await
            .map(|allocations| Response::new(pb::ListAllocationsResponse { allocations }))
    }

    async fn set_allocation_owner(
        &self,
        req: Request<pb::SetAllocationOwnerRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let req = crate::wire::owner(&req.into_inner()).map_err(Status::from)?;
        self.blocking(move |c| c.set_owner(req))
            .await
            .map(Response::new)
    }

    async fn resize_allocation(
        &self,
        req: Request<pb::ResizeAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let req = crate::wire::resize(&req.into_inner());
        self.blocking(move |c| c.resize(req))
            .await
            .map(Response::new)
    }

    async fn pause_allocation(
        &self,
        req: Request<pb::PauseAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let id = req.into_inner().id;
        self.blocking(move |c| c.set_paused(&id, true))
            .await
            .map(Response::new)
    }

    async fn resume_allocation(
        &self,
        req: Request<pb::PauseAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        let id = req.into_inner().id;
        self.blocking(move |c| c.set_paused(&id, false))
            .await
            .map(Response::new)
    }

    async fn get_node_status(
        &self,
        _req: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        self.blocking(|c| Ok(c.node_status()))
            .await
            .map(Response::new)
    }

    type WatchNodeStatusStream = StatusStream;

    async fn watch_node_status(
        &self,
        req: Request<pb::WatchNodeStatusRequest>,
    ) -> Result<Response<Self::WatchNodeStatusStream>, Status> {
        let ms = req.into_inner().interval_ms;
        let every = if ms == 0 {
            WATCH_DEFAULT
        } else {
            Duration::from_millis(u64::from(ms)).max(WATCH_MIN)
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let core = self.core.clone();
        let mut changes = core.subscribe();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let c = core.clone();
                let Ok(status) = tokio::task::spawn_blocking(move || c.node_status()).await else {
                    return;
                };
                if tx.send(Ok(status)).await.is_err() {
                    return; // the client went away
                }
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
