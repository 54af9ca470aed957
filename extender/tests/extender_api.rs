//! The extender over real HTTP against a fake API server that speaks the
//! real one's JSON (lists, 404 Status objects, merge patches with a
//! resourceVersion precondition, the pods/binding subresource): filter,
//! prioritize and bind with the bodies kube-scheduler sends, and the bad
//! inputs, each of which must change nothing. Then the same over HTTPS, as
//! `tessera scheduler-extender --tls-cert-file/--tls-key-file` serves it: a
//! certificate from a test CA, a bad certificate refused at start, and a
//! rotated one served once its files change.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tessera_extender::service::{Extender, Settings};
use tessera_node::scheduling::{Assignment, FORMAT_VERSION, GpuReport, NodeReport};
use tessera_placement::Policy;
use tessera_tls::certs::{Authority, ServingCert, der_to_pem};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------- fake API server

#[derive(Default)]
struct Cluster {
    nodes: Vec<Value>,
    /// (namespace, name) → pod
    pods: BTreeMap<(String, String), Value>,
    /// Every write: "patch ns/name", "bind ns/name node".
    writes: Vec<String>,
    version: u64,
}

type Shared = Arc<Mutex<Cluster>>;

fn status(code: u16, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "reason": reason, "message": message, "code": code,
    });
    respond(code, &body)
}

fn respond(code: u16, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

/// `spec.nodeName=X` and `status.phase!=Y` terms, as the API server
/// applies them.
fn selected(pod: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (field, want, negate) = match term.split_once("!=") {
            Some((f, v)) => (f, v, true),
            None => {
                let (f, v) = term.split_once('=').unwrap();
                (f, v, false)
            }
        };
        let got = match field {
            "spec.nodeName" => pod["spec"]["nodeName"].as_str().unwrap_or(""),
            "status.phase" => pod["status"]["phase"].as_str().unwrap_or(""),
            other => panic!("selector on {other}"),
        };
        (got == want) != negate
    })
}

fn query_param(uri: &hyper::Uri, key: &str) -> Option<String> {
    let q = uri.query()?;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            v.replace("%3D", "=")
                .replace("%21", "!")
                .replace("%2C", ",")
                .replace('+', " ")
        })
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

async fn api(cluster: Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    let mut c = cluster.lock().unwrap();
    let resp = match (parts.method.as_str(), path.as_slice()) {
        ("GET", ["api", "v1", "nodes"]) => respond(
            200,
            &json!({"kind": "NodeList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": c.version.to_string()}, "items": c.nodes}),
        ),
        ("GET", ["api", "v1", "nodes", name]) => {
            match c.nodes.iter().find(|n| n["metadata"]["name"] == *name) {
                Some(n) => respond(200, n),
                None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            }
        }
        ("GET", ["api", "v1", "pods"]) => {
            let sel = query_param(&parts.uri, "fieldSelector").unwrap_or_default();
            let items: Vec<&Value> = c.pods.values().filter(|p| selected(p, &sel)).collect();
            respond(
                200,
                &json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": c.version.to_string()}, "items": items}),
            )
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match c.pods.get(&(ns.to_string(), name.to_string())) {
                Some(p) => respond(200, p),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            assert_eq!(
                parts.headers["content-type"], "application/merge-patch+json",
                "a merge patch"
            );
            let patch: Value = serde_json::from_slice(&body).unwrap();
            c.version += 1;
            let version = c.version.to_string();
            let key = (ns.to_string(), name.to_string());
            match c.pods.get_mut(&key) {
                None => status(404, "NotFound", "pod not found"),
                Some(p) => {
                    let want = patch["metadata"]["resourceVersion"].as_str();
                    if want.is_some_and(|w| w != p["metadata"]["resourceVersion"]) {
                        status(409, "Conflict", "the object has been modified")
                    } else {
                        merge(p, &patch);
                        p["metadata"]["resourceVersion"] = json!(version);
                        let out = p.clone();
                        c.writes.push(format!("patch {ns}/{name}"));
                        respond(200, &out)
                    }
                }
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "binding"]) => {
            let b: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(b["kind"], "Binding");
            assert_eq!(b["target"]["kind"], "Node");
            let node = b["target"]["name"].as_str().unwrap().to_owned();
            let key = (ns.to_string(), name.to_string());
            match c.pods.get_mut(&key) {
                None => status(404, "NotFound", "pod not found"),
                Some(p) if p["spec"]["nodeName"].is_string() => {
                    status(409, "Conflict", "pod is already assigned to a node")
                }
                Some(p) => {
                    p["spec"]["nodeName"] = json!(node);
                    c.writes.push(format!("bind {ns}/{name} {node}"));
                    status(201, "", "")
                }
            }
        }
        (m, p) => panic!("unexpected API call {m} {p:?}"),
    };
    Ok(resp)
}

