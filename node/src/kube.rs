//! The Kubernetes client both plugins use, built one way: the in-cluster
//! config or the kubeconfig (`kube::Config::infer`), a kubeconfig file
//! named on the command line, or (tests only) a plain-HTTP API server URL.

use std::path::PathBuf;

/// Where the API server and its credentials come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KubeSource {
    /// In-cluster service account, else `$KUBECONFIG` or `~/.kube/config`.
    #[default]
    Infer,
    /// This kubeconfig file.
    Kubeconfig(PathBuf),
    /// This API server URL, plain HTTP, no credentials: how tests point a
    /// plugin at a local fake API server. Production options never carry one.
    Url(String),
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("Kubernetes client: {0}")]
    Config(String),
}

/// A client for `source`.
pub async fn client(source: &KubeSource) -> Result<kube::Client, KubeError> {
    // kube's TLS client takes the process-wide rustls provider; name it,
    // so that a second provider compiled into the binary is no ambiguity.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let err = |what: &str, e: &dyn std::fmt::Display| KubeError::Config(format!("{what}: {e}"));
    let config = match source {
        KubeSource::Infer => kube::Config::infer()
            .await
            .map_err(|e| err("in-cluster config or kubeconfig", &e))?,
        KubeSource::Kubeconfig(p) => {
            let shown = p.display().to_string();
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| err(&shown, &e))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| err(&shown, &e))?
        }
        KubeSource::Url(url) => {
            let uri = url
                .parse()
                .map_err(|e| err(&format!("API server URL {url:?}"), &e))?;
            kube::Config::new(uri)
        }
    };
    kube::Client::try_from(config).map_err(|e| err("client", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bad_sources_are_clear_errors() {
        let Err(e) = client(&KubeSource::Url("not a url".into())).await else {
            panic!("a URL that is not one");
        };
        assert!(e.to_string().contains("\"not a url\""), "{e}");
        let Err(e) = client(&KubeSource::Kubeconfig("/nonexistent/kubeconfig".into())).await else {
            panic!("no such kubeconfig");
        };
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
        assert!(
            client(&KubeSource::Url("http://127.0.0.1:1".into()))
                .await
                .is_ok(),
            "built without dialing"
        );
    }
}
