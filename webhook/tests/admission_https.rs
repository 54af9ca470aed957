//! Admission over real HTTPS: AdmissionReview JSON for many pod shapes goes through the
//! TLS server; each patch must apply cleanly, give a valid `Pod`, change exactly what is
//! expected, and change nothing on a second pass.

mod common;

use std::time::Duration;

use serde_json::{Value, json};
use tessera_webhook::admission::HOOK_PATH;
use tessera_webhook::certs::Authority;

use common::{Outcome, Server};
use tessera_webhook::dropin::Config;

async fn server() -> Server {
    common::server_with(Config::default()).await
}

/// A container as the API server hands it over after defaulting.
fn container(name: &str, slices: Option<&str>) -> Value {
    let mut c = json!({
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "resources": {},
    });
    if let Some(n) = slices {
        c["resources"] = json!({
            "limits": { "tessera.dev/vgpu": n, "cpu": "2" },
            "requests": { "tessera.dev/vgpu": n, "cpu": "1" },
        });
    }
    c
}

fn pod(containers: Vec<Value>, init: Vec<Value>, annotations: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "ml",
            "labels": { "app": "train" },
            "annotations": annotations,
        },
        "spec": {
            "containers": containers,
            "restartPolicy": "Never",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "securityContext": {},
            "tolerations": [{
                "key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300
            }],
            // A field newer than our k8s-openapi version: must survive untouched.
            "futureField": { "x": 1 },
        },
        "status": {},
    });
    if !init.is_empty() {
        p["spec"]["initContainers"] = Value::Array(init);
    }
    p
}

fn review_of(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "resource": { "group": "", "version": "v1", "resource": "pods" },
            "requestKind": { "group": "", "version": "v1", "kind": "Pod" },
            "requestResource": { "group": "", "version": "v1", "resource": "pods" },
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": { "username": "alice", "groups": ["system:authenticated"] },
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": { "apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions" },
        }
    })
}

async fn admit_on(s: &Server, pod: &Value) -> Outcome {
    common::admit_on(s, pod, &review_of(pod)).await
}

/// Admits `pod`, expects it allowed, checks a second pass changes nothing, returns it.
async fn admitted(pod: &Value) -> Value {
    common::admitted(Config::default(), review_of, pod).await.0
}

async fn denied(pod: &Value) -> String {
    common::denied(Config::default(), review_of, pod).await
}

fn env(name: &str, value: &str) -> Value {
    json!({ "name": name, "value": value })
}

