//! DRA pods as the placement engine sees them, with no I/O: the GPUs a node
//! publishes in its ResourceSlices less what the allocated ResourceClaims
//! hold, a pod's claims turned into engine requests, and filter and
//! prioritize over that. The slice view of device-plugin nodes (`view`)
//! stays beside it; this module only borrows its slice request and scores.
//!
//! What a node has: the newest generation of the pool of Tessera's driver
//! named after the node (all `resourceSliceCount` slices of it, else the node
//! is unknown: its plugin is rewriting the pool). Its devices are grouped
//! into GPUs by their `uuid` attribute:
//!
//! - `slices` layout (devices `gpu-<uuid>-s<n>`): a GPU of `S` slices, `f` of
//!   them allocated to no claim, is what `view` makes of a GPU of `S` slices
//!   with `f` free (memory in thousandths of a slice, so "k slices fit" is
//!   exact);
//! - `shared` layout (one device per GPU that allows multiple allocations):
//!   memory in MiB and compute in thousandths, less each allocation's
//!   consumed capacity (an allocation without one holds the whole GPU, as the
//!   DRA plugin prepares it).
//!
//! What a pod asks: each request of its unallocated claims whose device class
//! is the driver's (`vgpu.tessera.dev`, or `<class>.vgpu.tessera.dev` for one
//! GPU class). `count` devices: on a `slices` node that many slices (on one GPU
//! when a `matchAttribute` constraint on the driver's `uuid` covers the
//! request, else anywhere); on a `shared` node that many shares, each of the
//! requested `memory` and `compute` rounded up as the device's request policy
//! rounds them (its default when not asked; the whole capacity without a
//! policy). A claim already allocated asks nothing more and pins the pod to
//! the nodes of its pools. CEL selectors are left to the scheduler's DRA
//! allocator, which decides the devices: the extender only filters out nodes
//! that cannot hold the pod and ranks the others.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Device, DeviceSubRequest, ExactDeviceRequest, ResourceClaim,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_dra_plugin::claim::{CAPACITY_COMPUTE, CAPACITY_MEMORY};
use tessera_dra_plugin::quantity;
use tessera_dra_plugin::slices::{ATTR_CLASS, ATTR_PRODUCT, ATTR_UUID};
use tessera_placement::cluster::MILLI;
use tessera_placement::{Engine, Gpu, GpuNeed, MemoryNeed, Node, Policy, Request, TaskMix};

use crate::view::{self, UNCOUNTED};
use crate::wire::HostPriority;

const MIB: u64 = 1 << 20;
/// The compute capacity of a whole GPU, in percent.
const FULL_PERCENT: u64 = 100;

/// Why a pod's claims cannot be read (not a node's fault).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DraError {
    #[error(
        "pod {pod}: resource claim {claim} is not in the extender's view yet (created since its last watch event)"
    )]
    ClaimNotSeen { pod: String, claim: String },
    #[error("pod {pod}: the resource claim of its entry {entry:?} has not been created yet")]
    ClaimNotCreated { pod: String, entry: String },
    #[error(
        "resource claim {claim}: request {request:?}: allocationMode {mode:?} is not scored by the extender"
    )]
    Mode {
        claim: String,
        request: String,
        mode: String,
    },
    #[error("resource claim {claim}: request {request:?}: count {count} is not a positive number")]
    Count {
        claim: String,
        request: String,
        count: i64,
    },
    #[error("resource claim {claim}: request {request:?}: capacity {name} {value:?}: {reason}")]
    Capacity {
        claim: String,
        request: String,
        name: String,
        value: String,
        reason: String,
    },
}

/// One device of the driver allocated to a claim, from the claim's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// The claim's `namespace/name`.
    pub claim: String,
    pub pool: String,
    pub device: String,
    /// Consumed capacity: bytes and percent (None: not given, or unreadable:
    /// the whole device).
    pub memory: Option<u64>,
    pub compute: Option<u64>,
}

/// A claim's `namespace/name`.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

/// The devices of `driver` allocated to `claim`.
pub fn allocated(claim: &ResourceClaim, driver: &str) -> Vec<Allocated> {
    let key = claim_key(claim);
    tessera_dra_plugin::claim::results(claim)
        .filter(|r| r.driver == driver)
        .map(|r| {
            let read = |name: &str| {
                r.consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .and_then(|q| quantity::parse(&q.0).ok())
            };
            Allocated {
                claim: key.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                memory: read(CAPACITY_MEMORY),
                compute: read(CAPACITY_COMPUTE),
            }
        })
        .collect()
}

/// How a device's request policy rounds a consumed capacity (in the
/// capacity's unit: bytes or percent). `valid_values` is not modelled (the
/// driver publishes ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rounding {
    pub default: Option<u64>,
    pub min: Option<u64>,
    pub step: Option<u64>,
    pub max: Option<u64>,
}

