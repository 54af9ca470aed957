//! Test doubles that speak the real gRPC protocols over real unix sockets:
//! a kubelet (Registration server that then dials the plugin and follows
//! ListAndWatch, as the real one does), a PodResources server and a manager.
//! Used by the integration tests in `tests/` and usable by end-to-end tests.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use tessera_proto::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use tessera_proto::manager::v1 as mgr;
use tessera_proto::manager::v1::manager_server::{Manager, ManagerServer};
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tonic server on a unix socket, stopped on drop.
struct UnixServer {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl UnixServer {
    fn start(path: &Path, router: tonic::transport::server::Router) -> std::io::Result<Self> {
        let listener = crate::grpc::bind_unix(path)?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let res = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = res {
                tracing::warn!(error = %e, "test server stopped");
            }
        });
        Ok(Self {
            stop: Some(tx),
            task,
        })
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for f in lock(&self.shared.followers).drain(..) {
            f.abort();
        }
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        // Streams (ListAndWatch, WatchNodeStatus) never end by themselves.
        self.task.abort();
    }
}

// ---------------------------------------------------------------- kubelet

#[derive(Default)]
struct KubeletShared {
    registrations: Mutex<Vec<dp::RegisterRequest>>,
    /// The latest device list from the plugin.
    devices: Mutex<Option<watch::Sender<Vec<dp::Device>>>>,
    /// Every device list received, in order.
    lists: Mutex<Vec<Vec<dp::Device>>>,
    /// Tasks following a plugin's ListAndWatch; a restart ends them, as a
    /// real kubelet restart closes its connections.
    followers: Mutex<Vec<JoinHandle<()>>>,
    dir: PathBuf,
}

#[derive(Clone)]
struct KubeletRegistration {
    shared: Arc<KubeletShared>,
}

#[tonic::async_trait]
impl Registration for KubeletRegistration {
    async fn register(
        &self,
        req: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let r = req.into_inner();
        // What the real kubelet checks before accepting.
        if r.version != dp::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}",
                r.version
            )));
        }
        if !r.resource_name.contains('/') {
            return Err(Status::invalid_argument(format!(
                "resource name {:?} is not an extended resource name",
                r.resource_name
            )));
        }
        lock(&self.shared.registrations).push(r.clone());
        // Like the kubelet: dial the plugin's endpoint and follow its list.
        let endpoint = self.shared.dir.join(&r.endpoint);
        let shared = self.shared.clone();
        let follower = tokio::spawn(async move {
            let Ok(channel) = crate::grpc::unix_channel(&endpoint).await else {
                return;
            };
            let mut client = DevicePluginClient::new(channel);
            let Ok(resp) = client.list_and_watch(dp::Empty {}).await else {
                return;
            };
            let mut stream = resp.into_inner();
            while let Some(Ok(msg)) = stream.next().await {
                lock(&shared.lists).push(msg.devices.clone());
                if let Some(tx) = lock(&shared.devices).as_ref() {
                    tx.send_replace(msg.devices);
                }
            }
        });
        lock(&self.shared.followers).push(follower);
        Ok(Response::new(dp::Empty {}))
    }
}

/// A kubelet: serves Registration on `<dir>/kubelet.sock`, follows the
/// registered plugin's ListAndWatch, and calls the plugin on request.
pub struct FakeKubelet {
    dir: PathBuf,
    shared: Arc<KubeletShared>,
    devices_rx: watch::Receiver<Vec<dp::Device>>,
    server: Option<UnixServer>,
}

impl FakeKubelet {
    /// Starts serving on `<dir>/kubelet.sock`.
    pub fn start(dir: &Path) -> std::io::Result<Self> {
        let (tx, rx) = watch::channel(Vec::new());
        let shared = Arc::new(KubeletShared {
            registrations: Mutex::new(Vec::new()),
            devices: Mutex::new(Some(tx)),
            lists: Mutex::new(Vec::new()),
            followers: Mutex::new(Vec::new()),
            dir: dir.to_owned(),
        });
        let server = UnixServer::start(
            &dir.join(dp::KUBELET_SOCKET),
            Server::builder().add_service(RegistrationServer::new(KubeletRegistration {
                shared: shared.clone(),
            })),
        )?;
        Ok(Self {
            dir: dir.to_owned(),
            shared,
            devices_rx: rx,
            server: Some(server),
        })
    }

