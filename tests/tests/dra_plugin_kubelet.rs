//! The DRA plugin between a fake kubelet and a fake API server, on a
//! simulated node with the real manager: registration through the plugin
//! watcher's socket, claims read over HTTP through a kubeconfig, two claims
//! on one GPU and one on another prepared, a process started with each
//! claim's CDI edits applied sees exactly its memory and is refused past it;
//! a SIGKILL of the plugin changes nothing; unprepare removes everything; a
//! bad claim gets its own error and leaves nothing.

// The manager and the client roles; this file defines its own `role` test.
mod dra_support;
#[allow(unused_macros, unused_imports)]
mod manager_support;

use std::path::Path;
use std::time::Duration;

use dra_support::{NODE, Plugin, plugin_args, probe_with_claim};
use manager_support::*;
use prost::Message;
use serde_json::{Value, json};
use tessera_dra_plugin::names::{gpu_device, slice_device};
use tessera_dra_plugin::testing::{FakeApiServer, register};
use tessera_dra_plugin::{DRIVER_NAME, cdi};
use tessera_e2e::{ProbeChild, SimNode};
use tessera_proto::dra::v1 as dra;
use tessera_proto::dra::v1beta1 as dra_beta;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(15);

dra_role_test!();

fn claim(name: &str, uid: &str, results: Vec<Value>, config: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    })
}

fn result(device: &str, consumed: Option<Value>) -> Value {
    let mut r = json!({"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": device});
    if let Some(c) = consumed {
        r["consumedCapacity"] = c;
    }
    r
}

fn req(name: &str, uid: &str) -> dra::Claim {
    dra::Claim {
        namespace: "team".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// A prepare request for the claims named `(name, uid)`.
fn prepare_request<'a>(
    claims: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> dra::NodePrepareResourcesRequest {
    dra::NodePrepareResourcesRequest {
        claims: claims
            .into_iter()
            .map(|(name, uid)| req(name, uid))
            .collect(),
    }
}

/// Sends `request` to the plugin over its v1beta1 service (the same messages on the wire).
async fn prepare_v1beta1(
    plugin_dir: &Path,
    request: &dra::NodePrepareResourcesRequest,
) -> dra_beta::NodePrepareResourcesResponse {
    let channel = tessera_proto::unix::channel(&plugin_dir.join("dra.sock"))
        .await
        .expect("dial");
    let mut beta = dra_beta::dra_plugin_client::DraPluginClient::new(channel);
    let beta_req =
        dra_beta::NodePrepareResourcesRequest::decode(request.encode_to_vec().as_slice()).unwrap();
    beta.node_prepare_resources(beta_req)
        .await
        .expect("v1beta1 prepare")
        .into_inner()
}

/// The plugin's checkpoint as JSON.
fn checkpoint(plugin_dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(plugin_dir.join("checkpoint.json")).unwrap())
        .unwrap()
}

/// `f` on a thread of its own: the manager helpers run a runtime of their
/// own, which cannot start on one of the test's runtime threads.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("helper thread"))
}

fn allocation_ids(socket: &Path) -> Vec<String> {
    let mut ids: Vec<String> = off_runtime(|| node_status(socket))
        .allocations
        .into_iter()
        .filter_map(|a| a.allocation.map(|a| a.id))
        .collect();
    ids.sort();
    ids
}