async fn serve_http<F, Fut>(listener: TcpListener, f: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
{
    loop {
        let (tcp, _) = listener.accept().await.unwrap();
        let f = f.clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(f))
                .await;
        });
    }
}

// ---------------------------------------------------------------- cluster objects

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn gpu(uuid: &str, slices: u32, used: u32) -> GpuReport {
    GpuReport {
        uuid: uuid.into(),
        model: "NVIDIA A100-SXM4-80GB".into(),
        class: String::new(),
        memory_mib: 81920,
        slices,
        used_slices: used,
        pods: BTreeMap::new(),
        utilization: None,
        healthy: true,
    }
}

fn node(name: &str, report: Option<NodeReport>) -> Value {
    let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0"});
    if let Some(r) = report {
        annotations["tessera.dev/gpu-report"] = json!(r.to_json());
    }
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
        "spec": {},
        "status": {"allocatable": {"tessera.dev/vgpu": "8"}}
    })
}

fn report(at: u64, gpus: Vec<GpuReport>) -> Option<NodeReport> {
    Some(NodeReport {
        version: FORMAT_VERSION,
        at,
        gpus,
    })
}

/// A pod as the API server stores it (and the scheduler sends it).
fn pod(name: &str, slices: Option<&str>) -> Value {
    let mut resources = json!({});
    if let Some(s) = slices {
        resources = json!({"limits": {"tessera.dev/vgpu": s, "cpu": "1"},
                           "requests": {"tessera.dev/vgpu": s, "cpu": "1"}});
    }
    json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
                     "resourceVersion": "7", "creationTimestamp": "2026-12-02T03:00:00Z",
                     "annotations": {"tessera.dev/compute-policy": "burst"}},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": resources}],
            "restartPolicy": "Always"
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    })
}

/// Nodes: `two-by-two` has two 4-slice GPUs with 2 slices used on each;
/// `empty` one unused 4-slice GPU; `stale` reported long ago; `silent`
/// never reported; `sick` has one unhealthy GPU.
fn cluster() -> Cluster {
    let t = now();
    let mut sick = gpu("GPU-sick", 4, 0);
    sick.healthy = false;
    Cluster {
        nodes: vec![
            node(
                "two-by-two",
                report(t, vec![gpu("GPU-a", 4, 2), gpu("GPU-b", 4, 2)]),
            ),
            node("empty", report(t, vec![gpu("GPU-e", 4, 0)])),
            node("stale", report(t - 3600, vec![gpu("GPU-s", 4, 0)])),
            node("silent", None),
            node("sick", report(t, vec![sick])),
        ],
        ..Default::default()
    }
}

// ---------------------------------------------------------------- harness

struct Harness {
    cluster: Shared,
    extender: SocketAddr,
    /// HTTPS: the CA bundle the client trusts.
    tls: Option<String>,
    /// Shuts the server down (as SIGTERM does), and the server's task.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), tessera_extender::server::ServeError>>,
}

async fn start(c: Cluster, policy: Policy) -> Harness {
    start_with(c, policy, None).await
}

