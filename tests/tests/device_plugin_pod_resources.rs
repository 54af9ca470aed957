//! Which pod is which: the plugin reads a fake kubelet PodResources server
//! over a real unix socket, records owners in the real manager and deletes
//! allocations whose pods are gone, never touching allocations made
//! outside Kubernetes.

mod device_plugin_support;

use std::time::{Duration, Instant};

use device_plugin_support::*;
use tessera_device_plugin::passes::Pass;
use tessera_device_plugin::testing::{FakePodResources, FakePods};
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::manager::v1 as mgr;
use tessera_proto::manager::v1::manager_client::ManagerClient;

const RES: &str = "tessera.dev/vgpu";

async fn allocate(node: &Node, ids: &[&str]) -> String {
    let resp = node
        .client()
        .await
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: strings(ids),
            }],
        })
        .await
        .expect("allocate")
        .into_inner();
    resp.container_responses[0].envs["TESSERA_ALLOCATION"].clone()
}

fn find(node: &Node, id: &str) -> Option<mgr::Allocation> {
    node.allocations().into_iter().find(|a| a.id == id)
}

/// A node with one 80 GiB GPU in 8 slices whose plugin reads PodResources
/// every 50 ms and deletes an orphan after `grace`.
async fn start_with_pod_resources(grace: Duration) -> Node {
    Node::start_with(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0)]),
        "default:\n  slice: {slicesPerGpu: 8}\n",
        |o| {
            o.pod_resources_socket = Some(o.manager_socket.with_file_name("pod-resources.sock"));
            o.pod_resources_interval = Duration::from_millis(50);
            o.orphan_grace = grace;
        },
    )
    .await
}

async fn wait_for(what: &str, f: impl FnMut() -> bool) {
    wait_within(what, WAIT, f).await;
}

/// [`wait_for`] with a hang guard of `limit`.
async fn wait_within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn owners_are_recorded_and_allocations_of_gone_pods_deleted() {
    let mut node = start_with_pod_resources(Duration::from_millis(600)).await;
    node.wait_devices("8 slices", |d| d.len() == 8).await;
    let a = allocate(&node, &["GPU-a::0", "GPU-a::1"]).await;
    let b = allocate(&node, &["GPU-a::2"]).await;
    // An allocation made by the CLI, outside Kubernetes.
    let mut m = ManagerClient::new(
        tessera_device_plugin::grpc::unix_channel(&node.opts.manager_socket)
            .await
            .expect("dial manager"),
    );
    m.create_allocation(mgr::CreateAllocationRequest {
        id: "cli-job".into(),
        devices: vec![mgr::DeviceRequest {
            gpu_uuid: "GPU-a".into(),
            memory_limit_bytes: GI,
            compute_share_ppm: 100_000,
            slices: 0,
        }],
        labels: [("source".to_owned(), "cli".to_owned())].into(),
        ..Default::default()
    })
    .await
    .expect("cli allocation");

    // No PodResources server yet: listing fails, so nothing may be deleted.
    // A whole pass over the real socket fails and deletes nothing; that
    // a failed listing deletes nothing however long it lasts is shown on
    // the plugin's own paused clock (device-plugin/src/plugin.rs,
    // `orphans_are_deleted_after_the_grace_and_never_on_a_failed_listing`).
    node.pass(Pass::PodResources).await;
    assert_eq!(
        node.allocations().len(),
        3,
        "nothing deleted while the kubelet is unreachable"
    );

    let pods = FakePodResources::start(&node.path("pod-resources.sock")).expect("pod resources");
    pods.set_pods(&[
        (
            "team-a",
            "trainer",
            "main",
            RES,
            strings(&["GPU-a::1", "GPU-a::0"]),
        ),
        (
            "team-b",
            "other",
            "main",
            "nvidia.com/gpu",
            strings(&["GPU-a::2"]),
        ),
    ]);
    wait_for("owner of a recorded", || {
        find(&node, &a).is_some_and(|x| x.pod == "trainer")
    })
    .await;
    let x = find(&node, &a).expect("a");
    assert_eq!(
        (x.namespace.as_str(), x.container.as_str()),
        ("team-a", "main")
    );
    // b's slice is listed for another resource only: its pod is gone.
    wait_for("b deleted", || find(&node, &b).is_none()).await;
    assert!(find(&node, &a).is_some(), "a's pod is alive");
    assert!(
        find(&node, "cli-job").is_some(),
        "the CLI's allocation is not ours to delete"
    );

    // The trainer pod ends: its allocation goes too, after the grace period.
    let gone_at = Instant::now();
    pods.set_pods(&[]);
    wait_for("a deleted", || find(&node, &a).is_none()).await;
    assert!(
        gone_at.elapsed() >= Duration::from_millis(600),
        "deleted before the grace period"
    );
    assert!(find(&node, "cli-job").is_some());
    node.stop().await;
}