fn specs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The probe sees `limit` as its total, gets all of it and not a byte more.
fn holds_exactly(p: &mut ProbeChild, limit: u64) {
    for cmd in ["init", "ctx"] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    assert_eq!(p.cmd("meminfo", T).u64("total"), limit);
    let all = p.cmd(&format!("alloc {limit}"), T);
    assert!(all.ok, "the whole claim is usable: {}", all.raw);
    let one = p.cmd("alloc 1", T);
    assert_eq!(
        one.error.as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        one.raw
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_prepared_on_a_simulated_node_hold_their_memory_across_a_plugin_kill() {
    let n = SimNode::e2e(2, 0xd4a);
    let m = ManagerProc::on(&n);
    let st = off_runtime(|| node_status(&m.socket));
    let (u0, u1) = (st.gpus[0].uuid.clone(), st.gpus[1].uuid.clone());
    let api = FakeApiServer::start().await.expect("API server");
    let dir = n.dir.path();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let (registry, plugin_dir, cdi_dir) =
        (dir.join("registry"), dir.join("plugin"), dir.join("cdi"));
    let config = dir.join("config.yaml");
    // 4 slices per 16 GiB GPU: 4 GiB and 25 % each.
    std::fs::write(&config, "default:\n  slice: {slicesPerGpu: 4}\n").expect("config");
    let s = |p: &Path| p.display().to_string();
    let args = plugin_args(dir, &m.socket);
    let mut plugin = Plugin::start(&args, &dir.join("plugin.log"));

    let (info, mut kubelet) = match register(&registry, DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(info.endpoint, s(&plugin_dir.join("dra.sock")));
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    // Two claims on GPU 0 (two slices; 3 GiB and 20 % of the shared GPU),
    // one slice on GPU 1.
    let claims = [
        (
            "two-slices",
            "0a000000-0000-4000-8000-00000000000a",
            vec![
                result(&slice_device(&u0, 0), None),
                result(&slice_device(&u0, 1), None),
            ],
            8 * GI,
        ),
        (
            "shared",
            "0b000000-0000-4000-8000-00000000000b",
            vec![result(
                &gpu_device(&u0),
                Some(json!({"memory": "3Gi", "compute": "20"})),
            )],
            3 * GI,
        ),
        (
            "other-gpu",
            "0c000000-0000-4000-8000-00000000000c",
            vec![result(&slice_device(&u1, 2), None)],
            4 * GI,
        ),
    ];
    for (name, uid, results, _) in &claims {
        api.put_claim(claim(name, uid, results.clone(), json!([])));
    }
    let request = prepare_request(claims.iter().map(|(name, uid, ..)| (*name, *uid)));
    let first = kubelet
        .node_prepare_resources(request.clone())
        .await
        .expect("NodePrepareResources")
        .into_inner();
    assert_eq!(first.claims.len(), 3);
    for (name, uid, results, _) in &claims {
        let r = &first.claims[*uid];
        assert_eq!(r.error, "", "{name}: {}", plugin.log());
        let names: Vec<&str> = r.devices.iter().map(|d| d.device_name.as_str()).collect();
        let want: Vec<&str> = results
            .iter()
            .map(|r| r["device"].as_str().unwrap())
            .collect();
        assert_eq!(names, want, "{name}");
        assert!(
            r.devices
                .iter()
                .all(|d| d.pool_name == NODE && d.request_names == ["gpu"])
        );
        assert_eq!(
            r.devices[0].cdi_device_ids,
            [format!("{}={uid}", cdi::KIND)]
        );
    }
    let ids = allocation_ids(&m.socket);
    assert_eq!(ids.len(), 3, "{ids:?}");
    let mut probes = Vec::new();
    for (name, uid, _, limit) in &claims {
        let mut p = probe_with_claim(
            &n,
            &cdi_dir,
            &first.claims[*uid].devices[0].cdi_device_ids[0],
        );
        holds_exactly(&mut p, *limit);
        let truth = n.node().process(p.pid()).expect("probe on the node").memory;
        let gpu = usize::from(*name == "other-gpu");
        assert_eq!(truth[gpu], *limit, "{name}: ground truth {truth:?}");
        probes.push(p);
    }

    // The plugin is killed and started again: the same answers, v1beta1
    // exactly as v1, no second allocation.
    plugin.child.kill().expect("SIGKILL");
    plugin.child.wait().expect("reaped");
    let plugin = Plugin::start(&args, &dir.join("plugin2.log"));
    let (_, kubelet2) = match register(&registry, DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };
    drop(kubelet2);
    let again = prepare_v1beta1(&plugin_dir, &request).await;
    let again_v1 =
        dra::NodePrepareResourcesResponse::decode(again.encode_to_vec().as_slice()).unwrap();
    assert_eq!(again_v1, first, "{}", plugin.log());
    assert_eq!(allocation_ids(&m.socket), ids, "no second allocation");
    for (p, (_, _, _, limit)) in probes.iter_mut().zip(&claims) {
        let l = p.cmd("meminfo", T);
        assert_eq!(
            l.u64("total"),
            *limit,
            "still governed after the plugin restart"
        );
    }
    for p in probes {
        p.finish();
    }

    // Unprepare (and an unknown claim, which succeeds) removes everything.
    let mut un = dra::NodeUnprepareResourcesRequest {
        claims: request.claims.clone(),
    };
    un.claims
        .push(req("never", "0d000000-0000-4000-8000-00000000000d"));
    let gone = kubelet_for(&plugin_dir)
        .await
        .node_unprepare_resources(un)
        .await
        .expect("unprepare")
        .into_inner();
    assert_eq!(gone.claims.len(), 4);
    assert!(gone.claims.values().all(|c| c.error.is_empty()), "{gone:?}");
    assert!(allocation_ids(&m.socket).is_empty());
    assert!(specs(&cdi_dir).is_empty(), "{:?}", specs(&cdi_dir));
    let cp = checkpoint(&plugin_dir);
    assert_eq!(cp["claims"], json!({}));
    drop(kubelet);

    // Bad claims beside a good one: each its own error, nothing left of them.
    let good = ("good", "1a000000-0000-4000-8000-00000000001a");
    api.put_claim(claim(
        good.0,
        good.1,
        vec![result(&slice_device(&u1, 0), None)],
        json!([]),
    ));
    let mut other_pool = result(&slice_device(&u0, 0), None);
    other_pool["pool"] = "node-2".into();
    let bad_config = json!([{"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": {"apiVersion": "vgpu.tessera.dev/v1alpha1", "kind": "VgpuConfig", "computePolicy": "greedy"}}}]);
    let bads: Vec<(&str, &str, Option<Value>, &str)> = vec![
        (
            "missing",
            "2a000000-0000-4000-8000-00000000002a",
            None,
            "not found",
        ),
        (
            "recreated",
            "2b000000-0000-4000-8000-00000000002b",
            Some(claim(
                "recreated",
                "another-uid",
                vec![result(&slice_device(&u0, 0), None)],
                json!([]),
            )),
            "has uid another-uid",
        ),
        (
            "elsewhere",
            "2c000000-0000-4000-8000-00000000002c",
            Some(claim(
                "elsewhere",
                "2c000000-0000-4000-8000-00000000002c",
                vec![other_pool],
                json!([]),
            )),
            "on node node-1",
        ),
        (
            "no-such-gpu",
            "2d000000-0000-4000-8000-00000000002d",
            Some(claim(
                "no-such-gpu",
                "2d000000-0000-4000-8000-00000000002d",
                vec![result("gpu-ffff-s0", None)],
                json!([]),
            )),
            "not a device of this node",
        ),
        (
            "too-big",
            "2e000000-0000-4000-8000-00000000002e",
            Some(claim(
                "too-big",
                "2e000000-0000-4000-8000-00000000002e",
                vec![result(&gpu_device(&u0), Some(json!({"memory": "17Gi"})))],
                json!([]),
            )),
            "more than the GPU has",
        ),
        (
            "bad-config",
            "2f000000-0000-4000-8000-00000000002f",
            Some(claim(
                "bad-config",
                "2f000000-0000-4000-8000-00000000002f",
                vec![result(&slice_device(&u0, 0), None)],
                bad_config,
            )),
            "greedy",
        ),
    ];
    for (_, _, c, _) in &bads {
        if let Some(c) = c {
            api.put_claim(c.clone());
        }
    }
    let mut all = vec![req(good.0, good.1)];
    all.extend(bads.iter().map(|(name, uid, ..)| req(name, uid)));
    let mut k = kubelet_for(&plugin_dir).await;
    let r = k
        .node_prepare_resources(dra::NodePrepareResourcesRequest { claims: all })
        .await
        .expect("prepare")
        .into_inner();
    assert_eq!(r.claims[good.1].error, "");
    for (name, uid, _, want) in &bads {
        let e = &r.claims[*uid];
        assert!(e.devices.is_empty(), "{name}");
        assert!(e.error.contains(want), "{name}: {:?}", e.error);
    }
    assert_eq!(allocation_ids(&m.socket), [format!("dra-{}", good.1)]);
    assert_eq!(
        specs(&cdi_dir),
        [format!("vgpu.tessera.dev-claim_{}.json", good.1)]
    );
    let cp = checkpoint(&plugin_dir);
    assert_eq!(
        cp["claims"].as_object().unwrap().keys().collect::<Vec<_>>(),
        [good.1]
    );
    drop(plugin);
}

/// The `shared` layout: two claims hold shares of one GPU (consumable
/// capacity, one device allocated once per share). Each prepared device
/// carries its own allocation result's `shareID` (v1 and v1beta1 alike), so
/// the kubelet can tell the two shares apart; unpreparing one claim leaves
/// the other prepared, its share and its allocation untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_shares_of_one_gpu_are_named_by_their_share_ids_and_unprepared_one_at_a_time() {
    let n = SimNode::e2e(1, 0xd4c);
    let m = ManagerProc::on(&n);
    let st = off_runtime(|| node_status(&m.socket));
    let u0 = st.gpus[0].uuid.clone();
    let api = FakeApiServer::start().await.expect("API server");
    let dir = n.dir.path();
    api.write_kubeconfig(&dir.join("kubeconfig"))
        .expect("kubeconfig");
    std::fs::write(
        dir.join("config.yaml"),
        "default:\n  dra: {layout: shared, memoryMinimum: 1Gi}\n",
    )
    .expect("config");
    let plugin_dir = dir.join("plugin");
    let plugin = Plugin::start(&plugin_args(dir, &m.socket), &dir.join("plugin.log"));
    let (_, mut kubelet) = match register(&dir.join("registry"), DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };

    // What the scheduler's allocator writes for two claims on one shared
    // device: the same device, each result with a share id of its own.
    let shares = [
        (
            "share-a",
            "3a000000-0000-4000-8000-00000000003a",
            "5a000000-0000-4000-8000-00000000005a",
            "2Gi",
        ),
        (
            "share-b",
            "3b000000-0000-4000-8000-00000000003b",
            "5b000000-0000-4000-8000-00000000005b",
            "3Gi",
        ),
    ];
    for (name, uid, share, memory) in shares {
        let mut r = result(
            &gpu_device(&u0),
            Some(json!({"memory": memory, "compute": "20"})),
        );
        r["shareID"] = share.into();
        api.put_claim(claim(name, uid, vec![r], json!([])));
    }
    let request = prepare_request(shares.iter().map(|(name, uid, ..)| (*name, *uid)));
    let prepared = kubelet
        .node_prepare_resources(request.clone())
        .await
        .expect("NodePrepareResources")
        .into_inner();
    for (name, uid, share, _) in shares {
        let r = &prepared.claims[uid];
        assert_eq!(r.error, "", "{name}: {}", plugin.log());
        assert_eq!(r.devices.len(), 1, "{name}");
        assert_eq!(r.devices[0].device_name, gpu_device(&u0), "{name}");
        assert_eq!(r.devices[0].share_id.as_deref(), Some(share), "{name}");
    }
    let ids = allocation_ids(&m.socket);
    assert_eq!(ids.len(), 2, "one allocation per share: {ids:?}");

    // v1beta1 answers the same share ids (the plugin answers a prepared
    // claim again from its checkpoint).
    let again = prepare_v1beta1(&plugin_dir, &request).await;
    for (name, uid, share, _) in shares {
        assert_eq!(
            again.claims[uid].devices[0].share_id.as_deref(),
            Some(share),
            "{name}"
        );
    }
    let cp = checkpoint(&plugin_dir);
    for (_, uid, share, _) in shares {
        assert_eq!(cp["claims"][uid]["devices"][0]["shareId"], share, "{cp}");
    }

    // Unprepare the first share: the second stays, with its share id.
    let gone = kubelet
        .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
            claims: vec![req(shares[0].0, shares[0].1)],
        })
        .await
        .expect("unprepare")
        .into_inner();
    assert_eq!(gone.claims[shares[0].1].error, "", "{}", plugin.log());
    let left = allocation_ids(&m.socket);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(ids.contains(&left[0]));
    let cp = checkpoint(&plugin_dir);
    assert_eq!(
        cp["claims"].as_object().unwrap().keys().collect::<Vec<_>>(),
        [shares[1].1]
    );
    let still = kubelet
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![req(shares[1].0, shares[1].1)],
        })
        .await
        .expect("prepare again")
        .into_inner();
    assert_eq!(
        still.claims[shares[1].1].devices[0].share_id.as_deref(),
        Some(shares[1].2)
    );
    assert_eq!(allocation_ids(&m.socket), left, "no new allocation");
    drop(plugin);
}

