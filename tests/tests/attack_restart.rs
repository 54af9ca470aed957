//! Making the node forget a tenant: a tenant corrupts its own state file (it is mapped
//! read-write in its container), or an allocation's record is damaged, and the manager
//! restarts. The allocation must keep its capacity (a new allocation that would need it is
//! refused while the old one's process still runs), be served again (repaired in place,
//! the running process keeps working under its limit) and say so loudly: in the log, in
//! status (`recovered`, `RECOVERED` in `tessera status`) and in the metric
//! `tessera_allocation_recovered`, labelled with what was repaired.

mod manager_support;

use std::time::Duration;

use manager_support::*;
use tessera_e2e::SimNode;
use tessera_proto::manager::v1 as pb;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(10);

role_test!();

fn node() -> SimNode {
    SimNode::e2e(1, 0x5e7)
}

/// A 12 GiB, 10 % allocation whose process holds 6 GiB; `spoil` damages it while the
/// manager is down; after the restart it must still hold its place, and status and
/// metrics must say it was recovered: `repaired` is the metric's label, `in_status` a
/// part of the status field.
fn survives_restart(
    spoil: impl FnOnce(&pb::Allocation),
    expect_in_log: &str,
    repaired: &str,
    in_status: &str,
) {
    let _serial = serial();
    let n = node();
    let dir = n.dir.path().join("m");
    let m = ManagerProc::start(&n, &dir, &[]);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "held", &uuid, 12 * GI, 100_000);
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", &format!("alloc {}", 6 * GI)] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    // Before the damage, nothing is reported as recovered.
    assert_eq!(node_status(&m.socket).allocations[0].recovered, "");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert!(!e.types.contains_key("tessera_allocation_recovered"));
    m.stop();
    spoil(&a);

    let m = ManagerProc::start(&n, &dir, &[]);
    let log = m.log();
    assert!(log.contains(expect_in_log), "not reported loudly:\n{log}");
    let st = node_status(&m.socket);
    assert_eq!(st.allocations.len(), 1, "forgotten:\n{log}");
    assert_eq!(
        st.allocations[0].allocation.as_ref().unwrap().id,
        "held",
        "{log}"
    );
    // Reported in status, with what was repaired ...
    let recovered = &st.allocations[0].recovered;
    assert!(recovered.contains(in_status), "status says {recovered:?}");
    let out = client(&n, &["status", "--socket", m.socket.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("held "))
        .unwrap_or_else(|| panic!("no row for the allocation:\n{text}"));
    assert!(row.contains("RECOVERED"), "{row}");
    assert!(
        text.contains(&format!(
            "RECOVERED held: damaged files found at the manager's start: {recovered}"
        )),
        "{text}"
    );
    // ... and in the metric, on its GPU, labelled with what was repaired.
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(
        e.types
            .get("tessera_allocation_recovered")
            .map(String::as_str),
        Some("gauge")
    );
    assert_eq!(
        e.get(
            "tessera_allocation_recovered",
            &[("allocation", "held"), ("gpu", "0"), ("repaired", repaired)]
        ),
        Some(1.0),
        "{:?}",
        e.samples
    );
    // Its capacity is not re-sold: 15 GiB does not fit beside its 12.
    let big = pb::CreateAllocationRequest::one_device("greedy", &uuid, 15 * GI, 100_000);
    let e = with_client(&m.socket, async |c| c.create_allocation(big).await)
        .expect_err("capacity re-sold");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    // Nor its compute share: 95 % does not fit beside its 10 %.
    let greedy = pb::CreateAllocationRequest::one_device("greedy", &uuid, GI, 950_000);
    let e = with_client(&m.socket, async |c| c.create_allocation(greedy).await)
        .expect_err("share re-sold");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    // And the running process is governed by it still, at its old limit.
    let over = w.cmd(&format!("alloc {}", 12 * GI), T);
    assert!(!over.ok, "past the limit after the restart: {}", over.raw);
    w.kill();
    m.stop();
}

#[test]
fn a_tenant_that_corrupts_its_state_magic_keeps_its_place_after_a_restart() {
    survives_restart(
        |a| {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&a.state_path)
                .expect("the tenant's state file");
            f.write_all_at(b"XXXXXXXX", 0).expect("write");
        },
        "repaired in place",
        "state",
        "state header restored",
    );
}

#[test]
fn a_damaged_allocation_record_is_recovered_after_a_restart() {
    survives_restart(
        |a| {
            let dir = std::path::Path::new(&a.state_path).parent().unwrap();
            std::fs::write(dir.join("allocation.json"), "{\"id\": \"held\", \"dev").expect("write");
        },
        "recovered",
        "record",
        "record recovered from its checksummed copy",
    );
}
