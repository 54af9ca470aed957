//! The webhook's certificate rules: when a self-managed serving certificate is renewed,
//! when its CA rolls over, and the CA bundle it publishes. The certificates themselves
//! (CA, serving certificate, swappable resolver, rustls configuration) are
//! `tessera_tls::certs`, shared with the scheduler extender, and re-exported here.

use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;

pub use tessera_tls::certs::*;

/// A serving certificate is renewed once two thirds of its life have passed, which leaves
/// a third of it for retries if the renewal fails.
pub fn renewal_due(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> bool {
    let life = not_after - not_before;
    now >= not_before + life * 2 / 3
}

/// The CA is replaced while it still has two serving lifetimes left: certificates it signed
/// before then expire while it is still trusted.
pub fn ca_rollover_due(
    ca_not_after: OffsetDateTime,
    serving: Duration,
    now: OffsetDateTime,
) -> bool {
    ca_not_after - now < serving * 2
}

/// The CA bundle to publish: the certificates already trusted that have not expired, plus
/// `ours`; duplicates removed, order kept. Merging (rather than overwriting) means a
/// replica that has not yet seen a CA rollover cannot take the new CA out of the bundle.
pub fn merge_bundle(live: &str, ours: &[String], now: OffsetDateTime) -> String {
    let mut certs: Vec<CertificateDer<'static>> = Vec::new();
    let live_certs = CertificateDer::pem_slice_iter(live.as_bytes()).filter_map(Result::ok);
    let our_certs = ours
        .iter()
        .flat_map(|p| CertificateDer::pem_slice_iter(p.as_bytes()).filter_map(Result::ok));
    for der in live_certs.chain(our_certs) {
        let alive = validity_of_der(&der, "bundle entry").is_ok_and(|(_, end)| end > now);
        if alive && !certs.contains(&der) {
            certs.push(der);
        }
    }
    certs.iter().map(|d| der_to_pem(d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn renewal_and_rollover_rules() {
        let t0 = OffsetDateTime::now_utc();
        let end = t0 + DAY * 3;
        assert!(!renewal_due(t0, end, t0 + DAY));
        assert!(!renewal_due(t0, end, t0 + DAY * 2 - Duration::from_secs(1)));
        assert!(renewal_due(t0, end, t0 + DAY * 2));
        assert!(!ca_rollover_due(t0 + DAY * 100, DAY * 30, t0));
        assert!(ca_rollover_due(t0 + DAY * 59, DAY * 30, t0));
    }

    #[test]
    fn bundle_merges_dedups_and_drops_expired() {
        let t = OffsetDateTime::now_utc();
        let old = Authority::generate(DAY, t - DAY * 2).expect("old"); // expired yesterday
        let a = Authority::generate(DAY, t).expect("a");
        let b = Authority::generate(DAY, t).expect("b");
        let live = format!("{}{}", old.material().cert_pem, a.material().cert_pem);
        let merged = merge_bundle(
            &live,
            &[b.material().cert_pem.clone(), a.material().cert_pem.clone()],
            t,
        );
        let n = CertificateDer::pem_slice_iter(merged.as_bytes()).count();
        assert_eq!(n, 2, "{merged}");
        assert!(merged.starts_with(&a.material().cert_pem));
        assert!(merged.ends_with(&b.material().cert_pem));
        assert_eq!(merge_bundle("", &[], t), "");
    }
}
