//! Certificate generation and rotation: replicas sharing one CA through a fake store, the
//! bundle they publish, serving-certificate renewal, CA rollover, mounted files, and a
//! server that keeps answering over HTTPS while its certificate changes under it.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_webhook::certs::{Authority, CertError, merge_bundle};
use tessera_webhook::rotate::{CaStore, Lifetimes, MountedFiles, Saved, SelfManaged, StoredCa};
use time::OffsetDateTime;

/// The cluster as the webhook sees it: a Secret with a version and a webhook configuration
/// with a CA bundle.
#[derive(Default)]
struct FakeStore {
    secret: Mutex<Option<StoredCa>>,
    bundle: Mutex<String>,
    versions: AtomicUsize,
    saves: AtomicUsize,
}

impl FakeStore {
    fn bundle(&self) -> String {
        self.bundle.lock().expect("lock").clone()
    }
    fn stored(&self) -> Option<StoredCa> {
        self.secret.lock().expect("lock").clone()
    }
    /// Stores `ca` as the current CA, as if it had been there for a long time.
    fn put(&self, ca: &Authority) {
        let v = self.versions.fetch_add(1, Ordering::SeqCst) + 1;
        *self.secret.lock().expect("lock") = Some(StoredCa {
            current: ca.material().clone(),
            previous: None,
            version: Some(v.to_string()),
        });
    }
}

impl CaStore for FakeStore {
    async fn load(&self) -> Result<Option<StoredCa>, CertError> {
        // Yield so that replicas started together interleave like real API calls.
        tokio::task::yield_now().await;
        Ok(self.stored())
    }

    async fn save(&self, ca: &StoredCa) -> Result<Saved, CertError> {
        tokio::task::yield_now().await;
        let mut secret = self.secret.lock().expect("lock");
        let live_version = secret.as_ref().and_then(|s| s.version.clone());
        let ok = match (&ca.version, &*secret) {
            (None, None) => true,
            (Some(v), Some(_)) => Some(v) == live_version.as_ref(),
            _ => false,
        };
        if !ok {
            return Ok(Saved::Conflict);
        }
        let v = self.versions.fetch_add(1, Ordering::SeqCst) + 1;
        let mut stored = ca.clone();
        stored.version = Some(v.to_string());
        *secret = Some(stored);
        self.saves.fetch_add(1, Ordering::SeqCst);
        Ok(Saved::Yes)
    }

    async fn publish_bundle(&self, cas: &[String]) -> Result<(), CertError> {
        let mut b = self.bundle.lock().expect("lock");
        *b = merge_bundle(&b, cas, OffsetDateTime::now_utc());
        Ok(())
    }
}

const DAY: Duration = Duration::from_secs(86_400);

fn lifetimes(propagation: Duration) -> Lifetimes {
    Lifetimes {
        ca: DAY * 365,
        serving: DAY * 30,
        propagation,
    }
}

fn names() -> Vec<String> {
    vec![common::SERVICE_DNS.to_string()]
}

fn cert_count(bundle: &str) -> usize {
    bundle.matches("BEGIN CERTIFICATE").count()
}

#[tokio::test(start_paused = true)]
async fn replicas_started_together_share_one_ca() {
    let store = Arc::new(FakeStore::default());
    let a = SelfManaged::new(store.clone(), names(), lifetimes(Duration::ZERO));
    let b = SelfManaged::new(store.clone(), names(), lifetimes(Duration::ZERO));
    let now = OffsetDateTime::now_utc();
    let (ra, rb) = tokio::join!(a.start(now), b.start(now));
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    assert_eq!(
        store.saves.load(Ordering::SeqCst),
        1,
        "exactly one CA was saved"
    );
    let ca = store.stored().expect("stored").current;
    assert_eq!(store.bundle(), ca.cert_pem, "the bundle is that one CA");
    let ca_cn = common::subject_cn(&ca.cert_pem);
    for r in [ra, rb] {
        let leaf = r.current_leaf().expect("leaf");
        assert_eq!(common::issuer_cn(&leaf), ca_cn);
    }
}

#[tokio::test(start_paused = true)]
async fn serving_certificate_is_renewed_at_two_thirds_of_its_life() {
    let store = Arc::new(FakeStore::default());
    let m = SelfManaged::new(store.clone(), names(), lifetimes(Duration::ZERO));
    let t0 = OffsetDateTime::now_utc();
    let resolver = m.start(t0).await.expect("start");
    let first = resolver.current_leaf().expect("leaf");

    let t = m.tick(t0 + DAY * 10).await.expect("tick");
    assert!(!t.issued && !t.rolled_ca && !t.created_ca, "{t:?}");
    assert_eq!(resolver.current_leaf(), Some(first.clone()));

    let t = m.tick(t0 + DAY * 20).await.expect("tick");
    assert!(t.issued && !t.rolled_ca, "{t:?}");
    assert_ne!(resolver.current_leaf(), Some(first));
    assert_eq!(store.saves.load(Ordering::SeqCst), 1, "same CA");
}