/// The plugin restarted mid-way (its pod replaced) while one allocation has
/// its pod and another's pod is gone: the kept one keeps its owner, the
/// orphan is deleted no sooner than a whole grace after the restart (the
/// new plugin's clock starts over: a restart never shortens it), and the
/// new plugin serves and records a new pod's allocation.
#[tokio::test]
async fn a_restart_mid_way_keeps_owners_and_never_shortens_the_grace() {
    // Far longer than the steps from b's allocation to the plugin's stop
    // take (about a second and a half, the stop about one of them; the old
    // plugin's PodResources pass goes on until then), so a slow machine
    // does not see b deleted before the restart. The deletion after the
    // restart is then waited for with a grace on top of the hang guard.
    let grace = Duration::from_secs(12);
    let mut node = start_with_pod_resources(grace).await;
    let pods = FakePodResources::start(&node.path("pod-resources.sock")).expect("pod resources");
    pods.set_pods(&[("team-a", "trainer", "main", RES, strings(&["GPU-a::0"]))]);
    node.wait_devices("8 slices", |d| d.len() == 8).await;
    let a = allocate(&node, &["GPU-a::0"]).await;
    let b = allocate(&node, &["GPU-a::1"]).await;
    wait_for("owner of a recorded", || {
        find(&node, &a).is_some_and(|x| x.pod == "trainer")
    })
    .await;
    // b's pod is gone: its clock runs. The plugin goes before it ends.
    node.pass(Pass::PodResources).await;
    node.stop_plugin().await;
    assert!(find(&node, &b).is_some(), "b kept while its grace runs");

    let restarted = Instant::now();
    node.start_plugin();
    assert!(
        node.kubelet.wait_registrations(2, WAIT).await.is_some(),
        "the new plugin registers"
    );
    node.wait_devices("8 slices again", |d| d.len() == 8).await;
    // A new pod, served by the new plugin, listed as the kubelet lists it.
    pods.set_pods(&[
        ("team-a", "trainer", "main", RES, strings(&["GPU-a::0"])),
        ("team-c", "server", "main", RES, strings(&["GPU-a::2"])),
    ]);
    let c = allocate(&node, &["GPU-a::2"]).await;
    wait_for("owner of c recorded", || {
        find(&node, &c).is_some_and(|x| x.pod == "server")
    })
    .await;
    wait_within("b deleted", grace + WAIT, || find(&node, &b).is_none()).await;
    assert!(
        restarted.elapsed() >= grace,
        "b deleted {:?} after the restart, before a whole grace",
        restarted.elapsed()
    );
    let x = find(&node, &a).expect("a kept across the restart");
    assert_eq!(
        (x.namespace.as_str(), x.pod.as_str()),
        ("team-a", "trainer")
    );
    assert!(find(&node, &c).is_some());
    node.stop().await;
}

/// A node whose plugin reads pods' annotations from `pods` (in place of the
/// Kubernetes API) and polls PodResources often.
async fn node_with_pods(node_policy: &str, pods: &FakePods) -> Node {
    Node::start_with_pods(
        fake_gpus(&[("GPU-a", 80 * GI, 0, 0)]),
        &format!("default:\n  computePolicy: {node_policy}\n  slice: {{slicesPerGpu: 8}}\n"),
        Some(pods.clone()),
        |o| {
            o.pod_resources_socket = Some(o.manager_socket.with_file_name("pod-resources.sock"));
            o.pod_resources_interval = Duration::from_millis(50);
            o.orphan_grace = Duration::from_secs(60);
        },
    )
    .await
}

