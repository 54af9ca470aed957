//! Keeping the serving certificate valid: self-managed (our own CA, shared by the replicas
//! through a Secret, its bundle written into the webhook configuration) or mounted files
//! (cert-manager), both swapped into the running server without dropping a request.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

use crate::certs::{
    Authority, CaMaterial, CertError, ServingCert, SwappableCert, ca_rollover_due, renewal_due,
    validity_of_pem,
};
/// Mounted certificate files (cert-manager) are `tessera_tls::files`, shared with the
/// scheduler extender.
pub use tessera_tls::files::MountedFiles;

/// The CA as the replicas share it: the one that signs now, and the one before it, which
/// stays trusted until the certificates it signed have expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCa {
    pub current: CaMaterial,
    pub previous: Option<CaMaterial>,
    /// Opaque version for optimistic concurrency (the Secret's resourceVersion); `None` for
    /// a CA that was never stored.
    pub version: Option<String>,
}

/// What `CaStore::save` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Yes,
    /// Another replica saved first (or the version moved on): reload and use theirs.
    Conflict,
}

/// The cluster side of self-managed certificates, small so tests can fake it.
pub trait CaStore: Send + Sync {
    /// The shared CA, if one exists.
    fn load(&self) -> impl Future<Output = Result<Option<StoredCa>, CertError>> + Send;
    /// Creates the CA when `ca.version` is `None`, else replaces the one at that version.
    fn save(&self, ca: &StoredCa) -> impl Future<Output = Result<Saved, CertError>> + Send;
    /// Makes the webhook configuration trust at least `cas` (PEM); merges with what it
    /// trusts already (see `certs::merge_bundle`).
    fn publish_bundle(&self, cas: &[String]) -> impl Future<Output = Result<(), CertError>> + Send;
}

/// Replicas in one process (and tests) share a store through an `Arc`.
impl<S: CaStore> CaStore for Arc<S> {
    fn load(&self) -> impl Future<Output = Result<Option<StoredCa>, CertError>> + Send {
        (**self).load()
    }
    fn save(&self, ca: &StoredCa) -> impl Future<Output = Result<Saved, CertError>> + Send {
        (**self).save(ca)
    }
    fn publish_bundle(&self, cas: &[String]) -> impl Future<Output = Result<(), CertError>> + Send {
        (**self).publish_bundle(cas)
    }
}

/// Lifetimes and timing of self-managed certificates.
#[derive(Debug, Clone)]
pub struct Lifetimes {
    pub ca: Duration,
    pub serving: Duration,
    /// How long a new CA must have been in the published bundle before this replica serves
    /// a certificate it signed: time for every API server to pick up the new bundle.
    pub propagation: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        const DAY: u64 = 86_400;
        Self {
            ca: Duration::from_secs(5 * 365 * DAY),
            serving: Duration::from_secs(30 * DAY),
            propagation: Duration::from_secs(120),
        }
    }
}

/// What one `tick` did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tick {
    pub created_ca: bool,
    pub rolled_ca: bool,
    pub issued: bool,
}

struct Serving {
    cert: ServingCert,
    ca_pem: String,
}

/// Self-managed certificates for one replica.
pub struct SelfManaged<S> {
    store: S,
    dns_names: Vec<String>,
    lifetimes: Lifetimes,
    resolver: Mutex<Option<Arc<SwappableCert>>>,
    serving: Mutex<Option<Serving>>,
    /// The CA this replica last saw as current, and when it first saw it published.
    ca_seen: Mutex<Option<(String, OffsetDateTime)>>,
}