impl Rounding {
    fn of(policy: Option<&CapacityRequestPolicy>) -> Option<Rounding> {
        let p = policy?;
        let q = |q: Option<&Quantity>| q.and_then(|q| quantity::parse(&q.0).ok());
        let range = p.valid_range.as_ref();
        Some(Rounding {
            default: q(p.default.as_ref()),
            min: q(range.map(|r| &r.min)),
            step: q(range.and_then(|r| r.step.as_ref())).filter(|&s| s > 0),
            max: q(range.and_then(|r| r.max.as_ref())),
        })
    }

    /// What a request of `asked` consumes (None: the request's default),
    /// or None when the policy allows no such amount; `whole` is the
    /// device's capacity, consumed when neither a request nor a default
    /// says otherwise.
    fn consumed(rounding: Option<Rounding>, asked: Option<u64>, whole: u64) -> Option<u64> {
        let Some(r) = rounding else {
            return Some(asked.unwrap_or(whole));
        };
        let Some(mut v) = asked.or(r.default) else {
            return Some(whole);
        };
        let min = r.min.unwrap_or(0);
        v = v.max(min);
        if let Some(step) = r.step {
            v = min + (v - min).div_ceil(step) * step;
        }
        match r.max {
            Some(max) if v > max => None,
            _ => Some(v),
        }
    }
}

/// How one GPU is published.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// `slices` layout: `slices` devices of `memory` bytes and `compute`
    /// percent each, `free` of them allocated to no claim.
    Slices {
        slices: u32,
        free: u32,
        memory: u64,
        compute: u64,
    },
    /// `shared` layout: one device whose capacities claims consume.
    Shared {
        memory: u64,
        memory_free: u64,
        compute: u64,
        compute_free: u64,
        memory_rounding: Option<Rounding>,
        compute_rounding: Option<Rounding>,
    },
}

/// What one claim holds on a GPU (the task mix of the fragmentation measure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Slices(u32),
    Share { memory: u64, compute: u64 },
}

/// One GPU a node publishes, and what the allocated claims hold of it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraGpu {
    pub uuid: String,
    pub model: String,
    pub class: String,
    pub shape: Shape,
    pub uses: Vec<Use>,
}

/// A node's GPUs as its ResourceSlices publish them.
#[derive(Debug, Clone, PartialEq)]
pub struct DraNode {
    pub name: String,
    pub gpus: Vec<DraGpu>,
}

fn attribute<'a>(d: &'a Device, driver: &str, name: &str) -> Option<&'a str> {
    let attrs = d.attributes.as_ref()?;
    let a = attrs
        .get(name)
        .or_else(|| attrs.get(&format!("{driver}/{name}")))?;
    a.string.as_deref()
}

fn capacity(d: &Device, name: &str) -> Option<(u64, Option<Rounding>)> {
    let c = d.capacity.as_ref()?.get(name)?;
    let v = quantity::parse(&c.value.0).ok()?;
    Some((v, Rounding::of(c.request_policy.as_ref())))
}

/// Node `name`'s GPUs: its pool's newest complete generation of `slices`
/// (those of `driver` whose `nodeName` is the node) less `allocated` (the
/// allocated devices of every claim in that pool), or why it is unknown.
pub fn node_state(
    name: &str,
    slices: &[&ResourceSlice],
    allocated: &[&Allocated],
    driver: &str,
) -> Result<DraNode, String> {
    let mine: Vec<&ResourceSlice> = slices
        .iter()
        .copied()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(name))
        .collect();
    let Some(generation) = mine.iter().map(|s| s.spec.pool.generation).max() else {
        return Err(format!(
            "no ResourceSlice of {driver} names this node: its GPUs are unknown"
        ));
    };
    let newest: Vec<&ResourceSlice> = mine
        .into_iter()
        .filter(|s| s.spec.pool.generation == generation)
        .collect();
    let want = newest
        .iter()
        .map(|s| s.spec.pool.resource_slice_count)
        .max()
        .unwrap_or(0);
    if (newest.len() as i64) < want {
        return Err(format!(
            "its pool is being rewritten ({} of {want} ResourceSlices at generation {generation}): unknown for now",
            newest.len()
        ));
    }
    let pool = newest
        .first()
        .map(|s| s.spec.pool.name.clone())
        .unwrap_or_default();

    // GPUs in the order their first device is published; device → GPU.
    let mut gpus: Vec<DraGpu> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut device_gpu: BTreeMap<&str, usize> = BTreeMap::new();
    for d in newest.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let uuid = attribute(d, driver, ATTR_UUID)
            .unwrap_or(&d.name)
            .to_owned();
        let (memory, memory_rounding) = capacity(d, CAPACITY_MEMORY).unwrap_or((0, None));
        let (compute, compute_rounding) =
            capacity(d, CAPACITY_COMPUTE).unwrap_or((FULL_PERCENT, None));
        let gi = match index.get(&uuid) {
            Some(&gi) => gi,
            None => {
                let shape = if d.allow_multiple_allocations == Some(true) {
                    Shape::Shared {
                        memory,
                        memory_free: memory,
                        compute,
                        compute_free: compute,
                        memory_rounding,
                        compute_rounding,
                    }
                } else {
                    Shape::Slices {
                        slices: 0,
                        free: 0,
                        memory,
                        compute,
                    }
                };
                gpus.push(DraGpu {
                    uuid: uuid.clone(),
                    model: attribute(d, driver, ATTR_PRODUCT).unwrap_or("").to_owned(),
                    class: attribute(d, driver, ATTR_CLASS).unwrap_or("").to_owned(),
                    shape,
                    uses: Vec::new(),
                });
                index.insert(uuid, gpus.len() - 1);
                gpus.len() - 1
            }
        };
        if let Shape::Slices { slices, free, .. } = &mut gpus[gi].shape {
            *slices += 1;
            *free += 1;
        }
        device_gpu.insert(d.name.as_str(), gi);
    }

    // What the claims hold: a slice device once, a share by its consumed
    // capacity. Per claim and GPU, for the task mix.
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    let mut slices_of: BTreeMap<(&str, usize), u32> = BTreeMap::new();
    for a in allocated.iter().filter(|a| a.pool == pool) {
        let Some(&gi) = device_gpu.get(a.device.as_str()) else {
            continue; // a device of an older generation: gone
        };
        let g = &mut gpus[gi];
        match &mut g.shape {
            Shape::Slices { free, .. } => {
                if taken.insert(a.device.as_str()) {
                    *free = free.saturating_sub(1);
                    *slices_of.entry((a.claim.as_str(), gi)).or_default() += 1;
                }
            }
            Shape::Shared {
                memory,
                memory_free,
                compute,
                compute_free,
                ..
            } => {
                let m = a.memory.unwrap_or(*memory);
                let c = a.compute.unwrap_or(*compute);
                *memory_free = memory_free.saturating_sub(m);
                *compute_free = compute_free.saturating_sub(c);
                g.uses.push(Use::Share {
                    memory: m,
                    compute: c,
                });
            }
        }
    }
    for ((_, gi), n) in slices_of {
        gpus[gi].uses.push(Use::Slices(n));
    }
    Ok(DraNode {
        name: name.to_owned(),
        gpus,
    })
}

