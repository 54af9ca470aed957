//! Wire-format checks: the generated messages put each field under the tag
//! number of the published kubelet APIs, so a real kubelet can read them.
//! Expected bytes are built by hand from the upstream field numbers.
use prost::Message;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::podresources::v1 as pr;

/// A length-delimited field (string, bytes, message); short payloads only.
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![
        (field << 3) | 2,
        u8::try_from(payload.len()).expect("short payload"),
    ];
    v.extend_from_slice(payload);
    v
}

/// A small varint field (bool, int32, int64 < 128).
fn vi(field: u8, value: u8) -> Vec<u8> {
    vec![field << 3, value]
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn register_request_fields_match_upstream_numbers() {
    let req = dp::RegisterRequest {
        version: "v".into(),
        endpoint: "e".into(),
        resource_name: "r".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }),
    };
    let expected = cat(&[
        ld(1, b"v"),
        ld(2, b"e"),
        ld(3, b"r"),
        ld(4, &cat(&[vi(1, 1), vi(2, 1)])),
    ]);
    assert_eq!(req.encode_to_vec(), expected);
}

#[test]
fn device_and_topology_fields_match_upstream_numbers() {
    let dev = dp::Device {
        id: "a".into(),
        health: "H".into(),
        topology: Some(dp::TopologyInfo {
            nodes: vec![dp::NumaNode { id: 3 }],
        }),
    };
    let expected = cat(&[ld(1, b"a"), ld(2, b"H"), ld(3, &ld(1, &vi(1, 3)))]);
    assert_eq!(dev.encode_to_vec(), expected);
    let list = dp::ListAndWatchResponse { devices: vec![dev] };
    assert_eq!(list.encode_to_vec(), ld(1, &expected));
}

#[test]
fn preferred_allocation_fields_match_upstream_numbers() {
    let req = dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into()],
            must_include_device_i_ds: vec!["m".into()],
            allocation_size: 2,
        }],
    };
    let inner = cat(&[ld(1, b"a"), ld(2, b"m"), vi(3, 2)]);
    assert_eq!(req.encode_to_vec(), ld(1, &inner));
    let resp = dp::PreferredAllocationResponse {
        container_responses: vec![dp::ContainerPreferredAllocationResponse {
            device_i_ds: vec!["x".into()],
        }],
    };
    assert_eq!(resp.encode_to_vec(), ld(1, &ld(1, b"x")));
}

#[test]
fn container_allocate_response_fields_match_upstream_numbers() {
    let mut resp = dp::ContainerAllocateResponse {
        envs: Default::default(),
        mounts: vec![dp::Mount {
            container_path: "c".into(),
            host_path: "h".into(),
            read_only: true,
        }],
        devices: vec![dp::DeviceSpec {
            container_path: "c".into(),
            host_path: "h".into(),
            permissions: "r".into(),
        }],
        annotations: Default::default(),
        cdi_devices: vec![dp::CdiDevice { name: "n".into() }],
    };
    let expected = cat(&[
        ld(2, &cat(&[ld(1, b"c"), ld(2, b"h"), vi(3, 1)])),
        ld(3, &cat(&[ld(1, b"c"), ld(2, b"h"), ld(3, b"r")])),
        ld(5, &ld(1, b"n")),
    ]);
    assert_eq!(resp.encode_to_vec(), expected);

    // A map entry is a nested message {key = 1, value = 2} under the map's tag.
    resp = dp::ContainerAllocateResponse::default();
    resp.envs.insert("k".into(), "v".into());
    assert_eq!(
        resp.encode_to_vec(),
        ld(1, &cat(&[ld(1, b"k"), ld(2, b"v")]))
    );
    resp = dp::ContainerAllocateResponse::default();
    resp.annotations.insert("k".into(), "v".into());
    assert_eq!(
        resp.encode_to_vec(),
        ld(4, &cat(&[ld(1, b"k"), ld(2, b"v")]))
    );
}

#[test]
fn allocate_and_prestart_requests_match_upstream_numbers() {
    let req = dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: vec!["d".into()],
        }],
    };
    assert_eq!(req.encode_to_vec(), ld(1, &ld(1, b"d")));
    let pre = dp::PreStartContainerRequest {
        devices_ids: vec!["d".into()],
    };
    assert_eq!(pre.encode_to_vec(), ld(1, b"d"));
}

