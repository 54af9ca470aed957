//! The extender's watched view, on paused time against the fake API server
//! (`support`): a pod with a ResourceClaim placed on the node whose GPU has
//! room from watch events alone, an event changing the next decision, a bind
//! that never decides on a view older than what the extender has seen, a
//! watch that expires relisted without losing a change, and decisions that
//! answer before the first list instead of waiting for it. Every wait is on
//! an event or a counter; time only moves when every task waits on a timer.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{
    FakeApi, HANG, Options, Res, allocated, args_by_name, bind_args, claim, dra_pod, gpu, node,
    now, pod, report, resource_slice, scores, shared_device, slice_cluster, slice_devices, start,
};
use tessera_extender::cache::Kind;
use tessera_node::scheduling::Assignment;
use tessera_placement::Policy;

/// The device a `shared` GPU is published as.
fn device(uuid: &str) -> String {
    format!("gpu-{}", uuid.to_lowercase())
}

/// DRA nodes (no device-plugin report): `a` and `b` publish one 16Gi GPU
/// each in the `shared` layout, `c` one GPU cut into four 4Gi/25% slices.
fn dra_cluster() -> std::sync::Arc<FakeApi> {
    let api = FakeApi::new();
    for n in ["a", "b", "c"] {
        api.put(Res::Nodes, node(n, None));
    }
    api.put(
        Res::Slices,
        resource_slice("a", 1, vec![shared_device("GPU-a1", "16Gi")]),
    );
    api.put(
        Res::Slices,
        resource_slice("b", 1, vec![shared_device("GPU-b1", "16Gi")]),
    );
    api.put(
        Res::Slices,
        resource_slice("c", 1, slice_devices("GPU-c1", 4, "4Gi", "25")),
    );
    api
}

/// Node `a`'s GPU mostly taken: 12Gi and 80% by another pod's claim.
fn held_on_a() -> Value {
    allocated(
        claim("held", "12Gi", "80"),
        "a",
        &device("GPU-a1"),
        "share-1",
    )
}

fn nodenames(r: &Value) -> Vec<String> {
    serde_json::from_value(r["nodenames"].clone()).unwrap_or_else(|_| panic!("nodenames: {r}"))
}

