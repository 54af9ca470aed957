//! `tessera webhook`: picks the certificate source, starts its upkeep, and serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::net::TcpListener;

use crate::certs::{self, CertError};
use crate::cluster::KubeCaStore;
use crate::dropin::{self, Rounding, SliceShape};
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
    /// Which other projects' words are translated, into slices of what size.
    pub dropin: dropin::Config,
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

/// Flags of `tessera webhook`; each can also come from the environment variable named.
/// Certificates come from files when `--cert-file` is given, else they are self-managed.
#[derive(clap::Args, Debug, Clone)]
pub struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, env = "TESSERA_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Serving certificate chain (PEM), e.g. cert-manager's tls.crt; re-read when it changes.
    #[arg(long, env = "TESSERA_WEBHOOK_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "TESSERA_WEBHOOK_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Namespace of the webhook's Service and CA Secret (self-managed certificates).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tessera-system")]
    pub namespace: String,
    /// Name of the webhook's Service; the certificate is issued for its DNS names.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_SERVICE",
        default_value = "tessera-webhook"
    )]
    pub service: String,
    /// Secret that holds the CA the replicas share.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_CA_SECRET",
        default_value = "tessera-webhook-ca"
    )]
    pub ca_secret: String,
    /// MutatingWebhookConfiguration whose caBundle the webhook keeps current.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_CONFIG",
        default_value = "tessera-webhook"
    )]
    pub webhook_config: String,
    /// Lifetime of the self-managed CA, in days.
    #[arg(long, default_value_t = 1825, value_parser = clap::value_parser!(u64).range(1..))]
    pub ca_validity_days: u64,
    /// Lifetime of a serving certificate, in days; renewed at two thirds of it.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub serving_validity_days: u64,
    /// Seconds between certificate checks (and certificate file re-reads).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub check_interval_secs: u64,
    /// Other projects' pod specs translated into Tessera's request (docs/dropin.md):
    /// any of hami, kai, volcano, comma-separated; "none" for none. A pod in a dialect
    /// not listed is left as it came.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_DROPIN_DIALECTS",
        default_value = "hami,kai,volcano",
        value_delimiter = ',',
        value_parser = parse_dialect
    )]
    pub dropin_dialects: Vec<Option<Dialect>>,
    /// Memory of one slice, as the node config's default slice gives it (e.g. 4Gi):
    /// drop-in requests are counted in these.
    #[arg(long, env = "TESSERA_WEBHOOK_DROPIN_SLICE_MEMORY", default_value = "4Gi", value_parser = tessera_contract::units::size_arg)]
    pub dropin_slice_memory: u64,
    /// Slices per GPU, as the node config's default slice gives it; a slice's compute
    /// is 100% divided by it.
    #[arg(long, env = "TESSERA_WEBHOOK_DROPIN_SLICES_PER_GPU", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub dropin_slices_per_gpu: u32,
    /// A drop-in request that is not a whole number of slices: "up" (the next whole
    /// number, with a warning) or "refuse".
    #[arg(long, env = "TESSERA_WEBHOOK_DROPIN_ROUNDING", default_value = "up", value_parser = Rounding::parse)]
    pub dropin_rounding: Rounding,
    /// KAI-Scheduler picks the GPU of a KAI pod (docs/dropin.md, "Who picks the GPU"):
    /// its fraction annotations stay on it, so KAI reserves a GPU that Tessera's device
    /// plugin then serves (its `--kai-reservations` on). Off: KAI's words come off and
    /// Tessera picks the GPU on KAI's node.
    #[arg(long, env = "TESSERA_WEBHOOK_DROPIN_KAI_GPU_CHOICE", default_value_t = false, action = clap::ArgAction::Set)]
    pub dropin_kai_gpu_choice: bool,
    /// The GPU models (product names, comma-separated) the cluster's nodes have: a
    /// model list (`tessera.dev/gpu-models`, HAMi's `nvidia.com/use-gputype`) none of
    /// whose entries matches one is refused, and one that does becomes node affinity
    /// on the nodes' per-model labels. Empty: model lists are held only on the node.
    #[arg(long, env = "TESSERA_WEBHOOK_GPU_MODELS", value_delimiter = ',')]
    pub gpu_models: Vec<String>,
}

