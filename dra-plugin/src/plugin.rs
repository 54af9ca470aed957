//! The plugin's life: read the checkpoint, connect to the manager and the
//! API server, start publishing the node's ResourceSlices
//! ([`crate::publish`]), serve the DRA services on `dra.sock` in the plugin
//! dir, then the registration socket in the kubelet's registry dir (only
//! once there is something to call), until shut down; then remove both
//! sockets so the kubelet sees the plugin go.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_node::kube::KubeSource;
use tessera_node::manager::GrpcManager;
use tessera_proto::dra::{v1, v1beta1};
use tessera_proto::pluginregistration::v1::registration_server::RegistrationServer;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::checkpoint::{CheckpointError, Store};
use crate::driver::{ConfigFile, Driver, DriverOptions, KubeClaims};
use crate::registration::{self, Registration, Verdict};
use crate::service::{V1, V1beta1};

/// The DRA service socket's file name in the plugin dir.
pub const DRA_SOCKET: &str = "dra.sock";

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Config(#[from] tessera_node::config::ConfigError),
    #[error("cannot make a Kubernetes client: {0}")]
    Kube(String),
    #[error("cannot reach the manager at {path}: {source}")]
    Manager {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server on {path} failed: {source}")]
    Serve {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("no --node-name and cannot read the hostname: {0}")]
    NodeName(std::io::Error),
}

/// Everything the plugin is told at start.
#[derive(Debug, Clone)]
pub struct Options {
    pub driver: DriverOptions,
    /// The kubelet's plugin registry dir.
    pub registry_dir: PathBuf,
    /// The plugin's own dir: `dra.sock` and the checkpoint.
    pub plugin_dir: PathBuf,
    pub manager_socket: PathBuf,
    pub config_path: Option<PathBuf>,
    /// None: the in-cluster config (or the usual kubeconfig discovery).
    pub kubeconfig: Option<PathBuf>,
}

/// The Kubernetes client from `kubeconfig`, or the in-cluster config (or
/// the default kubeconfig) without one: [`tessera_node::kube::client`], the
/// device plugin's construction.
pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let source = kubeconfig.map_or(KubeSource::Infer, |p| KubeSource::Kubeconfig(p.to_owned()));
    tessera_node::kube::client(&source)
        .await
        .map_err(|e| Error::Kube(e.to_string()))
}

fn bind(path: &Path) -> Result<tokio::net::UnixListener, Error> {
    let err = |source| Error::Bind {
        path: path.display().to_string(),
        source,
    };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
        _ => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    tokio::net::UnixListener::bind(path).map_err(err)
}

/// Runs the plugin until `shutdown` completes.
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let store = Store::open(&opts.plugin_dir)?;
    let claims = KubeClaims(kube_client(opts.kubeconfig.as_deref()).await?);
    let manager =
        Arc::new(
            GrpcManager::new(&opts.manager_socket).map_err(|source| Error::Manager {
                path: opts.manager_socket.display().to_string(),
                source,
            })?,
        );
    let config = Arc::new(ConfigFile::open(
        opts.config_path.as_deref(),
        &opts.driver.node_name,
    )?);
    let publisher = tokio::spawn(crate::publish::run(
        claims.0.clone(),
        manager.clone(),
        config.clone(),
        opts.driver.driver_name.clone(),
        opts.driver.node_name.clone(),
    ));
    let driver = Arc::new(Driver::new(
        opts.driver.clone(),
        manager,
        claims,
        config,
        store,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let dra_path = opts.plugin_dir.join(DRA_SOCKET);
    let dra_listener = bind(&dra_path)?;
    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::from_arc(Arc::new(
            V1(driver.clone()),
        )))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::from_arc(
            Arc::new(V1beta1(driver)),
        ))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(dra_listener),
            stopped(stop_rx.clone()),
        );

    let reg_path = opts
        .registry_dir
        .join(registration::socket_name(&opts.driver.driver_name));
    let (reg, mut verdict) =
        Registration::new(&opts.driver.driver_name, &dra_path.display().to_string());
    let reg_listener = bind(&reg_path)?;
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(reg))
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), stopped(stop_rx));
    tracing::info!(
        driver = %opts.driver.driver_name,
        node = %opts.driver.node_name,
        dra = %dra_path.display(),
        registration = %reg_path.display(),
        "DRA plugin serving"
    );

    // The kubelet's verdict is only logged: a refused plugin keeps serving,
    // and the kubelet asks again when it restarts.
    let verdicts = tokio::spawn(async move {
        while verdict.changed().await.is_ok() {
            let v: Verdict = verdict.borrow().clone();
            if let Some(Err(e)) = v {
                tracing::error!(error = %e, "not registered");
            }
        }
    });
    let serve = async {
        tokio::try_join!(
            async {
                dra_server.await.map_err(|source| Error::Serve {
                    path: dra_path.display().to_string(),
                    source,
                })
            },
            async {
                reg_server.await.map_err(|source| Error::Serve {
                    path: reg_path.display().to_string(),
                    source,
                })
            },
        )
        .map(|_| ())
    };
    tokio::pin!(serve);
    let result = tokio::select! {
        r = &mut serve => r,
        () = shutdown => {
            let _ = stop_tx.send(true);
            serve.await
        }
    };
    verdicts.abort();
    publisher.abort();
    let _ = std::fs::remove_file(&reg_path);
    let _ = std::fs::remove_file(&dra_path);
    result
}
