//! The device plugin serves the GPUs the scheduler extender chose at bind:
//! the real plugin reads the pods bound to its node from a fake API server
//! speaking the real JSON (over HTTP, through kube), the fake kubelet drives
//! GetPreferredAllocation and Allocate over real gRPC, and the real manager
//! makes the allocations. Two pods bound back to back each get their own
//! GPUs; an assignment the node cannot honour, or device IDs that are not
//! the assigned GPUs, get a clear error and nothing is served; a pod placed
//! without the extender gets what the kubelet chose, as before.

mod device_plugin_support;

use device_plugin_support::*;
use serde_json::{Value, json};
use tessera_device_plugin::allocate::NVIDIA_VISIBLE_DEVICES;
use tessera_dra_plugin::testing::FakeApiServer;
use tessera_manager::gpu::GpuEvent;
use tessera_node::scheduling::{Assignment, ContainerAssignment, FORMAT_VERSION, GpuTake};
use tessera_proto::deviceplugin::v1beta1 as dp;
use tonic::Code;

/// envvar: the response names its GPUs in NVIDIA_VISIBLE_DEVICES.
const CONFIG: &str = "default:\n  slice: {slicesPerGpu: 4}\n  deviceListStrategy: envvar\n";
const ASSIGNED: &str = "tessera.dev/gpu-assignment";
const ALLOCATED: &str = "tessera.dev/gpu-allocated";

fn assignment(node: &str, gpus: &[(&str, u32)]) -> String {
    Assignment {
        version: FORMAT_VERSION,
        node: node.into(),
        containers: vec![ContainerAssignment {
            name: "main".into(),
            gpus: gpus
                .iter()
                .map(|&(uuid, slices)| GpuTake {
                    uuid: uuid.into(),
                    slices,
                })
                .collect(),
        }],
    }
    .to_json()
}

/// A pod as the API server holds it once bound to node-1 at `bound_at`,
/// its container asking for `slices`, with `assignment` if any.
fn pod(name: &str, bound_at: &str, slices: u32, assignment: Option<String>) -> Value {
    let mut annotations = json!({"tessera.dev/compute-policy": "burst"});
    if let Some(a) = assignment {
        annotations[ASSIGNED] = json!(a);
    }
    let mut pod = bound_pod(
        name,
        annotations,
        json!({"limits": {"tessera.dev/vgpu": slices.to_string()},
               "requests": {"tessera.dev/vgpu": slices.to_string()}}),
        json!({"phase": "Pending", "qosClass": "Burstable",
               "conditions": [{"type": "PodScheduled", "status": "True",
                               "lastTransitionTime": bound_at}]}),
    );
    pod["spec"]["schedulerName"] = json!("tessera-scheduler");
    pod
}

/// A node with three empty 4-slice GPUs, its plugin on the fake API server.
async fn start(api: &FakeApiServer) -> Node {
    let mut node = Node::start_on_api(
        api,
        fake_gpus(&[
            ("GPU-a", 80 * GI, 0, 0),
            ("GPU-b", 80 * GI, 0, 0),
            ("GPU-c", 80 * GI, 0, 0),
        ]),
        CONFIG,
    )
    .await;
    node.wait_devices("12 healthy slices", |d| d.len() == 12 && healthy(d) == 12)
        .await;
    node
}

/// What the kubelet does to admit a container: ask which of `available`
/// to take, then allocate those.
async fn admit(
    node: &Node,
    available: &[String],
    size: i32,
) -> Result<(Vec<String>, dp::ContainerAllocateResponse), tonic::Status> {
    let mut c = node.client().await;
    let chosen = c
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
        .await?
        .into_inner()
        .container_responses
        .remove(0)
        .device_i_ds;
    let resp = allocate(node, &chosen).await?;
    Ok((chosen, resp))
}

async fn allocate(
    node: &Node,
    ids: &[String],
) -> Result<dp::ContainerAllocateResponse, tonic::Status> {
    let mut r = node
        .client()
        .await
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        })
        .await?
        .into_inner();
    Ok(r.container_responses.remove(0))
}

fn slices(gpu: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{gpu}::{i}")).collect()
}

fn without(all: &[String], taken: &[String]) -> Vec<String> {
    all.iter().filter(|i| !taken.contains(i)).cloned().collect()
}

fn allocated_mark(api: &FakeApiServer, name: &str) -> Value {
    api.get(&pod_path(name)).expect("pod")["metadata"]["annotations"][ALLOCATED].clone()
}

