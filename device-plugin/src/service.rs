//! The kubelet-facing DevicePlugin gRPC service: thin glue from tonic to
//! the snapshot, the placement function, the allocate module and the
//! scheduler extender's assignments (`assignment`).

use std::sync::Arc;

use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use tonic::{Request, Response, Status};

use crate::allocate;
use crate::assignment::{self, Match, Pending, PodInfo, PodsOnNode};
use crate::constraints;
use crate::device_id::DeviceId;
use crate::placement::{self, GpuLoad, Policy};
use crate::refusal::AssignmentError;
use crate::state::{INVENTORY_WAIT, PluginState, Snapshot};
use crate::stream::{DeviceStream, device_stream};
use tessera_node::cdi::HostPaths;
use tessera_node::manager::ManagerApi;

/// Serves one node's slices to the kubelet.
pub(crate) struct PluginService<M, P> {
    pub(crate) state: Arc<PluginState>,
    pub(crate) manager: Arc<M>,
    pub(crate) host: HostPaths,
    /// The extender's assignments; None without the Kubernetes API.
    pub(crate) assigned: Option<Assigned<P>>,
}

/// Where the pods of this node and their assignments are read.
pub(crate) struct Assigned<P> {
    pub(crate) api: P,
    pub(crate) node: String,
    /// One Allocate at a time: a pod is marked served before the next
    /// request looks for its pod.
    pub(crate) one_at_a_time: tokio::sync::Mutex<()>,
    /// KAI-Scheduler's GPU choice is served too (`kai`, `--kai-reservations`).
    pub(crate) kai: bool,
}

impl<P: PodsOnNode> Assigned<P> {
    pub(crate) fn new(api: P, node: String, kai: bool) -> Self {
        Self {
            api,
            node,
            one_at_a_time: tokio::sync::Mutex::new(()),
            kai,
        }
    }

    /// The pods bound to this node, read once per request.
    async fn pods(&self) -> Result<Vec<PodInfo>, AssignmentError> {
        self.api
            .pods_on_node(&self.node)
            .await
            .map_err(|e| AssignmentError::Lookup {
                node: self.node.clone(),
                reason: e.to_string(),
            })
    }

    /// The containers waiting for a chosen GPU among `pods`: the extender's
    /// assignments, then KAI-Scheduler's reservations (`kai`).
    fn pending(&self, pods: &[PodInfo]) -> Vec<Pending> {
        let mut all = assignment::pending(pods, &self.node);
        if self.kai {
            let (kai, _) = crate::kai::pending(pods, &self.node);
            all.extend(kai.into_iter().map(|r| r.pending));
        }
        all
    }

    /// The pending container these (already checked) device IDs serve, if
    /// any, among `pods`: an error when they are not the GPUs it was
    /// assigned, or its assignment does not hold on this node.
    fn for_request(
        &self,
        pods: &[PodInfo],
        ids: &[String],
        snap: &Snapshot,
    ) -> Result<Option<Pending>, AssignmentError> {
        let mut pending = assignment::pending(pods, &self.node);
        let ids: Vec<DeviceId> = ids.iter().filter_map(|s| DeviceId::parse(s).ok()).collect();
        match assignment::find(&pending, &ids) {
            Match::Exact(i) => {
                let p = pending.swap_remove(i);
                assignment::check(&p, snap)?;
                Ok(Some(p))
            }
            Match::Other(i) => Err(assignment::disagreement(&pending[i], &ids, snap)),
            Match::None if self.kai => crate::kai::for_request(pods, &self.node, &ids, snap)
                .map_err(|e| AssignmentError::Kai(Box::new(e))),
            Match::None => Ok(None),
        }
    }

    /// Lowers `plan` to the exact limits of the pod it is for, where `pods` tell
    /// it for certain (`assignment::exact_for_request`); otherwise the PodResources
    /// pass lowers the allocation once the kubelet names its owner.
    fn lay_exact_limits(
        &self,
        pods: &[PodInfo],
        plan: &mut allocate::Plan,
        known: Option<&Pending>,
        snap: &Snapshot,
    ) {
        let n = plan.device_ids.len() as u64;
        let known = known.map(|p| (p.namespace.as_str(), p.name.as_str(), p.container.as_str()));
        if let Some(e) = assignment::exact_for_request(pods, &self.node, n, known)
            && tessera_node::exact::cap(&mut plan.devices, &e, &snap.cards())
        {
            tracing::info!(id = %plan.id, limits = ?plan.devices, "exact limits of the pod's words");
        }
    }

    /// Refuses devices that break the GPU constraint of every pod they may be
    /// for (`constraints::check`); `known`: the extender's pod, for certain.
    fn check_constraints(
        &self,
        pods: &[PodInfo],
        ids: &[String],
        known: Option<&Pending>,
        snap: &Snapshot,
    ) -> Result<(), Status> {
        let known = known.map(|p| (p.namespace.as_str(), p.name.as_str()));
        let c = constraints::candidates(pods, &self.node, ids.len() as u64, known);
        constraints::check(&c, ids, snap).map_err(Status::failed_precondition)
    }

    async fn mark(&self, p: &Pending) -> Result<(), AssignmentError> {
        self.api
            .mark_allocated(&p.namespace, &p.name, &p.allocated_value())
            .await
            .map_err(|e| AssignmentError::Mark {
                pod: p.pod(),
                reason: e.to_string(),
            })
    }
}