#[tokio::test(start_paused = true)]
async fn a_pod_with_a_claim_goes_to_the_node_whose_gpu_has_room_from_watch_events_alone() {
    let h = start(
        dra_cluster(),
        Options {
            policy: Policy::Binpack,
            ..Options::default()
        },
    )
    .await;
    // Start-up listed each kind once; from here on the view is fed by watch
    // events only.
    let listed = h.api.lists();
    assert_eq!(listed, 4, "{:?}", h.api.requests());

    h.api.put(Res::Claims, held_on_a());
    h.api.put(Res::Claims, claim("train", "5Gi", "30"));
    h.add_pod(dra_pod("p", "train"));
    h.ext
        .cache()
        .reach(Kind::ResourceClaims, h.api.last(Res::Claims), HANG)
        .await
        .expect("the claims' events are applied");

    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("p"), &["a", "b", "c"]))
        .await;
    assert_eq!(nodenames(&r), ["b"], "{r}");
    let failed = &r["failedNodes"];
    // a: 4Gi and 20% left; c: slices of 4Gi cannot serve 5Gi.
    assert!(
        failed["a"]
            .as_str()
            .unwrap()
            .contains("memory 5Gi, compute 30%"),
        "{r}"
    );
    assert!(
        failed["c"].as_str().unwrap().contains("team-a/train"),
        "{r}"
    );

    let (code, r) = h
        .post("prioritize", &args_by_name(&h.pod("p"), &["a", "b", "c"]))
        .await;
    assert_eq!(code, 200, "{r}");
    let s = scores(&r);
    assert_eq!((s["a"], s["b"], s["c"]), (0, 10, 0), "{r}");

    // The scheduler's allocator chose b's GPU; the extender binds the pod
    // there and writes no assignment (the claim is the pod's assignment).
    let (_, r) = h.post("bind", &bind_args("p", "uid-p", "b")).await;
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(h.api.writes(), ["bind team-a/p b"]);

    // A smaller claim fits both shared GPUs and one of c's slices: by
    // binpack, the GPU it fills up ranks first.
    h.api.put(Res::Claims, claim("small", "2Gi", "10"));
    h.add_pod(dra_pod("q", "small"));
    h.settled().await;
    let (_, r) = h
        .post("prioritize", &args_by_name(&h.pod("q"), &["a", "b", "c"]))
        .await;
    let s = scores(&r);
    assert_eq!(s["a"], 10, "{r}");
    assert!(s["b"] > 0 && s["c"] > 0, "{r}");

    assert_eq!(h.api.lists(), listed, "no list after start-up");
    for kind in ["nodes", "pods", "resourceslices", "resourceclaims"] {
        let prefix = format!("watch {kind} ");
        assert!(
            h.api.requests().iter().any(|r| r.starts_with(&prefix)),
            "{kind} watched: {:?}",
            h.api.requests()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_allocated_elsewhere_or_unreadable_gets_a_clear_answer() {
    let h = start(dra_cluster(), Options::default()).await;
    // A claim already allocated on a (shared with another pod): only a.
    h.api.put(Res::Claims, held_on_a());
    h.add_pod(dra_pod("shares", "held"));
    let mut all = claim("all", "1Gi", "1");
    all["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = json!("All");
    h.api.put(Res::Claims, all);
    h.add_pod(dra_pod("every", "all"));
    h.add_pod(dra_pod("early", "not-yet"));
    h.settled().await;

    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("shares"), &["a", "b"]))
        .await;
    assert_eq!(nodenames(&r), ["a"], "{r}");
    assert!(
        r["failedNodes"]["b"]
            .as_str()
            .unwrap()
            .contains("allocated claims are on a"),
        "{r}"
    );
    let (_, r) = h
        .post("bind", &bind_args("shares", "uid-shares", "b"))
        .await;
    assert!(
        r["error"].as_str().unwrap().contains("allocated on a"),
        "{r}"
    );
    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("every"), &["a", "b"]))
        .await;
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("allocationMode \"All\""),
        "{r}"
    );
    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("early"), &["a", "b"]))
        .await;
    assert!(
        r["error"].as_str().unwrap().contains("team-a/not-yet"),
        "{r}"
    );
    assert_eq!(h.api.writes(), Vec::<String>::new(), "nothing was written");
    // Bound where its claim is.
    let (_, r) = h
        .post("bind", &bind_args("shares", "uid-shares", "a"))
        .await;
    assert!(r.get("error").is_none(), "{r}");
}

#[tokio::test(start_paused = true)]
async fn an_event_arriving_changes_the_next_decision() {
    let h = start(dra_cluster(), Options::default()).await;
    h.api.put(Res::Claims, held_on_a());
    h.api.put(Res::Claims, claim("train", "5Gi", "30"));
    h.add_pod(dra_pod("p", "train"));
    h.settled().await;
    let filter = |names: &'static [&'static str]| {
        let h = &h;
        async move {
            let (_, r) = h.post("filter", &args_by_name(&h.pod("p"), names)).await;
            nodenames(&r)
        }
    };
    assert_eq!(filter(&["a", "b", "c"]).await, ["b"]);

    // The other pod's claim is deleted: a has room again.
    h.api.delete(Res::Claims, "team-a", "held");
    h.settled().await;
    assert_eq!(filter(&["a", "b", "c"]).await, ["a", "b"]);

    // c's plugin switches it to the shared layout (a new pool generation).
    h.api.put(
        Res::Slices,
        resource_slice("c", 2, vec![shared_device("GPU-c1", "16Gi")]),
    );
    h.settled().await;
    assert_eq!(filter(&["a", "b", "c"]).await, ["a", "b", "c"]);

    // A new node publishes its GPUs: known from then on.
    assert_eq!(filter(&["d"]).await, Vec::<String>::new());
    h.api.put(Res::Nodes, node("d", None));
    h.api.put(
        Res::Slices,
        resource_slice("d", 1, vec![shared_device("GPU-d1", "16Gi")]),
    );
    h.settled().await;
    assert_eq!(filter(&["d"]).await, ["d"]);
}

