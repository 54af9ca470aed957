//! The extender over real HTTP against a fake API server that speaks the
//! real one's JSON (lists and watches, 404 Status objects, merge patches
//! with a resourceVersion precondition, the pods/binding subresource; see
//! `support`): filter, prioritize and bind with the bodies kube-scheduler
//! sends, and the bad inputs, each of which must change nothing; on paused
//! time, over in-memory pipes. Then the same over HTTPS, as `tessera
//! scheduler-extender --tls-cert-file/--tls-key-file` serves it on TCP: a
//! certificate from a test CA, a bad certificate refused at start, a rotated
//! one served once its files change; and draining on shutdown.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use support::{Options, Res, args_by_name, bind_args, pod, scores, slice_cluster, start};
use tessera_node::scheduling::Assignment;
use tessera_placement::Policy;
use tessera_tls::certs::{Authority, ServingCert, der_to_pem};
use tokio::net::TcpStream;

const ALL: [&str; 5] = ["two-by-two", "empty", "stale", "silent", "sick"];

/// Served on TCP: HTTPS with this configuration and the CA bundle a client
/// trusts, or plain HTTP.
fn tcp(tls: Option<(Arc<rustls::ServerConfig>, String)>) -> Options {
    Options {
        tcp: Some(tls),
        ..Options::default()
    }
}

fn with_policy(policy: Policy) -> Options {
    Options {
        policy,
        ..Options::default()
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test(start_paused = true)]
async fn filter_keeps_only_nodes_with_one_gpu_that_holds_the_pod() {
    let h = start(slice_cluster(), Options::default()).await;
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

#[tokio::test(start_paused = true)]
async fn filter_answers_in_the_form_it_was_asked() {
    let h = start(slice_cluster(), Options::default()).await;
    // Without nodeCacheCapable the scheduler sends whole Node objects (a
    // NodeList with no list metadata) and reads `nodes` back.
    let nodes: Vec<Value> = ALL
        .iter()
        .map(|n| h.api.get(Res::Nodes, "", n).expect("node"))
        .collect();
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

#[tokio::test(start_paused = true)]
async fn prioritize_prefers_the_gpu_the_pod_fills() {
    for policy in [Policy::Defrag, Policy::Binpack] {
        let h = start(slice_cluster(), with_policy(policy)).await;
        let (code, r) = h
            .post(
                "prioritize",
                &args_by_name(&pod("p2", Some("2")), &["empty", "two-by-two", "silent"]),
            )
            .await;
        assert_eq!(code, StatusCode::OK, "{r}");
        let scores = scores(&r);
        assert_eq!(scores.len(), 3, "{r}");
        // Two slices fill a half-used GPU exactly; on the empty node they
        // would cut a whole GPU.
        assert_eq!(scores["two-by-two"], 10, "{policy}: {r}");
        assert!(scores["empty"] < 10 && scores["empty"] > 0, "{policy}: {r}");
        assert_eq!(scores["silent"], 0, "{policy}: {r}");
    }
}

#[tokio::test(start_paused = true)]
async fn binds_back_to_back_get_their_own_gpus_and_a_third_is_refused() {
    let h = start(slice_cluster(), Options::default()).await;
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

#[tokio::test(start_paused = true)]
async fn bad_inputs_get_a_clear_error_and_change_nothing() {
    let h = start(slice_cluster(), Options::default()).await;
    h.add_pod(pod("p", Some("2")));
    let mut frac = pod("frac", Some("500m"));
    frac["metadata"]["uid"] = json!("uid-frac");
    h.add_pod(frac.clone());

    // Malformed ExtenderArgs.
    for verb in ["filter", "prioritize", "bind"] {
        let (code, r) = h.post(verb, b"{\"pod\": 42").await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{verb}: {r}");
        assert!(r.to_string().contains("malformed"), "{verb}: {r}");
    }
    // A fractional slice count.
    let (_, r) = h.post("filter", &args_by_name(&frac, &ALL)).await;
    assert!(r["error"].as_str().unwrap().contains("500m"), "{r}");
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

#[tokio::test(start_paused = true)]
async fn pods_without_slices_or_claims_pass_through_untouched() {
    // With DRA on, the chart's scheduler sends the extender every pod it
    // schedules: one asking nothing of Tessera's passes every candidate,
    // even nodes the extender does not know, scores 0 everywhere, and is
    // bound as asked, with no assignment.
    let h = start(slice_cluster(), Options::default()).await;
    h.add_pod(pod("cpu-only", None));
    let (code, r) = h
        .post("filter", &args_by_name(&h.pod("cpu-only"), &ALL))
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert_eq!(r["nodenames"], json!(ALL), "{r}");
    assert!(
        r.get("failedNodes").is_none() && r.get("error").is_none(),
        "{r}"
    );
    let (code, r) = h
        .post("prioritize", &args_by_name(&h.pod("cpu-only"), &ALL))
        .await;
    assert_eq!(code, StatusCode::OK, "{r}");
    assert!(scores(&r).values().all(|&s| s == 0), "{r}");
    assert_eq!(scores(&r).len(), ALL.len(), "{r}");
    let (_, r) = h
        .post("bind", &bind_args("cpu-only", "uid-cpu-only", "sick"))
        .await;
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(h.writes(), ["bind team-a/cpu-only sick"]);
    assert!(
        h.pod("cpu-only")["metadata"]["annotations"]
            .get("tessera.dev/gpu-assignment")
            .is_none()
    );
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

#[tokio::test(start_paused = true)]
async fn filter_prioritize_and_bind_over_tls() {
    let certs = Certs::new();
    let tls = certs
        .flags()
        .server_tls()
        .expect("TLS")
        .expect("TLS, not plain");
    let h = start(slice_cluster(), tcp(Some((tls, certs.bundle())))).await;

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
    let e = https(h.addr(), &other.bundle(), "filter", b"{}")
        .await
        .expect_err("an untrusted certificate");
    assert!(
        matches!(e, tessera_tls::testing::RequestError::Tls(_)),
        "{e}"
    );
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
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

#[tokio::test(start_paused = true)]
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

#[tokio::test(start_paused = true)]
async fn a_rotated_certificate_is_served_after_its_files_change() {
    let certs = Certs::new();
    let tls = certs.flags().server_tls().expect("TLS").expect("TLS");
    let h = start(slice_cluster(), tcp(Some((tls, certs.bundle())))).await;
    let body = args_by_name(&pod("p3", Some("3")), &ALL);
    let first = https(h.addr(), &certs.bundle(), "filter", &body)
        .await
        .expect("served");
    assert_eq!(first.status, 200);

    // cert-manager renews: new certificate, new key, same CA.
    let next = certs.issue();
    certs.write(&next);
    // On the paused clock the re-read (every second) comes at its time exactly.
    let t0 = tokio::time::Instant::now();
    loop {
        // Every request meanwhile is answered, by the old certificate or the new.
        let r = https(h.addr(), &certs.bundle(), "filter", &body)
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
            t0.elapsed() <= Duration::from_millis(1_050),
            "the new certificate was not served within a re-read period (1 s) and a step"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- shutdown

#[tokio::test(start_paused = true)]
async fn a_bind_in_flight_at_shutdown_is_answered_before_the_server_stops() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut h = start(slice_cluster(), tcp(None)).await;
    h.add_pod(pod("p1", Some("2")));
    let body = bind_args("p1", "uid-p1", "two-by-two");
    let mut tcp = TcpStream::connect(h.addr()).await.unwrap();
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
    let t0 = tokio::time::Instant::now();
    while TcpStream::connect(h.addr()).await.is_ok() {
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
