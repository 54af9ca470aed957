//! Allocations as the manager keeps them: records checked against the node
//! ([`validate`], [`check_capacity`]) and the errors every allocation
//! operation reports. Requests are decoded into records once, at the edge
//! ([`crate::wire`]); the records on disk are [`crate::store`]'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_contract::units::FULL_COMPUTE_PPM;
use tessera_shm::{ControlSpec, DeviceSpec, Policy};

use crate::gpu::GpuInfo;

/// Longest allocation id (a DNS label, like Kubernetes names).
pub const MAX_ID_LEN: usize = 63;
/// The record's file name inside an allocation's directory.
pub const RECORD_FILE: &str = "allocation.json";
/// Most slices one device request may state (a GPU is cut into at most this many).
pub const MAX_SLICES: u32 = 1000;
/// Most device ids (`<uuid>::<n>`) one allocation may list, and their longest.
pub const MAX_DEVICE_IDS: usize = 1024;
pub const MAX_DEVICE_ID_LEN: usize = 256;
/// Longest owner fields: a namespace and a container name are DNS labels, a pod
/// name a DNS subdomain.
pub const MAX_NAMESPACE_LEN: usize = 63;
pub const MAX_POD_LEN: usize = 253;
pub const MAX_CONTAINER_LEN: usize = 63;
/// Longest error message the API sends (gRPC carries it in a header).
pub const MAX_MESSAGE_LEN: usize = 1024;

/// `s` for an error message: at most 64 characters, the rest counted, so a
/// hostile value cannot make a message huge.
pub fn clip(s: &str) -> String {
    const KEEP: usize = 64;
    if s.chars().count() <= KEEP {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(KEEP).collect();
    format!("{head:?}... ({} bytes)", s.len())
}

/// A message cut to `MAX_MESSAGE_LEN` bytes on a character boundary.
fn truncated(mut msg: String) -> String {
    if msg.len() > MAX_MESSAGE_LEN {
        let mut cut = MAX_MESSAGE_LEN - 3;
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        msg.truncate(cut);
        msg.push_str("...");
    }
    msg
}

/// Why an allocation request or operation failed; each maps onto a gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    Precondition(String),
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Shm(#[from] tessera_shm::ShmError),
}

impl From<AllocError> for tonic::Status {
    fn from(e: AllocError) -> Self {
        let msg = truncated(e.to_string());
        match e {
            AllocError::Invalid(_) => tonic::Status::invalid_argument(msg),
            AllocError::Conflict(_) => tonic::Status::already_exists(msg),
            AllocError::NotFound(_) => tonic::Status::not_found(msg),
            AllocError::Exhausted(_) => tonic::Status::resource_exhausted(msg),
            AllocError::Precondition(_) => tonic::Status::failed_precondition(msg),
            AllocError::Io { .. } | AllocError::Shm(_) => tonic::Status::internal(msg),
        }
    }
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> AllocError + '_ {
    move |error| AllocError::Io {
        path: path.to_owned(),
        error,
    }
}

mod policy_serde {
    use serde::{Deserialize, Deserializer, Serializer};
    use tessera_shm::Policy;

    pub fn serialize<S: Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
        let s = String::deserialize(d)?;
        Policy::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown policy {s:?}")))
    }
}

/// One GPU of an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub gpu_uuid: String,
    pub memory_limit_bytes: u64,
    pub compute_share_ppm: u32,
    /// Slices behind it (device plugin), 0 when not given in slices.
    #[serde(default)]
    pub slices: u32,
}

/// Everything the manager keeps about an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub id: String,
    pub devices: Vec<DeviceRecord>,
    #[serde(with = "policy_serde")]
    pub policy: Policy,
    #[serde(default)]
    pub device_ids: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub container: String,
    pub created_unix_ms: i64,
}

impl AllocationRecord {
    /// Whether `other` asks for the same allocation (owner and creation
    /// time aside): a repeated create is then answered with this one.
    pub fn same_request(&self, other: &AllocationRecord) -> bool {
        self.id == other.id
            && self.devices == other.devices
            && self.policy == other.policy
            && self.device_ids == other.device_ids
            && self.labels == other.labels
    }

