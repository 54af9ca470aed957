//! What the extender's tests share: a fake API server that speaks the real
//! one's JSON over HTTP/1.1 (lists with a resourceVersion, 404 Status
//! objects, merge patches with a resourceVersion precondition, the
//! pods/binding subresource, and watches: `?watch=true` answered with a
//! chunked stream of JSON events from a resourceVersion, field selectors
//! applied as the API server applies them to events, bookmarks when asked,
//! and `410 Expired` for a version older than the last compaction), reached
//! through in-memory pipes; the extender served over in-memory pipes too (or
//! TCP, for the tests of its network front); and the cluster objects.
//!
//! In-memory pipes move bytes without the kernel: on a paused tokio clock
//! nothing is in flight when the runtime goes idle, so time only advances
//! when every task waits on a timer, as a test on paused time needs.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tessera_extender::cache::Kind;
use tessera_extender::service::{Extender, Settings};
use tessera_node::scheduling::{FORMAT_VERSION, GpuReport, NodeReport};
use tessera_placement::Policy;
use tokio::io::DuplexStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

pub const DRIVER: &str = "vgpu.tessera.dev";
/// Long enough never to be what ends a test that works (a hang's deadline).
pub const HANG: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------- fake API server

/// The kinds of objects the fake API server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Res {
    Nodes,
    Pods,
    Slices,
    Claims,
}

impl Res {
    pub const ALL: [Res; 4] = [Res::Nodes, Res::Pods, Res::Slices, Res::Claims];

    fn name(self) -> &'static str {
        match self {
            Res::Nodes => "nodes",
            Res::Pods => "pods",
            Res::Slices => "resourceslices",
            Res::Claims => "resourceclaims",
        }
    }

    fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Res::Nodes => ("v1", "Node"),
            Res::Pods => ("v1", "Pod"),
            Res::Slices => ("resource.k8s.io/v1", "ResourceSlice"),
            Res::Claims => ("resource.k8s.io/v1", "ResourceClaim"),
        }
    }

    /// The extender's name for the same kind.
    pub fn kind(self) -> Kind {
        match self {
            Res::Nodes => Kind::Nodes,
            Res::Pods => Kind::Pods,
            Res::Slices => Kind::ResourceSlices,
            Res::Claims => Kind::ResourceClaims,
        }
    }
}

/// One write, as etcd keeps it: the object before and after (None: absent).
struct Change {
    rv: u64,
    res: Res,
    old: Option<Value>,
    new: Option<Value>,
}

#[derive(Default)]
pub struct Cluster {
    objects: BTreeMap<(Res, String, String), Value>,
    log: Vec<Change>,
    rv: u64,
    /// A watch from an older version is answered `410 Expired`.
    compacted: u64,
    /// Kinds whose watch events are held back (as a slow network would).
    held: BTreeSet<Res>,
    /// Watches opened before this generation end.
    generation: u64,
    /// Lists are refused (503) while set.
    refuse_lists: bool,
    /// Every request: "list pods", "watch pods 12", "get pods team-a/p", ...
    pub requests: Vec<String>,
    /// Every write the extender made: "patch ns/name", "bind ns/name node".
    pub writes: Vec<String>,
}

