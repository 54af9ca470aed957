//! The HTTPS server around `admission::review`: TLS from a swappable certificate, HTTP/1.1
//! and HTTP/2 (chosen by ALPN), `POST /mutate` and `GET /healthz`. Every decision is in
//! `admission`; what this file adds is the hardening any pod in the cluster can reach: it
//! bounds how long a client may hold a connection without finishing a request, how many
//! connections it holds, and how much request memory is in flight (`Limits`).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tessera_tls::drain::Drain;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::admission;
use crate::dropin::Config;

/// The largest request body accepted. etcd refuses objects over 1.5 MiB (its default
/// `--max-request-bytes`), so a pod that could ever be stored arrives in a review well
/// under 2 MiB; the API server itself forwards up to 3 MiB, which is what an attacker
/// would send.
pub const MAX_BODY: usize = 2 << 20;

/// Heap bytes admitting a review costs per byte of its body at the worst (many tiny JSON
/// values: each becomes a map entry in the parsed review, again in the typed pod, again
/// in the patch). Measured by `tests/attack_webhook.rs` (24.7 for a review of tiny
/// annotations), rounded up.
pub const PARSE_COST: usize = 28;

/// What a client may hold. The defaults fit the chart's 128 MiB memory limit with room:
/// connections cost at most ~`max_connections` × 160 KiB of buffers (rustls' 16 KiB
/// records and plaintext, hyper's `H1_MAX_BUF`, h2's windows), requests at most
/// `memory_budget` (bodies and what parsing them costs; measured in
/// `tests/attack_webhook.rs`, figures in docs/security.md).
#[derive(Debug, Clone)]
pub struct Limits {
    /// TLS handshake must complete within this.
    pub handshake_timeout: Duration,
    /// HTTP/1.1: a request head must arrive within this of the connection opening or the
    /// previous response (idle keep-alive connections close after it too).
    pub header_timeout: Duration,
    /// The whole body, waiting for memory budget included, must arrive within this of the
    /// head (the API server gives up on a webhook after at most 30 s, 10 s in the chart).
    pub body_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/2 keeps
    /// connections open between requests; this bounds an idle or never-finished one).
    pub idle_timeout: Duration,
    /// A connection with a request in flight whose socket moves no byte for this long is
    /// closed (a client that stops reading its answer).
    pub stall_timeout: Duration,
    /// Connections held at once; beyond it new ones are closed at once.
    pub max_connections: usize,
    /// Connections held at once from one IP address (a pod cannot take all of them).
    pub max_connections_per_peer: usize,
    /// HTTP/2 streams per connection.
    pub max_streams: u32,
    /// Largest body; a bigger `Content-Length` is refused before a byte is read.
    pub max_body: usize,
    /// Heap reserved by all requests at once: a request reserves `PARSE_COST` × its
    /// `Content-Length` (× `max_body` when it sends none), at most the whole budget, so
    /// the largest review is admitted alone and small ones by the hundred. Beyond it a
    /// request waits, within `body_timeout`, then gets 503.
    pub memory_budget: usize,
    /// On shutdown (SIGTERM), how long the requests in flight have to be answered before
    /// the server stops anyway; connections close as soon as theirs are.
    pub drain_timeout: Duration,
}

/// How long a connection told to close gracefully has to do so.
const GRACE: Duration = Duration::from_secs(1);
/// HTTP/1.1 read buffer cap (request heads are a few hundred bytes from the API server).
const H1_MAX_BUF: usize = 64 << 10;
/// HTTP/2 flow-control windows: what a client can make us buffer per connection.
const H2_WINDOW: u32 = 128 << 10;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(15),
            max_connections: 128,
            max_connections_per_peer: 32,
            max_streams: 32,
            max_body: MAX_BODY,
            memory_budget: PARSE_COST * MAX_BODY + (4 << 20),
            // The chart's webhook timeout (10 s): the API server gives up after it anyway.
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters a test or a log line reads: how much the server holds and what it refused.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections open now (accepted and not yet closed).
    pub open: AtomicUsize,
    /// The most open at once.
    pub peak_open: AtomicUsize,
    /// Connections closed at accept because a cap was reached.
    pub refused: AtomicU64,
    /// Connections closed by a timeout (handshake, idle, stall).
    pub timed_out: AtomicU64,
    /// Request memory reserved now, and the most at once.
    pub memory_reserved: AtomicUsize,
    pub peak_memory_reserved: AtomicUsize,
    /// Requests refused: body too large (413), no budget in time (503), body too slow (408).
    pub too_large: AtomicU64,
    pub busy: AtomicU64,
    pub slow_body: AtomicU64,
}

