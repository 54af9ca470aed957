//! Running the plugin: the background loops (inventory from the manager,
//! config reload, node labels, PodResources) and the serve-then-register
//! cycle that starts over whenever the kubelet restarts.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use tokio::task::JoinSet;
use tokio_stream::wrappers::UnixListenerStream;

use crate::edge::{GrpcPodResources, KubeNodeApi, KubePodApi, kube_client};
use crate::node_labels::NodeApiError;
use crate::passes::{Pass, Passes};
use crate::pod_resources::{OrphanTracker, PodApi, PodResourcesApi};
use crate::registration::{file_id, register};
use crate::service::{Assigned, PluginService, plugin_options};
use crate::state::PluginState;
use tessera_node::cdi::HostPaths;
use tessera_node::config::{Config, ConfigError};
use tessera_node::manager::{GrpcManager, ManagerApi};
use tessera_node::reload::ConfigReloader;

/// The extended resource the plugin advertises.
pub use tessera_contract::labels::RESOURCE as RESOURCE_NAME;
/// The plugin's socket file name in the kubelet's device-plugins dir.
pub const SOCKET_NAME: &str = "tessera.sock";

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC endpoint: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Kube(#[from] NodeApiError),
}

/// Everything the plugin is configured with (paths are config, not constants).
#[derive(Debug, Clone)]
pub struct Options {
    /// This node's name (Kubernetes node name).
    pub node_name: String,
    pub resource_name: String,
    /// The kubelet's device-plugins dir: `kubelet.sock` is there, and the
    /// plugin's own socket goes there.
    pub device_plugin_dir: PathBuf,
    pub socket_name: String,
    pub manager_socket: PathBuf,
    /// The kubelet's PodResources socket; None turns ownership tracking off.
    pub pod_resources_socket: Option<PathBuf>,
    /// The slice config file; None uses built-in defaults.
    pub config_path: Option<PathBuf>,
    pub config_poll: Duration,
    /// How often the kubelet socket is checked for a kubelet restart.
    pub kubelet_poll: Duration,
    pub host: HostPaths,
    /// Where the CDI spec of the node's GPUs goes when the node config's
    /// device-list strategy includes `cdi`; None writes none.
    pub cdi_spec_dir: Option<PathBuf>,
    /// Read node labels and write GPU labels through the Kubernetes API.
    pub use_kube: bool,
    /// The API server's URL (plain HTTP, no credentials) in place of the
    /// in-cluster config or kubeconfig: how tests point the plugin at a
    /// local fake API server. Production options never carry one.
    pub kube_url: Option<String>,
    /// Node labels to assume when the Kubernetes API is not used.
    pub static_labels: BTreeMap<String, String>,
    pub label_refresh: Duration,
    pub pod_resources_interval: Duration,
    /// An allocation without a pod for this long is deleted.
    pub orphan_grace: Duration,
    /// After losing the manager this long, every slice turns Unhealthy.
    pub manager_grace: Duration,
    /// `interval_ms` asked of WatchNodeStatus.
    pub status_interval: Duration,
    /// Where the running plugin counts its completed background passes
    /// (shared by clones: keep one to watch the plugin run with another).
    pub passes: Passes,
    /// Serve KAI-Scheduler's GPU choice (`crate::kai`): `nvidia.com/gpu` for its
    /// reservation pods, and the slices of a KAI pod on the GPU its group reserved.
    pub kai_reservations: bool,
}

impl Options {
    /// Production defaults for a node.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            resource_name: RESOURCE_NAME.to_owned(),
            device_plugin_dir: PathBuf::from(dp::DEVICE_PLUGIN_PATH),
            socket_name: SOCKET_NAME.to_owned(),
            manager_socket: PathBuf::from(tessera_proto::manager::v1::DEFAULT_SOCKET),
            pod_resources_socket: Some(PathBuf::from(
                tessera_proto::podresources::v1::KUBELET_SOCKET,
            )),
            config_path: None,
            config_poll: Duration::from_secs(2),
            kubelet_poll: Duration::from_secs(1),
            host: HostPaths::default(),
            cdi_spec_dir: None,
            use_kube: false,
            kube_url: None,
            static_labels: BTreeMap::new(),
            label_refresh: Duration::from_secs(60),
            pod_resources_interval: Duration::from_secs(10),
            orphan_grace: Duration::from_secs(60),
            manager_grace: Duration::from_secs(30),
            status_interval: Duration::from_secs(1),
            passes: Passes::default(),
            kai_reservations: false,
        }
    }
}