#[tokio::test(start_paused = true)]
async fn a_node_report_changing_or_aging_changes_the_next_decision() {
    let h = start(slice_cluster(), Options::default()).await;
    h.add_pod(pod("p3", Some("3")));
    h.settled().await;
    let filter = || async {
        let (_, r) = h
            .post(
                "filter",
                &args_by_name(&h.pod("p3"), &["two-by-two", "empty"]),
            )
            .await;
        r
    };
    assert_eq!(nodenames(&filter().await), ["empty"]);

    // two-by-two's device plugin reports its GPUs freed.
    h.api.put(
        Res::Nodes,
        node(
            "two-by-two",
            report(now(), vec![gpu("GPU-a", 4, 0), gpu("GPU-b", 4, 0)]),
        ),
    );
    h.settled().await;
    assert_eq!(nodenames(&filter().await), ["two-by-two", "empty"]);

    // Neither reports again within the deadline (120 s on the extender's
    // clock, which is tokio's): both are unknown, not empty. The reports
    // carry the wall clock, which runs on (a few seconds under load) while
    // tokio's is paused: the clock is advanced well past the deadline, and
    // short of the watches' 290 s.
    tokio::time::advance(Duration::from_secs(200)).await;
    let r = filter().await;
    assert_eq!(nodenames(&r), Vec::<String>::new(), "{r}");
    assert!(
        r["failedNodes"]["empty"]
            .as_str()
            .unwrap()
            .contains("unknown, not empty"),
        "{r}"
    );
}

fn assigned_gpu(p: &Value) -> String {
    let a = Assignment::parse(
        p["metadata"]["annotations"]["tessera.dev/gpu-assignment"]
            .as_str()
            .unwrap_or_else(|| panic!("an assignment: {p}")),
    )
    .unwrap();
    a.container("main").unwrap().gpus[0].uuid.clone()
}

#[tokio::test(start_paused = true)]
async fn a_bind_never_decides_on_a_view_older_than_what_it_has_seen() {
    let h = start(slice_cluster(), Options::default()).await;
    for name in ["p1", "p2", "p3"] {
        h.add_pod(pod(name, Some("2")));
    }
    h.settled().await;

    // The pods' events stop reaching the extender (a slow watch). p1 is
    // bound: the extender has seen its own patch of p1, its view has not.
    h.api.hold(Res::Pods, true);
    let (_, r) = h
        .post("bind", &bind_args("p1", "uid-p1", "two-by-two"))
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let first = assigned_gpu(&h.pod("p1"));
    let behind = h.ext.cache().progress(Kind::Pods);
    assert!(behind.applied < behind.seen, "{behind:?}");

    // p2 to the same node: the view lacks p1's slices, so no decision is
    // made on it; refused once the wait runs out, nothing written.
    let writes = h.api.writes();
    let (_, r) = h
        .post("bind", &bind_args("p2", "uid-p2", "two-by-two"))
        .await;
    let e = r["error"]
        .as_str()
        .unwrap_or_else(|| panic!("refused: {r}"));
    assert!(e.contains("view of pods is behind"), "{e}");
    assert_eq!(h.api.writes(), writes, "a refused bind writes nothing");

    // Again; this time the events come while the bind waits for them.
    let bind = tokio::spawn({
        let body = bind_args("p2", "uid-p2", "two-by-two");
        let ext = h.ext.clone();
        async move { ext.bind(&body).await }
    });
    tokio::time::timeout(HANG, async {
        while h.ext.cache().waiting(Kind::Pods) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the bind waits for the view");
    h.api.hold(Res::Pods, false);
    bind.await.unwrap().expect("bound once the view caught up");
    let second = assigned_gpu(&h.pod("p2"));
    let mut both = [first, second];
    both.sort();
    assert_eq!(both, ["GPU-a", "GPU-b"], "each its own GPU");

    // Both GPUs are full now.
    let (_, r) = h
        .post("bind", &bind_args("p3", "uid-p3", "two-by-two"))
        .await;
    assert!(r["error"].as_str().unwrap().contains("cannot hold"), "{r}");
}

#[tokio::test(start_paused = true)]
async fn an_expired_watch_is_relisted_and_the_view_misses_nothing() {
    let h = start(dra_cluster(), Options::default()).await;
    h.api.put(Res::Claims, held_on_a());
    h.api.put(Res::Claims, claim("train", "5Gi", "30"));
    h.add_pod(dra_pod("p", "train"));
    h.settled().await;
    let lists = h.api.lists();

    // While every watch is down, the other pod's claim goes, and the API
    // server compacts its history past the watches' last versions: resuming
    // them is answered 410 Expired, and the extender lists again.
    for res in Res::ALL {
        h.api.hold(res, true);
    }
    h.api.delete(Res::Claims, "team-a", "held").unwrap();
    h.api.compact_and_drop_watches();
    for res in Res::ALL {
        h.api.hold(res, false);
    }
    for res in Res::ALL {
        h.ext
            .cache()
            .lists(res.kind(), 2, HANG)
            .await
            .expect("listed again");
    }
    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("p"), &["a", "b", "c"]))
        .await;
    assert_eq!(nodenames(&r), ["a", "b"], "{r}");
    assert_eq!(
        h.api.lists(),
        lists + 4,
        "one list per kind: {:?}",
        h.api.requests()
    );
}

