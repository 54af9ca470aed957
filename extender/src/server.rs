//! The HTTP front of the extender: `POST /filter`, `/prioritize`, `/bind`
//! (the verbs the scheduler's `KubeSchedulerConfiguration` names) and
//! `GET /healthz`, over HTTP/1.1. The chart runs it beside the scheduler in
//! one pod, on the loopback address only.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

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

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    extender: Arc<Extender>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            a = listener.accept() => a.map_err(ServeError::Accept)?,
        };
        let ext = extender.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(ext.clone(), req));
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await
            {
                tracing::debug!(error = %e, "connection closed");
            }
        });
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