fn raise_peak(peak: &AtomicUsize, now: usize) {
    peak.fetch_max(now, Ordering::Relaxed);
}

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot accept connections on {addr}: {source}")]
    Accept {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Serves with the default `Limits` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_with(
        listener,
        tls,
        Limits::default(),
        Arc::new(Stats::default()),
        shutdown,
    )
    .await
}

/// What every connection shares.
struct Shared {
    limits: Limits,
    /// The drop-in dialects and slice shape admission translates with.
    config: Arc<Config>,
    stats: Arc<Stats>,
    /// Memory budget in KiB permits.
    budget: Semaphore,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    /// Open connections, told to close on shutdown.
    drain: Arc<Drain>,
}

/// Serves until `shutdown` completes, then drains: accepts nothing more, answers the
/// requests in flight (within `Limits::drain_timeout`) and closes every connection.
pub async fn serve_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_configured(
        listener,
        tls,
        limits,
        stats,
        Arc::new(Config::default()),
        shutdown,
    )
    .await
}

/// [`serve_with`], admitting with `config` (the dialects a cluster accepts, its slice).
pub async fn serve_configured(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    stats: Arc<Stats>,
    config: Arc<Config>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let acceptor = TlsAcceptor::from(tls);
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let shared = Arc::new(Shared {
        budget: Semaphore::new(kib(limits.memory_budget)),
        limits,
        config,
        stats,
        per_peer: Mutex::new(HashMap::new()),
        drain: Drain::new(),
    });
    let mut last_refusal_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Running out of file descriptors is temporary; anything else is fatal.
                Err(e) if e.raw_os_error() == Some(24) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(source) => return Err(ServeError::Accept { addr, source }),
            },
        };
        let Some(slot) = ConnSlot::take(&shared, peer.ip()) else {
            // Closing at once (rather than leaving it in the backlog) tells the client
            // now, and keeps the backlog for connections we can serve.
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            if last_refusal_log.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                last_refusal_log = Some(Instant::now());
                tracing::warn!(%peer, "connection cap reached; closing new connections");
            }
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let held = shared.drain.hold();
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(shared, acceptor, tcp, peer, slot).await;
            drop(held);
        });
    }
    // New connections are refused from here on (the Service sends them to another
    // replica, or the API server retries them).
    drop(listener);
    let open = shared.drain.open();
    let left = shared.drain.close(shared.limits.drain_timeout).await;
    tracing::info!(open, left, "stopped accepting; connections drained");
    Ok(())
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).min(Semaphore::MAX_PERMITS)
}

/// One connection's place under the caps, given back when dropped.
struct ConnSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl ConnSlot {
    fn take(shared: &Arc<Shared>, ip: IpAddr) -> Option<ConnSlot> {
        let mut peers = shared.per_peer.lock().unwrap_or_else(|e| e.into_inner());
        let open = shared.stats.open.load(Ordering::Relaxed);
        let mine = peers.get(&ip).copied().unwrap_or(0);
        if open >= shared.limits.max_connections || mine >= shared.limits.max_connections_per_peer {
            return None;
        }
        peers.insert(ip, mine + 1);
        let now = shared.stats.open.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&shared.stats.peak_open, now);
        Some(ConnSlot {
            shared: shared.clone(),
            ip,
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut peers = self
            .shared
            .per_peer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = peers.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.ip);
            }
        }
        self.shared.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When a connection last moved a byte and how many of its requests are in flight: what