/// The options this plugin registers with.
pub fn plugin_options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn loads(snap: &Snapshot) -> Vec<GpuLoad> {
    snap.gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| GpuLoad {
            uuid: g.gpu.uuid.clone(),
            index: g.gpu.index,
            slices: g.layout.slices,
            utilization: g.utilization,
        })
        .collect()
}

impl<M, P> PluginService<M, P> {
    /// The slices a preferred allocation may take under the GPU constraints
    /// of the pods the request may be for (`constraints::narrow`); `None`:
    /// every available slice.
    fn constrained(
        &self,
        pods: &[PodInfo],
        c: &dp::ContainerPreferredAllocationRequest,
        size: usize,
        snap: &Snapshot,
    ) -> Option<Vec<String>> {
        let a = self.assigned.as_ref()?;
        let cands = constraints::candidates(pods, &a.node, size as u64, None);
        constraints::narrow(
            &cands,
            &c.available_device_i_ds,
            &c.must_include_device_i_ds,
            size,
            snap,
        )
    }
}

#[tonic::async_trait]
impl<M: ManagerApi, P: PodsOnNode> DevicePlugin for PluginService<M, P> {
    async fn get_device_plugin_options(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _req: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.state.subscribe();
        Ok(Response::new(device_stream(rx, |s| s.devices.clone())))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let snap = self.state.with_inventory(INVENTORY_WAIT).await;
        let gpus = loads(&snap);
        let policy = Policy {
            placement: snap.node.placement,
            shared_threshold: snap.node.shared_threshold,
        };
        // The pods waiting for the extender's choice, and the pods whose GPU
        // constraint a request may be under; without them (or the API) the
        // node's own policy picks from every slice.
        let pods = match &self.assigned {
            Some(a) => a.pods().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "preferring by the node's policy");
                Vec::new()
            }),
            None => Vec::new(),
        };
        let pending = match &self.assigned {
            Some(a) => a.pending(&pods),
            None => Vec::new(),
        };
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            let size = usize::try_from(c.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "allocation_size {} is negative",
                    c.allocation_size
                ))
            })?;
            let assigned = assignment::prefer(
                &pending,
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
            );
            let ids = match assigned {
                Some((i, ids)) => {
                    tracing::debug!(pod = %pending[i].pod(), container = %pending[i].container, "preferring the assigned GPUs");
                    ids
                }
                None => placement::preferred(
                    &placement::Request {
                        available: &self
                            .constrained(&pods, c, size, &snap)
                            .unwrap_or_else(|| c.available_device_i_ds.clone()),
                        must_include: &c.must_include_device_i_ds,
                        size,
                    },
                    &gpus,
                    policy,
                ),
            };
            tracing::debug!(size, chosen = ?ids, "preferred allocation");
            container_responses.push(dp::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(dp::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let snap = self.state.with_inventory(INVENTORY_WAIT).await;
        if snap.node.ld_so_preload {
            let path = &self.host.preload_file;
            allocate::ensure_preload_file(path)
                .map_err(|e| Status::internal(format!("cannot write {}: {e}", path.display())))?;
        }
        let _one_at_a_time = match &self.assigned {
            Some(a) => Some(a.one_at_a_time.lock().await),
            None => None,
        };
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            let mut plan = allocate::plan(&c.devices_ids, &snap).inspect_err(|e| {
                tracing::warn!(devices = ?c.devices_ids, error = %e, "allocate refused");
            })?;
            if let Some(a) = &self.assigned {
                let refused = |e: AssignmentError| {
                    tracing::warn!(devices = ?c.devices_ids, error = %e, "allocate refused");
                    Status::from(e)
                };
                // Marked before the allocation is made: the next request
                // must not take this pod again, and a pod whose allocation
                // then fails is not admitted anyway.
                // One read of the node's pods serves the assignment and the exact
                // limits; without it nothing is served (as before).
                let pods = a.pods().await.map_err(refused)?;
                let known = a
                    .for_request(&pods, &c.devices_ids, &snap)
                    .map_err(refused)?;
                a.check_constraints(&pods, &c.devices_ids, known.as_ref(), &snap)
                    .inspect_err(|e| {
                        tracing::warn!(devices = ?c.devices_ids, error = %e.message(), "allocate refused");
                    })?;
                if let Some(p) = &known {
                    a.mark(p).await.map_err(refused)?;
                    tracing::info!(pod = %p.pod(), container = %p.container, devices = ?plan.device_ids, "serving the chosen GPUs (the scheduler extender's or KAI-Scheduler's)");
                }
                a.lay_exact_limits(&pods, &mut plan, known.as_ref(), &snap);
            }
            let alloc = allocate::create(self.manager.as_ref(), &plan)
                .await
                .map_err(|s| {
                    tracing::warn!(id = %plan.id, error = %s.message(), "manager refused the allocation");
                    Status::new(
                        s.code(),
                        format!("manager could not create allocation {}: {}", plan.id, s.message()),
                    )
                })?;
            tracing::info!(id = %alloc.id, devices = ?plan.device_ids, "allocated");
            let resp = allocate::container_response(
                &alloc,
                &self.host,
                snap.node.ld_so_preload,
                snap.node.device_list_strategy,
            )
            .map_err(|e| {
                tracing::error!(id = %alloc.id, error = %e, "allocate refused");
                Status::internal(e.to_string())
            })?;
            container_responses.push(resp);
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _req: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        // Not requested in the options; answer anyway, there is nothing to do.
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}
