//! Test doubles that speak the real gRPC protocols over real unix sockets:
//! a kubelet (Registration server that then dials the plugin and follows
//! ListAndWatch, as the real one does) and a PodResources server, and pods'
//! annotations in place of the Kubernetes API. The manager is never faked:
//! the integration tests in `tests/` run the real one in-process.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use tessera_proto::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
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
        // The device list followed (`devices`, `lists`) is the first resource's: a plugin
        // serving a second one (KAI's reservations) is dialled for it by the test.
        let first = {
            let mut regs = lock(&self.shared.registrations);
            regs.push(r.clone());
            regs[0].resource_name == r.resource_name
        };
        if !first {
            return Ok(Response::new(dp::Empty {}));
        }
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
