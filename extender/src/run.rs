//! `tessera scheduler-extender`: its flags and the daemon's life (a
//! Kubernetes client, the listener, serving until shutdown).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessera_placement::Policy;
use tokio::net::TcpListener;

use crate::server::{ServeError, serve};
use crate::service::{Extender, Settings};

/// Flags of `tessera scheduler-extender`.
#[derive(clap::Args, Debug, Clone)]
pub struct SchedulerExtenderArgs {
    /// Address to serve the extender API on (the chart: loopback, beside
    /// the scheduler in one pod).
    #[arg(
        long,
        env = "TESSERA_EXTENDER_LISTEN",
        default_value = "127.0.0.1:8888"
    )]
    pub listen: SocketAddr,
    /// Placement policy: defrag, fgd, binpack, spread, shared-threshold[:0..1].
    #[arg(long, env = "TESSERA_EXTENDER_POLICY", default_value = "defrag")]
    pub policy: Policy,
    /// A node whose device plugin has not reported its GPUs within this
    /// many seconds is unknown (filtered out), not empty.
    #[arg(long, env = "TESSERA_EXTENDER_NODE_DEADLINE", default_value_t = 120)]
    pub node_deadline_secs: u64,
    /// How stale (milliseconds) filter's and prioritize's view of the
    /// cluster may be; bind always reads afresh.
    #[arg(long, env = "TESSERA_EXTENDER_REFRESH_MS", default_value_t = 1000)]
    pub refresh_ms: u64,
}

impl SchedulerExtenderArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            policy: self.policy,
            node_deadline: Duration::from_secs(self.node_deadline_secs),
            refresh: Duration::from_millis(self.refresh_ms),
        }
    }
}

/// Why the extender could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Runs the extender with the in-cluster config (or a kubeconfig) until
/// `shutdown` completes.
pub async fn run(
    args: SchedulerExtenderArgs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    // kube's TLS client takes the process-wide rustls provider; name it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default().await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: args.listen,
            source,
        })?;
    tracing::info!(listen = %args.listen, policy = %args.policy, "scheduler extender serving");
    let ext = Arc::new(Extender::new(client, args.settings()));
    serve(listener, ext, shutdown).await?;
    Ok(())
}