/// Reads the config file at start ([`ConfigReloader::open`]: a bad file
/// here is fatal, there is no older config to keep).
fn initial_config(path: Option<&Path>) -> Result<(Config, Option<ConfigReloader>), Error> {
    match path {
        None => Ok((Config::default(), None)),
        Some(path) => {
            let (reloader, config) = ConfigReloader::open(path)?;
            Ok((config, Some(reloader)))
        }
    }
}

/// Runs the plugin until `shutdown` completes.
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    run_with_pods(opts, None::<KubePodApi>, shutdown).await
}

/// [`run`], reading pods' annotations from `pods` in place of the Kubernetes
/// API when given (whether or not `use_kube` is set): how tests inject a
/// double, which production options never carry.
pub async fn run_with_pods<A: PodApi>(
    opts: Options,
    pods: Option<A>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let (config, reloader) = initial_config(opts.config_path.as_deref())?;
    let manager = Arc::new(GrpcManager::new(&opts.manager_socket)?);
    let mut tasks = JoinSet::new();
    let state = Arc::new(PluginState::new(
        opts.node_name.clone(),
        config,
        opts.static_labels.clone(),
    ));

    let mut kube = None;
    if opts.use_kube {
        let client = kube_client(opts.kube_url.as_deref()).await?;
        kube = Some(client.clone());
        // The GPU report for the scheduler extender (docs/placement.md).
        tasks.spawn(crate::gpu_report::publish_loop(
            Arc::new(KubeNodeApi::with_client(client.clone())),
            manager.clone(),
            state.clone(),
            opts.node_name.clone(),
        ));
        let api = Arc::new(KubeNodeApi::with_client(client));
        tasks.spawn(crate::node_labels::sync_loop(
            api,
            state.clone(),
            opts.node_name.clone(),
            opts.label_refresh,
        ));
    }
    tasks.spawn(inventory_loop(
        opts.manager_socket.display().to_string(),
        manager.clone(),
        state.clone(),
        opts.status_interval,
        opts.manager_grace,
    ));
    if let Some(reloader) = reloader {
        tasks.spawn(config_loop(
            reloader,
            state.clone(),
            opts.config_poll,
            opts.passes.clone(),
        ));
    }
    if let Some(sock) = &opts.pod_resources_socket {
        let sync = SyncSettings {
            resource: opts.resource_name.clone(),
            interval: opts.pod_resources_interval,
            grace: opts.orphan_grace,
            passes: opts.passes.clone(),
        };
        // Pod policies need the Kubernetes API (pod annotations); without
        // it every allocation keeps the node's policy.
        let lister = GrpcPodResources::new(sock)?;
        if let Some(injected) = pods {
            tasks.spawn(pod_resources_loop(
                manager.clone(),
                state.clone(),
                lister,
                Some(injected),
                sync,
            ));
        } else {
            tasks.spawn(pod_resources_loop(
                manager.clone(),
                state.clone(),
                lister,
                kube.clone().map(KubePodApi::new),
                sync,
            ));
        }
    }

    tasks.spawn(preload_loop(state.clone(), opts.host.preload_file.clone()));
    tasks.spawn(crate::slices_file::publish_loop(
        state.clone(),
        crate::slices_file::path_for(&opts.manager_socket),
    ));
    if let Some(dir) = opts.cdi_spec_dir.clone() {
        tasks.spawn(crate::cdi::spec_loop(state.clone(), opts.host.clone(), dir));
    }

    let service = Arc::new(PluginService {
        state: state.clone(),
        manager: manager.clone(),
        host: opts.host.clone(),
        // The scheduler extender's assignments (docs/placement.md, "Allocate"), and
        // KAI-Scheduler's reservations (docs/dropin.md, "Who picks the GPU").
        assigned: kube.clone().map(|c| {
            Assigned::new(
                KubePodApi::new(c),
                opts.node_name.clone(),
                opts.kai_reservations,
            )
        }),
    });
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let slices = serve_and_register(
        &opts,
        Endpoint {
            socket: &opts.socket_name,
            resource: &opts.resource_name,
            options: plugin_options(),
        },
        service,
        shutdown.clone(),
    );
    let result = if opts.kai_reservations {
        let reservations = Arc::new(crate::kai::ReservationService {
            state,
            pods: kube.map(KubePodApi::new),
            node: opts.node_name.clone(),
            manager,
        });
        let kai = serve_and_register(
            &opts,
            Endpoint {
                socket: crate::kai::SOCKET_NAME,
                resource: crate::kai::RESOURCE,
                options: crate::kai::plugin_options(),
            },
            reservations,
            shutdown,
        );
        let (a, b) = tokio::join!(slices, kai);
        let _ = std::fs::remove_file(opts.device_plugin_dir.join(crate::kai::SOCKET_NAME));
        a.and(b)
    } else {
        slices.await
    };
    tasks.shutdown().await;
    let _ = std::fs::remove_file(opts.device_plugin_dir.join(&opts.socket_name));
    result
}

