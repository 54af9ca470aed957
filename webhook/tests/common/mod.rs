//! Helpers shared by the webhook's integration tests: a real HTTPS server on a loopback
//! port and a rustls client that trusts a given CA bundle.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tessera_webhook::certs::{self, SwappableCert};
use tokio::net::{TcpListener, TcpStream};

pub const SERVICE_DNS: &str = "tessera-webhook.tessera-system.svc";

/// Starts the webhook server with `cert`; returns its address. It runs until the test's
/// runtime ends.
pub async fn start_server(cert: Arc<SwappableCert>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = certs::server_config(cert).expect("tls config");
    tokio::spawn(tessera_webhook::server::serve(
        listener,
        tls,
        std::future::pending(),
    ));
    addr
}

/// One answer from the server.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The leaf certificate the server presented.
    pub leaf: CertificateDer<'static>,
}

/// One request on a new TLS connection (so each one sees the certificate current at the
/// time) trusting exactly the CAs in `bundle_pem`.
pub async fn request(
    addr: SocketAddr,
    bundle_pem: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Reply, String> {
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(bundle_pem.as_bytes()) {
        roots
            .add(der.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(certs::provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(SERVICE_DNS.to_string()).map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .ok_or("no peer certificate")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", SERVICE_DNS)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes()
        .to_vec();
    Ok(Reply { status, body, leaf })
}

/// The common name of a certificate's issuer.
pub fn issuer_cn(der: &CertificateDer<'_>) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("x509");
    cert.issuer()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The common name of a PEM certificate's subject.
pub fn subject_cn(pem: &str) -> String {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string()
}