/// One way to serve a request of a claim: the devices of one class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskSpec {
    /// The GPU class its device class names (None: any GPU of the driver).
    pub class: Option<String>,
    pub count: u32,
    /// Requested capacities: bytes and percent.
    pub memory: Option<u64>,
    pub compute: Option<u64>,
    /// Its devices on one GPU (a `matchAttribute` constraint on the uuid).
    pub one_gpu: bool,
}

/// One request of a claim: its alternatives, tried in order (one for
/// `exactly`, several for `firstAvailable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// `namespace/name` of the claim and the request's name, for messages.
    pub claim: String,
    pub request: String,
    pub alternatives: Vec<AskSpec>,
}

/// What a pod asks of the driver's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraNeed {
    pub pod: String,
    pub asks: Vec<Ask>,
    /// The nodes its allocated claims are on (None: no claim is allocated).
    pub pinned: Option<BTreeSet<String>>,
}

/// The GPU class a device class of `driver` selects: `Some(None)` for the
/// driver's own class, `Some(Some(class))` for `<class>.<driver>`, None for
/// another driver's.
fn class_of(device_class: &str, driver: &str) -> Option<Option<String>> {
    if device_class == driver {
        return Some(None);
    }
    device_class
        .strip_suffix(driver)
        .and_then(|c| c.strip_suffix('.'))
        .filter(|c| !c.is_empty())
        .map(|c| Some(c.to_owned()))
}

/// The fields `exactly` and a `firstAvailable` entry share.
struct RequestFields<'a> {
    class: &'a str,
    mode: Option<&'a str>,
    count: Option<i64>,
    capacity: Option<&'a BTreeMap<String, Quantity>>,
}

impl<'a> From<&'a ExactDeviceRequest> for RequestFields<'a> {
    fn from(r: &'a ExactDeviceRequest) -> Self {
        RequestFields {
            class: &r.device_class_name,
            mode: r.allocation_mode.as_deref(),
            count: r.count,
            capacity: r.capacity.as_ref().and_then(|c| c.requests.as_ref()),
        }
    }
}

impl<'a> From<&'a DeviceSubRequest> for RequestFields<'a> {
    fn from(r: &'a DeviceSubRequest) -> Self {
        RequestFields {
            class: &r.device_class_name,
            mode: r.allocation_mode.as_deref(),
            count: r.count,
            capacity: r.capacity.as_ref().and_then(|c| c.requests.as_ref()),
        }
    }
}