/// A resource the plugin registers with the kubelet, and where it serves it.
struct Endpoint<'a> {
    socket: &'a str,
    resource: &'a str,
    options: dp::DevicePluginOptions,
}

/// Serves on the plugin socket, registers, and starts over when the kubelet
/// socket is recreated or the plugin socket removed (a kubelet restart).
async fn serve_and_register<S: DevicePlugin>(
    opts: &Options,
    endpoint: Endpoint<'_>,
    service: Arc<S>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let plugin_socket = opts.device_plugin_dir.join(endpoint.socket);
    let kubelet_socket = opts.device_plugin_dir.join(dp::KUBELET_SOCKET);
    tokio::pin!(shutdown);
    loop {
        let listener = crate::grpc::bind_unix(&plugin_socket).map_err(|source| Error::Io {
            what: "cannot listen on",
            path: plugin_socket.display().to_string(),
            source,
        })?;
        let plugin_id = file_id(&plugin_socket);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::from_arc(service.clone()))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                }),
        );
        tracing::info!(socket = %plugin_socket.display(), "serving the device plugin API");

        // Register, retrying until the kubelet takes it.
        let mut warned = false;
        let kubelet_id = loop {
            if let Some(id) = file_id(&kubelet_socket) {
                match register(
                    &kubelet_socket,
                    endpoint.socket,
                    endpoint.resource,
                    endpoint.options,
                )
                .await
                {
                    Ok(()) => {
                        tracing::info!(resource = %endpoint.resource, "registered with the kubelet");
                        break id;
                    }
                    Err(e) if !warned => {
                        tracing::warn!(error = %e, "registration failed; retrying");
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
            opts.passes.count(Pass::Kubelet);
            tokio::select! {
                () = &mut shutdown => {
                    stop_server(stop_tx, server).await;
                    return Ok(());
                }
                () = tokio::time::sleep(opts.kubelet_poll) => {}
            }
        };

        // Watch for a kubelet restart.
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    stop_server(stop_tx, server).await;
                    return Ok(());
                }
                res = &mut server => {
                    tracing::error!(result = ?res, "device plugin server stopped; starting again");
                    break;
                }
                () = tokio::time::sleep(opts.kubelet_poll) => {
                    if file_id(&kubelet_socket) != Some(kubelet_id) {
                        tracing::info!("kubelet socket recreated: the kubelet restarted; registering again");
                        break;
                    }
                    if file_id(&plugin_socket) != plugin_id {
                        tracing::info!("plugin socket removed; serving and registering again");
                        break;
                    }
                    opts.passes.count(Pass::Kubelet);
                }
            }
        }
        stop_server(stop_tx, server).await;
    }
}