fn key_of(res: Res, obj: &Value) -> (Res, String, String) {
    (
        res,
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
        obj["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

impl Cluster {
    /// Stores `obj` (created or replaced) at a new resourceVersion.
    fn put(&mut self, res: Res, mut obj: Value) -> u64 {
        self.rv += 1;
        let (api_version, kind) = res.type_meta();
        obj["apiVersion"] = json!(api_version);
        obj["kind"] = json!(kind);
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = key_of(res, &obj);
        let old = self.objects.insert(key, obj.clone());
        self.log.push(Change {
            rv: self.rv,
            res,
            old,
            new: Some(obj),
        });
        self.rv
    }

    fn delete(&mut self, res: Res, ns: &str, name: &str) -> Option<u64> {
        let old = self
            .objects
            .remove(&(res, ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        self.log.push(Change {
            rv: self.rv,
            res,
            old: Some(old),
            new: None,
        });
        Some(self.rv)
    }

    fn get(&self, res: Res, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, ns.to_owned(), name.to_owned()))
    }

    /// The version of the last write of `res`.
    fn last(&self, res: Res) -> u64 {
        self.log
            .iter()
            .rev()
            .find(|c| c.res == res)
            .map_or(0, |c| c.rv)
    }
}

/// The fake API server: the cluster and a signal on every change.
pub struct FakeApi {
    cluster: Mutex<Cluster>,
    changed: watch::Sender<u64>,
}

impl FakeApi {
    pub fn new() -> Arc<FakeApi> {
        Arc::new(FakeApi {
            cluster: Mutex::new(Cluster::default()),
            changed: watch::Sender::new(0),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        let out = f(&mut self.cluster.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
        out
    }

    /// Creates or replaces an object; its new resourceVersion.
    pub fn put(&self, res: Res, obj: Value) -> u64 {
        self.with(|c| c.put(res, obj))
    }

    pub fn delete(&self, res: Res, ns: &str, name: &str) -> Option<u64> {
        self.with(|c| c.delete(res, ns, name))
    }

    pub fn get(&self, res: Res, ns: &str, name: &str) -> Option<Value> {
        self.cluster.lock().unwrap().get(res, ns, name).cloned()
    }

    pub fn pod(&self, name: &str) -> Value {
        self.get(Res::Pods, "team-a", name).expect("pod")
    }

    pub fn last(&self, res: Res) -> u64 {
        self.cluster.lock().unwrap().last(res)
    }

    pub fn requests(&self) -> Vec<String> {
        self.cluster.lock().unwrap().requests.clone()
    }

    pub fn lists(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.starts_with("list "))
            .count()
    }

    pub fn writes(&self) -> Vec<String> {
        self.cluster.lock().unwrap().writes.clone()
    }

    /// Holds back (or lets go) the watch events of `res`.
    pub fn hold(&self, res: Res, held: bool) {
        self.with(|c| {
            if held {
                c.held.insert(res);
            } else {
                c.held.remove(&res);
            }
        });
    }

    pub fn refuse_lists(&self, refuse: bool) {
        self.with(|c| c.refuse_lists = refuse);
    }

    /// Ends every open watch and forgets the history so far: a watch from
    /// before now is answered 410, as after an etcd compaction.
    pub fn compact_and_drop_watches(&self) {
        self.with(|c| {
            c.compacted = c.rv;
            c.generation += 1;
        });
    }

    /// Waits until the API server has answered a request for which `pred`
    /// holds.
    pub async fn requested(&self, pred: impl Fn(&str) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if self.requests().iter().any(|r| pred(r)) {
                return;
            }
            tokio::time::timeout(HANG, rx.changed())
                .await
                .expect("the request never came")
                .unwrap();
        }
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(body: Vec<u8>) -> Body {
    Full::new(Bytes::from(body)).boxed_unsync()
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "reason": reason, "message": message, "code": code,
    })
}

fn fail(code: u16, reason: &str, message: &str) -> Response<Body> {
    respond(code, &status(code, reason, message))
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// Whether `obj` passes a field selector (`a.b=x`, `a.b!=y`, comma-joined),
/// as the API server applies it.
fn selected(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (field, want, negate) = match term.split_once("!=") {
            Some((f, v)) => (f, v, true),
            None => {
                let (f, v) = term.split_once('=').unwrap();
                (f, v, false)
            }
        };
        let mut v = obj;
        for part in field.split('.') {
            v = &v[part];
        }
        let got = v.as_str().unwrap_or("");
        (got == want) != negate
    })
}

fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    a.remove(k);
                } else {
                    merge(a.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (slot, p) => *slot = p.clone(),
    }
}

fn collection(path: &[&str]) -> Option<Res> {
    match path {
        ["api", "v1", "nodes"] => Some(Res::Nodes),
        ["api", "v1", "pods"] => Some(Res::Pods),
        ["apis", "resource.k8s.io", "v1", "resourceslices"] => Some(Res::Slices),
        ["apis", "resource.k8s.io", "v1", "resourceclaims"] => Some(Res::Claims),
        _ => None,
    }
}

/// The event a watch with `selector` gets for `change`, if any: the API
/// server turns an object leaving the selection into DELETED and one
/// entering it into ADDED.
fn event(change: &Change, selector: &str) -> Option<Value> {
    let was = change.old.as_ref().is_some_and(|o| selected(o, selector));
    let is = change.new.as_ref().is_some_and(|o| selected(o, selector));
    let (kind, mut obj) = match (was, is) {
        (false, true) => ("ADDED", change.new.clone()?),
        (true, true) => ("MODIFIED", change.new.clone()?),
        (true, false) => ("DELETED", change.new.clone().or(change.old.clone())?),
        (false, false) => return None,
    };
    obj["metadata"]["resourceVersion"] = json!(change.rv.to_string());
    Some(json!({"type": kind, "object": obj}))
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap();
    b.push(b'\n');
    Bytes::from(b)
}

/// A watch of `res` from version `from`: the events after it, then each new
/// one as it comes, until the client goes, `timeout` passes (tokio's clock),
/// or the watches are dropped.
fn watch_stream(
    api: Arc<FakeApi>,
    res: Res,
    from: u64,
    selector: String,
    bookmarks: bool,
    timeout: Duration,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut changed = api.changed.subscribe();
        let generation = api.cluster.lock().unwrap().generation;
        let end = tokio::time::Instant::now() + timeout;
        let expired = {
            let c = api.cluster.lock().unwrap();
            (from < c.compacted).then(|| c.compacted)
        };
        if let Some(oldest) = expired {
            let msg = format!("too old resource version: {from} ({oldest})");
            let _ = tx
                .send(line(
                    &json!({"type": "ERROR", "object": status(410, "Expired", &msg)}),
                ))
                .await;
            return;
        }
        let mut pos = from;
        let mut bookmarked = from;
        loop {
            let (events, stop) = {
                let c = api.cluster.lock().unwrap();
                if c.generation != generation {
                    (Vec::new(), true)
                } else if c.held.contains(&res) {
                    (Vec::new(), false)
                } else {
                    let out: Vec<Value> = c
                        .log
                        .iter()
                        .filter(|ch| ch.rv > pos && ch.res == res)
                        .filter_map(|ch| event(ch, &selector))
                        .collect();
                    pos = c.rv;
                    (out, false)
                }
            };
            if stop {
                return;
            }
            for e in events {
                if tx.send(line(&e)).await.is_err() {
                    return;
                }
            }
            if bookmarks && pos > bookmarked {
                // Everything up to `pos` has been sent.
                let (api_version, kind) = res.type_meta();
                let bm = json!({"type": "BOOKMARK", "object": {
                    "apiVersion": api_version, "kind": kind,
                    "metadata": {"resourceVersion": pos.to_string()}}});
                if tx.send(line(&bm)).await.is_err() {
                    return;
                }
                bookmarked = pos;
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = tx.closed() => return,
                () = tokio::time::sleep_until(end) => return,
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(frames).boxed_unsync())
        .unwrap()
}

async fn handle(api: Arc<FakeApi>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    let q = query(&parts.uri);
    let method = parts.method.as_str();
    let selector = q.get("fieldSelector").cloned().unwrap_or_default();
    let note = |s: String| api.cluster.lock().unwrap().requests.push(s);

    if let (Some(res), "GET") = (collection(&path), method) {
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            note(format!("watch {} {from}", res.name()));
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .map_or(HANG, Duration::from_secs);
            let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
            let resp = watch_stream(api.clone(), res, from, selector, bookmarks, timeout);
            api.changed.send_modify(|n| *n += 1);
            return Ok(resp);
        }
        let mut guard = api.cluster.lock().unwrap();
        let c = &mut *guard;
        c.requests.push(format!("list {}", res.name()));
        let resp = if c.refuse_lists {
            fail(503, "ServiceUnavailable", "the API server is starting")
        } else {
            let items: Vec<&Value> = c
                .objects
                .iter()
                .filter(|((r, _, _), o)| *r == res && selected(o, &selector))
                .map(|(_, o)| o)
                .collect();
            let (api_version, kind) = res.type_meta();
            respond(
                200,
                &json!({"kind": format!("{kind}List"), "apiVersion": api_version,
                        "metadata": {"resourceVersion": c.rv.to_string()}, "items": items}),
            )
        };
        drop(guard);
        api.changed.send_modify(|n| *n += 1);
        return Ok(resp);
    }

    let resp = api.with(|c| match (method, path.as_slice()) {
        ("GET", ["api", "v1", "nodes", name]) => {
            c.requests.push(format!("get nodes {name}"));
            match c.get(Res::Nodes, "", name) {
                Some(n) => respond(200, n),
                None => fail(404, "NotFound", &format!("nodes \"{name}\" not found")),
            }
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            c.requests.push(format!("get pods {ns}/{name}"));
            match c.get(Res::Pods, ns, name) {
                Some(p) => respond(200, p),
                None => fail(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            assert_eq!(
                parts.headers["content-type"], "application/merge-patch+json",
                "a merge patch"
            );
            c.requests.push(format!("patch pods {ns}/{name}"));
            let patch: Value = serde_json::from_slice(&body).unwrap();
            match c.get(Res::Pods, ns, name).cloned() {
                None => fail(404, "NotFound", "pod not found"),
                Some(mut p) => {
                    let want = patch["metadata"]["resourceVersion"].as_str();
                    if want.is_some_and(|w| w != p["metadata"]["resourceVersion"]) {
                        fail(409, "Conflict", "the object has been modified")
                    } else {
                        merge(&mut p, &patch);
                        c.put(Res::Pods, p);
                        c.writes.push(format!("patch {ns}/{name}"));
                        respond(200, c.get(Res::Pods, ns, name).unwrap())
                    }
                }
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "binding"]) => {
            let b: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(b["kind"], "Binding");
            assert_eq!(b["target"]["kind"], "Node");
            let node = b["target"]["name"].as_str().unwrap().to_owned();
            c.requests.push(format!("bind pods {ns}/{name} {node}"));
            match c.get(Res::Pods, ns, name).cloned() {
                None => fail(404, "NotFound", "pod not found"),
                Some(p) if p["spec"]["nodeName"].is_string() => {
                    fail(409, "Conflict", "pod is already assigned to a node")
                }
                Some(mut p) => {
                    p["spec"]["nodeName"] = json!(node);
                    c.put(Res::Pods, p);
                    c.writes.push(format!("bind {ns}/{name} {node}"));
                    respond(201, &status(201, "", ""))
                }
            }
        }
        (m, p) => panic!("unexpected API call {m} {p:?}"),
    });
    Ok(resp)
}

/// Serves one HTTP/1.1 connection of the fake API server.
async fn serve_api<I>(api: Arc<FakeApi>, io: I)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| handle(api.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// A Kubernetes client of the fake API server: every request on a new
/// in-memory connection.
pub fn client(api: Arc<FakeApi>) -> kube::Client {
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let api = api.clone();
        async move {
            let (ours, theirs) = tokio::io::duplex(1 << 16);
            tokio::spawn(serve_api(api, theirs));
            let (mut send, conn) =
                hyper::client::conn::http1::handshake::<_, kube::client::Body>(TokioIo::new(ours))
                    .await?;
            tokio::spawn(conn);
            send.send_request(req).await
        }
    });
    kube::Client::new(svc, "default")
}

// ---------------------------------------------------------------- cluster objects

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub fn gpu(uuid: &str, slices: u32, used: u32) -> GpuReport {
    GpuReport {
        uuid: uuid.into(),
        model: "NVIDIA A100-SXM4-80GB".into(),
        vendor: String::new(),
        class: String::new(),
        memory_mib: 81920,
        slices,
        used_slices: used,
        pods: BTreeMap::new(),
        utilization: None,
        healthy: true,
    }
}

pub fn report(at: u64, gpus: Vec<GpuReport>) -> Option<NodeReport> {
    Some(NodeReport {
        version: FORMAT_VERSION,
        at,
        gpus,
    })
}

pub fn node(name: &str, report: Option<NodeReport>) -> Value {
    let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0"});
    if let Some(r) = report {
        annotations["tessera.dev/gpu-report"] = json!(r.to_json());
    }
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
        "spec": {},
        "status": {"allocatable": {"tessera.dev/vgpu": "8"}}
    })
}

/// A pod as the API server stores it (and the scheduler sends it).
pub fn pod(name: &str, slices: Option<&str>) -> Value {
    let mut resources = json!({});
    if let Some(s) = slices {
        resources = json!({"limits": {"tessera.dev/vgpu": s, "cpu": "1"},
                           "requests": {"tessera.dev/vgpu": s, "cpu": "1"}});
    }
    json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-02T03:00:00Z",
                     "annotations": {"tessera.dev/compute-policy": "burst"}},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": resources}],
            "restartPolicy": "Always"
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    })
}

