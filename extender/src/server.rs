//! The HTTP front of the extender: `POST /filter`, `/prioritize`, `/bind`
//! (the verbs the scheduler's `KubeSchedulerConfiguration` names) and
//! `GET /healthz`, over HTTP/1.1, in TLS when given a configuration (the
//! certificate and its reloading are `tessera_tls`, shared with the webhook).
//! The chart runs it beside the scheduler in one pod, on the loopback address.
//! On shutdown it drains: requests in flight (a bind half-way) are answered.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tessera_tls::drain::Drain;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::service::{Extender, ServiceError};
use crate::wire::{ExtenderBindingResult, ExtenderFilterResult};

/// The largest request accepted: a filter call with the whole `nodes` list
/// of a few thousand nodes (the chart sets `nodeCacheCapable`, which sends
/// names only).
pub const MAX_BODY: usize = 64 << 20;

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot accept connections: {0}")]
    Accept(#[source] std::io::Error),
}

/// A TLS handshake must complete within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head must arrive within this of the connection opening or of the
/// previous answer (idle keep-alive connections close after it too).
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// On shutdown, how long the requests in flight have to be answered (the chart's
/// `httpTimeout` is 30 s; the pod's grace period is 30 s too).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(25);

/// Where connections come from: a TCP listener, or (in tests) any stream
/// of connections, such as in-memory pipes on a paused clock.
pub trait Listener: Send {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next connection and who it is from (for logs).
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, String)>> + Send;
}

impl Listener for TcpListener {
    type Io = TcpStream;
    async fn accept(&mut self) -> std::io::Result<(TcpStream, String)> {
        let (tcp, peer) = TcpListener::accept(self).await?;
        Ok((tcp, peer.to_string()))
    }
}

/// Serves until `shutdown` completes, then drains: accepts nothing more
/// (the listener is closed), answers the requests in flight and closes.
/// `tls`: HTTPS with this configuration; `None`: plain HTTP (the caller
/// decides when that is allowed, see `run`).
pub async fn serve<L: Listener>(
    mut listener: L,
    tls: Option<Arc<rustls::ServerConfig>>,
    extender: Arc<Extender>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let acceptor = tls.map(TlsAcceptor::from);
    let drain = Drain::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a.map_err(ServeError::Accept)?,
        };
        let held = drain.hold();
        let (ext, acceptor, drain) = (extender.clone(), acceptor.clone(), drain.clone());
        tokio::spawn(async move {
            let _held = held;
            let result = match acceptor {
                None => connection(TokioIo::new(tcp), ext, &drain).await,
                Some(acceptor) => match handshake(&acceptor, tcp).await {
                    Ok(tls) => connection(TokioIo::new(tls), ext, &drain).await,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                },
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection closed");
            }
        });
    }
    drop(listener);
    let open = drain.open();
    let left = drain.close(DRAIN_TIMEOUT).await;
    tracing::info!(open, left, "stopped accepting; connections drained");
    Ok(())
}

async fn handshake<I>(
    acceptor: &TlsAcceptor,
    io: I,
) -> std::io::Result<tokio_rustls::server::TlsStream<I>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out"))?
}

/// One HTTP/1.1 connection, closed gracefully (after its request in flight)
/// when the server drains.
async fn connection<I>(io: TokioIo<I>, ext: Arc<Extender>, drain: &Drain) -> hyper::Result<()>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| handle(ext.clone(), req));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        () = drain.closing() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a response from constant parts")
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).expect("wire types serialize");
    reply(status, "application/json", body)
}

/// 400 for a body that is not the verb's JSON, 200 otherwise: the
/// scheduler reads a refusal from the result's `error`.
fn status_of(e: &ServiceError) -> StatusCode {
    match e {
        ServiceError::BadJson(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

async fn handle(
    ext: Arc<Extender>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_end_matches('/').to_owned();
    if parts.method == Method::GET && path == "/healthz" {
        return Ok(reply(StatusCode::OK, "text/plain", b"ok\n".to_vec()));
    }
    if parts.method != Method::POST {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            b"POST /filter, /prioritize or /bind\n".to_vec(),
        ));
    }
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text/plain",
                format!("request body: {e} (limit {MAX_BODY} bytes)\n").into_bytes(),
            ));
        }
    };
    let resp = match path.as_str() {
        "/filter" => match ext.filter(&body).await {
            Ok(r) => json(StatusCode::OK, &r),
            Err(e) => {
                tracing::warn!(error = %e, "filter refused");
                let r = ExtenderFilterResult {
                    error: e.to_string(),
                    ..Default::default()
                };
                json(status_of(&e), &r)
            }
        },
        "/prioritize" => match ext.prioritize(&body).await {
            Ok(r) => json(StatusCode::OK, &r),
            Err(e) => {
                tracing::warn!(error = %e, "prioritize refused");
                // HostPriorityList has no error field: the status says it.
                let status = match status_of(&e) {
                    StatusCode::OK => StatusCode::UNPROCESSABLE_ENTITY,
                    s => s,
                };
                reply(status, "text/plain", format!("{e}\n").into_bytes())
            }
        },
        "/bind" => match ext.bind(&body).await {
            Ok(r) => json(StatusCode::OK, &r),
            Err(e) => {
                tracing::warn!(error = %e, "bind refused");
                json(
                    status_of(&e),
                    &ExtenderBindingResult {
                        error: e.to_string(),
                    },
                )
            }
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            b"POST /filter, /prioritize or /bind\n".to_vec(),
        ),
    };
    Ok(resp)
}