    /// What a kubelet restart does: stop, delete every socket in the dir
    /// (the plugin's too), and serve again on a new `kubelet.sock`.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.server = None;
        for f in lock(&self.shared.followers).drain(..) {
            f.abort();
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_socket() {
                std::fs::remove_file(entry.path())?;
            }
        }
        self.server = Some(UnixServer::start(
            &self.dir.join(dp::KUBELET_SOCKET),
            Server::builder().add_service(RegistrationServer::new(KubeletRegistration {
                shared: self.shared.clone(),
            })),
        )?);
        Ok(())
    }

    /// Every registration received so far.
    pub fn registrations(&self) -> Vec<dp::RegisterRequest> {
        lock(&self.shared.registrations).clone()
    }

    /// Waits until at least `n` registrations arrived; None on timeout.
    pub async fn wait_registrations(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Option<Vec<dp::RegisterRequest>> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.registrations();
            if r.len() >= n {
                return Some(r);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The latest device list the plugin sent.
    pub fn devices(&self) -> Vec<dp::Device> {
        self.devices_rx.borrow().clone()
    }

    /// Every device list the plugin sent so far, in order: what a test
    /// reads to show a list never appeared, once a later one has.
    pub fn lists(&self) -> Vec<Vec<dp::Device>> {
        lock(&self.shared.lists).clone()
    }

    /// Waits until the device list satisfies `pred`; returns it, or None on
    /// timeout.
    pub async fn wait_devices(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[dp::Device]) -> bool,
    ) -> Option<Vec<dp::Device>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            {
                let d = self.devices_rx.borrow_and_update();
                if pred(&d) {
                    return Some(d.clone());
                }
            }
            match tokio::time::timeout_at(deadline, self.devices_rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// A client on the plugin's socket `<dir>/<endpoint>`.
    pub async fn plugin(
        &self,
        endpoint: &str,
    ) -> Result<DevicePluginClient<Channel>, tonic::transport::Error> {
        Ok(DevicePluginClient::new(
            crate::grpc::unix_channel(&self.dir.join(endpoint)).await?,
        ))
    }
}

// ----------------------------------------------------------- podresources

#[derive(Clone, Default)]
struct PodResourcesService {
    resp: Arc<Mutex<pr::ListPodResourcesResponse>>,
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _req: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(lock(&self.resp).clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _req: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        req: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let r = req.into_inner();
        let pod = lock(&self.resp)
            .pod_resources
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .cloned()
            .ok_or_else(|| Status::not_found("no such pod"))?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// The kubelet's PodResources API, answering what the test sets.
pub struct FakePodResources {
    svc: PodResourcesService,
    _server: UnixServer,
}

impl FakePodResources {
    pub fn start(socket: &Path) -> std::io::Result<Self> {
        let svc = PodResourcesService::default();
        let server = UnixServer::start(
            socket,
            Server::builder().add_service(PodResourcesListerServer::new(svc.clone())),
        )?;
        Ok(Self {
            svc,
            _server: server,
        })
    }

    /// Sets the pods `List` reports: (namespace, pod, container, resource,
    /// device IDs).
    pub fn set_pods(&self, pods: &[(&str, &str, &str, &str, Vec<String>)]) {
        let resp = pr::ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(ns, pod, ctr, res, ids)| pr::PodResources {
                    name: (*pod).to_owned(),
                    namespace: (*ns).to_owned(),
                    containers: vec![pr::ContainerResources {
                        name: (*ctr).to_owned(),
                        devices: vec![pr::ContainerDevices {
                            resource_name: (*res).to_owned(),
                            device_ids: ids.clone(),
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                })
                .collect(),
        };
        *lock(&self.svc.resp) = resp;
    }
}

// ------------------------------------------------------------------- pods

/// (namespace, pod) → annotations.
type PodAnnotations = BTreeMap<(String, String), BTreeMap<String, String>>;

/// Pods' annotations, as the Kubernetes API would report them; a pod not
/// set here is not found.
#[derive(Clone, Default, Debug)]
pub struct FakePods {
    pods: Arc<Mutex<PodAnnotations>>,
}

impl FakePods {
    /// Sets one pod's annotations.
    pub fn set(&self, namespace: &str, pod: &str, annotations: &[(&str, &str)]) {
        lock(&self.pods).insert(
            (namespace.to_owned(), pod.to_owned()),
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }
}

impl crate::pod_resources::PodApi for FakePods {
    async fn annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<BTreeMap<String, String>, crate::node_labels::NodeApiError> {
        lock(&self.pods)
            .get(&(namespace.to_owned(), pod.to_owned()))
            .cloned()
            .ok_or_else(|| {
                crate::node_labels::NodeApiError::NotFound(format!("pod {namespace}/{pod}"))
            })
    }
}

// ---------------------------------------------------------------- manager

#[derive(Clone)]
struct ManagerService {
    status: Arc<watch::Sender<mgr::NodeStatus>>,
    allocations: Arc<Mutex<BTreeMap<String, mgr::Allocation>>>,
    create_calls: Arc<Mutex<u32>>,
    /// Every ResizeAllocation received, refused ones too.
    resize_calls: Arc<Mutex<Vec<mgr::ResizeAllocationRequest>>>,
    state_dir: PathBuf,
    /// Set by `stop`: calls fail and status streams end, even on
    /// connections made before (the server only stops accepting new ones).
    down: Arc<watch::Sender<bool>>,
}

impl ManagerService {
    fn check_up(&self) -> Result<(), Status> {
        if *self.down.borrow() {
            Err(Status::unavailable("manager stopped"))
        } else {
            Ok(())
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[tonic::async_trait]
impl Manager for ManagerService {
    async fn create_allocation(
        &self,
        req: Request<mgr::CreateAllocationRequest>,
    ) -> Result<Response<mgr::Allocation>, Status> {
        self.check_up()?;
        *lock(&self.create_calls) += 1;
        let r = req.into_inner();
        if !valid_id(&r.id) {
            return Err(Status::invalid_argument(format!("bad id {:?}", r.id)));
        }
        let status = self.status.borrow().clone();
        for d in &r.devices {
            if !status.gpus.iter().any(|g| g.uuid == d.gpu_uuid) {
                return Err(Status::not_found(format!("no GPU {}", d.gpu_uuid)));
            }
        }
        let mut allocs = lock(&self.allocations);
        if allocs.contains_key(&r.id) {
            return Err(Status::already_exists(format!(
                "allocation {} exists",
                r.id
            )));
        }
        let dir = self.state_dir.join("allocations").join(&r.id);
        std::fs::create_dir_all(&dir).map_err(|e| Status::internal(e.to_string()))?;
        let control = dir.join("control");
        let state = dir.join("state");
        for f in [&control, &state] {
            std::fs::write(f, b"").map_err(|e| Status::internal(e.to_string()))?;
        }
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let a = mgr::Allocation {
            id: r.id.clone(),
            devices: r.devices,
            policy: r.policy,
            device_ids: r.device_ids,
            labels: r.labels,
            control_path: control.display().to_string(),
            state_path: state.display().to_string(),
            created_unix_ms: created,
            ..Default::default()
        };
        allocs.insert(r.id, a.clone());
        Ok(Response::new(a))
    }

    async fn delete_allocation(
        &self,
        req: Request<mgr::DeleteAllocationRequest>,
    ) -> Result<Response<mgr::DeleteAllocationResponse>, Status> {
        self.check_up()?;
        let id = req.into_inner().id;
        match lock(&self.allocations).remove(&id) {
            Some(_) => {
                let _ = std::fs::remove_dir_all(self.state_dir.join("allocations").join(&id));
                Ok(Response::new(mgr::DeleteAllocationResponse {}))
            }
            None => Err(Status::not_found(format!("no allocation {id}"))),
        }
    }

    async fn list_allocations(
        &self,
        _req: Request<mgr::ListAllocationsRequest>,
    ) -> Result<Response<mgr::ListAllocationsResponse>, Status> {
        self.check_up()?;
        Ok(Response::new(mgr::ListAllocationsResponse {
            allocations: lock(&self.allocations).values().cloned().collect(),
        }))
    }

    /// The device plugin resizes a priority only (a pod's memory and
    /// compute come from its slices): that is kept, with the real one's
    /// range check; a device change is answered as a manager without it.
    async fn resize_allocation(
        &self,
        req: Request<mgr::ResizeAllocationRequest>,
    ) -> Result<Response<mgr::Allocation>, Status> {
        self.check_up()?;
        let r = req.into_inner();
        lock(&self.resize_calls).push(r.clone());
        if !r.devices.is_empty() {
            return Err(Status::unimplemented(
                "the test manager resizes priorities only",
            ));
        }
        let mut allocs = lock(&self.allocations);
        let a = allocs
            .get_mut(&r.id)
            .ok_or_else(|| Status::not_found(format!("no allocation {}", r.id)))?;
        let Some(p) = r.priority else {
            return Err(Status::invalid_argument("nothing to resize"));
        };
        if !(tessera_contract::labels::PRIORITY_MIN..=tessera_contract::labels::PRIORITY_MAX)
            .contains(&p)
        {
            return Err(Status::invalid_argument(format!(
                "priority {p} is not in -1000..=1000"
            )));
        }
        a.priority = p;
        Ok(Response::new(a.clone()))
    }

    async fn pause_allocation(
        &self,
        _req: Request<mgr::PauseAllocationRequest>,
    ) -> Result<Response<mgr::Allocation>, Status> {
        Err(Status::unimplemented("the test manager does not pause"))
    }

    async fn resume_allocation(
        &self,
        _req: Request<mgr::PauseAllocationRequest>,
    ) -> Result<Response<mgr::Allocation>, Status> {
        Err(Status::unimplemented("the test manager does not pause"))
    }

    async fn set_allocation_owner(
        &self,
        req: Request<mgr::SetAllocationOwnerRequest>,
    ) -> Result<Response<mgr::Allocation>, Status> {
        self.check_up()?;
        let r = req.into_inner();
        let mut allocs = lock(&self.allocations);
        let a = allocs
            .get_mut(&r.id)
            .ok_or_else(|| Status::not_found(format!("no allocation {}", r.id)))?;
        // As the real one: a policy may only become stricter (guaranteed
        // is stricter than burst); UNSPECIFIED leaves it as it is.
        let strictness = |p: i32| match mgr::ComputePolicy::try_from(p) {
            Ok(mgr::ComputePolicy::Guaranteed) => 2,
            Ok(mgr::ComputePolicy::Burst) => 1,
            _ => 0,
        };
        if r.policy != mgr::ComputePolicy::Unspecified as i32 {
            if strictness(r.policy) < strictness(a.policy) {
                return Err(Status::failed_precondition(format!(
                    "allocation {} may only become stricter",
                    r.id
                )));
            }
            a.policy = r.policy;
        }
        a.namespace = r.namespace;
        a.pod = r.pod;
        a.container = r.container;
        Ok(Response::new(a.clone()))
    }

    async fn get_node_status(
        &self,
        _req: Request<mgr::NodeStatusRequest>,
    ) -> Result<Response<mgr::NodeStatus>, Status> {
        self.check_up()?;
        Ok(Response::new(self.status.borrow().clone()))
    }

    type WatchNodeStatusStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<mgr::NodeStatus, Status>> + Send>>;

    async fn watch_node_status(
        &self,
        req: Request<mgr::WatchNodeStatusRequest>,
    ) -> Result<Response<Self::WatchNodeStatusStream>, Status> {
        self.check_up()?;
        // As the real one: the current status at once, then on every change
        // and at least every interval.
        let interval = Duration::from_millis(u64::from(req.get_ref().interval_ms.max(10)));
        let mut status = self.status.subscribe();
        let mut down = self.down.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let s = status.borrow_and_update().clone();
                if tx.send(Ok(s)).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = status.changed() => if r.is_err() { return },
                    () = tokio::time::sleep(interval) => {}
                    _ = down.wait_for(|d| *d) => return,
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A manager: keeps allocations in memory, creates (empty) control and
/// state files under `state_dir`, and reports the node status the test sets.
pub struct FakeManager {
    svc: ManagerService,
    server: Option<UnixServer>,
    socket: PathBuf,
}

impl FakeManager {
    pub fn start(
        socket: &Path,
        state_dir: &Path,
        status: mgr::NodeStatus,
    ) -> std::io::Result<Self> {
        let (tx, _) = watch::channel(status);
        let svc = ManagerService {
            status: Arc::new(tx),
            allocations: Arc::default(),
            create_calls: Arc::default(),
            resize_calls: Arc::default(),
            state_dir: state_dir.to_owned(),
            down: Arc::new(watch::channel(false).0),
        };
        let server = UnixServer::start(
            socket,
            Server::builder().add_service(ManagerServer::new(svc.clone())),
        )?;
        Ok(Self {
            svc,
            server: Some(server),
            socket: socket.to_owned(),
        })
    }

    /// Reports a new node status to every watcher.
    pub fn set_status(&self, status: mgr::NodeStatus) {
        self.svc.status.send_replace(status);
    }

    /// Changes one GPU's status in place.
    pub fn update_gpu(&self, uuid: &str, f: impl FnOnce(&mut mgr::GpuStatus)) {
        self.svc.status.send_modify(|s| {
            if let Some(g) = s.gpus.iter_mut().find(|g| g.uuid == uuid) {
                f(g);
            }
        });
    }

    /// The allocations it holds.
    pub fn allocations(&self) -> Vec<mgr::Allocation> {
        lock(&self.svc.allocations).values().cloned().collect()
    }

    /// How many CreateAllocation calls it received.
    pub fn create_calls(&self) -> u32 {
        *lock(&self.svc.create_calls)
    }

    /// Every ResizeAllocation it received, in order.
    pub fn resize_calls(&self) -> Vec<mgr::ResizeAllocationRequest> {
        lock(&self.svc.resize_calls).clone()
    }

    /// Stops serving (its socket disappears), keeping its allocations.
    pub fn stop(&mut self) {
        self.svc.down.send_replace(true);
        self.server = None;
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeManager {
    fn drop(&mut self) {
        self.svc.down.send_replace(true);
    }
}

/// A GPU as the manager reports it.
pub fn gpu_status(
    index: u32,
    uuid: &str,
    name: &str,
    memory_bytes: u64,
    numa: i32,
) -> mgr::GpuStatus {
    mgr::GpuStatus {
        index,
        uuid: uuid.to_owned(),
        name: name.to_owned(),
        memory_total_bytes: memory_bytes,
        numa_node: numa,
        healthy: true,
        ..Default::default()
    }
}