#[tokio::test]
async fn an_annotated_pod_makes_its_allocation_stricter() {
    let annotations = FakePods::default();
    let mut node = node_with_pods("burst", &annotations).await;
    node.wait_devices("8 slices", |d| d.len() == 8).await;
    let a = allocate(&node, &["GPU-a::0"]).await;
    let plain = allocate(&node, &["GPU-a::1"]).await;
    assert_eq!(
        find(&node, &a).expect("a").policy,
        mgr::ComputePolicy::Burst as i32
    );
    let pods = FakePodResources::start(&node.path("pod-resources.sock")).expect("pod resources");
    pods.set_pods(&[
        ("team-a", "strict", "main", RES, strings(&["GPU-a::0"])),
        ("team-a", "plain", "main", RES, strings(&["GPU-a::1"])),
    ]);
    // The Kubernetes API does not know the pods yet: owners are recorded
    // all the same, under the node's policy.
    wait_for("owners recorded before the pods can be read", || {
        find(&node, &a).is_some_and(|x| x.pod == "strict")
            && find(&node, &plain).is_some_and(|x| x.pod == "plain")
    })
    .await;
    assert_eq!(
        find(&node, &a).expect("a").policy,
        mgr::ComputePolicy::Burst as i32
    );
    // Once they can be read, the annotated one turns guaranteed.
    annotations.set(
        "team-a",
        "strict",
        &[("tessera.dev/compute-policy", "guaranteed")],
    );
    annotations.set("team-a", "plain", &[("other", "x")]);
    wait_for("a guaranteed", || {
        find(&node, &a).is_some_and(|x| x.policy == mgr::ComputePolicy::Guaranteed as i32)
    })
    .await;
    // A whole pass later: the unannotated pod keeps the node's policy.
    node.pass(Pass::PodResources).await;
    let p = find(&node, &plain).expect("plain");
    assert_eq!(p.policy, mgr::ComputePolicy::Burst as i32);
    assert_eq!(p.pod, "plain");
    node.stop().await;
}

#[tokio::test]
async fn a_looser_pod_policy_is_refused_and_the_owner_still_recorded() {
    let annotations = FakePods::default();
    annotations.set(
        "team-a",
        "loose",
        &[("tessera.dev/compute-policy", "burst")],
    );
    let mut node = node_with_pods("guaranteed", &annotations).await;
    node.wait_devices("8 slices", |d| d.len() == 8).await;
    let a = allocate(&node, &["GPU-a::0"]).await;
    let pods = FakePodResources::start(&node.path("pod-resources.sock")).expect("pod resources");
    pods.set_pods(&[("team-a", "loose", "main", RES, strings(&["GPU-a::0"]))]);
    wait_for("owner recorded", || {
        find(&node, &a).is_some_and(|x| x.pod == "loose")
    })
    .await;
    node.pass(Pass::PodResources).await;
    assert_eq!(
        find(&node, &a).expect("a").policy,
        mgr::ComputePolicy::Guaranteed as i32,
        "burst is looser than the node's guaranteed: not applied"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_priority_annotation_is_applied_and_reapplied_when_it_changes() {
    let annotations = FakePods::default();
    annotations.set("team-a", "urgent", &[("tessera.dev/priority", "10")]);
    annotations.set("team-a", "typo", &[("tessera.dev/priority", "high")]);
    let mut node = node_with_pods("burst", &annotations).await;
    node.wait_devices("8 slices", |d| d.len() == 8).await;
    let a = allocate(&node, &["GPU-a::0"]).await;
    let typo = allocate(&node, &["GPU-a::1"]).await;
    let pods = FakePodResources::start(&node.path("pod-resources.sock")).expect("pod resources");
    pods.set_pods(&[
        ("team-a", "urgent", "main", RES, strings(&["GPU-a::0"])),
        ("team-a", "typo", "main", RES, strings(&["GPU-a::1"])),
    ]);
    wait_for("a at priority 10", || {
        find(&node, &a).is_some_and(|x| x.priority == 10)
    })
    .await;
    // Whole passes later: the bad value was never applied, and a's slices
    // are as Allocate made them (the number of calls, one per change, is
    // `pod_resources.rs`'s unit tests' to count, against a recording
    // manager).
    node.pass(Pass::PodResources).await;
    node.pass(Pass::PodResources).await;
    let x = find(&node, &a).expect("a");
    assert_eq!(x.priority, 10);
    assert_eq!(
        (
            x.devices.len(),
            x.devices[0].slices,
            x.devices[0].memory_limit_bytes
        ),
        (1, 1, 10 * GI),
        "a pod's slices are not resized"
    );
    assert_eq!(find(&node, &typo).expect("typo").priority, 0);
    assert_eq!(find(&node, &typo).expect("typo").pod, "typo");
    // The user changes the annotation: the next pass applies it.
    annotations.set("team-a", "urgent", &[("tessera.dev/priority", "-20")]);
    wait_for("a at priority -20", || {
        find(&node, &a).is_some_and(|x| x.priority == -20)
    })
    .await;
    node.pass(Pass::PodResources).await;
    assert_eq!(find(&node, &a).expect("a").priority, -20);
    assert_eq!(find(&node, &typo).expect("typo").priority, 0);
    node.stop().await;
}