/// the watchdog judges it by.
#[derive(Debug)]
struct Activity {
    start: Instant,
    /// Milliseconds since `start` of the last byte moved, or of the last request ending.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        })
    }
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }
    fn quiet_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A request in flight on a connection, from its head until its answer is written (the
/// guard rides in the response body, which hyper drops once it is sent).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(a: &Arc<Activity>) -> InFlight {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        a.touch();
        InFlight(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A socket that records each byte moved in `Activity`.
struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn connection(
    shared: Arc<Shared>,
    acceptor: TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    _slot: ConnSlot,
) {
    let limits = &shared.limits;
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            shared.stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let activity = Activity::new();
    let io = TokioIo::new(Watched {
        inner: tls,
        activity: activity.clone(),
    });
    let svc_shared = shared.clone();
    let svc_activity = activity.clone();
    let service = hyper::service::service_fn(move |req| {
        let guard = InFlight::new(&svc_activity);
        let shared = svc_shared.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&shared, req, guard).await) }
    });
    // ALPN decides the protocol: no sniffing phase that a silent client could hold open.
    let conn: Pin<Box<dyn ConnFuture>> = if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_streams)
            .initial_stream_window_size(H2_WINDOW)
            .initial_connection_window_size(H2_WINDOW)
            .max_header_list_size(H1_MAX_BUF as u32)
            .keep_alive_interval(Some(limits.idle_timeout / 2))
            .keep_alive_timeout(limits.header_timeout);
        Box::pin(b.serve_connection(io, service))
    } else {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(H1_MAX_BUF);
        Box::pin(b.serve_connection(io, service))
    };
    watch(shared.clone(), conn, activity, peer).await;
}

/// A hyper connection of either protocol.
trait ConnFuture: Future<Output = hyper::Result<()>> + Send {
    fn shut(self: Pin<&mut Self>);
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body a connection of either protocol can send from any thread.
trait SendBody: hyper::body::Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

impl<B> SendBody for B where B: hyper::body::Body<Data: Send, Error: Into<BoxError>> + Send + 'static
{}

impl<I, S, B> ConnFuture for hyper::server::conn::http1::Connection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send,
    S: hyper::service::HttpService<Incoming, ResBody = B, Error: Into<BoxError>> + Send,
    S::Future: Send,
    B: SendBody,
{
    fn shut(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B> ConnFuture for hyper::server::conn::http2::Connection<I, S, TokioExecutor>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B, Error: Into<BoxError>> + Send,
    S::Future: Send + 'static,
    B: SendBody,
{
    fn shut(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Drives a connection, closing it when it idles or stalls past the limits.
async fn watch(
    shared: Arc<Shared>,
    mut conn: Pin<Box<dyn ConnFuture>>,
    activity: Arc<Activity>,
    peer: SocketAddr,
) {
    let limits = &shared.limits;
    let tick = (limits.idle_timeout.min(limits.stall_timeout) / 4).max(Duration::from_millis(50));
    // When a graceful close began, and how long the connection has to complete it.
    let mut closing: Option<(Instant, Duration)> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    if e.is_timeout() {
                        shared.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep(tick) => {}
            // Shutdown: answer what is in flight, then close.
            _ = shared.drain.closing(), if closing.is_none() => {
                conn.as_mut().shut();
                closing = Some((Instant::now(), limits.drain_timeout));
                continue;
            }
        }
        if let Some((since, grace)) = closing {
            // A graceful close the client does not complete is made hard.
            if since.elapsed() > grace {
                tracing::debug!(%peer, "connection did not close; dropped");
                return;
            }
            continue;
        }
        let quiet = activity.quiet_for();
        let busy = activity.in_flight.load(Ordering::Relaxed) > 0;
        let expired = if busy {
            quiet > limits.stall_timeout
        } else {
            quiet > limits.idle_timeout
        };
        if expired {
            shared.stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, busy, "connection idle or stalled; closing");
            if busy {
                return;
            }
            conn.as_mut().shut();
            closing = Some((Instant::now(), GRACE));
        }
    }
}

/// A response body that holds its request's `InFlight` until it is sent, and a share of
/// the body budget until the answer is built.
pub struct Body {
    inner: Full<Bytes>,
    _in_flight: Option<InFlight>,
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body {
        inner: Full::new(body.into()),
        _in_flight: None,
    });
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn handle(shared: &Shared, req: Request<Incoming>, guard: InFlight) -> Response<Body> {
    let mut response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, TEXT, "ok\n"),
        (&Method::POST, "/mutate") => mutate(shared, req).await,
        (_, "/mutate") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "POST an AdmissionReview to /mutate\n",
        ),
        (_, path) => {
            let path: String = path.chars().take(128).collect();
            reply(
                StatusCode::NOT_FOUND,
                TEXT,
                format!(
                    "no such endpoint {path}; the webhook serves POST /mutate and GET /healthz\n"
                ),
            )
        }
    };
    response.body_mut()._in_flight = Some(guard);
    response
}