fn ask_spec(
    f: RequestFields<'_>,
    claim: &str,
    request: &str,
    driver: &str,
    one_gpu: bool,
) -> Result<Option<AskSpec>, DraError> {
    let Some(class) = class_of(f.class, driver) else {
        return Ok(None);
    };
    if let Some(mode) = f.mode.filter(|m| *m != "ExactCount") {
        return Err(DraError::Mode {
            claim: claim.to_owned(),
            request: request.to_owned(),
            mode: mode.to_owned(),
        });
    }
    let count = f.count.unwrap_or(1);
    let Ok(count) = u32::try_from(count)
        .map_err(|_| ())
        .and_then(|c| if c == 0 { Err(()) } else { Ok(c) })
    else {
        return Err(DraError::Count {
            claim: claim.to_owned(),
            request: request.to_owned(),
            count,
        });
    };
    let read = |name: &str| -> Result<Option<u64>, DraError> {
        f.capacity
            .and_then(|c| c.get(name))
            .map(|q| {
                quantity::parse(&q.0).map_err(|e| DraError::Capacity {
                    claim: claim.to_owned(),
                    request: request.to_owned(),
                    name: name.to_owned(),
                    value: q.0.clone(),
                    reason: e.to_string(),
                })
            })
            .transpose()
    };
    Ok(Some(AskSpec {
        class,
        count,
        memory: read(CAPACITY_MEMORY)?,
        compute: read(CAPACITY_COMPUTE)?,
        one_gpu: one_gpu || count == 1,
    }))
}

/// The asks of one unallocated claim: its requests that only the driver's
/// devices serve. A `firstAvailable` request with an alternative of another
/// driver is left to the allocator (it may not need a GPU of ours).
fn claim_asks(claim: &ResourceClaim, driver: &str) -> Result<Vec<Ask>, DraError> {
    let key = claim_key(claim);
    let devices = claim.spec.devices.as_ref();
    let uuid_attr = format!("{driver}/{ATTR_UUID}");
    let constraints: Vec<&k8s_openapi::api::resource::v1::DeviceConstraint> = devices
        .and_then(|d| d.constraints.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.match_attribute.as_deref() == Some(uuid_attr.as_str()))
        .collect();
    let on_one_gpu = |request: &str| {
        constraints.iter().any(|c| {
            c.requests
                .as_ref()
                .is_none_or(|rs| rs.is_empty() || rs.iter().any(|r| r == request))
        })
    };
    let mut asks = Vec::new();
    for r in devices
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
    {
        let one_gpu = on_one_gpu(&r.name);
        let mut alternatives = Vec::new();
        let mut foreign = false;
        if let Some(e) = &r.exactly {
            match ask_spec(e.into(), &key, &r.name, driver, one_gpu)? {
                Some(a) => alternatives.push(a),
                None => foreign = true,
            }
        }
        for s in r.first_available.iter().flatten() {
            let name = format!("{}/{}", r.name, s.name);
            match ask_spec(s.into(), &key, &name, driver, one_gpu || on_one_gpu(&name))? {
                Some(a) => alternatives.push(a),
                None => foreign = true,
            }
        }
        if !foreign && !alternatives.is_empty() {
            asks.push(Ask {
                claim: key.clone(),
                request: r.name.clone(),
                alternatives,
            });
        }
    }
    Ok(asks)
}

/// What `pod` asks of the driver's GPUs through its claims (found by
/// `namespace` and name with `claim`), or None when no claim of it is the
/// driver's.
pub fn need_of(
    pod: &Pod,
    driver: &str,
    claim: impl Fn(&str, &str) -> Option<Arc<ResourceClaim>>,
) -> Result<Option<DraNeed>, DraError> {
    let id = view::pod_key(pod);
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut asks = Vec::new();
    let mut pinned: Option<BTreeSet<String>> = None;
    let mut ours = false;
    for entry in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        let name = match &entry.resource_claim_name {
            Some(n) => n.clone(),
            None => {
                let status = statuses
                    .into_iter()
                    .flatten()
                    .find(|s| s.name == entry.name);
                match status {
                    // Generated, or found not to be needed.
                    Some(s) => match &s.resource_claim_name {
                        Some(n) => n.clone(),
                        None => continue,
                    },
                    None => {
                        return Err(DraError::ClaimNotCreated {
                            pod: id,
                            entry: entry.name.clone(),
                        });
                    }
                }
            }
        };
        let Some(c) = claim(ns, &name) else {
            return Err(DraError::ClaimNotSeen {
                pod: id,
                claim: format!("{ns}/{name}"),
            });
        };
        let held = allocated(&c, driver);
        let is_allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        if is_allocated {
            if held.is_empty() {
                continue; // allocated to other drivers only
            }
            ours = true;
            let pools: BTreeSet<String> = held.into_iter().map(|a| a.pool).collect();
            pinned = Some(match pinned {
                None => pools,
                Some(p) => p.intersection(&pools).cloned().collect(),
            });
            continue;
        }
        let a = claim_asks(&c, driver)?;
        ours |= !a.is_empty();
        asks.extend(a);
    }
    Ok(ours.then_some(DraNeed {
        pod: id,
        asks,
        pinned,
    }))
}