#[tokio::test(start_paused = true)]
async fn ca_rollover_keeps_the_old_ca_trusted_and_waits_for_propagation() {
    let store = Arc::new(FakeStore::default());
    let t0 = OffsetDateTime::now_utc();
    // A CA with 50 days left: less than two 30-day serving lifetimes.
    let old = Authority::generate(DAY * 50, t0).expect("old");
    store.put(&old);
    let m = SelfManaged::new(store.clone(), names(), lifetimes(Duration::from_secs(300)));
    let resolver = m.start(t0).await.expect("start");
    let stored = store.stored().expect("stored");
    assert_ne!(stored.current, *old.material(), "rolled over to a new CA");
    assert_eq!(stored.previous.as_ref(), Some(old.material()));
    assert_eq!(cert_count(&store.bundle()), 2, "bundle trusts old and new");
    assert!(store.bundle().contains(&old.material().cert_pem));
    assert!(store.bundle().contains(&stored.current.cert_pem));
    // This replica had no certificate yet, so it issued one from the new CA at once.
    let new_cn = common::subject_cn(&stored.current.cert_pem);
    assert_eq!(
        common::issuer_cn(&resolver.current_leaf().expect("leaf")),
        new_cn
    );

    // A second replica that served from the old CA moves only after propagation.
    let store2 = Arc::new(FakeStore::default());
    store2.put(&old);
    let serving_old =
        SelfManaged::new(store2.clone(), names(), lifetimes(Duration::from_secs(300)));
    // Pretend it started long ago, when the old CA was still fresh: lifetimes say no rollover
    // yet at that time.
    let early = SelfManaged::new(
        store2.clone(),
        names(),
        Lifetimes {
            serving: DAY,
            ..lifetimes(Duration::from_secs(300))
        },
    );
    let r_early = early.start(t0).await.expect("start early");
    let old_cn = common::subject_cn(&old.material().cert_pem);
    assert_eq!(
        common::issuer_cn(&r_early.current_leaf().expect("leaf")),
        old_cn
    );
    // Another replica rolls the CA over.
    serving_old.start(t0).await.expect("roll");
    assert_ne!(store2.stored().expect("s").current, *old.material());
    // `early` sees the new CA but keeps its old-CA certificate until propagation passes.
    let t = early
        .tick(t0 + Duration::from_secs(60))
        .await
        .expect("tick");
    assert!(!t.issued, "{t:?}");
    assert_eq!(
        common::issuer_cn(&r_early.current_leaf().expect("leaf")),
        old_cn
    );
    let t = early
        .tick(t0 + Duration::from_secs(60 + 301))
        .await
        .expect("tick");
    assert!(t.issued, "{t:?}");
    let new_cn = common::subject_cn(&store2.stored().expect("s").current.cert_pem);
    assert_eq!(
        common::issuer_cn(&r_early.current_leaf().expect("leaf")),
        new_cn
    );
}

#[tokio::test(start_paused = true)]
async fn a_broken_secret_is_an_error_not_a_silent_new_ca() {
    let store = Arc::new(FakeStore::default());
    *store.secret.lock().expect("lock") = Some(StoredCa {
        current: tessera_webhook::certs::CaMaterial {
            cert_pem: "not pem".into(),
            key_pem: "not pem".into(),
        },
        previous: None,
        version: Some("7".into()),
    });
    let m = SelfManaged::new(store.clone(), names(), lifetimes(Duration::ZERO));
    let err = m
        .start(OffsetDateTime::now_utc())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stored CA certificate"), "{err}");
    assert_eq!(store.saves.load(Ordering::SeqCst), 0);
}

