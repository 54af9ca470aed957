//! For tests (feature `testing`): an HTTPS client that trusts exactly the CAs given, one
//! request per connection, so each request sees the certificate served at that moment.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::certs::provider;

/// One answer from a server.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The leaf certificate the server presented.
    pub leaf: CertificateDer<'static>,
}

/// Why a request got no answer. `Connect` and `Lost` are what a client retries (no
/// server listening, or the connection closed before an answer); `Tls` is not (the
/// server presented a certificate we do not trust, or the handshake was refused).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("bad trust bundle or request: {0}")]
    Setup(String),
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[source] std::io::Error),
    #[error("no answer: {0}")]
    Lost(String),
}

/// A rustls client configuration trusting exactly the certificates in `bundle_pem`
/// (HTTP/1.1: no ALPN).
pub fn client_config(bundle_pem: &str) -> Result<Arc<rustls::ClientConfig>, RequestError> {
    let setup = |e: &dyn std::fmt::Display| RequestError::Setup(e.to_string());
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(bundle_pem.as_bytes()) {
        roots
            .add(der.map_err(|e| setup(&e))?)
            .map_err(|e| setup(&e))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A TLS connection to `addr`, verifying the server as `server_name` against the CAs in
/// `bundle_pem`, handshake done.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    bundle_pem: &str,
) -> Result<TlsStream<TcpStream>, RequestError> {
    let connector = tokio_rustls::TlsConnector::from(client_config(bundle_pem)?);
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| RequestError::Setup(e.to_string()))?;
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(RequestError::Connect)?;
    connector.connect(name, tcp).await.map_err(|e| {
        // rustls reports what it refused (a certificate, a protocol) as InvalidData; any
        // other kind is the connection itself going (reset, closed mid-handshake).
        if e.kind() == std::io::ErrorKind::InvalidData {
            RequestError::Tls(e)
        } else {
            RequestError::Lost(format!("during the TLS handshake: {e}"))
        }
    })
}

/// One request on a new TLS connection to `addr` (see [`connect`]).
pub async fn request(
    addr: SocketAddr,
    server_name: &str,
    bundle_pem: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Reply, RequestError> {
    let tls = connect(addr, server_name, bundle_pem).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .ok_or_else(|| RequestError::Lost("no peer certificate".into()))?;
    let lost = |e: &dyn std::fmt::Display| RequestError::Lost(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| lost(&e))?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", server_name)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| RequestError::Setup(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| lost(&e))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| lost(&e))?
        .to_bytes()
        .to_vec();
    Ok(Reply { status, body, leaf })
}
