//! Attacks any pod in the cluster can make on the webhook, over real HTTPS on loopback:
//! half-sent requests (slowloris), slow bodies, idle HTTP/2 connections, many large
//! bodies at once. Each test asserts the server cuts them off within its limits, holds no
//! more than its caps, keeps serving a neighbour, and (large bodies) stays inside its
//! memory limit by this process's own heap accounting. Figures are printed
//! (`cargo test -p tessera-webhook --test attack_webhook -- --nocapture`) and quoted in
//! docs/security.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tessera_webhook::certs::{self, Authority, SwappableCert};
use tessera_webhook::server::{Limits, MAX_BODY, Stats, serve_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

/// Counts heap bytes in use and the most at once, so a test can bound the server's memory.
struct Counting;
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) };
        IN_USE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = IN_USE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                IN_USE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests in this file measure one process's heap: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DNS: &str = "tessera-webhook.tessera-system.svc";

struct Server {
    addr: SocketAddr,
    stats: Arc<Stats>,
    client: Arc<rustls::ClientConfig>,
    client_h2: Arc<rustls::ClientConfig>,
}

async fn server(limits: Limits) -> Server {
    let now = time::OffsetDateTime::now_utc();
    let ca = Authority::generate(Duration::from_secs(86_400), now).expect("ca");
    let cert = ca
        .issue(&[DNS.to_string()], Duration::from_secs(3600), now)
        .expect("cert");
    let tls = certs::server_config(SwappableCert::new(&cert).expect("resolver")).expect("tls");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stats = Arc::new(Stats::default());
    tokio::spawn(serve_with(
        listener,
        tls,
        limits,
        stats.clone(),
        std::future::pending(),
    ));
    let mut roots = rustls::RootCertStore::empty();
    let der = CertificateDer::from_pem_slice(ca.material().cert_pem.as_bytes()).expect("pem");
    roots.add(der).expect("root");
    let config = || {
        rustls::ClientConfig::builder_with_provider(Arc::new(certs::provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots.clone())
            .with_no_client_auth()
    };
    let mut h2 = config();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    Server {
        addr,
        stats,
        client: Arc::new(config()),
        client_h2: Arc::new(h2),
    }
}

/// A TLS connection from the loopback address `127.0.0.<from>` (each its own peer).
async fn connect(
    s: &Server,
    from: u8,
    h2: bool,
) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, from)),
        0,
    ))?;
    let tcp = sock.connect(s.addr).await?;
    let config = if h2 { &s.client_h2 } else { &s.client };
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::try_from(DNS).expect("name"), tcp)
        .await
}