async fn kubelet_for(
    plugin_dir: &Path,
) -> dra::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    dra::dra_plugin_client::DraPluginClient::new(
        tessera_proto::unix::channel(&plugin_dir.join("dra.sock"))
            .await
            .expect("dial the plugin"),
    )
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// This node's slices of the driver, once `ready` holds of them.
async fn slices_when(
    api: &FakeApiServer,
    plugin: &Plugin,
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // Read before looking: a write answered after the look wakes the
        // wait below, so no change is missed and no timer is polled.
        let seen = api.served();
        let mine: Vec<Value> = api
            .list(SLICES)
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == NODE && s["spec"]["driver"] == DRIVER_NAME)
            .collect();
        if ready(&mine) {
            return mine;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            api.wait_served_beyond(seen, left).await,
            "slices never became as expected: {mine:#?}\n{}",
            plugin.log()
        );
    }
}

fn published_devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// What the kube-scheduler's allocator does with one request of `count`
/// devices of this driver: any `count` free devices, or, under a
/// `matchAttribute` constraint, `count` free devices that all have the same
/// value of that attribute. The devices chosen, or None when none fit.
fn allocate(
    devices: &[Value],
    taken: &[String],
    count: usize,
    match_attribute: Option<&str>,
) -> Option<Vec<String>> {
    let free: Vec<&Value> = devices
        .iter()
        .filter(|d| !taken.iter().any(|t| d["name"] == t.as_str()))
        .collect();
    let pick = |group: Vec<&Value>| -> Option<Vec<String>> {
        (group.len() >= count).then(|| {
            group[..count]
                .iter()
                .map(|d| d["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
    };
    match match_attribute {
        None => pick(free),
        Some(attr) => {
            // A constraint names the attribute with its domain.
            let (domain, name) = attr.split_once('/').expect("a qualified attribute");
            assert_eq!(domain, DRIVER_NAME);
            let mut groups: std::collections::BTreeMap<String, Vec<&Value>> = Default::default();
            for d in free {
                groups
                    .entry(d["attributes"][name].to_string())
                    .or_default()
                    .push(d);
            }
            groups.into_values().find_map(pick)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn published_slices_follow_the_node_and_three_slices_never_fit_on_two_plus_two() {
    let n = SimNode::e2e(2, 0xd4b);
    let m = ManagerProc::on(&n);
    let st = off_runtime(|| node_status(&m.socket));
    let (u0, u1) = (st.gpus[0].uuid.clone(), st.gpus[1].uuid.clone());
    let api = FakeApiServer::start().await.expect("API server");
    // The node's labels select the shared layout through an override.
    api.put(
        &format!("/api/v1/nodes/{NODE}"),
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": NODE, "labels": {"tessera.dev/dra-layout": "shared"}}}),
    );
    let dir = n.dir.path();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "default:\n  slice: {slicesPerGpu: 4}\n  dra: {layout: slices}\n\
         overrides:\n  - nodeSelector: {matchLabels: {tessera.dev/dra-layout: shared}}\n    dra: {layout: shared, memoryMinimum: 1Gi}\n\
         gpuClasses:\n  - {name: general-purpose, products: ['*Simulated*']}\n",
    )
    .expect("config");
    let s = |p: &Path| p.display().to_string();
    let (registry, cdi_dir) = (dir.join("registry"), dir.join("cdi"));
    let args = plugin_args(dir, &m.socket);
    let plugin = Plugin::start(&args, &dir.join("plugin.log"));

    // Shared: one device per GPU of the manager, its memory and the
    // override's minimum, the attributes the classes select on.
    let shared = slices_when(&api, &plugin, |s| published_devices(s).len() == 2).await;
    let devs = published_devices(&shared);
    for (d, (uuid, g)) in devs.iter().zip([(&u0, &st.gpus[0]), (&u1, &st.gpus[1])]) {
        assert_eq!(d["name"], gpu_device(uuid));
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["attributes"]["uuid"]["string"], uuid.as_str());
        assert_eq!(d["attributes"]["index"]["int"], g.index);
        assert_eq!(d["attributes"]["productName"]["string"], g.name.as_str());
        assert_eq!(d["attributes"]["class"]["string"], "general-purpose");
        assert_eq!(d["attributes"]["computeCapability"]["version"], "8.6.0");
        assert_eq!(d["capacity"]["memory"]["value"], "16Gi");
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["min"],
            "1Gi"
        );
        assert_eq!(d["capacity"]["compute"]["value"], "100");
    }
    assert_eq!(shared[0]["spec"]["pool"]["name"], NODE);

    // The config file drops the override: the slices layout replaces the
    // shared devices, at a newer pool generation.
    let generation = shared[0]["spec"]["pool"]["generation"]
        .as_i64()
        .expect("generation");
    // ldSoPreload on: the claims' specs mount the preload file too.
    std::fs::write(
        &config,
        "default:\n  slice: {slicesPerGpu: 4}\n  dra: {layout: slices}\n  ldSoPreload: true\n",
    )
    .expect("config");
    let sliced = slices_when(&api, &plugin, |s| published_devices(s).len() == 8).await;
    assert_eq!(sliced.len(), 1, "the stale slices are gone: {sliced:#?}");
    assert!(sliced[0]["spec"]["pool"]["generation"].as_i64() > Some(generation));
    let devs = published_devices(&sliced);
    let names: Vec<&str> = devs.iter().map(|d| d["name"].as_str().unwrap()).collect();
    let want: Vec<String> = [&u0, &u1]
        .iter()
        .flat_map(|u| (0..4).map(move |i| slice_device(u, i)))
        .collect();
    assert_eq!(names, want);
    for d in &devs {
        assert_eq!(d["capacity"]["memory"]["value"], "4Gi");
        assert_eq!(d["capacity"]["compute"]["value"], "25");
    }

    // Two claims of two slices each, one per GPU, as a scheduler would
    // place them: each GPU has 2 slices left.
    let (_, mut kubelet) = match register(&registry, DRIVER_NAME, T).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", plugin.log()),
    };
    let placed = [
        ("a", "3a000000-0000-4000-8000-00000000003a", &u0),
        ("b", "3b000000-0000-4000-8000-00000000003b", &u1),
    ];
    let mut taken = Vec::new();
    for (name, uid, gpu) in placed {
        // The scheduler may put a claim on either GPU; these go one each.
        let on_gpu: Vec<Value> = devs
            .iter()
            .filter(|d| d["attributes"]["uuid"]["string"] == gpu.as_str())
            .cloned()
            .collect();
        let got = allocate(&on_gpu, &taken, 2, Some("vgpu.tessera.dev/uuid")).expect("two fit");
        let results: Vec<Value> = got.iter().map(|d| result(d, None)).collect();
        assert!(
            got.iter().all(|d| d.starts_with(&gpu_device(gpu))),
            "{got:?}"
        );
        api.put_claim(claim(name, uid, results, json!([])));
        let r = kubelet
            .node_prepare_resources(dra::NodePrepareResourcesRequest {
                claims: vec![req(name, uid)],
            })
            .await
            .expect("prepare")
            .into_inner();
        assert_eq!(r.claims[uid].error, "", "{}", plugin.log());
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(cdi::spec_path(&cdi_dir, uid)).expect("spec"),
        )
        .expect("spec JSON");
        let mounts = spec["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m["containerPath"] == "/etc/ld.so.preload"
                    && m["hostPath"] == s(&dir.join("ld.so.preload"))),
            "{mounts:?}"
        );
        taken.extend(got);
    }
    let limits: Vec<u64> = off_runtime(|| node_status(&m.socket))
        .allocations
        .iter()
        .flat_map(|a| a.devices.iter().map(|d| d.memory_limit_bytes))
        .collect();
    assert_eq!(limits, [8 * GI, 8 * GI]);
    // The preload file names the library the specs' LD_PRELOAD names.
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(cdi::spec_path(&cdi_dir, placed[0].1)).expect("spec"),
    )
    .expect("spec JSON");
    let preload = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .expect("env")
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix("LD_PRELOAD="))
        .expect("LD_PRELOAD")
        .to_owned();
    assert_eq!(
        std::fs::read_to_string(dir.join("ld.so.preload")).expect("the preload file"),
        format!("{preload}\n")
    );

    // The example claim: three slices under its matchAttribute on the uuid.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/dra/three-slices.yaml"),
    )
    .expect("the example");
    let docs = tessera_dra_plugin::testing::yaml_documents(&text).expect("YAML");
    let template = docs
        .iter()
        .find(|d| d["kind"] == "ResourceClaimTemplate")
        .expect("a template");
    let spec = &template["spec"]["spec"]["devices"];
    let count = spec["requests"][0]["exactly"]["count"]
        .as_u64()
        .expect("count") as usize;
    let attr = spec["constraints"][0]["matchAttribute"]
        .as_str()
        .expect("matchAttribute");
    assert_eq!((count, attr), (3, "vgpu.tessera.dev/uuid"));
    // 4 slices are free, 2 + 2: without the constraint a scheduler would
    // split the request over both GPUs (as the device plugin does today);
    // with it, the node cannot hold it.
    let split = allocate(&devs, &taken, count, None).expect("4 free slices");
    assert!(split.iter().any(|d| d.starts_with(&gpu_device(&u0))));
    assert!(split.iter().any(|d| d.starts_with(&gpu_device(&u1))));
    assert_eq!(allocate(&devs, &taken, count, Some(attr)), None);
    // Once claim a goes, GPU 0 has 4 free and holds the three on it alone.
    let gone = kubelet
        .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
            claims: vec![req(placed[0].0, placed[0].1)],
        })
        .await
        .expect("unprepare")
        .into_inner();
    assert_eq!(gone.claims[placed[0].1].error, "");
    taken.retain(|d| !d.starts_with(&gpu_device(&u0)));
    let three = allocate(&devs, &taken, count, Some(attr)).expect("fits on GPU 0");
    assert!(
        three.iter().all(|d| d.starts_with(&gpu_device(&u0))),
        "{three:?}"
    );
}