/// A pod whose container uses the claim `claim` (created from a template:
/// its name is in the pod's status, as the resourceclaim controller writes it).
pub fn dra_pod(name: &str, claim: &str) -> Value {
    let mut p = pod(name, None);
    p["spec"]["resourceClaims"] =
        json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-5g-30"}]);
    p["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    p["status"]["resourceClaimStatuses"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
    p
}

/// One GPU of the `shared` layout, as the DRA plugin publishes it.
pub fn shared_device(uuid: &str, memory: &str) -> Value {
    json!({
        "name": format!("gpu-{}", uuid.to_lowercase()),
        "attributes": {"uuid": {"string": uuid}, "index": {"int": 0},
                       "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
        "allowMultipleAllocations": true,
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {"default": "1Gi",
                       "validRange": {"min": "1Gi", "step": "256Mi"}}},
            "compute": {"value": "100", "requestPolicy": {"default": "25",
                        "validRange": {"min": "1", "max": "100", "step": "1"}}}
        }
    })
}

/// The `slices` layout: `n` slices of `memory` and `compute` percent each.
pub fn slice_devices(uuid: &str, n: u32, memory: &str, compute: &str) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "name": format!("gpu-{}-s{i}", uuid.to_lowercase()),
                "attributes": {"uuid": {"string": uuid}, "slice": {"int": i},
                               "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
                "capacity": {"memory": {"value": memory}, "compute": {"value": compute}}
            })
        })
        .collect()
}

