//! Certificates: a CA (rcgen) and the serving certificates it signs, serving certificates
//! read from PEM, a rustls certificate resolver that can be swapped while the server runs,
//! and the rustls server configuration the HTTPS servers (webhook, scheduler extender) use.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

/// Why a certificate could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what} is not a PEM certificate: {reason}")]
    BadCertificate { what: String, reason: String },
    #[error("{what} is not a PEM private key: {reason}")]
    BadKey { what: String, reason: String },
    #[error("the TLS library refused the certificate or key: {0}")]
    Tls(#[from] rustls::Error),
    #[error(
        "{what}: the key does not go with the certificate, or the TLS library refused them: {reason}"
    )]
    Mismatch { what: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The store of a self-managed CA (the webhook's Secret) failed.
    #[error("Kubernetes API: {0}")]
    Api(String),
}

/// A CA as it is stored: certificate and PKCS#8 key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaMaterial {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA that can sign serving certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    material: CaMaterial,
    not_after: OffsetDateTime,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Certificates start a little in the past so that a node whose clock lags ours still
/// accepts them.
const BACKDATE: time::Duration = time::Duration::minutes(5);

impl Authority {
    /// A new self-signed CA valid from `now` for `validity`.
    pub fn generate(validity: Duration, now: OffsetDateTime) -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        // Named after its key, so two CAs made in the same second are told apart by name.
        let id: String = key
            .public_key_raw()
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        dn.push(DnType::CommonName, format!("tessera-webhook-ca-{id}"));
        dn.push(DnType::OrganizationName, "Tessera");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + validity;
        let cert = params.self_signed(&key)?;
        let material = CaMaterial {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Self::from_material(&material)
    }

    /// The CA from its stored form.
    pub fn from_material(material: &CaMaterial) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(&material.key_pem).map_err(|e| CertError::BadKey {
            what: "CA key".into(),
            reason: e.to_string(),
        })?;
        let (_, not_after) = validity_of_pem(&material.cert_pem, "CA certificate")?;
        let issuer = Issuer::from_ca_cert_pem(&material.cert_pem, key).map_err(|e| {
            CertError::BadCertificate {
                what: "CA certificate".into(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            issuer,
            material: material.clone(),
            not_after,
        })
    }

    pub fn material(&self) -> &CaMaterial {
        &self.material
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// A serving certificate for `dns_names`, never outliving the CA.
    pub fn issue(
        &self,
        dns_names: &[String],
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<ServingCert, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(dns_names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            dns_names.first().cloned().unwrap_or_default(),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now - BACKDATE;
        params.not_after = (now + validity).min(self.not_after);
        let cert = params.signed_by(&key, &self.issuer)?;
        ServingCert::from_pem(&cert.pem(), &key.serialize_pem(), "serving certificate")
    }
}

/// A serving certificate with its key, ready for rustls.
#[derive(Debug, Clone)]
pub struct ServingCert {
    pub chain: Vec<CertificateDer<'static>>,
    key_pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl ServingCert {
    /// From PEM text (a chain, leaf first, and its key), as cert-manager writes them.
    pub fn from_pem(cert_pem: &str, key_pem: &str, what: &str) -> Result<Self, CertError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| CertError::BadCertificate {
                    what: what.into(),
                    reason: e.to_string(),
                })?;
        let leaf = chain.first().ok_or_else(|| CertError::BadCertificate {
            what: what.into(),
            reason: "no CERTIFICATE block".into(),
        })?;
        let (not_before, not_after) = validity_of_der(leaf, what)?;
        // Check the key parses now, so a bad file is refused before it replaces a good one.
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| CertError::BadKey {
            what: format!("key of the {what}"),
            reason: e.to_string(),
        })?;
        let cert = Self {
            chain,
            key_pem: key_pem.to_string(),
            not_before,
            not_after,
        };
        // A key of another certificate is the usual mistake (a half-written rotation):
        // name the file.
        cert.certified_key().map_err(|e| match e {
            CertError::Tls(e) => CertError::Mismatch {
                what: what.into(),
                reason: e.to_string(),
            },
            other => other,
        })?;
        Ok(cert)
    }

    /// The private key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The form rustls serves; checks that the key belongs to the certificate.
    pub fn certified_key(&self) -> Result<Arc<CertifiedKey>, CertError> {
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| {
            CertError::BadKey {
                what: "serving key".into(),
                reason: e.to_string(),
            }
        })?;
        Ok(Arc::new(CertifiedKey::from_der(
            self.chain.clone(),
            key,
            &provider(),
        )?))
    }
}

/// The crypto provider everything here uses (ring), named once.
pub fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The serving certificate, replaceable while the server runs: each new TLS handshake
/// reads the current one, connections already open keep theirs, so a swap drops nothing.
#[derive(Debug)]
pub struct SwappableCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl SwappableCert {
    pub fn new(cert: &ServingCert) -> Result<Arc<Self>, CertError> {
        Ok(Arc::new(Self {
            current: RwLock::new(cert.certified_key()?),
        }))
    }

    /// Serves `cert` to every handshake from now on.
    pub fn swap(&self, cert: &ServingCert) -> Result<(), CertError> {
        let key = cert.certified_key()?;
        // A poisoned lock only means a reader panicked; the Arc inside is still whole.
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }

    /// The leaf certificate served now (for logs and tests).
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        let key = self.current.read().unwrap_or_else(|p| p.into_inner());
        key.cert.first().cloned()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// ALPN names of the HTTP versions a server speaks.
pub const H2: &[u8] = b"h2";
pub const HTTP1: &[u8] = b"http/1.1";

/// A TLS configuration for HTTP/2 and HTTP/1.1 (the webhook): TLS 1.2+.
pub fn server_config(cert: Arc<SwappableCert>) -> Result<Arc<rustls::ServerConfig>, CertError> {
    server_config_alpn(cert, &[H2, HTTP1])
}

/// A TLS configuration offering `protocols` by ALPN, most preferred first. A server that
/// speaks only HTTP/1.1 (the scheduler extender) must not offer `h2`: Go's client would
/// take it.
pub fn server_config_alpn(
    cert: Arc<SwappableCert>,
    protocols: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, CertError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// `(not_before, not_after)` of the first certificate in `pem`.
pub fn validity_of_pem(
    pem: &str,
    what: &str,
) -> Result<(OffsetDateTime, OffsetDateTime), CertError> {
    let der =
        CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| CertError::BadCertificate {
            what: what.into(),
            reason: e.to_string(),
        })?;
    validity_of_der(&der, what)
}

/// `(not_before, not_after)` of one DER certificate.
pub fn validity_of_der(
    der: &CertificateDer<'_>,
    what: &str,
) -> Result<(OffsetDateTime, OffsetDateTime), CertError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| CertError::BadCertificate {
            what: what.into(),
            reason: e.to_string(),
        })?;
    let v = cert.validity();
    Ok((v.not_before.to_datetime(), v.not_after.to_datetime()))
}

