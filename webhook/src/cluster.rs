//! The Kubernetes side of self-managed certificates: the CA lives in a Secret that the
//! replicas share; its bundle goes into the `MutatingWebhookConfiguration`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;

use crate::certs::{CaMaterial, CertError, merge_bundle};
use crate::rotate::{CaStore, Saved, StoredCa};

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const PREV_CERT: &str = "previous-ca.crt";
const PREV_KEY: &str = "previous-ca.key";

/// `CaStore` over the Kubernetes API.
#[derive(Clone)]
pub struct KubeCaStore {
    secrets: Api<Secret>,
    configs: Api<MutatingWebhookConfiguration>,
    secret_name: String,
    config_name: String,
}

impl std::fmt::Debug for KubeCaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCaStore")
            .field("secret_name", &self.secret_name)
            .field("config_name", &self.config_name)
            .finish_non_exhaustive()
    }
}

impl KubeCaStore {
    pub fn new(client: Client, namespace: &str, secret_name: &str, config_name: &str) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            configs: Api::all(client),
            secret_name: secret_name.to_string(),
            config_name: config_name.to_string(),
        }
    }
}

fn api_err(what: &str, e: kube::Error) -> CertError {
    CertError::Api(format!("{what}: {e}"))
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Reads the CA out of a Secret's data; a Secret that lacks the keys is an error, not an
/// absent CA, so a broken Secret is never silently replaced.
pub fn ca_from_secret(secret: &Secret) -> Result<StoredCa, CertError> {
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| -> Result<Option<String>, CertError> {
        data.get(key)
            .map(|b| {
                String::from_utf8(b.0.clone())
                    .map_err(|_| CertError::Api(format!("Secret key {key} is not UTF-8 PEM")))
            })
            .transpose()
    };
    let name = secret.metadata.name.clone().unwrap_or_default();
    let current = match (text(CA_CERT)?, text(CA_KEY)?) {
        (Some(cert_pem), Some(key_pem)) => CaMaterial { cert_pem, key_pem },
        _ => {
            return Err(CertError::Api(format!(
                "Secret {name} lacks {CA_CERT} or {CA_KEY}; delete it to let the webhook make a new CA"
            )));
        }
    };
    let previous = match (text(PREV_CERT)?, text(PREV_KEY)?) {
        (Some(cert_pem), Some(key_pem)) => Some(CaMaterial { cert_pem, key_pem }),
        _ => None,
    };
    Ok(StoredCa {
        current,
        previous,
        version: secret.metadata.resource_version.clone(),
    })
}

/// The Secret that stores `ca`.
pub fn secret_from_ca(name: &str, ca: &StoredCa) -> Secret {
    let mut data = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
    };
    put(CA_CERT, &ca.current.cert_pem);
    put(CA_KEY, &ca.current.key_pem);
    if let Some(p) = &ca.previous {
        put(PREV_CERT, &p.cert_pem);
        put(PREV_KEY, &p.key_pem);
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: ca.version.clone(),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_string(),
                "tessera".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// Sets every webhook's `caBundle` in `config` to the merge of what it has and `cas`;
/// returns whether anything changed.
pub fn apply_bundle(
    config: &mut MutatingWebhookConfiguration,
    cas: &[String],
    now: OffsetDateTime,
) -> bool {
    let mut changed = false;
    for hook in config.webhooks.iter_mut().flatten() {
        let live = hook
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        let merged = merge_bundle(&live, cas, now);
        if merged != live {
            hook.client_config.ca_bundle = Some(ByteString(merged.into_bytes()));
            changed = true;
        }
    }
    changed
}

impl CaStore for KubeCaStore {
    async fn load(&self) -> Result<Option<StoredCa>, CertError> {
        let secret = self
            .secrets
            .get_opt(&self.secret_name)
            .await
            .map_err(|e| api_err(&format!("reading Secret {}", self.secret_name), e))?;
        secret.as_ref().map(ca_from_secret).transpose()
    }

    async fn save(&self, ca: &StoredCa) -> Result<Saved, CertError> {
        let secret = secret_from_ca(&self.secret_name, ca);
        let pp = PostParams::default();
        let result = match &ca.version {
            None => self.secrets.create(&pp, &secret).await.map(drop),
            Some(_) => self
                .secrets
                .replace(&self.secret_name, &pp, &secret)
                .await
                .map(drop),
        };
        match result {
            Ok(()) => Ok(Saved::Yes),
            Err(e) if is_conflict(&e) => Ok(Saved::Conflict),
            Err(e) => Err(api_err(&format!("writing Secret {}", self.secret_name), e)),
        }
    }

    async fn publish_bundle(&self, cas: &[String]) -> Result<(), CertError> {
        let what = format!("updating MutatingWebhookConfiguration {}", self.config_name);
        for _ in 0..5 {
            let mut config = self
                .configs
                .get(&self.config_name)
                .await
                .map_err(|e| api_err(&what, e))?;
            if !apply_bundle(&mut config, cas, OffsetDateTime::now_utc()) {
                return Ok(());
            }
            // Replace carries the resourceVersion we read, so two replicas merging at once
            // cannot lose each other's CA: the loser gets 409 and merges again.
            match self
                .configs
                .replace(&self.config_name, &PostParams::default(), &config)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(api_err(&what, e)),
            }
        }
        Err(CertError::Api(format!("{what}: kept conflicting")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};

    use super::*;
    use crate::certs::Authority;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn secret_round_trip_keeps_both_cas_and_the_version() {
        let now = OffsetDateTime::now_utc();
        let a = Authority::generate(DAY, now).expect("a");
        let b = Authority::generate(DAY, now).expect("b");
        let ca = StoredCa {
            current: a.material().clone(),
            previous: Some(b.material().clone()),
            version: Some("42".into()),
        };
        let secret = secret_from_ca("tessera-webhook-ca", &ca);
        assert_eq!(ca_from_secret(&secret).expect("parse"), ca);
    }

    #[test]
    fn secret_without_the_ca_is_an_error_that_says_what_to_do() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("tessera-webhook-ca".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = ca_from_secret(&secret).unwrap_err().to_string();
        assert!(e.contains("lacks ca.crt or ca.key; delete it"), "{e}");
    }

    #[test]
    fn bundle_goes_into_every_webhook_and_only_changes_when_needed() {
        let now = OffsetDateTime::now_utc();
        let a = Authority::generate(DAY, now).expect("a");
        let hook = |name: &str| MutatingWebhook {
            name: name.into(),
            client_config: WebhookClientConfig::default(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            ..Default::default()
        };
        let mut config = MutatingWebhookConfiguration {
            webhooks: Some(vec![hook("one"), hook("two")]),
            ..Default::default()
        };
        let cas = vec![a.material().cert_pem.clone()];
        assert!(apply_bundle(&mut config, &cas, now));
        for h in config.webhooks.as_ref().expect("hooks") {
            let b = h.client_config.ca_bundle.as_ref().expect("bundle");
            assert_eq!(String::from_utf8_lossy(&b.0), a.material().cert_pem);
        }
        assert!(
            !apply_bundle(&mut config, &cas, now),
            "second apply is a no-op"
        );
    }
}