/// What a pod asking `tessera.dev/vgpu` asks of a node that only DRA serves
/// (Kubernetes' `DRAExtendedResource`: the DeviceClass of the driver names
/// the resource, and the scheduler allocates each container's count as that
/// many devices of the class, anywhere on the node).
pub fn from_slices(need: &crate::view::PodNeed) -> DraNeed {
    DraNeed {
        pod: need.pod.clone(),
        asks: need
            .containers
            .iter()
            .map(|c| Ask {
                claim: format!("{}'s {}", need.pod, tessera_contract::labels::RESOURCE),
                request: c.name.clone(),
                alternatives: vec![AskSpec {
                    class: need.class.clone(),
                    count: c.slices,
                    memory: None,
                    compute: None,
                    one_gpu: c.slices == 1,
                }],
            })
            .collect(),
        pinned: None,
    }
}

/// GPUs the same engine can rank together: one cut of slices (with its
/// slice's capacities), or shares under the same request policies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Slices {
        slices: u32,
        memory: u64,
        compute: u64,
    },
    Shared {
        memory: Option<Rounding>,
        compute: Option<Rounding>,
    },
}

fn group_of(g: &DraGpu) -> Group {
    match g.shape {
        Shape::Slices {
            slices,
            memory,
            compute,
            ..
        } => Group::Slices {
            slices,
            memory,
            compute,
        },
        Shape::Shared {
            memory_rounding,
            compute_rounding,
            ..
        } => Group::Shared {
            memory: memory_rounding,
            compute: compute_rounding,
        },
    }
}

fn engine_gpu(g: &DraGpu) -> Gpu {
    match g.shape {
        // The one slice adapter, as `view` counts a GPU of slices.
        Shape::Slices { slices, free, .. } => {
            tessera_placement::slices::slice_gpu(&g.model, &g.class, slices, free, None)
        }
        Shape::Shared {
            memory,
            memory_free,
            compute,
            compute_free,
            ..
        } => Gpu {
            model: g.model.clone(),
            class: g.class.clone(),
            memory_mib: memory / MIB,
            memory_free_mib: memory_free / MIB,
            compute_free: permille(compute_free, compute),
            slices: 0,
            slices_free: 0,
            utilization: None,
        },
    }
}

/// `part` of `whole` percent-capacity in thousandths of the GPU, at most 1000.
fn permille(part: u64, whole: u64) -> u32 {
    (part.min(whole) * u64::from(MILLI))
        .checked_div(whole)
        .unwrap_or(0) as u32
}

/// The engine requests that serve `ask` on GPUs of `group` (placed in
/// turn), or None when no GPU of the group can.
fn requests(ask: &AskSpec, group: &Group) -> Option<Vec<Request>> {
    let one = |gpu: GpuNeed| Request {
        cpu_milli: 0,
        memory_mib: 0,
        gpu,
        models: ask.class.iter().cloned().collect(),
    };
    match *group {
        Group::Slices {
            slices,
            memory,
            compute,
        } => {
            // A slice device must hold what the request asks of it.
            if ask.memory.is_some_and(|m| m > memory) || ask.compute.is_some_and(|c| c > compute) {
                return None;
            }
            if ask.one_gpu {
                if ask.count > slices {
                    return None;
                }
                view::slice_request(ask.count, slices, &ask.class).map(|r| vec![r])
            } else {
                let r = view::slice_request(1, slices, &ask.class)?;
                Some(vec![r; ask.count as usize])
            }
        }
        Group::Shared { memory, compute } => {
            // Per share; `whole` stands for "the whole device".
            const WHOLE: u64 = u64::MAX;
            let m = Rounding::consumed(memory, ask.memory, WHOLE)?;
            let c = Rounding::consumed(compute, ask.compute, FULL_PERCENT)?;
            let n = if ask.one_gpu { u64::from(ask.count) } else { 1 };
            let compute = c.saturating_mul(n).saturating_mul(10);
            if compute > u64::from(MILLI) {
                return None;
            }
            let memory = if m == WHOLE {
                MemoryNeed::PerMille(MILLI)
            } else {
                MemoryNeed::Mib(m.saturating_mul(n).div_ceil(MIB))
            };
            let share = one(GpuNeed::Share {
                compute: compute as u32,
                memory,
                slices: 0,
            });
            let times = if ask.one_gpu { 1 } else { ask.count as usize };
            Some(vec![share; times])
        }
    }
}

/// The engine request a GPU's use stands for, in its group.
fn use_request(u: &Use, group: &Group) -> Option<Request> {
    match (u, group) {
        (Use::Slices(k), Group::Slices { slices, .. }) => view::slice_request(*k, *slices, &None),
        (Use::Share { memory, compute }, Group::Shared { .. }) => Some(Request {
            cpu_milli: 0,
            memory_mib: 0,
            gpu: GpuNeed::Share {
                compute: (compute.saturating_mul(10)).min(u64::from(MILLI)) as u32,
                memory: MemoryNeed::Mib(memory.div_ceil(MIB)),
                slices: 0,
            },
            models: Vec::new(),
        }),
        _ => None,
    }
}

/// An engine over the GPUs of one group of some nodes, and the way back to
/// the nodes.
struct GroupEngine {
    engine: Engine,
    /// Engine node index → index into the given nodes.
    back: Vec<usize>,
}