#[test]
fn pod_resources_fields_match_upstream_numbers() {
    let devices = pr::ContainerDevices {
        resource_name: "r".into(),
        device_ids: vec!["d".into()],
        topology: Some(pr::TopologyInfo {
            nodes: vec![pr::NumaNode { id: 1 }],
        }),
    };
    let resp = pr::ListPodResourcesResponse {
        pod_resources: vec![pr::PodResources {
            name: "p".into(),
            namespace: "n".into(),
            containers: vec![pr::ContainerResources {
                name: "c".into(),
                devices: vec![devices.clone()],
                cpu_ids: vec![5],
                memory: vec![],
                dynamic_resources: vec![],
            }],
        }],
    };
    let devices_bytes = cat(&[ld(1, b"r"), ld(2, b"d"), ld(3, &ld(1, &vi(1, 1)))]);
    // Repeated scalars are packed in proto3.
    let container = cat(&[ld(1, b"c"), ld(2, &devices_bytes), ld(3, &[5])]);
    let pod = cat(&[ld(1, b"p"), ld(2, b"n"), ld(3, &container)]);
    assert_eq!(resp.encode_to_vec(), ld(1, &pod));

    let get = pr::GetPodResourcesRequest {
        pod_name: "p".into(),
        pod_namespace: "n".into(),
    };
    assert_eq!(get.encode_to_vec(), cat(&[ld(1, b"p"), ld(2, b"n")]));
    let alloc = pr::AllocatableResourcesResponse {
        devices: vec![devices],
        cpu_ids: vec![],
        memory: vec![],
    };
    assert_eq!(alloc.encode_to_vec(), ld(1, &devices_bytes));
}

/// The DRA messages of one version against upstream's numbers; `v1beta1`
/// must encode exactly as `v1` (same messages, other package).
macro_rules! dra_wire_test {
    ($name:ident, $m:path) => {
        #[test]
        fn $name() {
            use $m as d;
            let claim = d::Claim {
                namespace: "n".into(),
                uid: "u".into(),
                name: "c".into(),
            };
            let claim_bytes = cat(&[ld(1, b"n"), ld(2, b"u"), ld(3, b"c")]);
            assert_eq!(claim.encode_to_vec(), claim_bytes);
            let req = d::NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            };
            assert_eq!(req.encode_to_vec(), ld(1, &claim_bytes));
            let un = d::NodeUnprepareResourcesRequest {
                claims: vec![claim],
            };
            assert_eq!(un.encode_to_vec(), ld(1, &claim_bytes));

            let device = d::Device {
                request_names: vec!["r".into()],
                pool_name: "p".into(),
                device_name: "d".into(),
                cdi_device_ids: vec!["x".into()],
                share_id: Some("s".into()),
            };
            // share_id is field 5 upstream (cdi_device_ids kept 4).
            let device_bytes = cat(&[
                ld(1, b"r"),
                ld(2, b"p"),
                ld(3, b"d"),
                ld(4, b"x"),
                ld(5, b"s"),
            ]);
            assert_eq!(device.encode_to_vec(), device_bytes);
            let one = d::NodePrepareResourceResponse {
                devices: vec![device],
                error: "e".into(),
            };
            let one_bytes = cat(&[ld(1, &device_bytes), ld(2, b"e")]);
            assert_eq!(one.encode_to_vec(), one_bytes);
            // A map entry is a nested message {key = 1, value = 2}.
            let mut resp = d::NodePrepareResourcesResponse::default();
            resp.claims.insert("u".into(), one);
            assert_eq!(
                resp.encode_to_vec(),
                ld(1, &cat(&[ld(1, b"u"), ld(2, &one_bytes)]))
            );
            let mut un_resp = d::NodeUnprepareResourcesResponse::default();
            un_resp.claims.insert(
                "u".into(),
                d::NodeUnprepareResourceResponse { error: "e".into() },
            );
            assert_eq!(
                un_resp.encode_to_vec(),
                ld(1, &cat(&[ld(1, b"u"), ld(2, &ld(1, b"e"))]))
            );
        }
    };
}

dra_wire_test!(dra_v1_fields_match_upstream_numbers, tessera_proto::dra::v1);
dra_wire_test!(
    dra_v1beta1_fields_match_upstream_numbers,
    tessera_proto::dra::v1beta1
);

#[test]
fn plugin_registration_fields_match_upstream_numbers() {
    use tessera_proto::pluginregistration::v1 as reg;
    let info = reg::PluginInfo {
        r#type: "t".into(),
        name: "n".into(),
        endpoint: "e".into(),
        supported_versions: vec!["a".into(), "b".into()],
    };
    assert_eq!(
        info.encode_to_vec(),
        cat(&[
            ld(1, b"t"),
            ld(2, b"n"),
            ld(3, b"e"),
            ld(4, b"a"),
            ld(4, b"b")
        ])
    );
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "e".into(),
    };
    assert_eq!(status.encode_to_vec(), cat(&[vi(1, 1), ld(2, b"e")]));
    assert!(reg::InfoRequest {}.encode_to_vec().is_empty());
    assert!(
        reg::RegistrationStatusResponse {}
            .encode_to_vec()
            .is_empty()
    );
}

/// The gRPC paths the kubelet calls: `/<package>.<Service>/<Method>`.
#[test]
fn service_names_are_the_kubelets() {
    use tonic::server::NamedService;
    type V1<T> = tessera_proto::dra::v1::dra_plugin_server::DraPluginServer<T>;
    type V1b1<T> = tessera_proto::dra::v1beta1::dra_plugin_server::DraPluginServer<T>;
    type Reg<T> = tessera_proto::pluginregistration::v1::registration_server::RegistrationServer<T>;
    struct S;
    assert_eq!(
        <V1<S> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        <V1b1<S> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        <Reg<S> as NamedService>::NAME,
        "pluginregistration.Registration"
    );
}
