//! Test doubles for the plugin's peers, on real sockets: an API server that
//! speaks the JSON of `resource.k8s.io/v1` over plain HTTP/1.1 (what kube-rs
//! reads through a kubeconfig), and the kubelet's plugin watcher.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto::dra::v1::dra_plugin_client::DraPluginClient;
use tessera_proto::pluginregistration::v1 as reg;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Channel;

type Objects = Arc<Mutex<BTreeMap<String, serde_json::Value>>>;

/// An API server holding objects by their REST path
/// (`/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/name`):
/// GET of an object or of a collection (a list), POST to a collection,
/// PUT, merge PATCH and DELETE of an object. Every request is recorded.
pub struct FakeApiServer {
    pub addr: SocketAddr,
    objects: Objects,
    requests: Arc<Mutex<Vec<String>>>,
    /// Requests answered so far: what a test waits on to see the next
    /// change the plugin makes, instead of polling on a timer.
    served: Served,
    task: tokio::task::JoinHandle<()>,
}

type Served = Arc<tokio::sync::watch::Sender<usize>>;

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The REST path of a namespaced resource claim.
pub fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeApiServer {
    /// Listens on an ephemeral port of 127.0.0.1.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let objects: Objects = Arc::default();
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let served: Served = Arc::new(tokio::sync::watch::channel(0).0);
        let (o, r, n) = (objects.clone(), requests.clone(), served.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                // As the real API server (Go's net/http sets TCP_NODELAY):
                // without it an answer written in two parts waits out the
                // client's delayed ACK, 40 ms a request.
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve_conn(sock, o.clone(), r.clone(), n.clone()));
            }
        });
        Ok(Self {
            addr,
            objects,
            requests,
            served,
            task,
        })
    }

    /// Writes a kubeconfig that points at this server.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
                self.addr
            ),
        )
    }

    /// Stores (or replaces) a resource claim, by its namespace and name.
    pub fn put_claim(&self, claim: serde_json::Value) {
        let ns = claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        lock(&self.objects).insert(claim_path(&ns, &name), claim);
    }

    /// Stores (or replaces) any object at its REST path
    /// (`/api/v1/nodes/node-1`).
    pub fn put(&self, path: &str, object: serde_json::Value) {
        lock(&self.objects).insert(path.to_owned(), object);
    }

    /// Removes the object at `path`.
    pub fn remove(&self, path: &str) -> Option<serde_json::Value> {
        lock(&self.objects).remove(path)
    }

    /// The object at `path`.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        lock(&self.objects).get(path).cloned()
    }

    /// Every object under the collection `path`.
    pub fn list(&self, collection: &str) -> Vec<serde_json::Value> {
        list_of(&lock(&self.objects), collection)
    }

    /// The requests served so far: `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.requests).clone()
    }

    /// How many requests have been answered (their effect on the objects
    /// is in place by then).
    pub fn served(&self) -> usize {
        *self.served.borrow()
    }

    /// Waits until more than `seen` requests have been answered; false
    /// when `wait` passed first.
    pub async fn wait_served_beyond(&self, seen: usize, wait: Duration) -> bool {
        let mut rx = self.served.subscribe();
        matches!(
            tokio::time::timeout(wait, rx.wait_for(|&n| n > seen)).await,
            Ok(Ok(_))
        )
    }
}

fn list_of(
    objects: &BTreeMap<String, serde_json::Value>,
    collection: &str,
) -> Vec<serde_json::Value> {
    let collection = collection.trim_end_matches('/');
    let prefix = format!("{collection}/");
    // `/api/v1/pods` also lists every namespace's
    // `/api/v1/namespaces/<ns>/pods/<name>`, as the API server does.
    let across = collection
        .rsplit_once('/')
        .filter(|(group, _)| !group.contains("/namespaces/"))
        .map(|(group, resource)| (format!("{group}/namespaces/"), format!("/{resource}/")));
    objects
        .iter()
        .filter(|(p, _)| {
            let direct = p
                .strip_prefix(&prefix)
                .is_some_and(|rest| !rest.contains('/'));
            let namespaced = across.as_ref().is_some_and(|(ns, res)| {
                p.strip_prefix(ns.as_str())
                    .and_then(|rest| rest.split_once(res.as_str()))
                    .is_some_and(|(ns, name)| !ns.contains('/') && !name.contains('/'))
            });
            direct || namespaced
        })
        .map(|(_, v)| v.clone())
        .collect()
}

/// A JSON merge patch (RFC 7386): objects merge, `null` removes, anything
/// else replaces.
fn merge_patch(into: &mut serde_json::Value, patch: &serde_json::Value) {
    match (into, patch) {
        (serde_json::Value::Object(o), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    o.remove(k);
                } else {
                    merge_patch(o.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (slot, p) => *slot = p.clone(),
    }
}

/// A query parameter's value as sent (`%3D` for `=`, `+` for a space).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, reason: &str, message: &str) -> (u16, serde_json::Value) {
    (
        code,
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": if code < 300 { "Success" } else { "Failure" },
            "message": message, "reason": reason, "code": code,
        }),
    )
}