fn group_engine(
    nodes: &[&DraNode],
    group: &Group,
    policy: Policy,
    need: &DraNeed,
) -> Option<GroupEngine> {
    let mut enodes = Vec::new();
    let mut back = Vec::new();
    let mut mix: Vec<Request> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let gpus: Vec<&DraGpu> = n.gpus.iter().filter(|g| &group_of(g) == group).collect();
        if gpus.is_empty() {
            continue;
        }
        for g in &gpus {
            mix.extend(g.uses.iter().filter_map(|u| use_request(u, group)));
        }
        let egpus = gpus.iter().map(|g| engine_gpu(g)).collect();
        enodes.push(Node::new(n.name.clone(), UNCOUNTED, UNCOUNTED, egpus));
        back.push(i);
    }
    if enodes.is_empty() {
        return None;
    }
    for a in &need.asks {
        if let Some(r) = a.alternatives.first().and_then(|s| requests(s, group)) {
            mix.extend(r);
        }
    }
    let mix = TaskMix::from_requests(&mix, 1.0);
    match Engine::new(enodes, policy, &mix) {
        Ok(engine) => Some(GroupEngine { engine, back }),
        Err(e) => {
            // The GPUs are built here from what was published; a bug.
            tracing::error!(error = %e, "placement engine refused the DRA view");
            None
        }
    }
}

fn groups(nodes: &[&DraNode]) -> Vec<Group> {
    let mut g: Vec<Group> = nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(group_of))
        .collect();
    g.sort();
    g.dedup();
    g
}

fn describe(s: &AskSpec) -> String {
    let mut parts = vec![format!(
        "{} device{}",
        s.count,
        if s.count == 1 { "" } else { "s" }
    )];
    if let Some(m) = s.memory {
        parts.push(format!(
            "memory {}",
            tessera_contract::units::format_bytes(m)
        ));
    }
    if let Some(c) = s.compute {
        parts.push(format!("compute {c}%"));
    }
    if let Some(c) = &s.class {
        parts.push(format!("class {c:?}"));
    }
    if s.one_gpu && s.count > 1 {
        parts.push("on one GPU".into());
    }
    parts.join(", ")
}

/// Whether `node` can hold every ask of `need`, placed in turn by `policy`
/// (each request tries its alternatives in order), or why not.
pub fn fits(node: &DraNode, need: &DraNeed, policy: Policy) -> Result<(), String> {
    if let Some(pinned) = &need.pinned
        && !pinned.contains(&node.name)
    {
        let on: Vec<&str> = pinned.iter().map(String::as_str).collect();
        return Err(format!(
            "the pod's allocated claims are on {}",
            if on.is_empty() {
                "no single node".to_owned()
            } else {
                on.join(", ")
            }
        ));
    }
    let all = [node];
    let mut engines: Vec<(Group, GroupEngine)> = groups(&all)
        .into_iter()
        .filter_map(|g| group_engine(&all, &g, policy, need).map(|e| (g, e)))
        .collect();
    'ask: for ask in &need.asks {
        for spec in &ask.alternatives {
            for (group, ge) in &mut engines {
                let Some(reqs) = requests(spec, group) else {
                    continue;
                };
                let mut placed = Vec::new();
                let mut ok = true;
                for r in &reqs {
                    match ge.engine.place(r) {
                        Ok(c) => placed.push((c, r)),
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    continue 'ask;
                }
                for (c, r) in placed {
                    // Gives back exactly what `place` took.
                    let _ = ge.engine.release(&c, r);
                }
            }
        }
        let what: Vec<String> = ask.alternatives.iter().map(describe).collect();
        return Err(format!(
            "no GPU holds {} for claim {} request {:?}",
            what.join(" or "),
            ask.claim,
            ask.request
        ));
    }
    Ok(())
}

/// Filter: the names that can hold the pod, and why each other one cannot.
pub fn filter(
    names: &[String],
    states: &BTreeMap<String, Result<DraNode, String>>,
    need: &DraNeed,
) -> (Vec<String>, BTreeMap<String, String>) {
    // Fit does not depend on the policy; binpack is the cheapest.
    view::verdicts(names, states, |n| fits(n, need, Policy::Binpack))
}