    /// The control file's content for this allocation.
    pub fn control_spec(&self, context_overhead_bytes: u64) -> ControlSpec {
        let mut spec = ControlSpec::new(
            self.id.clone(),
            self.devices
                .iter()
                .map(|d| DeviceSpec {
                    uuid: d.gpu_uuid.clone(),
                    memory_limit_bytes: d.memory_limit_bytes,
                    compute_share_ppm: d.compute_share_ppm,
                    policy: self.policy,
                })
                .collect(),
        );
        spec.context_overhead_bytes = context_overhead_bytes;
        spec
    }
}

/// How strict a policy is: a guaranteed share is also a cap.
fn strictness(p: Policy) -> u8 {
    match p {
        Policy::Burst => 0,
        Policy::Guaranteed => 1,
    }
}

/// Whether moving from `from` to `to` only tightens the policy.
pub fn is_stricter_or_same(from: Policy, to: Policy) -> bool {
    strictness(to) >= strictness(from)
}

/// Checks an allocation id: a DNS label of lower-case letters, digits and `-`.
pub fn check_id(id: &str) -> Result<(), AllocError> {
    let ok_chars = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if id.is_empty()
        || id.len() > MAX_ID_LEN
        || !ok_chars
        || id.starts_with('-')
        || id.ends_with('-')
    {
        return Err(AllocError::Invalid(format!(
            "allocation id {} is invalid: use 1-{MAX_ID_LEN} characters of a-z, 0-9 and '-', \
             starting and ending with a letter or digit",
            clip(id)
        )));
    }
    Ok(())
}