fn route(method: &str, target: &str, body: &[u8], objects: &Objects) -> (u16, serde_json::Value) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let path = path.trim_end_matches('/').to_owned();
    let mut objs = lock(objects);
    match method {
        "GET" => {
            if let Some(o) = objs.get(&path) {
                return (200, o.clone());
            }
            let items = list_of(&objs, &path);
            let is_collection = path.ends_with('s') && !items.is_empty()
                || path.ends_with("resourceslices")
                || path.ends_with("resourceclaims")
                || path.ends_with("/pods");
            if !is_collection {
                return status(404, "NotFound", &format!("{path} not found"));
            }
            // `k=v` terms of the label and field selectors: a label names
            // metadata.labels[k], a field a dotted path (spec.nodeName).
            let terms = |param: &str| -> Vec<(String, String)> {
                query
                    .split('&')
                    .filter_map(|kv| kv.strip_prefix(param))
                    .flat_map(|s| {
                        percent_decode(s)
                            .split(',')
                            .filter_map(|t| {
                                t.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            let labels = terms("labelSelector=");
            let fields = terms("fieldSelector=");
            let items: Vec<_> = items
                .into_iter()
                .filter(|o| {
                    labels
                        .iter()
                        .all(|(k, v)| o["metadata"]["labels"][k.as_str()] == v.as_str())
                        && fields
                            .iter()
                            .all(|(k, v)| k.split('.').fold(o, |at, part| &at[part]) == v.as_str())
                })
                .collect();
            (
                200,
                serde_json::json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        }
        "POST" => {
            let Ok(mut o) = serde_json::from_slice::<serde_json::Value>(body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            let name = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if name.is_empty() {
                return status(422, "Invalid", "metadata.name is required");
            }
            let at = format!("{path}/{name}");
            if objs.contains_key(&at) {
                return status(409, "AlreadyExists", &format!("{at} already exists"));
            }
            o["metadata"]["uid"] = format!("uid-{}", objs.len()).into();
            o["metadata"]["resourceVersion"] = "1".into();
            objs.insert(at, o.clone());
            (201, o)
        }
        "PUT" => {
            let Ok(mut o) = serde_json::from_slice::<serde_json::Value>(body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            let Some(old) = objs.get(&path) else {
                return status(404, "NotFound", &format!("{path} not found"));
            };
            let v: u64 = old["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            o["metadata"]["uid"] = old["metadata"]["uid"].clone();
            o["metadata"]["resourceVersion"] = (v + 1).to_string().into();
            objs.insert(path, o.clone());
            (200, o)
        }
        "PATCH" => {
            // Merge patches only (what kube's `Patch::Merge` sends).
            let Ok(patch) = serde_json::from_slice::<serde_json::Value>(body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            let Some(o) = objs.get_mut(&path) else {
                return status(404, "NotFound", &format!("{path} not found"));
            };
            let v: u64 = o["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            merge_patch(o, &patch);
            o["metadata"]["resourceVersion"] = (v + 1).to_string().into();
            (200, o.clone())
        }
        "DELETE" => match objs.remove(&path) {
            Some(_) => status(200, "", "deleted"),
            None => status(404, "NotFound", &format!("{path} not found")),
        },
        _ => status(405, "MethodNotAllowed", method),
    }
}

async fn serve_conn(
    sock: TcpStream,
    objects: Objects,
    requests: Arc<Mutex<Vec<String>>>,
    served: Served,
) {
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = String::new();
        match rd.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_owned(), target.to_owned());
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if rd.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        if rd.read_exact(&mut body).await.is_err() {
            return;
        }
        lock(&requests).push(format!("{method} {target}"));
        let (code, value) = route(&method, &target, &body, &objects);
        served.send_modify(|n| *n += 1);
        let text = value.to_string();
        let head = format!(
            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            text.len()
        );
        if wr.write_all(head.as_bytes()).await.is_err()
            || wr.write_all(text.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

/// The kubelet's plugin watcher: finds the registration socket of `driver`
/// in `registry_dir` (waiting up to `wait` for it), asks GetInfo, dials the
/// endpoint it names and tells the plugin it is registered.
pub async fn register(
    registry_dir: &Path,
    driver: &str,
    wait: Duration,
) -> Result<(reg::PluginInfo, DraPluginClient<Channel>), String> {
    let sock = registry_dir.join(crate::registration::socket_name(driver));
    let deadline = tokio::time::Instant::now() + wait;
    let channel = loop {
        if sock.exists()
            && let Ok(c) = tessera_proto::unix::channel(&sock).await
        {
            break c;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "no registration socket at {} after {wait:?}",
                sock.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut r = reg::registration_client::RegistrationClient::new(channel);
    let info = r
        .get_info(reg::InfoRequest {})
        .await
        .map_err(|s| format!("GetInfo: {s}"))?
        .into_inner();
    let dra = tessera_proto::unix::channel(Path::new(&info.endpoint))
        .await
        .map_err(|e| format!("dial {}: {e}", info.endpoint))?;
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .map_err(|s| format!("NotifyRegistrationStatus: {s}"))?;
    Ok((info, DraPluginClient::new(dra)))
}

/// The documents of a multi-document YAML file (`---` lines between them),
/// as JSON values: how a test reads the example manifests.
pub fn yaml_documents(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |doc: &mut String| -> Result<(), String> {
        if let Some(v) = tessera_contract::yaml::from_yaml::<serde_json::Value>(doc)
            .map_err(|e| e.to_string())?
        {
            docs.push(v);
        }
        doc.clear();
        Ok(())
    };
    for line in text.lines() {
        if line.trim_end() == "---" {
            flush(&mut current)?;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current)?;
    Ok(docs)
}
