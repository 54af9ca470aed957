//! `tessera webhook`: picks the certificate source, starts its upkeep, and serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::net::TcpListener;

use crate::certs::{self, CertError};
use crate::cluster::KubeCaStore;
use crate::rotate::{Lifetimes, MountedFiles, SelfManaged};
use crate::server::{self, ServeError};

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// Our own CA in the Secret `secret` of `namespace`; its bundle is written into the
    /// `MutatingWebhookConfiguration` named `config_name`.
    SelfManaged {
        namespace: String,
        service: String,
        secret: String,
        config_name: String,
        lifetimes: Lifetimes,
    },
    /// `tls.crt` and `tls.key` as cert-manager mounts them.
    Files { cert: PathBuf, key: PathBuf },
}

/// Everything `tessera webhook` needs.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub certs: CertSource,
    /// How often certificates are checked (self-managed) or files re-read (mounted).
    pub check_interval: Duration,
}

/// Why the webhook could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Kube(#[source] kube::Error),
}

/// The DNS names a Service is reached by from the API server.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ]
}

/// Runs the webhook until `shutdown` completes.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let resolver = match &opts.certs {
        CertSource::Files { cert, key } => {
            let files = MountedFiles::new(cert.clone(), key.clone());
            let resolver = files.start()?;
            tokio::spawn(files.run(resolver.clone(), opts.check_interval));
            resolver
        }
        CertSource::SelfManaged {
            namespace,
            service,
            secret,
            config_name,
            lifetimes,
        } => {
            let client = kube::Client::try_default().await.map_err(RunError::Kube)?;
            let store = KubeCaStore::new(client, namespace, secret, config_name);
            let manager = Arc::new(SelfManaged::new(
                store,
                service_dns_names(service, namespace),
                lifetimes.clone(),
            ));
            let resolver = manager.start(OffsetDateTime::now_utc()).await?;
            tokio::spawn(manager.run(opts.check_interval));
            resolver
        }
    };
    let tls = certs::server_config(resolver)?;
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: opts.listen,
            source,
        })?;
    tracing::info!(addr = %opts.listen, "webhook serving");
    server::serve(listener, tls, shutdown).await?;
    Ok(())
}