/// Prioritize: every candidate scored by the engine's order for the pod's
/// largest ask (its first alternative), as `view::prioritize` scores slice
/// pods: 10 for the best, 1 for the worst that holds it, 0 for a node that
/// cannot or that the extender does not know. The task mix is what the
/// claims on the candidates hold, and the pod's asks.
pub fn prioritize(
    names: &[String],
    states: &BTreeMap<String, Result<DraNode, String>>,
    need: &DraNeed,
    policy: Policy,
) -> Vec<HostPriority> {
    let known: Vec<&DraNode> = names
        .iter()
        .filter_map(|n| states.get(n).and_then(|s| s.as_ref().ok()))
        .filter(|n| need.pinned.as_ref().is_none_or(|p| p.contains(&n.name)))
        .collect();
    let biggest = need
        .asks
        .iter()
        .filter_map(|a| a.alternatives.first())
        .max_by_key(|s| (s.count, s.memory, s.compute));
    let mut ranked: Vec<(tessera_placement::Rank, &str)> = Vec::new();
    if let Some(spec) = biggest {
        for group in groups(&known) {
            let Some(req) = requests(spec, &group).and_then(|r| r.into_iter().next()) else {
                continue;
            };
            let Some(mut ge) = group_engine(&known, &group, policy, need) else {
                continue;
            };
            let all: Vec<usize> = (0..ge.engine.len()).collect();
            let Ok(order) = ge.engine.ranked(&req, &all) else {
                continue;
            };
            for (i, r) in order {
                ranked.push((r, known[ge.back[i]].name.as_str()));
            }
        }
    } else {
        // Only allocated claims: the pinned nodes, equally.
        for n in &known {
            ranked.push((tessera_placement::Rank([0.0; 4]), n.name.as_str()));
        }
    }
    view::scores(names, ranked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        CapacityRequestPolicyRange, DeviceAttribute, DeviceCapacity, ResourcePool,
        ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const GI: u64 = 1 << 30;
    const D: &str = "vgpu.tessera.dev";

    fn attrs(uuid: &str) -> Option<BTreeMap<String, DeviceAttribute>> {
        Some(BTreeMap::from([
            (
                ATTR_UUID.to_owned(),
                DeviceAttribute {
                    string: Some(uuid.into()),
                    ..Default::default()
                },
            ),
            (
                ATTR_PRODUCT.to_owned(),
                DeviceAttribute {
                    string: Some("NVIDIA A100".into()),
                    ..Default::default()
                },
            ),
        ]))
    }

    fn cap(v: &str, policy: Option<CapacityRequestPolicy>) -> DeviceCapacity {
        DeviceCapacity {
            value: Quantity(v.into()),
            request_policy: policy,
        }
    }

    fn shared_device(uuid: &str) -> Device {
        let range = |min: &str, step: &str, max: Option<&str>| CapacityRequestPolicyRange {
            min: Quantity(min.into()),
            step: Some(Quantity(step.into())),
            max: max.map(|m| Quantity(m.into())),
        };
        Device {
            name: format!("gpu-{uuid}"),
            attributes: attrs(uuid),
            allow_multiple_allocations: Some(true),
            capacity: Some(BTreeMap::from([
                (
                    CAPACITY_MEMORY.to_owned(),
                    cap(
                        "16Gi",
                        Some(CapacityRequestPolicy {
                            default: Some(Quantity("1Gi".into())),
                            valid_range: Some(range("1Gi", "256Mi", None)),
                            valid_values: None,
                        }),
                    ),
                ),
                (
                    CAPACITY_COMPUTE.to_owned(),
                    cap(
                        "100",
                        Some(CapacityRequestPolicy {
                            default: Some(Quantity("25".into())),
                            valid_range: Some(range("1", "1", Some("100"))),
                            valid_values: None,
                        }),
                    ),
                ),
            ])),
            ..Default::default()
        }
    }

    fn slice_devices(uuid: &str, n: u32) -> Vec<Device> {
        (0..n)
            .map(|i| Device {
                name: format!("gpu-{uuid}-s{i}"),
                attributes: attrs(uuid),
                capacity: Some(BTreeMap::from([
                    (CAPACITY_MEMORY.to_owned(), cap("4Gi", None)),
                    (CAPACITY_COMPUTE.to_owned(), cap("25", None)),
                ])),
                ..Default::default()
            })
            .collect()
    }

    fn slice(
        node: &str,
        i: usize,
        of: i64,
        generation: i64,
        devices: Vec<Device>,
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{node}-{D}-{i}")),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: D.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: node.into(),
                    generation,
                    resource_slice_count: of,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn share(claim: &str, device: &str, memory: u64, compute: u64) -> Allocated {
        Allocated {
            claim: claim.into(),
            pool: "n".into(),
            device: device.into(),
            memory: Some(memory),
            compute: Some(compute),
        }
    }

    fn ask(count: u32, memory: Option<u64>, compute: Option<u64>, one_gpu: bool) -> DraNeed {
        DraNeed {
            pod: "ns/p".into(),
            asks: vec![Ask {
                claim: "ns/c".into(),
                request: "gpu".into(),
                alternatives: vec![AskSpec {
                    class: None,
                    count,
                    memory,
                    compute,
                    one_gpu: one_gpu || count == 1,
                }],
            }],
            pinned: None,
        }
    }

    #[test]
    fn shared_gpus_lose_what_claims_consumed_and_requests_round_up_by_the_policy() {
        let s = slice("n", 0, 1, 3, vec![shared_device("a"), shared_device("b")]);
        let held = [
            share("ns/x", "gpu-a", 12 * GI, 70),
            share("ns/y", "gpu-a", 2 * GI, 10),
            // Of an older generation's device: gone, not counted.
            share("ns/z", "gpu-gone", 16 * GI, 100),
        ];
        let refs: Vec<&Allocated> = held.iter().collect();
        let n = node_state("n", &[&s], &refs, D).unwrap();
        assert_eq!(n.gpus.len(), 2);
        let Shape::Shared {
            memory_free,
            compute_free,
            ..
        } = n.gpus[0].shape
        else {
            panic!("shared");
        };
        assert_eq!((memory_free, compute_free), (2 * GI, 20));
        assert_eq!(n.gpus[0].uses.len(), 2);
        // GPU a alone: 2Gi and 20% fit; 2.1Gi rounds up to 2.25Gi (1Gi +
        // n·256Mi), which does not.
        let only_a = slice("n", 0, 1, 3, vec![shared_device("a")]);
        let a = node_state("n", &[&only_a], &refs, D).unwrap();
        assert!(fits(&a, &ask(1, Some(2 * GI), Some(20), false), Policy::Binpack).is_ok());
        let e = fits(
            &a,
            &ask(1, Some(2 * GI + 100 * MIB), Some(20), false),
            Policy::Binpack,
        )
        .unwrap_err();
        assert!(e.contains("memory") && e.contains("20%"), "{e}");
        assert!(fits(&a, &ask(1, Some(GI), Some(21), false), Policy::Binpack).is_err());
        // Not asked: the policy's defaults (1Gi, 25%): more compute than a has.
        assert!(fits(&a, &ask(1, None, None, false), Policy::Binpack).is_err());
        assert!(fits(&n, &ask(1, None, None, false), Policy::Binpack).is_ok());
        // Two 8Gi shares on one GPU fit b only; anywhere, a and b could not
        // hold three.
        let mut two = ask(2, Some(8 * GI), Some(40), true);
        assert!(fits(&n, &two, Policy::Binpack).is_ok());
        two.asks[0].alternatives[0].count = 3;
        two.asks[0].alternatives[0].one_gpu = false;
        assert!(fits(&n, &two, Policy::Binpack).is_err());
        // Rounding: the default when not asked; the maximum refused.
        let r = Rounding {
            default: Some(26),
            min: Some(1),
            step: Some(5),
            max: Some(100),
        };
        assert_eq!(Rounding::consumed(Some(r), None, 100), Some(26));
        assert_eq!(Rounding::consumed(Some(r), Some(7), 100), Some(11));
        assert_eq!(Rounding::consumed(Some(r), Some(101), 100), None);
        assert_eq!(Rounding::consumed(None, None, 100), Some(100));
    }

    #[test]
    fn slice_gpus_count_allocated_devices_once_and_an_incomplete_pool_is_unknown() {
        let s = slice("n", 0, 1, 1, {
            let mut d = slice_devices("a", 4);
            d.extend(slice_devices("b", 4));
            d
        });
        let taken = |claim: &str, dev: &str| Allocated {
            claim: claim.into(),
            pool: "n".into(),
            device: dev.into(),
            memory: None,
            compute: None,
        };
        let held = [
            taken("ns/x", "gpu-a-s0"),
            taken("ns/x", "gpu-a-s1"),
            taken("ns/y", "gpu-a-s1"), // the same device twice: once
            taken("ns/y", "gpu-b-s0"),
        ];
        let refs: Vec<&Allocated> = held.iter().collect();
        let n = node_state("n", &[&s], &refs, D).unwrap();
        let free: Vec<u32> = n
            .gpus
            .iter()
            .map(|g| match g.shape {
                Shape::Slices { free, .. } => free,
                Shape::Shared { .. } => panic!("slices"),
            })
            .collect();
        assert_eq!(free, [2, 3]);
        // 3 slices on one GPU: b only has them; 5 on one GPU: none.
        assert!(fits(&n, &ask(3, None, None, true), Policy::Binpack).is_ok());
        assert!(fits(&n, &ask(5, None, None, true), Policy::Binpack).is_err());
        // 5 slices anywhere: 2 + 3.
        assert!(fits(&n, &ask(5, None, None, false), Policy::Binpack).is_ok());
        // A slice of 4Gi cannot serve a request of 5Gi.
        assert!(fits(&n, &ask(1, Some(5 * GI), None, false), Policy::Binpack).is_err());

        // Generation 2 is being written: 1 of 2 slices there.
        let newer = slice("n", 0, 2, 2, slice_devices("a", 4));
        let e = node_state("n", &[&s, &newer], &[], D).unwrap_err();
        assert!(e.contains("being rewritten"), "{e}");
        let e = node_state("other", &[&s], &[], D).unwrap_err();
        assert!(e.contains("unknown"), "{e}");
    }

    #[test]
    fn device_classes_name_the_driver_and_its_gpu_classes() {
        assert_eq!(class_of(D, D), Some(None));
        assert_eq!(
            class_of("high-performance.vgpu.tessera.dev", D),
            Some(Some("high-performance".into()))
        );
        assert_eq!(class_of("gpu.nvidia.com", D), None);
        assert_eq!(class_of(".vgpu.tessera.dev", D), None);
        assert_eq!(class_of("xvgpu.tessera.dev", D), None);
    }
}