/// Waits for the server to close a connection; how long from `since`, or `None` if it
/// was still open after `limit`. Whatever the server sends before closing is returned.
async fn closed_after(
    tls: &mut TlsStream<tokio::net::TcpStream>,
    since: Instant,
    limit: Duration,
) -> Option<(Duration, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = since + limit;
    loop {
        match tokio::time::timeout_at(end, tls.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((since.elapsed(), got)),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A whole, well-formed request on a new connection from `127.0.0.<from>`: its status.
async fn healthz(s: &Server, from: u8) -> Result<u16, String> {
    let mut tls = connect(s, from, false).await.map_err(|e| e.to_string())?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let (_, reply) = closed_after(&mut tls, Instant::now(), Duration::from_secs(10))
        .await
        .ok_or("no answer in 10 s")?;
    status_of(&reply).ok_or_else(|| format!("not HTTP: {:?}", String::from_utf8_lossy(&reply)))
}

fn status_of(reply: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(reply.get(..12)?).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// 300 connections that finish TLS and send half a request head, all from one pod. The
/// per-peer cap holds all but 16 of them off at once; those 16 are cut off by the header
/// timeout; a neighbour (another address) is served throughout.
#[tokio::test(start_paused = true)]
async fn half_sent_heads_from_one_pod_are_capped_and_cut_off() {
    let _serial = SERIAL.lock().await;
    let limits = Limits::default();
    let s = server(limits.clone()).await;
    let start = Instant::now();
    let mut held = Vec::new();
    let mut refused_at_once = 0;
    for _ in 0..300 {
        match connect(&s, 10, false).await {
            Ok(mut tls) => {
                if tls
                    .write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-")
                    .await
                    .is_ok()
                {
                    held.push((tls, Instant::now()));
                } else {
                    refused_at_once += 1;
                }
            }
            Err(_) => refused_at_once += 1,
        }
    }
    let peak = s.stats.peak_open.load(Ordering::Relaxed);
    assert!(
        peak <= limits.max_connections_per_peer,
        "{peak} connections held from one address, cap {}",
        limits.max_connections_per_peer
    );
    // The neighbour is served while the attacker's connections are held.
    assert_eq!(healthz(&s, 11).await, Ok(200));
    let mut worst = Duration::ZERO;
    let mut still_open = 0;
    let mut count = 0;
    for (mut tls, sent) in held {
        match closed_after(&mut tls, sent, limits.header_timeout * 3).await {
            Some((after, _)) => {
                // Those refused at accept close at once; the held ones at the timeout.
                if after > Duration::from_millis(500) {
                    count += 1;
                    worst = worst.max(after);
                }
            }
            None => still_open += 1,
        }
    }
    assert_eq!(
        still_open, 0,
        "half-sent requests outlived 3 x the header timeout"
    );
    assert!(count > 0, "no connection was held at all");
    eprintln!(
        "FIGURE webhook half-sent heads, one pod: 300 sent, peak held {peak} (cap {}), \
         {refused_at_once} refused at accept, {count} held ones cut off after \
         at most {:.2} s (header timeout {} s); total {:.1} s",
        limits.max_connections_per_peer,
        worst.as_secs_f64(),
        limits.header_timeout.as_secs(),
        start.elapsed().as_secs_f64(),
    );
    assert!(worst >= limits.header_timeout - Duration::from_millis(100));
}

/// 300 half-sent heads from 30 addresses: the global cap bounds what is held, every one is
/// cut off by the header timeout, and the server serves again afterwards.
#[tokio::test(start_paused = true)]
async fn half_sent_heads_from_many_pods_hit_the_global_cap_and_are_cut_off() {
    let _serial = SERIAL.lock().await;
    let limits = Limits::default();
    let s = server(limits.clone()).await;
    let heap_before = IN_USE.load(Ordering::Relaxed);
    PEAK.store(heap_before, Ordering::Relaxed);
    let mut held = Vec::new();
    for i in 0..300u32 {
        if let Ok(mut tls) = connect(&s, 20 + (i % 30) as u8, false).await
            && tls
                .write_all(b"POST /mutate HTTP/1.1\r\nhost:")
                .await
                .is_ok()
        {
            held.push((tls, Instant::now()));
        }
    }
    let peak = s.stats.peak_open.load(Ordering::Relaxed);
    assert!(
        peak <= limits.max_connections,
        "{peak} held, cap {}",
        limits.max_connections
    );
    let mut worst = Duration::ZERO;
    for (mut tls, sent) in held {
        let (after, _) = closed_after(&mut tls, sent, limits.header_timeout * 3)
            .await
            .expect("a half-sent request outlived 3 x the header timeout");
        worst = worst.max(after);
    }
    let heap = PEAK.load(Ordering::Relaxed).saturating_sub(heap_before);
    assert_eq!(
        healthz(&s, 60).await,
        Ok(200),
        "served again after the attack"
    );
    eprintln!(
        "FIGURE webhook half-sent heads, 30 pods: 300 sent, peak held {peak} (cap {}), \
         refused {} at accept, all cut off after at most {:.2} s; heap of both ends {:.1} MiB",
        limits.max_connections,
        s.stats.refused.load(Ordering::Relaxed),
        worst.as_secs_f64(),
        heap as f64 / (1 << 20) as f64,
    );
}

/// A whole head, then a body that stops half-way: answered 408 and closed within the body
/// timeout.
#[tokio::test(start_paused = true)]
async fn half_sent_bodies_are_cut_off() {
    let _serial = SERIAL.lock().await;
    let limits = Limits {
        body_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let s = server(limits.clone()).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        let mut tls = connect(&s, 70, false).await.expect("connect");
        tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{\"a\":")
            .await
            .expect("send");
        held.push((tls, Instant::now()));
    }
    let mut worst = Duration::ZERO;
    for (mut tls, sent) in held {
        let (after, reply) = closed_after(&mut tls, sent, limits.body_timeout * 4)
            .await
            .expect("a half-sent body outlived 4 x the body timeout");
        assert_eq!(
            status_of(&reply),
            Some(408),
            "{:?}",
            String::from_utf8_lossy(&reply)
        );
        worst = worst.max(after);
    }
    assert!(worst >= limits.body_timeout - Duration::from_millis(100));
    eprintln!(
        "FIGURE webhook half-sent bodies: 10 cut off with 408 after at most {:.2} s (body \
         timeout {} s)",
        worst.as_secs_f64(),
        limits.body_timeout.as_secs()
    );
}

/// HTTP/2 by ALPN, then silence (no preface): closed at the idle timeout, not held forever.
#[tokio::test(start_paused = true)]
async fn silent_http2_connections_are_closed_when_idle() {
    let _serial = SERIAL.lock().await;
    let limits = Limits {
        idle_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let s = server(limits.clone()).await;
    let mut tls = connect(&s, 80, true).await.expect("connect");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (after, _) = closed_after(&mut tls, Instant::now(), limits.idle_timeout * 4)
        .await
        .expect("a silent HTTP/2 connection outlived 4 x the idle timeout");
    assert!(after >= limits.idle_timeout - Duration::from_millis(100));
    eprintln!(
        "FIGURE webhook silent HTTP/2 connection closed after {:.2} s (idle timeout {} s)",
        after.as_secs_f64(),
        limits.idle_timeout.as_secs()
    );
}

/// A review of a pod carrying `bytes` of annotations (valid JSON the admission code parses
/// in full).
fn big_review(bytes: usize) -> Vec<u8> {
    big_review_asking(bytes, json!({"tessera.dev/vgpu": "1"}))
}

/// [`big_review`] whose container asks for `limits` (another project's words: the
/// review is translated too).
fn big_review_asking(bytes: usize, limits: Value) -> Vec<u8> {
    let mut annotations = serde_json::Map::new();
    // Many small entries: the shape that costs the parser the most per byte.
    let mut i = 0usize;
    let mut size = 0;
    while size < bytes {
        let k = format!("example.com/k{i}");
        size += k.len() + 8;
        annotations.insert(k, json!("v"));
        i += 1;
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1", "operation": "CREATE", "namespace": "ml",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "mallory"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "image": "i",
                    "resources": {"limits": limits}}]}
            }
        }
    });
    serde_json::to_vec(&review).expect("json")
}

