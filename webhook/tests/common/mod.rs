//! Helpers shared by the webhook's integration tests: a real HTTPS server on a loopback
//! port, a rustls client that trusts a given CA bundle, and one admission over it (the
//! review's answer checked and its patch applied).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use tessera_webhook::certs::{self, Authority, SwappableCert};
use tessera_webhook::dropin::Config;
use tessera_webhook::server::{Limits, Stats, serve_configured};
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

/// A webhook server on loopback with a fresh CA, and that CA to trust.
pub struct Server {
    pub addr: SocketAddr,
    pub ca_pem: String,
}

/// Starts the webhook server with the drop-in `config` and a certificate from a new CA.
pub async fn server_with(config: Config) -> Server {
    let now = time::OffsetDateTime::now_utc();
    let ca = Authority::generate(Duration::from_secs(86_400), now).expect("ca");
    let cert = ca
        .issue(&[SERVICE_DNS.to_string()], Duration::from_secs(3600), now)
        .expect("cert");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = certs::server_config(SwappableCert::new(&cert).expect("resolver")).expect("tls");
    tokio::spawn(serve_configured(
        listener,
        tls,
        Limits::default(),
        Arc::new(Stats::default()),
        Arc::new(config),
        std::future::pending(),
    ));
    Server {
        addr,
        ca_pem: ca.material().cert_pem.clone(),
    }
}

/// What the webhook said about one pod.
#[derive(Debug)]
pub enum Outcome {
    /// Allowed: the pod after the patch (the same pod when there was none), whether there
    /// was a patch, and the warnings.
    Allowed {
        pod: Value,
        patched: bool,
        warnings: Vec<String>,
    },
    Denied(String),
}

/// Sends `review` (an AdmissionReview of `pod`) over HTTPS. The answer must be an
/// AdmissionReview for the same request; a refusal carries no patch; a patch must apply
/// cleanly to `pod` and leave a valid `Pod`.
pub async fn admit_on(s: &Server, pod: &Value, review: &Value) -> Outcome {
    let body = serde_json::to_vec(review).expect("json");
    let reply = request(s.addr, &s.ca_pem, "POST", "/mutate", body)
        .await
        .expect("request");
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let answer: Value = serde_json::from_slice(&reply.body).expect("review json");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], review["request"]["uid"]);
    if response["allowed"] != json!(true) {
        assert!(
            response.get("patch").is_none(),
            "a refusal carries no patch"
        );
        let msg = response["status"]["message"].as_str().expect("message");
        return Outcome::Denied(msg.to_string());
    }
    let warnings = response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|s| s.as_str().expect("text").to_owned())
                .collect()
        })
        .unwrap_or_default();
    let Some(patch) = response.get("patch") else {
        return Outcome::Allowed {
            pod: pod.clone(),
            patched: false,
            warnings,
        };
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("patch is base64 text"))
        .expect("base64");
    let ops: json_patch::Patch = serde_json::from_slice(&bytes).expect("RFC 6902 patch");
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &ops).expect("patch applies cleanly");
    serde_json::from_value::<Pod>(patched.clone()).expect("still a valid Pod");
    Outcome::Allowed {
        pod: patched,
        patched: true,
        warnings,
    }
}

/// Admits `pod` (its review made by `review_of`) on a new server under `config`; expects
/// it allowed and a second pass to change nothing. The pod after the patch, and the
/// warnings.
pub async fn admitted(
    config: Config,
    review_of: impl Fn(&Value) -> Value,
    pod: &Value,
) -> (Value, Vec<String>) {
    let s = server_with(config).await;
    let (out, warnings) = match admit_on(&s, pod, &review_of(pod)).await {
        Outcome::Allowed { pod, warnings, .. } => (pod, warnings),
        Outcome::Denied(m) => panic!("denied: {m}"),
    };
    match admit_on(&s, &out, &review_of(&out)).await {
        Outcome::Allowed { patched, pod, .. } => {
            assert!(!patched, "second pass changed the pod: {pod:#}")
        }
        Outcome::Denied(m) => panic!("second pass denied: {m}"),
    }
    (out, warnings)
}

/// Admits `pod` on a new server under `config`; expects it refused; the message.
pub async fn denied(config: Config, review_of: impl Fn(&Value) -> Value, pod: &Value) -> String {
    match admit_on(&server_with(config).await, pod, &review_of(pod)).await {
        Outcome::Denied(m) => m,
        Outcome::Allowed { pod, .. } => panic!("allowed: {pod:#}"),
    }
}
