//! The HTTPS server around `admission::review`: TLS from a swappable certificate, HTTP/1.1
//! and HTTP/2, `POST /mutate` and `GET /healthz`. Thin on purpose: every decision is in
//! `admission`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission;

/// The API server sends at most a few MiB per object; anything larger is not a review.
pub const MAX_BODY: usize = 8 << 20;
/// A client that does not finish its TLS handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Serves until `shutdown` completes. Connections already open finish on their own.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let acceptor = TlsAcceptor::from(tls);
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
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
        let acceptor = acceptor.clone();
        tokio::spawn(async move { connection(acceptor, tcp, peer).await });
    }
}

async fn connection(acceptor: TlsAcceptor, tcp: tokio::net::TcpStream, peer: SocketAddr) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let service = hyper::service::service_fn(handle);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

type Body = Full<Bytes>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(req: Request<Incoming>) -> Result<Response<Body>, std::convert::Infallible> {
    let text = "text/plain; charset=utf-8";
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, text, "ok\n"),
        (&Method::POST, "/mutate") => {
            match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(body) => answer(&body.to_bytes()),
                Err(e) => reply(
                    StatusCode::BAD_REQUEST,
                    text,
                    format!("cannot read the request body (at most {MAX_BODY} bytes): {e}\n"),
                ),
            }
        }
        (_, "/mutate") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "POST an AdmissionReview to /mutate\n",
        ),
        (_, path) => reply(
            StatusCode::NOT_FOUND,
            text,
            format!("no such endpoint {path}; the webhook serves POST /mutate and GET /healthz\n"),
        ),
    };
    Ok(response)
}

/// The HTTP answer to one AdmissionReview body.
pub fn answer(body: &[u8]) -> Response<Body> {
    match admission::review(body) {
        Ok(json) => reply(StatusCode::OK, "application/json", json),
        Err(e) => {
            tracing::warn!(error = %e, "bad admission request");
            reply(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                format!("{e}\n"),
            )
        }
    }
}