/// Sends `body` as one request; the status. `chunked` leaves out Content-Length.
async fn post(s: &Server, from: u8, body: Arc<Vec<u8>>, chunked: bool) -> Result<u16, String> {
    let mut tls = connect(s, from, false).await.map_err(|e| e.to_string())?;
    let head = if chunked {
        "POST /mutate HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_string()
    } else {
        format!(
            "POST /mutate HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
    };
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // Sending may fail once the server has answered and closed; the answer still counts.
    let _ = async {
        for piece in body.chunks(64 << 10) {
            if chunked {
                tls.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                tls.write_all(piece).await?;
                tls.write_all(b"\r\n").await?;
            } else {
                tls.write_all(piece).await?;
            }
        }
        if chunked {
            tls.write_all(b"0\r\n\r\n").await?;
        }
        std::io::Result::Ok(())
    }
    .await;
    let (_, reply) = closed_after(&mut tls, Instant::now(), Duration::from_secs(60))
        .await
        .ok_or("no answer in 60 s")?;
    status_of(&reply).ok_or_else(|| format!("not HTTP: {:?}", String::from_utf8_lossy(&reply)))
}

/// 8 concurrent 7.9 MB bodies: refused from their Content-Length, nothing read.
#[tokio::test(start_paused = true)]
async fn oversized_bodies_are_refused_unread() {
    let _serial = SERIAL.lock().await;
    let s = server(Limits::default()).await;
    let body = Arc::new(vec![b' '; 7_900_000]);
    let start = Instant::now();
    let answers =
        futures_join((0..8).map(|i| tokio::spawn(post_owned(&s, 90 + i, body.clone(), false))))
            .await;
    for a in &answers {
        assert_eq!(*a, Ok(413));
    }
    assert_eq!(s.stats.peak_memory_reserved.load(Ordering::Relaxed), 0);
    eprintln!(
        "FIGURE webhook 8 x 7.9 MB bodies with Content-Length: all 413 in {:.2} s, 0 bytes \
         reserved",
        start.elapsed().as_secs_f64()
    );
}

/// A review in HAMi's words is translated (a copy of the pod is rewritten and parsed
/// again): it must still cost no more per body byte than the server reserves for it.
#[tokio::test(start_paused = true)]
async fn a_translated_review_costs_within_what_is_reserved_for_it() {
    let _serial = SERIAL.lock().await;
    let s = server(Limits::default()).await;
    for (what, limits) in [
        ("slices", json!({"tessera.dev/vgpu": "1"})),
        (
            "HAMi",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        ),
    ] {
        let body = Arc::new(big_review_asking(MAX_BODY - (64 << 10), limits));
        let base = IN_USE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        assert_eq!(post(&s, 100, body.clone(), false).await, Ok(200));
        let one = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        eprintln!(
            "FIGURE webhook one {:.1} MB review in {what}'s words: {:.1} x its body",
            body.len() as f64 / 1e6,
            one as f64 / body.len() as f64
        );
        assert!(
            one <= body.len() * tessera_webhook::server::PARSE_COST,
            "{what}: one review cost {:.1} x its body, PARSE_COST is {}",
            one as f64 / body.len() as f64,
            tessera_webhook::server::PARSE_COST
        );
    }
}

/// 8 concurrent bodies just under the limit, half without Content-Length (chunked), each
/// a valid review of the costliest shape the admission code parses: the memory budget
/// admits one at a time, every one is answered (200, or 503 when its turn did not come
/// within the body timeout), and the heap of the whole process (both ends) stays within
/// the budget, below the chart's 128 MiB limit.
#[tokio::test(start_paused = true)]
async fn concurrent_large_reviews_stay_within_the_memory_budget() {
    let _serial = SERIAL.lock().await;
    let limits = Limits::default();
    let s = server(limits.clone()).await;
    let body = Arc::new(big_review(MAX_BODY - (64 << 10)));
    assert!(body.len() <= MAX_BODY);
    // One review alone first: what parsing costs per body byte.
    let base = IN_USE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    assert_eq!(post(&s, 100, body.clone(), false).await, Ok(200));
    let one = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let base = IN_USE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let answers = futures_join(
        (0..8).map(|i| tokio::spawn(post_owned(&s, 101 + i, body.clone(), i % 2 == 0))),
    )
    .await;
    let heap = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    for a in &answers {
        // 200, or 503 when the budget was not free within the body timeout.
        assert!(matches!(a, Ok(200) | Ok(503)), "{a:?}");
    }
    assert!(answers.contains(&Ok(200)));
    let reserved = s.stats.peak_memory_reserved.load(Ordering::Relaxed);
    assert!(
        reserved <= limits.memory_budget,
        "{reserved} bytes reserved at once"
    );
    const MIB: f64 = (1 << 20) as f64;
    // What one review really cost must be within what the server reserves for it, or
    // the budget does not bound memory.
    assert!(
        one <= body.len() * tessera_webhook::server::PARSE_COST,
        "one review cost {:.1} x its body, PARSE_COST is {}",
        one as f64 / body.len() as f64,
        tessera_webhook::server::PARSE_COST
    );
    // Both ends of 9 TLS connections are in this heap too: 8 MiB for them.
    assert!(
        heap <= limits.memory_budget + (8 << 20),
        "heap peaked {:.1} MiB over the baseline, budget {:.1} MiB",
        heap as f64 / MIB,
        limits.memory_budget as f64 / MIB
    );
    eprintln!(
        "FIGURE webhook 8 concurrent {:.1} MB reviews: {} answered 200, {} 503, in {:.2} s; \
         peak memory reserved {:.1} MiB (budget {:.1} MiB); heap peak {:.1} MiB for 8 \
         (one alone: {:.1} MiB, {:.1} x its body)",
        body.len() as f64 / 1e6,
        answers.iter().filter(|a| **a == Ok(200)).count(),
        answers.iter().filter(|a| **a == Ok(503)).count(),
        start.elapsed().as_secs_f64(),
        reserved as f64 / MIB,
        limits.memory_budget as f64 / MIB,
        heap as f64 / MIB,
        one as f64 / MIB,
        one as f64 / body.len() as f64,
    );
}

fn post_owned(
    s: &Server,
    from: u8,
    body: Arc<Vec<u8>>,
    chunked: bool,
) -> impl std::future::Future<Output = Result<u16, String>> + Send + 'static {
    let s = Server {
        addr: s.addr,
        stats: s.stats.clone(),
        client: s.client.clone(),
        client_h2: s.client_h2.clone(),
    };
    async move { post(&s, from, body, chunked).await }
}

async fn futures_join<T: Send + 'static>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for t in tasks.collect::<Vec<_>>() {
        out.push(t.await.expect("task"));
    }
    out
}
