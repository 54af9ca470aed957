//! Helpers shared by the webhook's integration tests: a real HTTPS server on a loopback
//! port and a rustls client that trusts a given CA bundle.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tessera_webhook::certs::{self, SwappableCert};
use tokio::net::TcpListener;

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

pub use tessera_tls::testing::Reply;

/// One request on a new TLS connection (so each one sees the certificate current at the
/// time) trusting exactly the CAs in `bundle_pem`.
pub async fn request(
    addr: SocketAddr,
    bundle_pem: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Reply, String> {
    tessera_tls::testing::request(addr, SERVICE_DNS, bundle_pem, method, path, body)
        .await
        .map_err(|e| e.to_string())
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