/// PEM text of one DER certificate.
pub fn der_to_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn ca_signs_serving_cert_that_never_outlives_it() {
        let ca = Authority::generate(DAY * 10, now()).expect("ca");
        let names = vec!["svc.ns.svc".to_string()];
        let short = ca.issue(&names, DAY, now()).expect("issue");
        assert!(short.not_after <= now() + DAY);
        let long = ca.issue(&names, DAY * 100, now()).expect("issue");
        assert_eq!(long.not_after, ca.not_after());
    }

    #[test]
    fn authority_round_trips_through_pem() {
        let ca = Authority::generate(DAY, now()).expect("ca");
        let again = Authority::from_material(ca.material()).expect("reload");
        assert_eq!(again.not_after(), ca.not_after());
        assert!(again.issue(&["x".into()], DAY, now()).is_ok());
    }

    #[test]
    fn bad_material_is_a_clear_error() {
        let ca = Authority::generate(DAY, now()).expect("ca");
        let bad_key = CaMaterial {
            cert_pem: ca.material().cert_pem.clone(),
            key_pem: "not a key".into(),
        };
        let e = Authority::from_material(&bad_key).unwrap_err().to_string();
        assert!(e.contains("CA key"), "{e}");
        let bad_cert = CaMaterial {
            cert_pem: "garbage".into(),
            key_pem: ca.material().key_pem.clone(),
        };
        let e = Authority::from_material(&bad_cert).unwrap_err().to_string();
        assert!(e.contains("CA certificate"), "{e}");
    }

    #[test]
    fn mismatched_key_is_refused() {
        let ca = Authority::generate(DAY, now()).expect("ca");
        let a = ca.issue(&["a".into()], DAY, now()).expect("a");
        let b = ca.issue(&["b".into()], DAY, now()).expect("b");
        let a_pem: String = a.chain.iter().map(|d| der_to_pem(d)).collect();
        let err = ServingCert::from_pem(&a_pem, &b.key_pem, "test cert").unwrap_err();
        assert!(matches!(err, CertError::Mismatch { .. }), "{err}");
        assert!(err.to_string().starts_with("test cert: "), "{err}");
        assert!(ServingCert::from_pem(&a_pem, &a.key_pem, "test cert").is_ok());
    }

    #[test]
    fn pem_encoding_round_trips() {
        let ca = Authority::generate(DAY, now()).expect("ca");
        let der = CertificateDer::from_pem_slice(ca.material().cert_pem.as_bytes()).expect("der");
        assert_eq!(der_to_pem(&der), ca.material().cert_pem);
    }
}