/// Five CA rollovers under a live server, on a clock the test owns (the upkeep is told
/// the time; nothing sleeps). Each client trusts the bundle as published when it read it,
/// as the API server does after it picks up the configuration. The two edge cases a
/// rotation must survive are checked by construction every round: a client that read the
/// bundle just before a rollover and connects just after it (the old certificate still
/// serves), and one that read it just after the rollover and connects once the serving
/// certificate moved (the bundle it read already trusts the new CA).
#[tokio::test(start_paused = true)]
async fn server_keeps_answering_while_certificates_rotate() {
    let store = Arc::new(FakeStore::default());
    let propagation = Duration::from_secs(120);
    let m = SelfManaged::new(store.clone(), names(), lifetimes(propagation));
    // The test's clock starts five propagation waits in the past, so that it never runs
    // ahead of the wall clock the TLS client checks validity against.
    let mut now = OffsetDateTime::now_utc() - propagation * 5;
    let resolver = m.start(now).await.expect("start");
    let addr = common::start_server(resolver.clone()).await;
    let get = |bundle: String| async move {
        common::request(addr, &bundle, "GET", "/healthz", vec![]).await
    };

    let mut leaves = std::collections::HashSet::new();
    for round in 0..5 {
        let before = store.bundle();
        let serving = get(before.clone()).await.expect("before the rollover");
        assert_eq!(serving.status, 200);
        leaves.insert(serving.leaf.to_vec());

        // The stored CA is made to look old; a tick replaces it and publishes the bundle.
        let aging = Authority::generate(DAY * 40, now).expect("ca");
        store.put(&aging);
        let t = m.tick(now).await.expect("tick");
        assert!(t.rolled_ca && !t.issued, "round {round}: {t:?}");
        let after = store.bundle();
        let new_ca = store.stored().expect("stored").current.cert_pem;
        assert!(after.contains(&new_ca) && !before.contains(&new_ca));

        // Read before, connect after: the old certificate still serves.
        let r = get(before.clone()).await.expect("old bundle, right after");
        assert_eq!((r.status, &r.leaf), (200, &serving.leaf));

        // Not a moment before the propagation wait is over does the certificate move...
        let t = m
            .tick(now + propagation - Duration::from_secs(1))
            .await
            .expect("tick");
        assert!(!t.issued, "round {round}: moved before propagation: {t:?}");
        // ...and then it does.
        now += propagation;
        let t = m.tick(now).await.expect("tick");
        assert!(
            t.issued,
            "round {round}: the serving certificate moves: {t:?}"
        );

        // Read right after the rollover, connect now: the new certificate, trusted.
        let r = get(after).await.expect("new bundle, after the move");
        assert_eq!(r.status, 200);
        assert_ne!(r.leaf, serving.leaf, "round {round}: still the old leaf");
        leaves.insert(r.leaf.to_vec());
        // The new leaf really is from the new CA: the pre-rollover bundle does not trust it.
        assert!(get(before).await.is_err(), "round {round}");
    }
    assert_eq!(leaves.len(), 6, "one leaf per CA");
}

#[test]
fn mounted_files_reload_when_they_change_and_refuse_bad_ones() {
    let dir = tempfile::tempdir().expect("tmp");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let now = OffsetDateTime::now_utc();
    let ca = Authority::generate(DAY, now).expect("ca");
    let write = |cert: &tessera_webhook::certs::ServingCert, key: &str| {
        let pem: String = cert
            .chain
            .iter()
            .map(|d| tessera_webhook::certs::der_to_pem(d))
            .collect();
        std::fs::write(&cert_path, pem).expect("write");
        std::fs::write(&key_path, key).expect("write");
    };

    let files = MountedFiles::new(cert_path.clone(), key_path.clone());
    let err = files.start().unwrap_err().to_string();
    assert!(err.contains("tls.crt"), "{err}");

    let (a, a_key) = issue_with_key(&ca, now);
    write(&a, &a_key);
    let resolver = files.start().expect("start");
    assert_eq!(resolver.current_leaf().as_ref(), a.chain.first());
    assert!(!files.reload(&resolver).expect("unchanged"));

    let (b, b_key) = issue_with_key(&ca, now);
    write(&b, &b_key);
    assert!(files.reload(&resolver).expect("changed"));
    assert_eq!(resolver.current_leaf().as_ref(), b.chain.first());

    // A half-written rotation (new cert, old key) is refused; the last good one stays.
    let (c, _) = issue_with_key(&ca, now);
    write(&c, &b_key);
    assert!(files.reload(&resolver).is_err());
    assert_eq!(resolver.current_leaf().as_ref(), b.chain.first());
}

/// A serving certificate and its key PEM, the way cert-manager would write them.
fn issue_with_key(
    ca: &Authority,
    now: OffsetDateTime,
) -> (tessera_webhook::certs::ServingCert, String) {
    let cert = ca.issue(&names(), DAY, now).expect("issue");
    let key = cert.key_pem().to_string();
    (cert, key)
}