/// The extender serving with `tls` (a configuration and the CA bundle a
/// client trusts), or plain HTTP.
async fn start_with(
    c: Cluster,
    policy: Policy,
    tls: Option<(Arc<rustls::ServerConfig>, String)>,
) -> Harness {
    let cluster: Shared = Arc::new(Mutex::new(c));
    let api_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = api_listener.local_addr().unwrap();
    let shared = cluster.clone();
    tokio::spawn(serve_http(api_listener, move |req| {
        api(shared.clone(), req)
    }));

    let config = kube::Config::new(format!("http://{api_addr}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let ext = Arc::new(Extender::new(
        client,
        Settings {
            policy,
            node_deadline: Duration::from_secs(120),
            // Every call reads afresh: the test changes the cluster between calls.
            refresh: Duration::ZERO,
        },
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let extender = listener.local_addr().unwrap();
    let (config, bundle) = tls.unzip();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(tessera_extender::server::serve(
        listener,
        config,
        ext,
        async {
            let _ = stopped.await;
        },
    ));
    Harness {
        cluster,
        extender,
        tls: bundle,
        stop: Some(stop),
        served,
    }
}

impl Harness {
    async fn post(&self, verb: &str, body: &[u8]) -> (StatusCode, Value) {
        if let Some(bundle) = &self.tls {
            let r = https(self.extender, bundle, verb, body)
                .await
                .expect("an HTTPS answer");
            return (StatusCode::from_u16(r.status).unwrap(), as_json(&r.body));
        }
        let tcp = TcpStream::connect(self.extender).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::post(format!("/{verb}"))
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let code = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (code, as_json(&bytes))
    }

    fn add_pod(&self, p: Value) {
        let mut c = self.cluster.lock().unwrap();
        let key = (
            p["metadata"]["namespace"].as_str().unwrap().to_owned(),
            p["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        c.pods.insert(key, p);
    }

    fn pod(&self, name: &str) -> Value {
        self.cluster.lock().unwrap().pods[&("team-a".to_owned(), name.to_owned())].clone()
    }

    fn writes(&self) -> Vec<String> {
        self.cluster.lock().unwrap().writes.clone()
    }
}

fn as_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

const ALL: [&str; 5] = ["two-by-two", "empty", "stale", "silent", "sick"];

/// ExtenderArgs as kube-scheduler sends them with `nodeCacheCapable: true`.
fn args_by_name(pod: &Value, names: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({"pod": pod, "nodes": null, "nodenames": names})).unwrap()
}

fn bind_args(name: &str, uid: &str, node: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"podName": name, "podNamespace": "team-a", "podUID": uid, "node": node}),
    )
    .unwrap()
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn filter_keeps_only_nodes_with_one_gpu_that_holds_the_pod() {
    let h = start(cluster(), Policy::default()).await;
    // 3 slices: 2 + 2 free on two GPUs is not one GPU that holds them.
    let (code, r) = h
        .post("filter", &args_by_name(&pod("p3", Some("3")), &ALL))
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!(r["nodenames"], json!(["empty"]), "{r}");
    let failed = r["failedNodes"].as_object().unwrap();
    let keys: Vec<&str> = failed.keys().map(String::as_str).collect();
    assert_eq!(keys, ["sick", "silent", "stale", "two-by-two"], "{r}");
    assert!(
        failed["two-by-two"]
            .as_str()
            .unwrap()
            .contains("3 more slices"),
        "{r}"
    );
    assert!(
        failed["stale"]
            .as_str()
            .unwrap()
            .contains("unknown, not empty"),
        "{r}"
    );
    assert!(
        failed["silent"].as_str().unwrap().contains("gpu-report"),
        "{r}"
    );
    assert!(r.get("error").is_none(), "{r}");

    // 2 slices fit both GPUs of two-by-two too.
    let (_, r) = h
        .post("filter", &args_by_name(&pod("p2", Some("2")), &ALL))
        .await;
    assert_eq!(r["nodenames"], json!(["two-by-two", "empty"]), "{r}");

    // 8 slices = two whole 4-slice GPUs: no node has two unused ones.
    let (_, r) = h
        .post("filter", &args_by_name(&pod("p8", Some("8")), &ALL))
        .await;
    assert_eq!(r["nodenames"], json!([]), "{r}");
    // 4 = one whole GPU: only the empty node.
    let (_, r) = h
        .post("filter", &args_by_name(&pod("p4", Some("4")), &ALL))
        .await;
    assert_eq!(r["nodenames"], json!(["empty"]), "{r}");
}

#[tokio::test]
async fn filter_answers_in_the_form_it_was_asked() {
    let h = start(cluster(), Policy::default()).await;
    // Without nodeCacheCapable the scheduler sends whole Node objects (a
    // NodeList with no list metadata) and reads `nodes` back.
    let nodes: Vec<Value> = h.cluster.lock().unwrap().nodes.clone();
    let body = serde_json::to_vec(
        &json!({"pod": pod("p3", Some("3")), "nodes": {"metadata": {}, "items": nodes}}),
    )
    .unwrap();
    let (code, r) = h.post("filter", &body).await;
    assert_eq!(code, StatusCode::OK, "{r}");
    let names: Vec<&str> = r["nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["empty"], "{r}");
    assert!(r.get("nodenames").is_none(), "{r}");
}

#[tokio::test]
async fn prioritize_prefers_the_gpu_the_pod_fills() {
    for policy in [Policy::Defrag, Policy::Binpack] {
        let h = start(cluster(), policy).await;
        let (code, r) = h
            .post(
                "prioritize",
                &args_by_name(&pod("p2", Some("2")), &["empty", "two-by-two", "silent"]),
            )
            .await;
        assert_eq!(code, StatusCode::OK, "{r}");
        let scores: BTreeMap<String, i64> = r
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["host"].as_str().unwrap().into(),
                    h["score"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(scores.len(), 3, "{r}");
        // Two slices fill a half-used GPU exactly; on the empty node they
        // would cut a whole GPU.
        assert_eq!(scores["two-by-two"], 10, "{policy}: {r}");
        assert!(scores["empty"] < 10 && scores["empty"] > 0, "{policy}: {r}");
        assert_eq!(scores["silent"], 0, "{policy}: {r}");
    }
}

#[tokio::test]
async fn binds_back_to_back_get_their_own_gpus_and_a_third_is_refused() {
    let h = start(cluster(), Policy::default()).await;
    for name in ["p1", "p2", "p3"] {
        h.add_pod(pod(name, Some("2")));
    }
    let mut gpus = Vec::new();
    for name in ["p1", "p2"] {
        let (code, r) = h
            .post(
                "bind",
                &bind_args(name, &format!("uid-{name}"), "two-by-two"),
            )
            .await;
        assert_eq!(code, StatusCode::OK, "{r}");
        assert!(r.get("error").is_none(), "{name}: {r}");
        let p = h.pod(name);
        assert_eq!(p["spec"]["nodeName"], "two-by-two");
        let a = Assignment::parse(
            p["metadata"]["annotations"]["tessera.dev/gpu-assignment"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(a.node, "two-by-two");
        let c = a.container("main").unwrap();
        assert_eq!(c.gpus.len(), 1);
        assert_eq!(c.gpus[0].slices, 2);
        gpus.push(c.gpus[0].uuid.clone());
        // The user's annotations are kept.
        assert_eq!(
            p["metadata"]["annotations"]["tessera.dev/compute-policy"],
            "burst"
        );
    }
    gpus.sort();
    assert_eq!(gpus, ["GPU-a", "GPU-b"]);
    let before = h.writes();
    assert_eq!(
        before,
        [
            "patch team-a/p1",
            "bind team-a/p1 two-by-two",
            "patch team-a/p2",
            "bind team-a/p2 two-by-two"
        ]
    );
    // Both GPUs are full now (the node's report still says 2 used each:
    // the assignments count).
    let (_, r) = h
        .post("bind", &bind_args("p3", "uid-p3", "two-by-two"))
        .await;
    assert!(r["error"].as_str().unwrap().contains("cannot hold"), "{r}");
    assert_eq!(h.writes(), before, "a refused bind writes nothing");
    assert!(h.pod("p3")["spec"]["nodeName"].is_null());
    // And the filter now sees two-by-two full for 2 slices.
    let (_, r) = h
        .post(
            "filter",
            &args_by_name(&h.pod("p3"), &["two-by-two", "empty"]),
        )
        .await;
    assert_eq!(r["nodenames"], json!(["empty"]), "{r}");
}

#[tokio::test]
async fn bad_inputs_get_a_clear_error_and_change_nothing() {
    let h = start(cluster(), Policy::default()).await;
    h.add_pod(pod("p", Some("2")));
    h.add_pod(pod("cpu-only", None));
    let mut frac = pod("frac", Some("500m"));
    frac["metadata"]["uid"] = json!("uid-frac");
    h.add_pod(frac.clone());

    // Malformed ExtenderArgs.
    for verb in ["filter", "prioritize", "bind"] {
        let (code, r) = h.post(verb, b"{\"pod\": 42").await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{verb}: {r}");
        assert!(r.to_string().contains("malformed"), "{verb}: {r}");
    }
    // A pod without a Tessera request.
    let (code, r) = h
        .post("filter", &args_by_name(&pod("cpu-only", None), &ALL))
        .await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("requests no tessera.dev/vgpu"),
        "{r}"
    );
    let (code, r) = h
        .post("prioritize", &args_by_name(&pod("cpu-only", None), &ALL))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{r}");
    // A fractional slice count.
    let (_, r) = h.post("filter", &args_by_name(&frac, &ALL)).await;
    assert!(r["error"].as_str().unwrap().contains("500m"), "{r}");
    let (_, r) = h
        .post("bind", &bind_args("cpu-only", "uid-cpu-only", "empty"))
        .await;
    assert!(r["error"].as_str().unwrap().contains("requests no"), "{r}");
    // A node the extender does not know.
    let (_, r) = h
        .post("filter", &args_by_name(&pod("p", Some("2")), &["nowhere"]))
        .await;
    assert!(
        r["failedNodes"]["nowhere"]
            .as_str()
            .unwrap()
            .contains("not seen"),
        "{r}"
    );
    let (_, r) = h.post("bind", &bind_args("p", "uid-p", "nowhere")).await;
    assert!(r["error"].as_str().unwrap().contains("not found"), "{r}");
    // Nodes unknown to it by their reports.
    for node in ["stale", "silent", "sick"] {
        let (_, r) = h.post("bind", &bind_args("p", "uid-p", node)).await;
        assert!(
            r["error"].as_str().unwrap().contains("cannot hold"),
            "{node}: {r}"
        );
    }
    // A pod that changed: deleted and created again under the same name.
    let (_, r) = h.post("bind", &bind_args("p", "uid-old", "empty")).await;
    assert!(r["error"].as_str().unwrap().contains("changed"), "{r}");
    // A pod that is gone.
    let (_, r) = h
        .post("bind", &bind_args("gone", "uid-gone", "empty"))
        .await;
    assert!(r["error"].as_str().unwrap().contains("not found"), "{r}");
    assert_eq!(h.writes(), Vec::<String>::new(), "nothing was written");
    assert!(
        h.pod("p")["metadata"]["annotations"]
            .get("tessera.dev/gpu-assignment")
            .is_none()
    );

    // A pod already bound is not bound again.
    let (_, r) = h.post("bind", &bind_args("p", "uid-p", "empty")).await;
    assert!(r.get("error").is_none(), "{r}");
    let writes = h.writes();
    let (_, r) = h.post("bind", &bind_args("p", "uid-p", "empty")).await;
    assert!(
        r["error"].as_str().unwrap().contains("already bound"),
        "{r}"
    );
    assert_eq!(h.writes(), writes);
}

// ---------------------------------------------------------------- HTTPS

/// The name the extender's certificate is for (the chart's `tlsConfig`
/// names it as `serverName`).
const TLS_NAME: &str = "localhost";

/// One request over TLS on a new connection, trusting `bundle` only.
async fn https(
    addr: SocketAddr,
    bundle: &str,
    verb: &str,
    body: &[u8],
) -> Result<tessera_tls::testing::Reply, tessera_tls::testing::RequestError> {
    tessera_tls::testing::request(
        addr,
        TLS_NAME,
        bundle,
        "POST",
        &format!("/{verb}"),
        body.into(),
    )
    .await
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: tessera_extender::SchedulerExtenderArgs,
}

/// `tessera scheduler-extender` flags, parsed as the binary parses them.
fn flags(flags: &[&str]) -> tessera_extender::SchedulerExtenderArgs {
    use clap::Parser as _;
    Cli::try_parse_from(std::iter::once("scheduler-extender").chain(flags.iter().copied()))
        .expect("flags")
        .args
}

/// A test CA and certificate files it signed for [`TLS_NAME`], in a
/// temporary directory.
struct Certs {
    ca: Authority,
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let ca = Authority::generate(Duration::from_secs(86_400), time::OffsetDateTime::now_utc())
            .expect("ca");
        let c = Certs {
            ca,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        c.write(&c.issue());
        c
    }

    fn issue(&self) -> ServingCert {
        self.ca
            .issue(
                &[TLS_NAME.to_string()],
                Duration::from_secs(3600),
                time::OffsetDateTime::now_utc(),
            )
            .expect("issue")
    }

    fn cert_path(&self) -> String {
        self.dir.path().join("tls.crt").display().to_string()
    }

    fn key_path(&self) -> String {
        self.dir.path().join("tls.key").display().to_string()
    }

    /// Writes `cert` and its key as cert-manager's mounted files.
    fn write(&self, cert: &ServingCert) {
        let pem: String = cert.chain.iter().map(|d| der_to_pem(d)).collect();
        std::fs::write(self.cert_path(), pem).expect("write cert");
        std::fs::write(self.key_path(), cert.key_pem()).expect("write key");
    }

    /// The extender's flags serving these files, re-read every second.
    fn flags(&self) -> tessera_extender::SchedulerExtenderArgs {
        flags(&[
            "--listen",
            "0.0.0.0:8888",
            "--tls-cert-file",
            &self.cert_path(),
            "--tls-key-file",
            &self.key_path(),
            "--tls-reload-secs",
            "1",
        ])
    }

    fn bundle(&self) -> String {
        self.ca.material().cert_pem.clone()
    }
}

#[tokio::test]
async fn filter_prioritize_and_bind_over_tls() {
    let certs = Certs::new();
    let tls = certs
        .flags()
        .server_tls()
        .expect("TLS")
        .expect("TLS, not plain");
    let h = start_with(cluster(), Policy::default(), Some((tls, certs.bundle()))).await;

    let (code, r) = h
        .post("filter", &args_by_name(&pod("p3", Some("3")), &ALL))
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!(r["nodenames"], json!(["empty"]), "{r}");

    let (code, r) = h
        .post(
            "prioritize",
            &args_by_name(&pod("p2", Some("2")), &["empty", "two-by-two"]),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!(r.as_array().map(Vec::len), Some(2), "{r}");

    h.add_pod(pod("p1", Some("2")));
    let (code, r) = h
        .post("bind", &bind_args("p1", "uid-p1", "two-by-two"))
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(h.pod("p1")["spec"]["nodeName"], "two-by-two");
    assert_eq!(h.writes(), ["patch team-a/p1", "bind team-a/p1 two-by-two"]);

    // A client that trusts another CA is refused in the handshake, and plain
    // HTTP to the TLS port gets no answer: nothing more is written.
    let other = Certs::new();
    let e = https(h.extender, &other.bundle(), "filter", b"{}")
        .await
        .expect_err("an untrusted certificate");
    assert!(
        matches!(e, tessera_tls::testing::RequestError::Tls(_)),
        "{e}"
    );
    let tcp = TcpStream::connect(h.extender).await.unwrap();
    let plain = async {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let req = Request::post("/bind")
            .header("host", "localhost")
            .body(Full::new(Bytes::from(bind_args("p1", "uid-p1", "empty"))))
            .unwrap();
        send.send_request(req).await
    };
    assert!(plain.await.is_err(), "plain HTTP answered on the TLS port");
    assert_eq!(h.writes().len(), 2);
}

#[tokio::test]
async fn a_bad_certificate_or_plain_http_off_loopback_is_a_clear_error_at_start() {
    let certs = Certs::new();
    let run = |args| tessera_extender::run(args, std::future::pending());

    // Not PEM.
    std::fs::write(certs.cert_path(), "not a certificate").unwrap();
    let e = run(certs.flags()).await.expect_err("garbage").to_string();
    assert!(e.contains("not a PEM certificate"), "{e}");
    assert!(e.contains(&certs.cert_path()), "{e}");

    // A key that is not the certificate's.
    let (a, b) = (certs.issue(), certs.issue());
    certs.write(&a);
    std::fs::write(certs.key_path(), b.key_pem()).unwrap();
    let e = run(certs.flags()).await.expect_err("mismatch").to_string();
    assert!(
        e.contains("the key does not go with the certificate"),
        "{e}"
    );
    assert!(e.contains(&certs.cert_path()), "{e}");

    // Missing.
    std::fs::remove_file(certs.key_path()).unwrap();
    let e = run(certs.flags()).await.expect_err("missing").to_string();
    assert!(e.contains("cannot read"), "{e}");
    assert!(e.contains(&certs.key_path()), "{e}");

    // No certificate on an address others reach.
    let e = run(flags(&["--listen", "0.0.0.0:0"]))
        .await
        .expect_err("plain off loopback")
        .to_string();
    assert!(e.contains("refusing to serve plain HTTP"), "{e}");
}

#[tokio::test]
async fn a_rotated_certificate_is_served_after_its_files_change() {
    let certs = Certs::new();
    let tls = certs.flags().server_tls().expect("TLS").expect("TLS");
    let h = start_with(cluster(), Policy::default(), Some((tls, certs.bundle()))).await;
    let body = args_by_name(&pod("p3", Some("3")), &ALL);
    let first = https(h.extender, &certs.bundle(), "filter", &body)
        .await
        .expect("served");
    assert_eq!(first.status, 200);

    // cert-manager renews: new certificate, new key, same CA.
    let next = certs.issue();
    certs.write(&next);
    let t0 = std::time::Instant::now();
    loop {
        // Every request meanwhile is answered, by the old certificate or the new.
        let r = https(h.extender, &certs.bundle(), "filter", &body)
            .await
            .expect("served through the rotation");
        assert_eq!(r.status, 200);
        if r.leaf == next.chain[0] {
            break;
        }
        assert_eq!(
            r.leaf, first.leaf,
            "neither the old certificate nor the new"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the new certificate was not served within 60 s (re-read every second)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- shutdown

#[tokio::test]
async fn a_bind_in_flight_at_shutdown_is_answered_before_the_server_stops() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut h = start(cluster(), Policy::default()).await;
    h.add_pod(pod("p1", Some("2")));
    let body = bind_args("p1", "uid-p1", "two-by-two");
    let mut tcp = TcpStream::connect(h.extender).await.unwrap();
    // `Expect: 100-continue`: `100 Continue` comes once the handler reads the body, so
    // the bind is in flight, by construction, when the shutdown comes.
    let head = format!(
        "POST /bind HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         expect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        interim.push(tcp.read_u8().await.expect("100 Continue"));
    }
    assert!(interim.starts_with(b"HTTP/1.1 100"), "{interim:?}");
    h.stop.take().unwrap().send(()).unwrap();
    // It stops listening ...
    let t0 = std::time::Instant::now();
    while TcpStream::connect(h.extender).await.is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(60), "still listening");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... waits for the bind in flight (the process would exit when this returns) ...
    assert!(!h.served.is_finished(), "stopped with a bind in flight");
    // ... answers it, then closes the connection and stops.
    tcp.write_all(&body).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.expect("the answer");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(h.pod("p1")["spec"]["nodeName"], "two-by-two");
    tokio::time::timeout(Duration::from_secs(60), h.served)
        .await
        .expect("the server stopped")
        .expect("join")
        .expect("served cleanly");
}
