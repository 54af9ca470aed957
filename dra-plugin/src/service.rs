//! The kubelet's DRA gRPC services, `v1` and `v1beta1`, over one [`Driver`].
//! The two versions are the same messages in two protobuf packages: a
//! `v1beta1` call is re-read as `v1` (same bytes on the wire), served, and
//! its answer re-read as `v1beta1`, so both versions answer exactly alike.

use std::sync::Arc;

use prost::Message;
use tessera_node::manager::ManagerApi;
use tessera_proto::dra::{v1, v1beta1};
use tonic::{Request, Response, Status};

use crate::driver::{ClaimSource, Driver};

/// The `v1` service.
pub struct V1<C, M>(pub Arc<Driver<C, M>>);
/// The `v1beta1` service.
pub struct V1beta1<C, M>(pub Arc<Driver<C, M>>);

#[tonic::async_trait]
impl<C: ClaimSource, M: ManagerApi> v1::dra_plugin_server::DraPlugin for V1<C, M> {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.0.prepare(req.into_inner().claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(
            self.0.unprepare(req.into_inner().claims).await,
        ))
    }
}

/// `msg` re-read as the same message of the other version.
fn convert<A: Message, B: Message + Default>(msg: &A) -> Result<B, Status> {
    B::decode(msg.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("v1/v1beta1 conversion: {e}")))
}

#[tonic::async_trait]
impl<C: ClaimSource, M: ManagerApi> v1beta1::dra_plugin_server::DraPlugin for V1beta1<C, M> {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let r: v1::NodePrepareResourcesRequest = convert(req.get_ref())?;
        Ok(Response::new(convert(&self.0.prepare(r.claims).await)?))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let r: v1::NodeUnprepareResourcesRequest = convert(req.get_ref())?;
        Ok(Response::new(convert(&self.0.unprepare(r.claims).await)?))
    }
}