/// The node's ResourceSlice (one of one) at pool generation `generation`.
pub fn resource_slice(node: &str, generation: u64, devices: Vec<Value>) -> Value {
    json!({
        "metadata": {"name": format!("{node}-{DRIVER}-0")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices}
    })
}

/// A claim asking one device of the driver's class with these capacities.
pub fn claim(name: &str, memory: &str, compute: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": memory, "compute": compute}}}}]}}
    })
}

/// `claim` allocated on `node`'s device `device`, consuming what it asked.
pub fn allocated(mut claim: Value, node: &str, device: &str, share: &str) -> Value {
    let asked = claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"].clone();
    claim["status"] = json!({"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                 "device": device, "shareID": share, "consumedCapacity": asked}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    }});
    claim
}

// ---------------------------------------------------------------- the extender

/// The extender's front on in-memory pipes.
pub struct MemoryListener(mpsc::Receiver<DuplexStream>);

impl tessera_extender::server::Listener for MemoryListener {
    type Io = DuplexStream;
    async fn accept(&mut self) -> std::io::Result<(DuplexStream, String)> {
        match self.0.recv().await {
            Some(io) => Ok((io, "memory".into())),
            // The harness is gone: accept nothing more, ever.
            None => std::future::pending().await,
        }
    }
}

enum Front {
    Memory(mpsc::Sender<DuplexStream>),
    Tcp {
        addr: SocketAddr,
        /// HTTPS: the CA bundle the client trusts.
        tls: Option<String>,
    },
}

/// How the harness starts the extender.
pub struct Options {
    pub policy: Policy,
    pub dra: bool,
    /// Serve on TCP (with this TLS configuration and the bundle a client
    /// trusts, or plain), not in memory.
    pub tcp: Option<Option<(Arc<rustls::ServerConfig>, String)>>,
    /// Wait for the first lists before returning.
    pub synced: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: Policy::default(),
            dra: true,
            tcp: None,
            synced: true,
        }
    }
}