impl<S> std::fmt::Debug for SelfManaged<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfManaged")
            .field("dns_names", &self.dns_names)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data behind these locks is replaced whole, so a panicked holder left nothing half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: CaStore> SelfManaged<S> {
    pub fn new(store: S, dns_names: Vec<String>, lifetimes: Lifetimes) -> Self {
        Self {
            store,
            dns_names,
            lifetimes,
            resolver: Mutex::new(None),
            serving: Mutex::new(None),
            ca_seen: Mutex::new(None),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// First tick: makes sure there is a CA, a published bundle and a serving certificate,
    /// and returns the resolver the server should use.
    pub async fn start(&self, now: OffsetDateTime) -> Result<Arc<SwappableCert>, CertError> {
        self.tick(now).await?;
        lock(&self.resolver)
            .clone()
            .ok_or_else(|| CertError::Api("no serving certificate after the first tick".into()))
    }

    /// One round of upkeep; safe to run on every replica at any time.
    pub async fn tick(&self, now: OffsetDateTime) -> Result<Tick, CertError> {
        let mut outcome = Tick::default();
        let stored = self.ensure_ca(now, &mut outcome).await?;
        let current = Authority::from_material(&stored.current)?;

        let mut trusted = vec![stored.current.cert_pem.clone()];
        if let Some(prev) = &stored.previous {
            trusted.push(prev.cert_pem.clone());
        }
        self.store.publish_bundle(&trusted).await?;

        let seen_at = {
            let mut seen = lock(&self.ca_seen);
            match &*seen {
                Some((pem, at)) if *pem == stored.current.cert_pem => *at,
                _ => {
                    *seen = Some((stored.current.cert_pem.clone(), now));
                    now
                }
            }
        };
        let need = match &*lock(&self.serving) {
            None => true,
            Some(s) => {
                let expiring = renewal_due(s.cert.not_before, s.cert.not_after, now);
                let old_ca = s.ca_pem != stored.current.cert_pem;
                // Our certificate's CA is still in the bundle, so there is no hurry to move
                // to the new CA before every API server trusts it, unless ours is expiring.
                let settled = now - seen_at >= self.lifetimes.propagation;
                expiring || (old_ca && settled)
            }
        };
        if need {
            let cert = current.issue(&self.dns_names, self.lifetimes.serving, now)?;
            let mut resolver = lock(&self.resolver);
            match &*resolver {
                Some(r) => r.swap(&cert)?,
                None => *resolver = Some(SwappableCert::new(&cert)?),
            }
            *lock(&self.serving) = Some(Serving {
                cert,
                ca_pem: stored.current.cert_pem.clone(),
            });
            outcome.issued = true;
        }
        Ok(outcome)
    }

    /// Loads the shared CA, creating or rolling it over as needed. Conflicts mean another
    /// replica did the same first; we then use theirs.
    async fn ensure_ca(
        &self,
        now: OffsetDateTime,
        outcome: &mut Tick,
    ) -> Result<StoredCa, CertError> {
        for _ in 0..5 {
            let stored = match self.store.load().await? {
                Some(s) => s,
                None => {
                    let ca = Authority::generate(self.lifetimes.ca, now)?;
                    let fresh = StoredCa {
                        current: ca.material().clone(),
                        previous: None,
                        version: None,
                    };
                    if self.store.save(&fresh).await? == Saved::Yes {
                        outcome.created_ca = true;
                    }
                    continue;
                }
            };
            let (_, not_after) =
                validity_of_pem(&stored.current.cert_pem, "stored CA certificate")?;
            if !ca_rollover_due(not_after, self.lifetimes.serving, now) {
                return Ok(stored);
            }
            let ca = Authority::generate(self.lifetimes.ca, now)?;
            let rolled = StoredCa {
                current: ca.material().clone(),
                previous: Some(stored.current.clone()),
                version: stored.version.clone(),
            };
            if self.store.save(&rolled).await? == Saved::Yes {
                outcome.rolled_ca = true;
            }
        }
        Err(CertError::Api(
            "the CA Secret kept changing under us; giving up this round".into(),
        ))
    }

    /// Runs `tick` every `interval` forever, logging failures (the current certificate keeps
    /// serving; a later tick retries).
    pub async fn run(self: Arc<Self>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            match self.tick(OffsetDateTime::now_utc()).await {
                Ok(t) if t != Tick::default() => tracing::info!(?t, "certificate upkeep"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "certificate upkeep failed; will retry"),
            }
        }
    }
}