#[tokio::test(start_paused = true)]
async fn decisions_answer_before_the_first_list_instead_of_waiting_for_it() {
    let api = slice_cluster();
    api.refuse_lists(true);
    let h = start(
        api,
        Options {
            synced: false,
            ..Options::default()
        },
    )
    .await;
    h.add_pod(pod("p2", Some("2")));
    let body = args_by_name(&h.pod("p2"), &["empty"]);
    let (_, r) = h.post("filter", &body).await;
    assert!(
        r["error"].as_str().unwrap().contains("has not listed"),
        "{r}"
    );
    let (code, r) = h.post("prioritize", &body).await;
    assert_eq!(code, 422, "{r}");

    api_lists_again(&h).await;
    let (_, r) = h.post("filter", &body).await;
    assert_eq!(nodenames(&r), ["empty"], "{r}");
}

async fn api_lists_again(h: &support::Harness) {
    h.api.refuse_lists(false);
    h.ext.synced(HANG).await.expect("listed once lists work");
    assert!(h.api.lists() > 4, "retried: {:?}", h.api.requests());
}

#[tokio::test(start_paused = true)]
async fn with_dra_off_only_nodes_and_pods_are_watched() {
    let h = start(
        dra_cluster(),
        Options {
            dra: false,
            policy: Policy::Binpack,
            ..Options::default()
        },
    )
    .await;
    h.api.put(Res::Claims, claim("train", "5Gi", "30"));
    h.add_pod(dra_pod("p", "train"));
    h.settled().await;
    // The claim is not the extender's to judge: the pod passes through.
    let (_, r) = h
        .post("filter", &args_by_name(&h.pod("p"), &["a", "b", "c"]))
        .await;
    assert_eq!(nodenames(&r), ["a", "b", "c"], "{r}");
    let watched: Vec<String> = h
        .api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("list ") || r.starts_with("watch "))
        .collect();
    assert!(
        watched
            .iter()
            .all(|r| r.contains(" nodes") || r.contains(" pods")),
        "{watched:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_vgpu_pod_on_nodes_only_dra_serves_is_judged_by_their_slices() {
    // kubeletPlugin=dra: the driver's DeviceClass names tessera.dev/vgpu
    // (DRAExtendedResource) and the scheduler allocates a container's count
    // as that many devices of it, on nodes without a device plugin's report.
    let api = dra_cluster();
    api.put(
        Res::Nodes,
        node("dp", report(now(), vec![gpu("GPU-dp", 4, 4)])),
    );
    let h = start(api, Options::default()).await;
    h.api.put(Res::Claims, held_on_a());
    h.add_pod(pod("v", Some("2")));
    h.settled().await;
    let names = ["a", "b", "c", "dp"];
    // Two devices: two default shares (1Gi, 25% each) on a shared GPU, or
    // two slices of c. a has 20% left; dp's device plugin reports it full.
    let (_, r) = h.post("filter", &args_by_name(&h.pod("v"), &names)).await;
    assert_eq!(nodenames(&r), ["b", "c"], "{r}");
    assert!(
        r["failedNodes"]["a"]
            .as_str()
            .unwrap()
            .contains("2 devices"),
        "{r}"
    );
    assert!(
        r["failedNodes"]["dp"]
            .as_str()
            .unwrap()
            .contains("2 more slices"),
        "{r}"
    );
    let (_, r) = h
        .post("prioritize", &args_by_name(&h.pod("v"), &names))
        .await;
    let s = scores(&r);
    assert!(s["b"] > 0 && s["c"] > 0, "{r}");
    assert_eq!((s["a"], s["dp"]), (0, 0), "{r}");
    // The allocator's claim is the pod's assignment: bind only binds.
    let (_, r) = h.post("bind", &bind_args("v", "uid-v", "c")).await;
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(h.api.writes(), ["bind team-a/v c"]);
}