pub struct Harness {
    pub api: Arc<FakeApi>,
    pub ext: Arc<Extender>,
    front: Front,
    /// Shuts the server down (as SIGTERM does), and the server's task.
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<Result<(), tessera_extender::server::ServeError>>,
}

pub async fn start(api: Arc<FakeApi>, opts: Options) -> Harness {
    let ext = Arc::new(Extender::start(
        client(api.clone()),
        Settings {
            policy: opts.policy,
            node_deadline: Duration::from_secs(120),
            view_wait: Duration::from_secs(10),
            dra_driver: opts.dra.then(|| DRIVER.to_owned()),
        },
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let (front, served) = match opts.tcp {
        None => {
            let (tx, rx) = mpsc::channel(16);
            let served = tokio::spawn(tessera_extender::server::serve(
                MemoryListener(rx),
                None,
                ext.clone(),
                shutdown,
            ));
            (Front::Memory(tx), served)
        }
        Some(tls) => {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (config, bundle) = tls.unzip();
            let served = tokio::spawn(tessera_extender::server::serve(
                listener,
                config,
                ext.clone(),
                shutdown,
            ));
            (Front::Tcp { addr, tls: bundle }, served)
        }
    };
    if opts.synced {
        ext.synced(HANG)
            .await
            .expect("the extender lists the cluster");
    }
    Harness {
        api,
        ext,
        front,
        stop: Some(stop),
        served,
    }
}

/// The device-plugin nodes of the slice tests: `two-by-two` has two 4-slice
/// GPUs with 2 slices used on each; `empty` one unused 4-slice GPU; `stale`
/// reported long ago; `silent` never reported; `sick` has one unhealthy GPU.
pub fn slice_cluster() -> Arc<FakeApi> {
    let api = FakeApi::new();
    let t = now();
    let mut sick = gpu("GPU-sick", 4, 0);
    sick.healthy = false;
    for n in [
        node(
            "two-by-two",
            report(t, vec![gpu("GPU-a", 4, 2), gpu("GPU-b", 4, 2)]),
        ),
        node("empty", report(t, vec![gpu("GPU-e", 4, 0)])),
        node("stale", report(t - 3600, vec![gpu("GPU-s", 4, 0)])),
        node("silent", None),
        node("sick", report(t, vec![sick])),
    ] {
        api.put(Res::Nodes, n);
    }
    api
}

impl Harness {
    pub fn tls_bundle(&self) -> Option<&str> {
        match &self.front {
            Front::Tcp { tls, .. } => tls.as_deref(),
            Front::Memory(_) => None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        match &self.front {
            Front::Tcp { addr, .. } => *addr,
            Front::Memory(_) => panic!("served in memory"),
        }
    }

    pub async fn post(&self, verb: &str, body: &[u8]) -> (StatusCode, Value) {
        let req = Request::post(format!("/{verb}"))
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        let resp = match &self.front {
            Front::Memory(tx) => {
                let (ours, theirs) = tokio::io::duplex(1 << 16);
                tx.send(theirs).await.expect("the extender serves");
                let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(ours))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                send.send_request(req).await.unwrap()
            }
            Front::Tcp { addr, tls: None } => {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                send.send_request(req).await.unwrap()
            }
            Front::Tcp {
                addr,
                tls: Some(bundle),
            } => {
                let r = tessera_tls::testing::request(
                    *addr,
                    "localhost",
                    bundle,
                    "POST",
                    &format!("/{verb}"),
                    body.into(),
                )
                .await
                .expect("an HTTPS answer");
                return (StatusCode::from_u16(r.status).unwrap(), as_json(&r.body));
            }
        };
        let code = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (code, as_json(&bytes))
    }

    /// Creates `p` in the API server (a watch event for the extender).
    pub fn add_pod(&self, p: Value) -> u64 {
        self.api.put(Res::Pods, p)
    }

    pub fn pod(&self, name: &str) -> Value {
        self.api.pod(name)
    }

    pub fn writes(&self) -> Vec<String> {
        self.api.writes()
    }

    /// Waits until the extender's view holds every write made so far.
    pub async fn settled(&self) {
        for res in Res::ALL {
            let kind = res.kind();
            if self.ext.cache().driver().is_none()
                && matches!(kind, Kind::ResourceSlices | Kind::ResourceClaims)
            {
                continue;
            }
            self.ext
                .cache()
                .reach(kind, self.api.last(res), HANG)
                .await
                .expect("the view catches up");
        }
    }
}

pub fn as_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// ExtenderArgs as kube-scheduler sends them with `nodeCacheCapable: true`.
pub fn args_by_name(pod: &Value, names: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({"pod": pod, "nodes": null, "nodenames": names})).unwrap()
}

pub fn bind_args(name: &str, uid: &str, node: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"podName": name, "podNamespace": "team-a", "podUID": uid, "node": node}),
    )
    .unwrap()
}

/// The scores of a prioritize answer by host.
pub fn scores(r: &Value) -> BTreeMap<String, i64> {
    r.as_array()
        .unwrap_or_else(|| panic!("a HostPriorityList: {r}"))
        .iter()
        .map(|h| {
            (
                h["host"].as_str().unwrap().into(),
                h["score"].as_i64().unwrap(),
            )
        })
        .collect()
}
