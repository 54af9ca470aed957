//! `tessera scheduler-extender`: its flags and the daemon's life (how it
//! serves, a Kubernetes client, the listener, serving until shutdown).
//!
//! How it serves: HTTPS when given `--tls-cert-file` and `--tls-key-file`
//! (re-read when they change, as the webhook's); plain HTTP only on a
//! loopback address, where only the scheduler in the same pod reaches it. A
//! non-loopback address without a certificate is refused at start: whatever
//! reaches the extender can bind pods.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_placement::Policy;
use tessera_tls::certs::{self, CertError, HTTP1};
use tessera_tls::files::MountedFiles;
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
    /// How long (seconds) a bind waits for the watched view to catch up
    /// with what the extender has seen before it is refused.
    #[arg(
        long,
        env = "TESSERA_EXTENDER_VIEW_WAIT",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub view_wait_secs: u64,
    /// The DRA driver whose claims the extender scores (it then watches the
    /// driver's ResourceSlices and every ResourceClaim, resource.k8s.io/v1,
    /// Kubernetes 1.34+). Empty: DRA off, nodes and pods only.
    #[arg(long, env = "TESSERA_EXTENDER_DRA_DRIVER", default_value = "")]
    pub dra_driver: String,
    /// No longer used: the extender watches the cluster instead of listing
    /// it every this many milliseconds. Accepted so that an older chart's
    /// flag does not stop the extender.
    #[arg(long, env = "TESSERA_EXTENDER_REFRESH_MS", hide = true)]
    pub refresh_ms: Option<u64>,
    /// Serving certificate chain (PEM), e.g. cert-manager's tls.crt: serve
    /// HTTPS. Re-read when it changes. Without it the extender serves plain
    /// HTTP, and only on a loopback `--listen`.
    #[arg(
        long,
        env = "TESSERA_EXTENDER_TLS_CERT_FILE",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(
        long,
        env = "TESSERA_EXTENDER_TLS_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// Seconds between re-reads of the certificate files.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_reload_secs: u64,
}

/// How the extender serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Plain HTTP: loopback addresses only.
    Plain,
    /// HTTPS from certificate files, re-read every `reload`.
    Tls {
        cert: PathBuf,
        key: PathBuf,
        reload: Duration,
    },
}

impl SchedulerExtenderArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            policy: self.policy,
            node_deadline: Duration::from_secs(self.node_deadline_secs),
            view_wait: Duration::from_secs(self.view_wait_secs),
            dra_driver: Some(self.dra_driver.clone()).filter(|d| !d.is_empty()),
        }
    }

    /// How to serve: TLS with a certificate, plain only on loopback.
    pub fn transport(&self) -> Result<Transport, RunError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Ok(Transport::Tls {
                cert: cert.clone(),
                key: key.clone(),
                reload: Duration::from_secs(self.tls_reload_secs),
            }),
            (None, None) if self.listen.ip().is_loopback() => Ok(Transport::Plain),
            (None, None) => Err(RunError::PlainOffLoopback { addr: self.listen }),
            // clap's `requires` makes these unreachable from the command line.
            (Some(_), None) => Err(RunError::HalfTls("--tls-key-file")),
            (None, Some(_)) => Err(RunError::HalfTls("--tls-cert-file")),
        }
    }

    /// The TLS configuration to serve with (`None`: plain HTTP), its
    /// certificate files loaded (a missing or bad one is an error here) and
    /// re-read every `--tls-reload-secs` on the current tokio runtime.
    pub fn server_tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, RunError> {
        match self.transport()? {
            Transport::Plain => Ok(None),
            Transport::Tls { cert, key, reload } => {
                let resolver = MountedFiles::watch(cert, key, reload)?;
                // HTTP/1.1 only: offering h2 would make Go's client (the scheduler) take it.
                Ok(Some(certs::server_config_alpn(resolver, &[HTTP1])?))
            }
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
    #[error(
        "refusing to serve plain HTTP on {addr}, which is not a loopback address: whatever \
         reaches the extender can bind pods. Give --tls-cert-file and --tls-key-file, or \
         listen on 127.0.0.1"
    )]
    PlainOffLoopback { addr: SocketAddr },
    #[error("TLS needs {0} too")]
    HalfTls(&'static str),
    #[error("extender TLS: {0}")]
    Cert(#[from] CertError),
}

/// Runs the extender with the in-cluster config (or a kubeconfig) until
/// `shutdown` completes.
pub async fn run(
    args: SchedulerExtenderArgs,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    // kube's TLS client takes the process-wide rustls provider; name it.
    let _ = certs::provider().install_default();
    // Before anything else: a bad certificate or a plain non-loopback address
    // is a clear error at start.
    let tls = args.server_tls()?;
    let client = kube::Client::try_default().await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: args.listen,
            source,
        })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    if args.refresh_ms.is_some() {
        tracing::warn!("--refresh-ms is no longer used: the extender watches the cluster");
    }
    let settings = args.settings();
    let dra = settings.dra_driver.clone().unwrap_or_else(|| "off".into());
    tracing::info!(listen = %args.listen, scheme, policy = %args.policy, %dra, "scheduler extender serving");
    let ext = Arc::new(Extender::start(client, settings));
    serve(listener, tls, ext, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SchedulerExtenderArgs,
    }

    fn args(flags: &[&str]) -> Result<SchedulerExtenderArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("extender").chain(flags.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn plain_http_only_on_loopback() {
        for listen in ["127.0.0.1:8888", "[::1]:8888"] {
            let a = args(&["--listen", listen]).expect("flags");
            assert_eq!(a.transport().expect(listen), Transport::Plain);
        }
        for listen in ["0.0.0.0:8888", "10.0.0.7:8888", "[::]:8888"] {
            let a = args(&["--listen", listen]).expect("flags");
            let e = a.transport().expect_err(listen).to_string();
            assert!(e.contains("refusing to serve plain HTTP"), "{e}");
            assert!(e.contains("--tls-cert-file"), "{e}");
        }
    }

    #[test]
    fn a_certificate_means_tls_on_any_address() {
        let a = args(&[
            "--listen",
            "0.0.0.0:8888",
            "--tls-cert-file",
            "/c.pem",
            "--tls-key-file",
            "/k.pem",
            "--tls-reload-secs",
            "5",
        ])
        .expect("flags");
        assert_eq!(
            a.transport().expect("tls"),
            Transport::Tls {
                cert: "/c.pem".into(),
                key: "/k.pem".into(),
                reload: Duration::from_secs(5),
            }
        );
        // One without the other is refused by the flags themselves.
        assert!(args(&["--tls-cert-file", "/c.pem"]).is_err());
        assert!(args(&["--tls-key-file", "/k.pem"]).is_err());
    }
}