/// The GPUs of each allocation the manager holds, sorted.
fn allocated_gpus(node: &Node) -> Vec<Vec<String>> {
    let mut v: Vec<Vec<String>> = node
        .allocations()
        .iter()
        .map(|a| a.devices.iter().map(|d| d.gpu_uuid.clone()).collect())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn two_pods_bound_back_to_back_each_get_their_own_gpus() {
    let api = FakeApiServer::start().await.expect("api server");
    // Bound one second apart, onto B and C. Left to itself the plugin would
    // put both on A (the first GPU, and two slices there leave room for
    // another two).
    api.put(
        &pod_path("first"),
        pod(
            "first",
            "2026-12-02T03:00:01Z",
            2,
            Some(assignment("node-1", &[("GPU-b", 2)])),
        ),
    );
    api.put(
        &pod_path("second"),
        pod(
            "second",
            "2026-12-02T03:00:02Z",
            2,
            Some(assignment("node-1", &[("GPU-c", 2)])),
        ),
    );
    let node = start(&api).await;
    let everything = [slices("GPU-a", 4), slices("GPU-b", 4), slices("GPU-c", 4)].concat();

    let (ids, resp) = admit(&node, &everything, 2).await.expect("first pod");
    assert_eq!(ids, slices("GPU-b", 2));
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-b");
    assert_eq!(allocated_mark(&api, "first"), "main");
    assert_eq!(allocated_mark(&api, "second"), Value::Null);

    let (ids2, resp) = admit(&node, &without(&everything, &ids), 2)
        .await
        .expect("second pod");
    assert_eq!(ids2, slices("GPU-c", 2));
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-c");
    assert_eq!(allocated_mark(&api, "second"), "main");
    assert_eq!(allocated_gpus(&node), [["GPU-b"], ["GPU-c"]]);

    // Both served: a third pod, placed without the extender, gets what the
    // node's own policy picks and the kubelet sends, as before.
    api.put(
        &pod_path("plain"),
        pod("plain", "2026-12-02T03:00:03Z", 2, None),
    );
    let rest = without(&without(&everything, &ids), &ids2);
    let (ids3, resp) = admit(&node, &rest, 2).await.expect("plain pod");
    // defrag: the two slices left on B fill it exactly.
    assert_eq!(ids3, ["GPU-b::2", "GPU-b::3"]);
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-b");
    assert_eq!(allocated_mark(&api, "plain"), Value::Null);
    assert_eq!(allocated_gpus(&node).len(), 3);
    node.stop().await;
}

#[tokio::test]
async fn the_kubelets_ids_on_other_gpus_are_refused_and_nothing_is_served() {
    let api = FakeApiServer::start().await.expect("api server");
    api.put(
        &pod_path("p"),
        pod(
            "p",
            "2026-12-02T03:00:01Z",
            2,
            Some(assignment("node-1", &[("GPU-b", 2)])),
        ),
    );
    let node = start(&api).await;

    // The kubelet sends two slices of A (it did not take the preference):
    // the pod was assigned B.
    let e = allocate(&node, &slices("GPU-a", 2))
        .await
        .expect_err("not the assigned GPU");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "pod team-a/p container \"main\" was assigned GPU-b×2 by the scheduler extender, \
         but the kubelet allocated GPU-a::0,GPU-a::1"
    );
    assert!(node.allocations().is_empty(), "nothing served");
    assert_eq!(allocated_mark(&api, "p"), Value::Null, "pod not marked");

    // A request of another size is not that pod's: served as sent.
    let resp = allocate(&node, &slices("GPU-a", 1))
        .await
        .expect("one slice");
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-a");

    // The assigned slices: served, and the pod marked.
    let resp = allocate(&node, &slices("GPU-b", 2))
        .await
        .expect("assigned");
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-b");
    assert_eq!(allocated_mark(&api, "p"), "main");
    node.stop().await;
}

#[tokio::test]
async fn an_assignment_this_node_cannot_honour_is_a_clear_error() {
    let api = FakeApiServer::start().await.expect("api server");
    // A GPU this node does not have.
    api.put(
        &pod_path("ghost"),
        pod(
            "ghost",
            "2026-12-02T03:00:01Z",
            2,
            Some(assignment("node-1", &[("GPU-zz", 2)])),
        ),
    );
    let mut node = start(&api).await;
    let everything = [slices("GPU-a", 4), slices("GPU-b", 4), slices("GPU-c", 4)].concat();
    let e = admit(&node, &everything, 2).await.expect_err("unknown GPU");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "pod team-a/ghost was assigned GPU GPU-zz, which this node does not have"
    );
    assert!(node.allocations().is_empty());
    assert_eq!(allocated_mark(&api, "ghost"), Value::Null);

    // An unhealthy GPU: the kubelet no longer offers its slices, and what it
    // sends instead is refused, naming the GPU.
    api.remove(&pod_path("ghost"));
    api.put(
        &pod_path("sick"),
        pod(
            "sick",
            "2026-12-02T03:00:02Z",
            2,
            Some(assignment("node-1", &[("GPU-c", 2)])),
        ),
    );
    node.gpu.push_event(GpuEvent::Xid {
        uuid: "GPU-c".into(),
        xid: 48,
    });
    node.wait_devices("GPU-c unhealthy", |d| healthy(d) == 8)
        .await;
    let healthy_now = [slices("GPU-a", 4), slices("GPU-b", 4)].concat();
    let e = admit(&node, &healthy_now, 2)
        .await
        .expect_err("unhealthy GPU");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "pod team-a/sick was assigned GPU GPU-c, which is unhealthy"
    );
    assert!(node.allocations().is_empty());

    // Assignments that are not this node's or do not fit their pod are
    // ignored (logged): those pods get what the kubelet sends.
    api.remove(&pod_path("sick"));
    api.put(
        &pod_path("elsewhere"),
        pod(
            "elsewhere",
            "2026-12-02T03:00:03Z",
            2,
            Some(assignment("node-9", &[("GPU-b", 2)])),
        ),
    );
    api.put(
        &pod_path("garbled"),
        pod(
            "garbled",
            "2026-12-02T03:00:04Z",
            2,
            Some("{\"version\":1".into()),
        ),
    );
    api.put(
        &pod_path("oversized"),
        pod(
            "oversized",
            "2026-12-02T03:00:05Z",
            1,
            Some(assignment("node-1", &[("GPU-b", 2)])),
        ),
    );
    let (ids, resp) = admit(&node, &healthy_now, 2).await.expect("served as sent");
    assert_eq!(ids, slices("GPU-a", 2));
    assert_eq!(resp.envs[NVIDIA_VISIBLE_DEVICES], "GPU-a");
    for p in ["elsewhere", "garbled", "oversized"] {
        assert_eq!(allocated_mark(&api, p), Value::Null, "{p}");
    }
    node.stop().await;
}
