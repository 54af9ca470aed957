//! Hostile input to the manager's API over its real socket: slice counts that overflow
//! sums, megabyte strings in every field, and a seeded fuzz of a few hundred requests
//! mixing them. Every one must be answered with a clear, short error (or accepted when
//! valid), and the manager must keep serving status and a complete `/metrics` after.

mod manager_support;

use manager_support::*;
use tessera_e2e::SimNode;
use tessera_proto::manager::v1 as pb;

const GI: u64 = 1 << 30;

role_test!();

fn node() -> SimNode {
    SimNode::e2e(1, 0xf22)
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, xs: &'a [String]) -> &'a String {
        &xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// The body of one `GET /metrics` (any HTTP/1.1 server framing).
fn metrics_body(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).expect("connect to metrics");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n")
        .expect("send request");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read response");
    let (head, body) = out.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// Longest error message a client may get (the manager caps them at 1024 bytes).
const MAX_MESSAGE: usize = 1024;

#[test]
fn hostile_requests_get_short_errors_and_the_manager_keeps_serving() {
    let n = node();
    let m = ManagerProc::on(&n);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let huge = "x".repeat(1 << 20);
    let strings = vec![
        String::new(),
        uuid.clone(),
        huge.clone(),
        "a".repeat(64),
        "Ünïcödé-\u{0}-\n".into(),
        format!("{uuid}::0"),
        "ok-id".into(),
    ];
    let numbers = [0u64, 1, GI, 16 * GI, 16 * GI + 1, u64::MAX, u32::MAX as u64];
    let mut rng = Rng(0x7e55e2a);
    let mut accepted = 0;
    let mut refused = 0;
    for i in 0..300 {
        // A valid request with 0, 1 or 2 of its fields made hostile.
        let mut req = pb::CreateAllocationRequest {
            id: format!("f{i}"),
            devices: vec![pb::DeviceRequest {
                gpu_uuid: uuid.clone(),
                memory_limit_bytes: GI,
                compute_share_ppm: 100_000,
                slices: 1,
            }],
            ..Default::default()
        };
        for _ in 0..rng.next() % 3 {
            let num = numbers[(rng.next() % numbers.len() as u64) as usize];
            match rng.next() % 8 {
                0 => req.id = rng.pick(&strings).clone(),
                1 => req.devices[0].gpu_uuid = rng.pick(&strings).clone(),
                2 => req.devices[0].memory_limit_bytes = num,
                3 => req.devices[0].compute_share_ppm = num as u32,
                4 => req.devices[0].slices = num as u32,
                5 => req.device_ids.push(rng.pick(&strings).clone()),
                6 => {
                    let d = req.devices[0].clone();
                    req.devices
                        .extend(std::iter::repeat_n(d, (num % 100) as usize));
                }
                _ => {
                    req.labels
                        .insert(rng.pick(&strings).clone(), rng.pick(&strings).clone());
                }
            }
        }
        match with_client(&m.socket, async |c| c.create_allocation(req).await) {
            Ok(a) => {
                accepted += 1;
                let id = a.into_inner().id;
                // Owner strings: hostile ones refused, short.
                let owner = pb::SetAllocationOwnerRequest {
                    id: id.clone(),
                    namespace: rng.pick(&strings).clone(),
                    pod: rng.pick(&strings).clone(),
                    container: rng.pick(&strings).clone(),
                    ..Default::default()
                };
                if let Err(e) =
                    with_client(&m.socket, async |c| c.set_allocation_owner(owner).await)
                {
                    assert!(e.message().len() <= MAX_MESSAGE, "{}", e.message().len());
                }
                let del = pb::DeleteAllocationRequest { id };
                with_client(&m.socket, async |c| c.delete_allocation(del).await).expect("delete");
            }
            Err(e) => {
                refused += 1;
                assert!(
                    e.message().len() <= MAX_MESSAGE,
                    "request {i}: a {} byte message",
                    e.message().len()
                );
                assert!(!e.message().is_empty(), "request {i}: no reason given");
                assert_ne!(
                    e.code(),
                    tonic::Code::Internal,
                    "request {i}: {}",
                    e.message()
                );
            }
        }
    }
    // The manager still serves, and /metrics is whole.
    let st = node_status(&m.socket);
    assert_eq!(st.gpus.len(), 1);
    let text = metrics_body(m.metrics);
    let e = parse_exposition(&text).expect("valid exposition");
    assert!(
        e.get("tessera_gpu_slices_allocated", &[("gpu", "0")])
            .is_some(),
        "{text}"
    );
    // A request deleted with a megabyte id: NotFound, short.
    let del = pb::DeleteAllocationRequest { id: huge };
    let e = with_client(&m.socket, async |c| c.delete_allocation(del).await).unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().len() < 200, "{}", e.message().len());
    eprintln!("FIGURE api fuzz: 300 requests, {accepted} accepted, {refused} refused, all short");
    assert!(accepted > 0 && refused > 0);
    m.stop();
}
