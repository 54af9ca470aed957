//! Serving certificates from mounted files (cert-manager writes them into a Secret, the
//! kubelet updates the volume): read at start, where a missing or bad file is a clear
//! error, then re-read on an interval and swapped into the running server when they
//! change; a bad new pair is refused and the old certificate keeps serving.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::certs::{CertError, ServingCert, SwappableCert};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The pair behind the lock is replaced whole, so a panicked holder left nothing half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Certificates from mounted files (cert-manager writes them into a Secret, the kubelet
/// updates the volume): re-read on an interval and swapped in when they change.
#[derive(Debug)]
pub struct MountedFiles {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    last: Mutex<Option<(String, String)>>,
}

impl MountedFiles {
    pub fn new(cert_path: PathBuf, key_path: PathBuf) -> Self {
        Self {
            cert_path,
            key_path,
            last: Mutex::new(None),
        }
    }

    fn read(&self) -> Result<(String, String), CertError> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|source| CertError::Read {
                path: p.display().to_string(),
                source,
            })
        };
        Ok((read(&self.cert_path)?, read(&self.key_path)?))
    }

    /// Loads the files; fails with a clear error if they are missing or bad.
    pub fn start(&self) -> Result<Arc<SwappableCert>, CertError> {
        let (cert, key) = self.read()?;
        let serving = ServingCert::from_pem(&cert, &key, &self.cert_path.display().to_string())?;
        *lock(&self.last) = Some((cert, key));
        SwappableCert::new(&serving)
    }

    /// Swaps in the files if they changed since the last load. A bad new pair is an error
    /// and the old certificate keeps serving. Returns whether it swapped.
    pub fn reload(&self, resolver: &SwappableCert) -> Result<bool, CertError> {
        let pair = self.read()?;
        if lock(&self.last).as_ref() == Some(&pair) {
            return Ok(false);
        }
        let serving =
            ServingCert::from_pem(&pair.0, &pair.1, &self.cert_path.display().to_string())?;
        resolver.swap(&serving)?;
        *lock(&self.last) = Some(pair);
        Ok(true)
    }

    /// Loads the files (an error if they are missing or bad) and re-reads them every
    /// `interval` on the current tokio runtime; returns the resolver to serve from.
    pub fn watch(
        cert_path: PathBuf,
        key_path: PathBuf,
        interval: Duration,
    ) -> Result<Arc<SwappableCert>, CertError> {
        let files = Self::new(cert_path, key_path);
        let resolver = files.start()?;
        tokio::spawn(files.run(resolver.clone(), interval));
        Ok(resolver)
    }

    /// Re-reads the files every `interval` forever (see [`MountedFiles::reload`]).
    pub async fn run(self, resolver: Arc<SwappableCert>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            match self.reload(&resolver) {
                Ok(true) => {
                    tracing::info!(path = %self.cert_path.display(), "reloaded serving certificate")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "new certificate files rejected; keeping the old ones")
                }
            }
        }
    }
}