/// A fresh id for a request that named none.
pub fn generate_id() -> String {
    format!("alloc-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Checks a record against the node's GPUs: everything that needs no
/// knowledge of other allocations. A create checks the record its request
/// decodes to ([`crate::wire::create`]); a resize checks the resized
/// record as it is.
pub fn validate(rec: &AllocationRecord, gpus: &[GpuInfo]) -> Result<(), AllocError> {
    let bad = |m: String| Err(AllocError::Invalid(m));
    check_id(&rec.id)?;
    let devices = &rec.devices;
    if devices.is_empty() {
        return bad("an allocation needs at least one device".into());
    }
    if devices.len() > tessera_shm::layout::MAX_DEVICES {
        return bad(format!(
            "an allocation spans at most {} devices, got {}",
            tessera_shm::layout::MAX_DEVICES,
            devices.len()
        ));
    }
    for (i, d) in devices.iter().enumerate() {
        let Some(gpu) = gpus.iter().find(|g| g.uuid == d.gpu_uuid) else {
            let known: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
            return bad(format!(
                "device {i}: no GPU {} on this node (GPUs here: {})",
                clip(&d.gpu_uuid),
                known.join(", ")
            ));
        };
        if devices[..i].iter().any(|o| o.gpu_uuid == d.gpu_uuid) {
            return bad(format!("device {i}: GPU {} listed twice", d.gpu_uuid));
        }
        if d.memory_limit_bytes == 0 {
            return bad(format!("device {i}: memory_limit_bytes must be above 0"));
        }
        if d.memory_limit_bytes > gpu.memory_total_bytes {
            return bad(format!(
                "device {i}: memory limit {} exceeds GPU {}'s {} bytes",
                d.memory_limit_bytes, gpu.uuid, gpu.memory_total_bytes
            ));
        }
        if d.compute_share_ppm == 0 || d.compute_share_ppm > FULL_COMPUTE_PPM {
            return bad(format!(
                "device {i}: compute_share_ppm {} is not in 1..=1000000 (300000 = 30%)",
                d.compute_share_ppm
            ));
        }
        if d.slices > MAX_SLICES {
            return bad(format!(
                "device {i}: {} slices; a GPU has at most {MAX_SLICES}",
                d.slices
            ));
        }
    }
    if rec.device_ids.len() > MAX_DEVICE_IDS {
        return bad(format!(
            "{} device ids; at most {MAX_DEVICE_IDS}",
            rec.device_ids.len()
        ));
    }
    for dev_id in &rec.device_ids {
        if dev_id.len() > MAX_DEVICE_ID_LEN {
            return bad(format!(
                "device id {} is over {MAX_DEVICE_ID_LEN} bytes",
                clip(dev_id)
            ));
        }
        let ok = dev_id.rsplit_once("::").is_some_and(|(uuid, n)| {
            n.parse::<u32>().is_ok() && devices.iter().any(|d| d.gpu_uuid == uuid)
        });
        if !ok {
            return bad(format!(
                "device id {} is not <gpu-uuid>::<n> for a GPU of this allocation",
                clip(dev_id)
            ));
        }
    }
    if rec.labels.len() > 64 {
        return bad(format!("{} labels; at most 64", rec.labels.len()));
    }
    for (k, v) in &rec.labels {
        if k.is_empty() || k.len() > 253 || v.len() > 1024 {
            return bad(format!(
                "label {}: keys are 1-253 bytes, values at most 1024",
                clip(k)
            ));
        }
    }
    Ok(())
}

/// Checks the owner fields of a SetAllocationOwner request: Kubernetes
/// names, length-limited (they become metric labels and log fields).
pub fn check_owner(namespace: &str, pod: &str, container: &str) -> Result<(), AllocError> {
    for (what, v, max) in [
        ("namespace", namespace, MAX_NAMESPACE_LEN),
        ("pod", pod, MAX_POD_LEN),
        ("container", container, MAX_CONTAINER_LEN),
    ] {
        let ok_chars = v
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if v.len() > max || !ok_chars {
            return Err(AllocError::Invalid(format!(
                "{what} {} is not a Kubernetes name (at most {max} of a-z, 0-9, '-', '.')",
                clip(v)
            )));
        }
    }
    Ok(())
}

/// Refuses a record that does not fit beside `existing` on its GPUs:
/// neither memory limits nor compute shares are over-committed.
pub fn check_capacity<'a>(
    rec: &AllocationRecord,
    gpus: &[GpuInfo],
    existing: impl Iterator<Item = &'a AllocationRecord> + Clone,
) -> Result<(), AllocError> {
    for d in &rec.devices {
        let Some(gpu) = gpus.iter().find(|g| g.uuid == d.gpu_uuid) else {
            continue; // validate() already refused unknown GPUs
        };
        let on_gpu = existing
            .clone()
            .flat_map(|a| a.devices.iter())
            .filter(|o| o.gpu_uuid == d.gpu_uuid);
        let (mem, ppm) = on_gpu.fold((0u64, 0u64), |(m, p), o| {
            (m + o.memory_limit_bytes, p + u64::from(o.compute_share_ppm))
        });
        let free_mem = gpu.memory_total_bytes.saturating_sub(mem);
        if d.memory_limit_bytes > free_mem {
            return Err(AllocError::Exhausted(format!(
                "GPU {} (index {}) has {} of {} bytes of memory unallocated; {} requested",
                gpu.uuid, gpu.index, free_mem, gpu.memory_total_bytes, d.memory_limit_bytes
            )));
        }
        let free_ppm = u64::from(FULL_COMPUTE_PPM).saturating_sub(ppm);
        if u64::from(d.compute_share_ppm) > free_ppm {
            return Err(AllocError::Exhausted(format!(
                "GPU {} (index {}) has {} of its compute time unallocated; {} requested",
                gpu.uuid,
                gpu.index,
                tessera_contract::units::format_ppm(free_ppm as u32),
                tessera_contract::units::format_ppm(d.compute_share_ppm)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::test_gpu;
    use tessera_proto::manager::v1 as pb;

    const GI: u64 = 1 << 30;

    fn gpus() -> Vec<GpuInfo> {
        vec![test_gpu(0, 16 * GI), test_gpu(1, 16 * GI)]
    }

    fn req(uuid: &str, mem: u64, ppm: u32) -> pb::CreateAllocationRequest {
        pb::CreateAllocationRequest::one_device("a1", uuid, mem, ppm)
    }

    /// What a create does with a request: decode, then validate.
    fn norm(r: &pb::CreateAllocationRequest) -> Result<AllocationRecord, AllocError> {
        let rec = crate::wire::create(r)?.into_record(r.id.clone(), Policy::Burst, 1);
        validate(&rec, &gpus())?;
        Ok(rec)
    }

    #[test]
    fn hostile_sizes_are_refused_with_short_messages() {
        let g = gpus();
        // Slices past any GPU's (2^32-1 overflowed the slice sums before).
        let mut r = req(&g[0].uuid, GI, 1000);
        r.devices[0].slices = u32::MAX;
        let e = norm(&r).unwrap_err().to_string();
        assert!(e.contains("at most 1000"), "{e}");
        r.devices[0].slices = MAX_SLICES;
        norm(&r).unwrap();
        // A megabyte of UUID, id, device id or label key: refused, not echoed.
        let huge = "x".repeat(1 << 20);
        let mut r = req(&huge, GI, 1000);
        let e = norm(&r).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains("1048576 bytes"), "{}", e.len());
        r = req(&g[0].uuid, GI, 1000);
        r.id = huge.clone();
        let e = crate::wire::create(&r)
            .and_then(|c| validate(&c.into_record(huge.clone(), Policy::Burst, 1), &g))
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400, "{}", e.len());
        r = req(&g[0].uuid, GI, 1000);
        r.device_ids = vec![huge.clone()];
        assert!(norm(&r).unwrap_err().to_string().len() < 400);
        r.device_ids = vec![format!("{}::0", g[0].uuid); MAX_DEVICE_IDS + 1];
        assert!(norm(&r).unwrap_err().to_string().contains("at most"));
        r = req(&g[0].uuid, GI, 1000);
        r.labels.insert(huge.clone(), "v".into());
        assert!(norm(&r).unwrap_err().to_string().len() < 400);
        // Whatever an error says, the status carries at most MAX_MESSAGE_LEN bytes.
        let status = tonic::Status::from(AllocError::Invalid(huge.clone()));
        assert!(status.message().len() <= MAX_MESSAGE_LEN);
        assert!(status.message().ends_with("..."));
    }

    #[test]
    fn owners_are_kubernetes_names() {
        check_owner("ml", "train-0.x", "main").unwrap();
        check_owner("", "", "").unwrap();
        for (ns, pod, c) in [
            (&"n".repeat(64)[..], "p", "c"),
            ("ml", &"p".repeat(254)[..], "c"),
            ("ml", "p", "Main"),
            ("ml", "p\n", "c"),
        ] {
            let e = check_owner(ns, pod, c).unwrap_err().to_string();
            assert!(e.len() < 300, "{e}");
        }
    }

    #[test]
    fn a_good_request_becomes_a_record_with_the_default_policy() {
        let g = gpus();
        let rec = norm(&req(&g[0].uuid, 4 * GI, 300_000)).unwrap();
        assert_eq!(rec.policy, Policy::Burst);
        assert_eq!(rec.devices[0].memory_limit_bytes, 4 * GI);
        let spec = rec.control_spec(0);
        assert_eq!(spec.devices[0].compute_share_ppm, 300_000);
        assert_eq!(spec.devices[0].policy, Policy::Burst);
        spec.validate().unwrap();
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let g = gpus();
        let u = g[0].uuid.clone();
        let cases: Vec<(pb::CreateAllocationRequest, &str)> = vec![
            (req("GPU-nope", GI, 1), "no GPU \"GPU-nope\""),
            (req(&u, 0, 1), "memory_limit_bytes must be above 0"),
            (req(&u, 17 * GI, 1), "exceeds GPU"),
            (req(&u, GI, 0), "compute_share_ppm 0"),
            (req(&u, GI, 1_000_001), "compute_share_ppm 1000001"),
            (
                pb::CreateAllocationRequest {
                    id: "Bad_ID".into(),
                    ..req(&u, GI, 1)
                },
                "allocation id \"Bad_ID\" is invalid",
            ),
            (
                pb::CreateAllocationRequest {
                    devices: vec![],
                    ..req(&u, GI, 1)
                },
                "at least one device",
            ),
            (
                pb::CreateAllocationRequest {
                    policy: 7,
                    ..req(&u, GI, 1)
                },
                "unknown compute policy 7",
            ),
            (
                pb::CreateAllocationRequest {
                    device_ids: vec!["GPU-other::0".into()],
                    ..req(&u, GI, 1)
                },
                "device id \"GPU-other::0\"",
            ),
        ];
        for (r, want) in cases {
            let e = norm(&r).expect_err(want);
            assert!(matches!(e, AllocError::Invalid(_)), "{e}");
            assert!(e.to_string().contains(want), "{e} lacks {want}");
        }
        let mut twice = req(&u, GI, 1);
        twice.devices.push(twice.devices[0].clone());
        assert!(
            norm(&twice)
                .unwrap_err()
                .to_string()
                .contains("listed twice")
        );
    }

    /// A resize checks the resized record itself, with the same rules and
    /// messages as a create, never a request rebuilt from it.
    #[test]
    fn a_resized_record_is_checked_as_it_is() {
        let g = gpus();
        let mut r = req(&g[0].uuid, 4 * GI, 300_000);
        r.device_ids = vec![format!("{}::0", g[0].uuid)];
        r.labels.insert("source".into(), "device-plugin".into());
        let good = norm(&r).unwrap();
        validate(&good, &g).unwrap();
        let resized = |f: &dyn Fn(&mut DeviceRecord)| {
            let mut rec = good.clone();
            f(&mut rec.devices[0]);
            validate(&rec, &g)
        };
        resized(&|d| d.memory_limit_bytes = 16 * GI).unwrap();
        for (change, want) in [
            (
                &(|d: &mut DeviceRecord| d.memory_limit_bytes = 17 * GI)
                    as &dyn Fn(&mut DeviceRecord),
                "device 0: memory limit 18253611008 exceeds GPU",
            ),
            (
                &|d| d.memory_limit_bytes = 0,
                "memory_limit_bytes must be above 0",
            ),
            (
                &|d| d.compute_share_ppm = 0,
                "compute_share_ppm 0 is not in",
            ),
            (
                &|d| d.compute_share_ppm = 1_000_001,
                "compute_share_ppm 1000001",
            ),
        ] {
            let e = resized(change).expect_err(want);
            assert!(matches!(e, AllocError::Invalid(_)), "{e}");
            assert!(e.to_string().contains(want), "{e} lacks {want}");
        }
        // A record another version left with a GPU this node lacks.
        let mut gone = good.clone();
        gone.devices[0].gpu_uuid = "GPU-gone".into();
        let e = validate(&gone, &g).unwrap_err().to_string();
        assert!(e.contains("no GPU \"GPU-gone\" on this node"), "{e}");
    }

    #[test]
    fn ids() {
        for ok in ["a", "a-1", "run-123-abc", &"x".repeat(63)] {
            check_id(ok).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"x".repeat(64), "a/b"] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
        let g = generate_id();
        check_id(&g).unwrap();
        assert_ne!(g, generate_id());
    }

    #[test]
    fn capacity_is_never_overcommitted() {
        let g = gpus();
        let mut a = norm(&req(&g[0].uuid, 10 * GI, 600_000)).unwrap();
        a.id = "a".into();
        let existing = [a];
        let fits = norm(&req(&g[0].uuid, 6 * GI, 400_000)).unwrap();
        check_capacity(&fits, &g, existing.iter()).unwrap();
        let too_big = norm(&req(&g[0].uuid, 6 * GI + 1, 100_000)).unwrap();
        let e = check_capacity(&too_big, &g, existing.iter()).unwrap_err();
        assert!(matches!(e, AllocError::Exhausted(_)));
        assert!(e.to_string().contains("memory unallocated"), "{e}");
        let too_much = norm(&req(&g[0].uuid, GI, 400_001)).unwrap();
        let e = check_capacity(&too_much, &g, existing.iter()).unwrap_err();
        assert!(e.to_string().contains("40% of its compute time"), "{e}");
        // Another GPU is not affected.
        let other = norm(&req(&g[1].uuid, 16 * GI, FULL_COMPUTE_PPM)).unwrap();
        check_capacity(&other, &g, existing.iter()).unwrap();
    }

    #[test]
    fn policies_only_tighten() {
        assert!(is_stricter_or_same(Policy::Burst, Policy::Guaranteed));
        assert!(is_stricter_or_same(Policy::Burst, Policy::Burst));
        assert!(!is_stricter_or_same(Policy::Guaranteed, Policy::Burst));
    }
}