/// Reads a review within the body budget and deadline, and answers it.
async fn mutate(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let limits = &shared.limits;
    let stats = &shared.stats;
    let deadline = Instant::now() + limits.body_timeout;
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        stats.too_large.fetch_add(1, Ordering::Relaxed);
        return too_large(limits.max_body);
    }
    let reserve = declared.map_or(limits.max_body, |n| n as usize).max(1);
    let cost = reserve.saturating_mul(PARSE_COST).min(limits.memory_budget);
    let permits = kib(cost) as u32;
    let permit = match tokio::time::timeout_at(deadline, shared.budget.acquire_many(permits)).await
    {
        Ok(Ok(p)) => p,
        _ => {
            stats.busy.fetch_add(1, Ordering::Relaxed);
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                "the webhook is at its request memory budget; retry\n",
            );
        }
    };
    let now = stats.memory_reserved.fetch_add(cost, Ordering::Relaxed) + cost;
    raise_peak(&stats.peak_memory_reserved, now);
    let body = tokio::time::timeout_at(deadline, Limited::new(req.into_body(), reserve).collect());
    let response = match body.await {
        // Parsing a large review takes a while: off the threads that serve sockets.
        Ok(Ok(body)) => {
            let config = shared.config.clone();
            tokio::task::spawn_blocking(move || answer_with(&body.to_bytes(), &config))
                .await
                .unwrap_or_else(|_| {
                    reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        TEXT,
                        "admission failed\n",
                    )
                })
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            stats.too_large.fetch_add(1, Ordering::Relaxed);
            too_large(reserve)
        }
        Ok(Err(e)) => reply(
            StatusCode::BAD_REQUEST,
            TEXT,
            format!("cannot read the request body: {e}\n"),
        ),
        Err(_) => {
            stats.slow_body.fetch_add(1, Ordering::Relaxed);
            reply(
                StatusCode::REQUEST_TIMEOUT,
                TEXT,
                format!(
                    "the request body did not arrive within {} s\n",
                    limits.body_timeout.as_secs()
                ),
            )
        }
    };
    stats.memory_reserved.fetch_sub(cost, Ordering::Relaxed);
    drop(permit);
    response
}

fn too_large(limit: usize) -> Response<Body> {
    reply(
        StatusCode::PAYLOAD_TOO_LARGE,
        TEXT,
        format!("the request body is over {limit} bytes\n"),
    )
}

/// The HTTP answer to one AdmissionReview body (default drop-in config).
pub fn answer(body: &[u8]) -> Response<Body> {
    answer_with(body, &Config::default())
}

/// The HTTP answer to one AdmissionReview body.
pub fn answer_with(body: &[u8], config: &Config) -> Response<Body> {
    match admission::review_with(body, config) {
        Ok(json) => reply(StatusCode::OK, "application/json", json),
        Err(e) => {
            tracing::warn!(error = %e, "bad admission request");
            // The reason may quote the request; a hostile body must not make it huge.
            let mut msg = e.to_string();
            if msg.len() > 1024 {
                let mut cut = 1024;
                while !msg.is_char_boundary(cut) {
                    cut -= 1;
                }
                msg.truncate(cut);
                msg.push_str("...");
            }
            reply(StatusCode::BAD_REQUEST, TEXT, format!("{msg}\n"))
        }
    }
}