use tessera_contract::dropin::Dialect;

/// A dialect name, or `none` (no dialect at all).
fn parse_dialect(s: &str) -> Result<Option<Dialect>, String> {
    match s.trim() {
        "none" | "" => Ok(None),
        name => Dialect::parse(name).map(Some),
    }
}

impl WebhookArgs {
    pub fn options(&self) -> Options {
        const DAY: u64 = 86_400;
        let certs = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => CertSource::SelfManaged {
                namespace: self.namespace.clone(),
                service: self.service.clone(),
                secret: self.ca_secret.clone(),
                config_name: self.webhook_config.clone(),
                lifetimes: Lifetimes {
                    ca: Duration::from_secs(self.ca_validity_days * DAY),
                    serving: Duration::from_secs(self.serving_validity_days * DAY),
                    ..Lifetimes::default()
                },
            },
        };
        Options {
            listen: self.listen,
            certs,
            check_interval: Duration::from_secs(self.check_interval_secs),
            dropin: dropin::Config {
                dialects: self.dropin_dialects.iter().flatten().copied().collect(),
                slice: SliceShape {
                    memory_mib: (self.dropin_slice_memory >> 20).max(1),
                    per_gpu: self.dropin_slices_per_gpu,
                },
                rounding: self.dropin_rounding,
                kai_gpu_choice: self.dropin_kai_gpu_choice,
                gpu_models: self
                    .gpu_models
                    .iter()
                    .map(|m| m.trim().to_owned())
                    .filter(|m| !m.is_empty())
                    .collect(),
            },
        }
    }
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

/// Runs the webhook until `shutdown` completes, then drains its connections.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    run_with(opts, |_| {}, shutdown).await
}

/// [`run`], calling `ready` with the address bound once the server listens (a test
/// started on port 0 learns its port, and when it serves).
pub async fn run_with(
    opts: Options,
    ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    // kube's TLS client asks rustls for the process default provider; name it once, so a
    // second provider compiled into the binary cannot make that ambiguous.
    let _ = certs::provider().install_default();
    let resolver = match &opts.certs {
        CertSource::Files { cert, key } => {
            MountedFiles::watch(cert.clone(), key.clone(), opts.check_interval)?
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
    let addr = listener.local_addr().unwrap_or(opts.listen);
    tracing::info!(%addr, "webhook serving");
    ready(addr);
    let stats = Arc::new(server::Stats::default());
    tokio::spawn(report_refusals(stats.clone(), Duration::from_secs(60)));
    tracing::info!(
        dialects = ?opts.dropin.dialects,
        slice_mib = opts.dropin.slice.memory_mib,
        slices_per_gpu = opts.dropin.slice.per_gpu,
        rounding = ?opts.dropin.rounding,
        kai_gpu_choice = opts.dropin.kai_gpu_choice,
        "drop-in translation"
    );
    server::serve_configured(
        listener,
        tls,
        server::Limits::default(),
        stats,
        Arc::new(opts.dropin.clone()),
        shutdown,
    )
    .await?;
    Ok(())
}

/// Logs, once per `every` in which any happened, what the server's limits cut
/// off: a sign of an attack or of a cluster that outgrew them.
async fn report_refusals(stats: Arc<server::Stats>, every: Duration) {
    use std::sync::atomic::Ordering::Relaxed;
    let read = |s: &server::Stats| {
        [
            s.refused.load(Relaxed),
            s.timed_out.load(Relaxed),
            s.too_large.load(Relaxed),
            s.busy.load(Relaxed),
            s.slow_body.load(Relaxed),
        ]
    };
    let mut last = read(&stats);
    loop {
        tokio::time::sleep(every).await;
        let now = read(&stats);
        if now != last {
            let d: Vec<u64> = now.iter().zip(&last).map(|(n, l)| n - l).collect();
            tracing::warn!(
                refused_at_cap = d[0],
                timed_out = d[1],
                too_large = d[2],
                over_memory_budget = d[3],
                slow_body = d[4],
                peak_connections = stats.peak_open.load(Relaxed),
                "requests cut off by the webhook's limits in the last {} s",
                every.as_secs()
            );
            last = now;
        }
    }
}