async fn stop_server<T>(
    stop: tokio::sync::oneshot::Sender<()>,
    mut server: tokio::task::JoinHandle<T>,
) {
    let _ = stop.send(());
    // Graceful shutdown waits for open ListAndWatch streams, which only the
    // kubelet ends; give it a moment, then cut them.
    if tokio::time::timeout(Duration::from_secs(1), &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
}

/// Keeps the host's `ld.so.preload` file in place while the node config
/// asks for it: containers restarted by the kubelet reuse their old Allocate
/// answer and mount the file without asking the plugin again.
async fn preload_loop(state: Arc<PluginState>, path: PathBuf) {
    let mut rx = state.subscribe();
    let mut failed = false;
    loop {
        let wanted = rx.borrow_and_update().node.ld_so_preload;
        if wanted {
            match crate::allocate::ensure_preload_file(&path) {
                Ok(()) => failed = false,
                Err(e) if !failed => {
                    tracing::error!(path = %path.display(), error = %e, "cannot write the preload file");
                    failed = true;
                }
                Err(_) => {}
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Follows the manager's node status; marks every slice Unhealthy when the
/// manager has been unreachable for longer than `grace`.
async fn inventory_loop<M: ManagerApi>(
    socket: String,
    manager: Arc<M>,
    state: Arc<PluginState>,
    interval: Duration,
    grace: Duration,
) {
    let interval_ms = u32::try_from(interval.as_millis()).unwrap_or(u32::MAX);
    // The manager sends at least every interval; silence for much longer
    // means the stream is dead even if the socket is not.
    let silence = interval * 3 + Duration::from_secs(1);
    let retry = (grace / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut lost_at: Option<Instant> = None;
    loop {
        match manager.watch_node_status(interval_ms).await {
            Ok(mut stream) => loop {
                match tokio::time::timeout(silence, stream.next()).await {
                    Ok(Some(Ok(status))) => {
                        if lost_at.take().is_some() {
                            tracing::info!("manager reachable again");
                        }
                        state.update_status(&status, Instant::now());
                    }
                    Ok(Some(Err(e))) => {
                        tracing::warn!(error = %e.message(), "node status stream failed");
                        break;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        tracing::warn!("no node status from the manager for {silence:?}");
                        break;
                    }
                }
            },
            Err(e) => {
                if lost_at.is_none() {
                    tracing::warn!(%socket, error = %e.message(), "cannot watch the manager's node status; retrying");
                }
            }
        }
        let since = *lost_at.get_or_insert_with(Instant::now);
        if since.elapsed() >= grace {
            state.set_manager_lost();
        }
        tokio::time::sleep(retry).await;
    }
}

/// Polls the config file ([`tessera_node::reload`]: a valid new file is
/// put in force at once, an invalid or unreadable one is logged and the
/// config in force stays).
async fn config_loop(
    mut reloader: ConfigReloader,
    state: Arc<PluginState>,
    poll: Duration,
    passes: Passes,
) {
    loop {
        tokio::time::sleep(poll).await;
        if let Some(config) = reloader.poll() {
            state.set_config(config);
        }
        passes.count(Pass::Config);
    }
}

/// How the PodResources loop runs.
struct SyncSettings {
    /// The resource whose devices are ours.
    resource: String,
    interval: Duration,
    /// An allocation without a pod for this long is deleted.
    grace: Duration,
    passes: Passes,
}

async fn pod_resources_loop<M: ManagerApi, P: PodResourcesApi, A: PodApi>(
    manager: Arc<M>,
    state: Arc<PluginState>,
    pods: P,
    pod_api: Option<A>,
    sync: SyncSettings,
) {
    let mut tracker = OrphanTracker::new(sync.grace);
    let mut tick = tokio::time::interval(sync.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match crate::pod_resources::sync_once(
            manager.as_ref(),
            &pods,
            pod_api.as_ref(),
            &sync.resource,
            &mut tracker,
            &state.snapshot().cards(),
        )
        .await
        {
            Ok(r) => {
                failing = false;
                if r != Default::default() {
                    tracing::debug!(report = ?r, "pod resources pass");
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e.message(), "pod resources pass failed; nothing deleted");
                    failing = true;
                }
            }
        }
        sync.passes.count(Pass::PodResources);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tessera_node::config::Config;
    use tessera_node::testing::{FakeManager, Method};
    use tessera_proto::manager::v1 as mgr;
    use tessera_proto::podresources::v1 as pr;
    use tonic::Status;

    /// The kubelet's PodResources: unreachable (None) or listing no pods.
    #[derive(Clone, Default)]
    struct Lister(Arc<Mutex<Option<pr::ListPodResourcesResponse>>>);

    impl PodResourcesApi for Lister {
        async fn list(&self) -> Result<pr::ListPodResourcesResponse, Status> {
            let answer = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            answer.ok_or_else(|| Status::unavailable("no kubelet"))
        }
    }

    fn ours(id: &str, source: &str) -> mgr::Allocation {
        mgr::Allocation {
            id: id.into(),
            device_ids: vec![format!("GPU-a::{id}")],
            labels: [(
                tessera_contract::labels::SOURCE.to_owned(),
                source.to_owned(),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// On the plugin's own (paused) clock: a kubelet that cannot be listed
    /// deletes nothing however long it lasts, and an allocation whose pod is
    /// gone is deleted on the first pass at or past the grace period, never
    /// before.
    #[tokio::test(start_paused = true)]
    async fn orphans_are_deleted_after_the_grace_and_never_on_a_failed_listing() {
        let grace = Duration::from_secs(60);
        let interval = Duration::from_secs(10);
        let manager = Arc::new(FakeManager::default());
        manager.insert(ours("0", "device-plugin"));
        manager.insert(ours("1", "cli"));
        let kubelet = Lister::default();
        let passes = Passes::default();
        let task = tokio::spawn(pod_resources_loop(
            manager.clone(),
            Arc::new(PluginState::new("n", Config::default(), BTreeMap::new())),
            kubelet.clone(),
            None::<crate::testing::FakePods>,
            SyncSettings {
                resource: RESOURCE_NAME.to_owned(),
                interval,
                grace,
                passes: passes.clone(),
            },
        ));
        let hang = Duration::from_secs(24 * 3600);
        // Ten grace periods of failed listings.
        passes
            .wait_beyond(Pass::PodResources, 0, 60, hang)
            .await
            .expect("passes");
        assert_eq!(manager.count(Method::Delete), 0);
        assert_eq!(manager.allocations().len(), 2);

        *kubelet.0.lock().expect("lock") = Some(pr::ListPodResourcesResponse::default());
        let listed_from = Instant::now();
        while manager.count(Method::Delete) == 0 {
            let seen = passes.get(Pass::PodResources);
            passes
                .wait_beyond(Pass::PodResources, seen, 1, hang)
                .await
                .expect("pass");
        }
        let waited = listed_from.elapsed();
        assert!(
            waited >= grace,
            "deleted {waited:?} after the pod was seen gone"
        );
        assert!(waited <= grace + 2 * interval, "deleted late: {waited:?}");
        let left: Vec<String> = manager.allocations().into_iter().map(|a| a.id).collect();
        assert_eq!(left, ["1"], "the CLI's allocation is not the plugin's");
        task.abort();
    }

    /// On the plugin's own (paused) clock: slices turn Unhealthy once the
    /// manager has been unreachable for the grace period, not before, and
    /// Healthy again when it answers.
    #[tokio::test(start_paused = true)]
    async fn slices_turn_unhealthy_after_the_manager_grace_and_back() {
        let manager = Arc::new(FakeManager::default());
        manager.set_status(mgr::NodeStatus {
            gpus: vec![mgr::GpuStatus {
                uuid: "GPU-a".into(),
                memory_total_bytes: 8 << 30,
                healthy: true,
                ..Default::default()
            }],
            ..Default::default()
        });
        let state = Arc::new(PluginState::new("n", Config::default(), BTreeMap::new()));
        let mut rx = state.subscribe();
        let interval = Duration::from_secs(1);
        let grace = Duration::from_secs(30);
        let task = tokio::spawn(inventory_loop(
            "test".into(),
            manager.clone(),
            state.clone(),
            interval,
            grace,
        ));
        rx.wait_for(|s| s.manager_up).await.expect("up");
        let up_at = Instant::now();
        // The first watch answered; every one after fails for a while (the
        // next comes after the stream's silence: no time passes here).
        for _ in 0..100 {
            manager.fail_next(Method::Watch, Status::unavailable("down"));
        }
        rx.wait_for(|s| !s.manager_up).await.expect("lost");
        let lost_after = up_at.elapsed();
        // Silence (3 intervals + 1 s) ends the stream; the grace runs from
        // the first failed watch after it.
        let silence = interval * 3 + Duration::from_secs(1);
        assert!(lost_after >= silence + grace, "lost after {lost_after:?}");
        assert!(
            lost_after <= silence + grace + Duration::from_secs(2),
            "lost late: {lost_after:?}"
        );
        assert!(
            state
                .snapshot()
                .devices
                .iter()
                .all(|d| d.health == dp::UNHEALTHY)
        );
        // The failures run out: the manager answers, the slices come back.
        rx.wait_for(|s| s.manager_up).await.expect("back");
        assert!(
            state
                .snapshot()
                .devices
                .iter()
                .all(|d| d.health == dp::HEALTHY)
        );
        task.abort();
    }
}