#[tokio::test(start_paused = true)]
async fn one_container_gets_the_shim() {
    let p = pod(vec![container("main", Some("2"))], vec![], json!({}));
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn other_containers_see_no_gpu() {
    let p = pod(
        vec![container("main", Some("2")), container("sidecar", None)],
        vec![],
        json!({}),
    );
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    expected["spec"]["containers"][1]["env"] = json!([env("NVIDIA_VISIBLE_DEVICES", "void")]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn init_containers_are_injected_too() {
    let p = pod(
        vec![container("main", Some("1"))],
        vec![container("warmup", Some("1")), container("fetch", None)],
        json!({}),
    );
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    expected["spec"]["initContainers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    expected["spec"]["initContainers"][1]["env"] = json!([env("NVIDIA_VISIBLE_DEVICES", "void")]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn user_ld_preload_keeps_its_entries_after_the_shim() {
    let mut main = container("main", Some("4"));
    main["env"] = json!([env("LD_PRELOAD", "/opt/a.so /opt/b.so"), env("X", "1")]);
    let p = pod(vec![main], vec![], json!({}));
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"][0] =
        env("LD_PRELOAD", &format!("{HOOK_PATH}:/opt/a.so:/opt/b.so"));
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn already_injected_pod_is_left_alone() {
    let mut main = container("main", Some("2"));
    main["env"] = json!([env("LD_PRELOAD", &format!("{HOOK_PATH}:/opt/a.so"))]);
    let mut side = container("side", None);
    side["env"] = json!([env("NVIDIA_VISIBLE_DEVICES", "void")]);
    let p = pod(vec![main, side], vec![], json!({}));
    match admit_on(&server().await, &p).await {
        Outcome::Allowed { patched, .. } => assert!(!patched),
        Outcome::Denied(m) => panic!("{m}"),
    }
}

#[tokio::test(start_paused = true)]
async fn pod_without_slices_is_not_changed() {
    // It reaches the webhook because of its (valid) annotation.
    let p = pod(
        vec![container("web", None)],
        vec![],
        json!({ "tessera.dev/gpu-class": "general-purpose" }),
    );
    match admit_on(&server().await, &p).await {
        Outcome::Allowed { patched, .. } => assert!(!patched),
        Outcome::Denied(m) => panic!("{m}"),
    }
}

#[tokio::test(start_paused = true)]
async fn gpu_class_becomes_required_node_affinity() {
    let p = pod(
        vec![container("main", Some("2"))],
        vec![],
        json!({ "tessera.dev/gpu-class": "high-performance" }),
    );
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    expected["spec"]["affinity"] = json!({ "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
            { "matchExpressions": [
                { "key": "tessera.dev/gpu-class", "operator": "In", "values": ["high-performance"] }
            ] }
        ] }
    } });
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn gpu_class_is_added_to_every_existing_term() {
    let mut p = pod(
        vec![container("main", Some("2"))],
        vec![],
        json!({ "tessera.dev/gpu-class": "general-purpose" }),
    );
    let zone =
        |z: &str| json!({ "key": "topology.kubernetes.io/zone", "operator": "In", "values": [z] });
    p["spec"]["affinity"] = json!({ "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
            { "matchExpressions": [zone("a")] },
            { "matchExpressions": [zone("b")] },
        ] },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            { "weight": 1, "preference": { "matchExpressions": [zone("c")] } }
        ],
    } });
    let class =
        json!({ "key": "tessera.dev/gpu-class", "operator": "In", "values": ["general-purpose"] });
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    let terms = &mut expected["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    terms[0]["matchExpressions"] = json!([zone("a"), class.clone()]);
    terms[1]["matchExpressions"] = json!([zone("b"), class]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn compute_policy_is_carried_to_every_slice_container() {
    let p = pod(
        vec![container("a", Some("1")), container("b", Some("3"))],
        vec![],
        json!({ "tessera.dev/compute-policy": "guaranteed" }),
    );
    let mut expected = p.clone();
    for i in 0..2 {
        expected["spec"]["containers"][i]["env"] = json!([
            env("LD_PRELOAD", HOOK_PATH),
            env("TESSERA_COMPUTE_POLICY", "guaranteed")
        ]);
    }
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn containers_with_whole_gpus_keep_them() {
    let mut whole = container("whole", None);
    whole["resources"] = json!({ "limits": { "nvidia.com/gpu": "1" } });
    let p = pod(vec![container("main", Some("2")), whole], vec![], json!({}));
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn limits_only_is_accepted() {
    let mut main = container("main", None);
    main["resources"] = json!({ "limits": { "tessera.dev/vgpu": "3" } });
    let p = pod(vec![main], vec![], json!({}));
    let mut expected = p.clone();
    expected["spec"]["containers"][0]["env"] = json!([env("LD_PRELOAD", HOOK_PATH)]);
    assert_eq!(admitted(&p).await, expected);
}

#[tokio::test(start_paused = true)]
async fn privileged_container_with_slices_is_refused() {
    let mut main = container("main", Some("2"));
    main["securityContext"] = json!({ "privileged": true });
    let m = denied(&pod(vec![main], vec![], json!({}))).await;
    assert!(m.contains("\"main\" is privileged"), "{m}");
    assert!(m.contains("bypasses its slice limits"), "{m}");
}

#[tokio::test(start_paused = true)]
async fn bad_slice_counts_are_refused() {
    for bad in ["0", "500m", "1.5"] {
        let m = denied(&pod(vec![container("main", Some(bad))], vec![], json!({}))).await;
        assert!(
            m.contains(&format!(
                "whole number of slices of at least 1, like \"2\"; got \"{bad}\""
            )),
            "{m}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn requests_and_limits_must_agree() {
    let mut main = container("main", None);
    main["resources"] = json!({
        "limits": { "tessera.dev/vgpu": "2" },
        "requests": { "tessera.dev/vgpu": "1" },
    });
    let m = denied(&pod(vec![main], vec![], json!({}))).await;
    assert!(
        m.contains("requests (\"1\") and limits (\"2\") disagree"),
        "{m}"
    );

    let mut only_requests = container("main", None);
    only_requests["resources"] = json!({ "requests": { "tessera.dev/vgpu": "2" } });
    let m = denied(&pod(vec![only_requests], vec![], json!({}))).await;
    assert!(m.contains("set it in limits"), "{m}");
}

#[tokio::test(start_paused = true)]
async fn forged_annotations_are_refused() {
    for key in ["tessera.dev/allocation", "alloc.tessera.dev/devices"] {
        let p = pod(
            vec![container("main", Some("2"))],
            vec![],
            json!({ key: "GPU-1234::0" }),
        );
        let m = denied(&p).await;
        assert!(
            m.contains(&format!("annotation \"{key}\" is in Tessera's namespace")),
            "{m}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn bad_policy_and_class_annotations_are_refused() {
    let p = pod(
        vec![container("main", Some("2"))],
        vec![],
        json!({ "tessera.dev/compute-policy": "best-effort", "tessera.dev/gpu-class": "fast gpus" }),
    );
    let m = denied(&p).await;
    assert!(
        m.contains("\"best-effort\" is not a compute policy; use \"guaranteed\" or \"burst\""),
        "{m}"
    );
    assert!(
        m.contains("\"fast gpus\" is not a valid label value"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn pods_may_not_set_what_the_device_plugin_sets() {
    let mut main = container("main", Some("2"));
    main["env"] = json!([
        env("TESSERA_CONTROL", "/tmp/my-limits"),
        env("NVIDIA_VISIBLE_DEVICES", "all")
    ]);
    let m = denied(&pod(vec![main], vec![], json!({}))).await;
    assert!(m.contains("sets TESSERA_CONTROL"), "{m}");
    assert!(m.contains("sets NVIDIA_VISIBLE_DEVICES"), "{m}");
}

#[tokio::test(start_paused = true)]
async fn sidecar_asking_for_all_gpus_is_refused() {
    let mut side = container("side", None);
    side["env"] = json!([env("NVIDIA_VISIBLE_DEVICES", "all")]);
    let m = denied(&pod(
        vec![container("main", Some("1")), side],
        vec![],
        json!({}),
    ))
    .await;
    assert!(
        m.contains("\"side\" requests no tessera.dev/vgpu but sets NVIDIA_VISIBLE_DEVICES=\"all\""),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn ld_preload_from_a_configmap_is_refused() {
    let mut main = container("main", Some("1"));
    main["env"] = json!([{ "name": "LD_PRELOAD", "valueFrom": { "configMapKeyRef": { "name": "c", "key": "k" } } }]);
    let m = denied(&pod(vec![main], vec![], json!({}))).await;
    assert!(
        m.contains("sets LD_PRELOAD from a ConfigMap or Secret"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn class_conflicting_with_node_selector_is_refused() {
    let mut p = pod(
        vec![container("main", Some("1"))],
        vec![],
        json!({ "tessera.dev/gpu-class": "high-performance" }),
    );
    p["spec"]["nodeSelector"] = json!({ "tessera.dev/gpu-class": "general-purpose" });
    let m = denied(&p).await;
    assert!(m.contains("contradicts nodeSelector"), "{m}");
}

#[tokio::test(start_paused = true)]
async fn every_problem_is_reported_at_once() {
    let mut a = container("a", Some("0"));
    a["securityContext"] = json!({ "privileged": true });
    let mut b = container("b", Some("2"));
    b["securityContext"] = json!({ "privileged": true });
    let m = denied(&pod(vec![a, b], vec![], json!({ "tessera.dev/x": "y" }))).await;
    assert!(m.starts_with("Tessera refused this pod: "), "{m}");
    for part in [
        "\"tessera.dev/x\"",
        "container \"a\": tessera.dev/vgpu",
        "\"b\" is privileged",
    ] {
        assert!(m.contains(part), "missing {part}: {m}");
    }
}

#[tokio::test(start_paused = true)]
async fn other_operations_pass_untouched() {
    let s = server().await;
    let p = pod(vec![container("main", Some("2"))], vec![], json!({}));
    let mut review = review_of(&p);
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = p.clone();
    let body = serde_json::to_vec(&review).expect("json");
    let reply = common::request(s.addr, &s.ca_pem, "POST", "/mutate", body)
        .await
        .expect("request");
    let v: Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(v["response"]["allowed"], json!(true));
    assert!(v["response"].get("patch").is_none());
}

#[tokio::test(start_paused = true)]
async fn wrong_kind_is_refused_with_a_clear_message() {
    let s = server().await;
    let mut review =
        review_of(&json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {} }));
    review["request"]["kind"] = json!({ "group": "apps", "version": "v1", "kind": "Deployment" });
    let body = serde_json::to_vec(&review).expect("json");
    let reply = common::request(s.addr, &s.ca_pem, "POST", "/mutate", body)
        .await
        .expect("request");
    assert_eq!(reply.status, 200);
    let v: Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(v["response"]["allowed"], json!(false));
    let m = v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        m.contains("only handles v1 Pods, got apps/v1/Deployment"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_400_with_the_reason() {
    let s = server().await;
    let post = |body: &str| {
        common::request(
            s.addr,
            &s.ca_pem,
            "POST",
            "/mutate",
            body.as_bytes().to_vec(),
        )
    };
    let r = post("{not json").await.expect("request");
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("request body is not an AdmissionReview"));

    let r = post(
        r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":null}"#,
    )
    .await
    .expect("request");
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("expected apiVersion \"admission.k8s.io/v1\"")
    );

    let r = post(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#)
        .await
        .expect("request");
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("has no request"));

    let r = common::request(s.addr, &s.ca_pem, "GET", "/mutate", vec![])
        .await
        .expect("request");
    assert_eq!(r.status, 405);
    let r = common::request(s.addr, &s.ca_pem, "GET", "/healthz", vec![])
        .await
        .expect("request");
    assert_eq!((r.status, r.body.as_slice()), (200, b"ok\n".as_slice()));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_does_not_trust_our_ca_is_turned_away() {
    let s = server().await;
    let other = Authority::generate(Duration::from_secs(3600), time::OffsetDateTime::now_utc())
        .expect("ca");
    let err = common::request(
        s.addr,
        &other.material().cert_pem,
        "GET",
        "/healthz",
        vec![],
    )
    .await
    .unwrap_err();
    assert!(err.starts_with("TLS:"), "{err}");
}
