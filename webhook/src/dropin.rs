//! Other projects' words into Tessera's request: a pure function from a pod written for
//! HAMi, KAI-Scheduler or Volcano's vGPU to the slices (`tessera.dev/vgpu`) each of its
//! containers needs, or the reasons Tessera cannot honour it.
//!
//! Tessera's unit is the slice: a node's GPU is cut into `slices_per_gpu` slices of
//! `memory` and `100% / slices_per_gpu` compute each, and a container's limits on a GPU
//! are its slices there times the slice size. So every ask becomes "so many slices of one
//! GPU"; an ask that is not a whole number of slices is rounded up (the pod gets at least
//! what it asked, the admission response warns, the original words stay on the pod) or,
//! with [`Rounding::Refuse`], refused. What Tessera cannot promise at all (more than a
//! GPU, a share on each of several GPUs, a model list no node has) is refused with the
//! pod's words. HAMi's model and UUID lists become Tessera's own list annotations
//! (`tessera_contract::gpu_filter`), which the device plugin and the extender hold the
//! pod to, and the admission turns into node affinity where a node label says it.
//! The names are the contract's ([`tessera_contract::dropin`]); docs/dropin.md is the
//! table of what each word becomes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{Map, Value, json};
use tessera_contract::dropin::*;

/// Which dialects a cluster accepts and how big its slices are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Dialects translated; a pod in another one is left exactly as it came (its own
    /// scheduler and device plugin may still serve it on nodes Tessera does not run on).
    pub dialects: BTreeSet<Dialect>,
    pub slice: SliceShape,
    pub rounding: Rounding,
    /// KAI-Scheduler picks the GPU (docs/dropin.md, "Who picks the GPU"): a KAI pod keeps
    /// its fraction annotations and what KAI's admission added, so KAI places it as a
    /// fraction and its binder reserves the GPU, which the device plugin then serves;
    /// only `NVIDIA_VISIBLE_DEVICES` comes off (the device plugin names the GPU). Off:
    /// all of KAI's words come off and Tessera picks the GPU on KAI's node.
    pub kai_gpu_choice: bool,
    /// The GPU models (product names, as the nodes' `gpu-product.tessera.dev/` labels
    /// come from) the cluster's nodes have. Empty: not known here; then a model list is
    /// not checked at admission and gets no node affinity (the device plugin and the
    /// extender still hold the pod to it).
    pub gpu_models: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dialects: Dialect::ALL.into_iter().collect(),
            slice: SliceShape::default(),
            rounding: Rounding::Up,
            kai_gpu_choice: false,
            gpu_models: Vec::new(),
        }
    }
}

/// The slice the cluster's GPU nodes advertise (the node config's default slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceShape {
    /// Memory of one slice, MiB.
    pub memory_mib: u64,
    /// Slices per GPU; one slice's compute is `100% / per_gpu`.
    pub per_gpu: u32,
}

impl Default for SliceShape {
    /// The chart's default node config: 4 GiB slices, 8 per GPU.
    fn default() -> Self {
        SliceShape {
            memory_mib: 4096,
            per_gpu: 8,
        }
    }
}

/// What to do with an ask that is not a whole number of slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Give the next whole number of slices, and say so in a warning.
    Up,
    /// Refuse the pod, naming the slice size.
    Refuse,
}

impl Rounding {
    pub fn parse(s: &str) -> Result<Rounding, String> {
        match s {
            "up" => Ok(Rounding::Up),
            "refuse" => Ok(Rounding::Refuse),
            other => Err(format!(
                "unknown drop-in rounding {other:?}; expected \"up\" or \"refuse\""
            )),
        }
    }
}

/// One container's translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// `true` for an init container.
    pub init: bool,
    /// Its index in its list.
    pub index: usize,
    pub name: String,
    /// Slices of `tessera.dev/vgpu` it gets.
    pub slices: u32,
    /// The resource names to take off its limits and requests.
    pub remove: Vec<String>,
    /// What it asked for where that is less than its slices (a 3000 MiB ask on 4 GiB
    /// slices), for [`ANNOTATION_EXACT_LIMITS`]: the node enforces exactly this.
    pub exact: Exact,
    /// Variables to take off its env: those KAI-Scheduler's admission pointed at the
    /// ConfigMap its binder writes its GPU choice into. Tessera's device plugin names the
    /// GPU; a pod's own plain value stays (and is refused as for any slice container).
    pub remove_env: Vec<String>,
    /// ConfigMaps to take off its `envFrom`: the one KAI-Scheduler's admission added
    /// (`<prefix>-<n>-evar`), which only KAI's binder creates, so the container could
    /// never start.
    pub remove_env_from: Vec<String>,
}

/// A container's exact ask, where it is below what its whole slices give. `None`: the
/// slices' own value is the ask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exact {
    pub memory_mib: Option<u64>,
    pub compute_percent: Option<u64>,
    /// A share of the card's memory (`gpumem-percentage`, a KAI fraction), in millionths
    /// of the card: only the node knows the card, so it works out the bytes
    /// ([`ANNOTATION_EXACT_MEMORY_PERCENT`]).
    pub memory_ppm: Option<u32>,
    /// A share of the card's compute in millionths of the GPU: a KAI fraction's, which
    /// is a share of the whole GPU (`0.3` is 300,000, `0.333` 333,000), written beside
    /// its memory share (`computePercent` in [`ANNOTATION_EXACT_MEMORY_PERCENT`]: a
    /// fraction of a percent does not fit `dropin-limits`' whole percent).
    pub compute_ppm: Option<u32>,
}

/// A pod's translation.
#[derive(Debug, Clone, PartialEq)]
pub struct Translation {
    pub dialect: Dialect,
    pub containers: Vec<ContainerPlan>,
    /// `tessera.dev/priority` to set, from HAMi's `nvidia.com/priority`.
    pub priority: Option<i32>,
    /// A container asked for a compute share (HAMi's `gpucores`, Volcano's `vgpu-cores`):
    /// in those projects a cap, so the pod gets `tessera.dev/compute-policy: guaranteed`
    /// (its share is a cap even on an idle GPU) rather than the node's `burst`.
    pub cap_compute: bool,
    /// Pod annotations to take off (KAI's: left on, KAI would reserve a GPU for them).
    pub remove_annotations: Vec<String>,
    /// Pod volumes to take off (with their mounts): the ConfigMap volume KAI-Scheduler's
    /// admission added (`<prefix>-<n>-vol`), whose ConfigMap only KAI's binder creates.
    pub remove_volumes: Vec<String>,
    /// The original words, for [`ANNOTATION_ORIGINAL`].
    pub original: Value,
    /// What the user should know: rounding, policies Tessera's placement decides.
    pub warnings: Vec<String>,
    /// The vendor whose GPUs the pod asked for in that vendor's own words (HAMi's
    /// `amd.com/gpumem`, ...), for `tessera.dev/gpu-vendor`; `None` for NVIDIA's words,
    /// which have always meant any Tessera GPU.
    pub vendor: Option<tessera_contract::Vendor>,
    /// Tessera's GPU-list annotations ([`tessera_contract::gpu_filter`]) to set, from
    /// HAMi's model and UUID lists: (Tessera's key, the pod's value).
    pub gpu_lists: Vec<(&'static str, String)>,
}

/// Translates `pod`, or says why Tessera cannot honour it (each line names the field and
/// quotes the pod's value). `Ok(None)`: the pod uses no accepted dialect.
pub fn translate(pod: &Pod, config: &Config) -> Result<Option<Translation>, Vec<String>> {
    // Borrowed, not cloned: every pod the webhook sees passes here, and a review's memory
    // is budgeted per body byte (server::PARSE_COST).
    let no_annotations = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&no_annotations);
    let no_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let containers: Vec<(bool, usize, &Container)> = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (true, i, c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (false, i, c)),
        )
        .collect();
    let accepts = |d| config.dialects.contains(&d);
    let hami = accepts(Dialect::Hami)
        && (containers.iter().any(|(_, _, c)| is_hami(c))
            || HAMI_POD_ANNOTATIONS
                .iter()
                .any(|k| annotations.contains_key(*k)));
    let volcano = accepts(Dialect::Volcano)
        && containers
            .iter()
            .any(|(_, _, c)| VOLCANO_RESOURCES.iter().any(|r| word(c, r).is_some()));
    let kai = accepts(Dialect::Kai)
        && [
            KAI_GPU_FRACTION,
            KAI_GPU_MEMORY,
            KAI_GPU_FRACTION_NUM_DEVICES,
        ]
        .iter()
        .any(|k| annotations.contains_key(*k));
    let used: Vec<Dialect> = [
        (hami, Dialect::Hami),
        (kai, Dialect::Kai),
        (volcano, Dialect::Volcano),
    ]
    .into_iter()
    .filter_map(|(on, d)| on.then_some(d))
    .collect();
    let dialect = match used.as_slice() {
        [] => return Ok(None),
        [d] => *d,
        many => {
            let names: Vec<&str> = many.iter().map(|d| d.as_str()).collect();
            return Err(vec![format!(
                "the pod uses the words of several GPU-sharing projects ({}); use one",
                names.join(", ")
            )]);
        }
    };
    let mut t = Translation {
        dialect,
        containers: Vec::new(),
        priority: None,
        cap_compute: false,
        remove_annotations: Vec::new(),
        remove_volumes: Vec::new(),
        original: Value::Null,
        warnings: Vec::new(),
        vendor: None,
        gpu_lists: Vec::new(),
    };
    let mut refusals = Vec::new();
    let mut original = Map::new();
    original.insert("dialect".into(), json!(dialect.as_str()));
    match dialect {
        Dialect::Hami => hami_pod(&containers, annotations, config, &mut t, &mut refusals),
        Dialect::Volcano => volcano_pod(&containers, config, &mut t, &mut refusals),
        Dialect::Kai => kai_pod(&containers, annotations, config, &mut t, &mut refusals),
    }
    // KAI's admission's ConfigMap volume (`<its prefix>-<n>-vol` of ConfigMap
    // `<prefix>-<n>`): only KAI's binder creates that ConfigMap, and a pod whose volume's
    // ConfigMap never comes never starts.
    if dialect == Dialect::Kai
        && !config.kai_gpu_choice
        && let Some(p) = annotations.get(KAI_CONFIGMAP_ANNOTATION)
    {
        let prefix = format!("{p}-");
        t.remove_volumes = spec
            .volumes
            .iter()
            .flatten()
            .filter(|v| {
                v.config_map.as_ref().is_some_and(|c| {
                    c.name.starts_with(&prefix) && v.name == format!("{}-vol", c.name)
                })
            })
            .map(|v| v.name.clone())
            .collect();
    }
    let policy_key = tessera_contract::labels::ANNOTATION_COMPUTE_POLICY;
    if t.cap_compute
        && let Some(v) = annotations.get(policy_key)
        && v != "guaranteed"
    {
        refusals.push(format!(
            "a compute share ({HAMI_GPUCORES} or {VOLCANO_VGPU_CORES}) is a cap, which Tessera's compute policy \"guaranteed\" gives, but the annotation {policy_key}: {v:?} says otherwise; remove one"
        ));
    }
    let vendor_key = tessera_contract::labels::ANNOTATION_GPU_VENDOR;
    if let Some(v) = t.vendor
        && let Some(theirs) = annotations.get(vendor_key)
        && theirs.trim() != v.as_str()
    {
        refusals.push(format!(
            "the pod asks in HAMi's words for {v} cards but the annotation {vendor_key}: {theirs:?} says otherwise; remove one"
        ));
    }
    let mut words = Map::new();
    for plan in &t.containers {
        let c = containers
            .iter()
            .find(|(init, index, _)| *init == plan.init && *index == plan.index)
            .map(|(_, _, c)| *c);
        let mut mine = Map::new();
        for name in &plan.remove {
            if let Some(v) = c.and_then(|c| word(c, name)) {
                mine.insert(name.clone(), json!(v));
            }
        }
        if !mine.is_empty() {
            words.insert(plan.name.clone(), Value::Object(mine));
        }
    }
    if !words.is_empty() {
        original.insert("containers".into(), Value::Object(words));
    }
    let pod_words: Map<String, Value> = annotations
        .iter()
        .filter(|(k, _)| {
            KAI_ANNOTATIONS.contains(&k.as_str()) || HAMI_POD_ANNOTATIONS.contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    if !pod_words.is_empty() {
        original.insert("annotations".into(), Value::Object(pod_words));
    }
    t.original = Value::Object(original);
    if refusals.is_empty() {
        Ok(Some(t))
    } else {
        Err(refusals)
    }
}

/// HAMi's pod annotations.
const HAMI_POD_ANNOTATIONS: [&str; 6] = [
    HAMI_USE_GPUTYPE,
    HAMI_NOUSE_GPUTYPE,
    HAMI_USE_GPUUUID,
    HAMI_NOUSE_GPUUUID,
    HAMI_GPU_SCHEDULER_POLICY,
    HAMI_NODE_SCHEDULER_POLICY,
];

fn is_hami(c: &Container) -> bool {
    HAMI_SHARING_RESOURCES.iter().any(|r| word(c, r).is_some())
        || HAMI_VENDORS
            .iter()
            .any(|v| [v.gpumem, v.gpucores].iter().any(|r| word(c, r).is_some()))
}

/// The names of HAMi's resources for one vendor's cards: NVIDIA's (`nvidia.com/*`, with
/// a memory percentage and a priority) or another vendor's (`amd.com/*`,
/// `hygon.com/dcu*`: count, MiB and percent of the cores only).
#[derive(Debug, Clone, Copy)]
struct HamiWords {
    vendor: Option<tessera_contract::Vendor>,
    gpu: &'static str,
    gpumem: &'static str,
    gpumem_percentage: Option<&'static str>,
    gpucores: &'static str,
    priority: Option<&'static str>,
}

const HAMI_NVIDIA_WORDS: HamiWords = HamiWords {
    vendor: None,
    gpu: HAMI_GPU,
    gpumem: HAMI_GPUMEM,
    gpumem_percentage: Some(HAMI_GPUMEM_PERCENTAGE),
    gpucores: HAMI_GPUCORES,
    priority: Some(HAMI_PRIORITY),
};

impl HamiWords {
    fn all(self) -> impl Iterator<Item = &'static str> {
        [
            Some(self.gpu),
            Some(self.gpumem),
            self.gpumem_percentage,
            Some(self.gpucores),
            self.priority,
        ]
        .into_iter()
        .flatten()
    }
}

/// Which vendor's HAMi words a container uses, or the refusal when it mixes two.
fn hami_words(c: &Container) -> Result<HamiWords, String> {
    let sets = std::iter::once(HAMI_NVIDIA_WORDS).chain(HAMI_VENDORS.iter().map(|v| HamiWords {
        vendor: Some(v.vendor),
        gpu: v.gpu,
        gpumem: v.gpumem,
        gpumem_percentage: None,
        gpucores: v.gpucores,
        priority: None,
    }));
    // A vendor's card count alone is its own device plugin's word: it does not pick the
    // set, the sharing words do.
    let used: Vec<HamiWords> = sets
        .filter(|w| {
            w.all()
                .filter(|r| *r != w.gpu)
                .any(|r| word(c, r).is_some())
        })
        .collect();
    match used.as_slice() {
        [one] => Ok(*one),
        [] => Ok(HAMI_NVIDIA_WORDS),
        many => Err(format!(
            "container {:?} uses HAMi's words for several vendors' cards ({}); a container's slices are on one GPU, ask in one vendor's words",
            c.name,
            many.iter().map(|w| w.gpumem).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The container's value for a resource: limits first (extended resources must have
/// requests equal to limits, so limits are what counts), else requests.
fn word(c: &Container, name: &str) -> Option<String> {
    let r = c.resources.as_ref()?;
    r.limits
        .as_ref()
        .and_then(|l| l.get(name))
        .or_else(|| r.requests.as_ref().and_then(|l| l.get(name)))
        .map(|q| q.0.clone())
}

/// How much of one GPU a container asks for, in the dialect's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Memory {
    /// The whole card's memory (HAMi's and Volcano's default when none is given).
    Whole,
    Mib(u64),
    Percent(u64),
    /// KAI's fraction of a GPU.
    Fraction(f64),
}

struct Ask<'a> {
    container: &'a str,
    /// The field and value that set the memory, for messages.
    memory_field: Option<(&'a str, String)>,
    memory: Memory,
    cores: Option<(&'a str, u64)>,
    gpus: u32,
    gpus_field: Option<&'a str>,
}

/// Slices for an ask and the exact limits below them, or the refusal. Rounding warnings
/// go to `warnings`.
fn slices_for(
    ask: &Ask<'_>,
    config: &Config,
    warnings: &mut Vec<String>,
) -> Result<(u32, Exact), String> {
    let shape = config.slice;
    let per_gpu = f64::from(shape.per_gpu);
    let who = format!("container {:?}", ask.container);
    let memory_slices = match ask.memory {
        Memory::Whole => per_gpu,
        Memory::Mib(m) => m as f64 / shape.memory_mib as f64,
        Memory::Percent(p) => p as f64 * per_gpu / 100.0,
        Memory::Fraction(f) => f * per_gpu,
    };
    let core_slices = ask.cores.map_or(0.0, |(_, c)| c as f64 * per_gpu / 100.0);
    let need = memory_slices.max(core_slices);
    if need > per_gpu + 1e-9 {
        let (field, value) = ask
            .memory_field
            .clone()
            .unwrap_or(("memory", String::new()));
        return Err(format!(
            "{who}: {field}: {value:?} is more than one GPU holds here ({} slices of {} MiB); ask for at most {} MiB per GPU",
            shape.per_gpu,
            shape.memory_mib,
            u64::from(shape.per_gpu) * shape.memory_mib
        ));
    }
    let whole = need.ceil().max(1.0);
    let rounded = whole - need > 1e-9;
    let per_gpu_slices = whole as u32;
    if rounded {
        let what = match (&ask.memory_field, ask.cores) {
            (Some((f, v)), Some((cf, c))) => format!("{f}: {v:?} and {cf}: {c:?}"),
            (Some((f, v)), None) => format!("{f}: {v:?}"),
            (None, Some((cf, c))) => format!("{cf}: {c:?}"),
            (None, None) => "the request".to_string(),
        };
        let slice = format!(
            "a slice is {} MiB and {}% of a GPU",
            shape.memory_mib,
            100.0 / per_gpu
        );
        match config.rounding {
            Rounding::Refuse => {
                return Err(format!(
                    "{who}: {what} is not a whole number of Tessera slices ({slice}); ask for a multiple"
                ));
            }
            Rounding::Up => warnings.push(format!(
                "{who}: {what} rounded up to {per_gpu_slices} whole slices ({} MiB, {}% of a GPU) for scheduling; {slice}; the limits are exactly the words (a share of the card's memory is worked out on the node, from the GPU the slices are on)",
                u64::from(per_gpu_slices) * shape.memory_mib,
                f64::from(per_gpu_slices) * 100.0 / per_gpu
            )),
        }
    }
    if ask.gpus > 1 && per_gpu_slices != shape.per_gpu {
        let field = ask.gpus_field.unwrap_or("gpus");
        return Err(format!(
            "{who}: {field}: \"{}\" with a share of each GPU: Tessera places a container's slices where they fit and cannot promise a share on each of {} GPUs; ask for 1 GPU, or for whole GPUs",
            ask.gpus, ask.gpus
        ));
    }
    // Below its whole slices only on one GPU (several GPUs are whole cards, above): the
    // pod is scheduled and accounted as its slices, and limited to exactly its words.
    let mut exact = Exact::default();
    if ask.gpus == 1 {
        if let Memory::Mib(m) = ask.memory
            && m < u64::from(per_gpu_slices) * shape.memory_mib
        {
            exact.memory_mib = Some(m);
        }
        if let Some((_, c)) = ask.cores
            && (c as f64) * per_gpu / 100.0 < whole - 1e-9
        {
            exact.compute_percent = Some(c);
        }
        // A share of the card below its slices' (30% on 3 of 8 slices, 37.5%). KAI's
        // fraction is a share of the whole GPU, its compute too; HAMi's and Volcano's
        // percentages are memory only (their compute is `gpucores`, above, or no cap).
        let (share, of_compute) = match ask.memory {
            Memory::Percent(p) => (Some(p as f64 / 100.0), false),
            Memory::Fraction(f) => (Some(f), true),
            Memory::Whole | Memory::Mib(_) => (None, false),
        };
        if let Some(f) = share
            && f * per_gpu < whole - 1e-9
        {
            // In (0, 1] (refused otherwise above), so the ppm is in 1..=1e6; KAI's 0.3
            // is 300,000 exactly after rounding.
            let ppm = ((f * 1e6).round() as u32).max(1);
            exact.memory_ppm = Some(ppm);
            if of_compute {
                exact.compute_ppm = Some(ppm);
            }
        }
    }
    Ok((per_gpu_slices * ask.gpus, exact))
}

/// What a translation takes off a container: resources, env variables, `envFrom`
/// ConfigMaps (see [`ContainerPlan`]).
#[derive(Debug, Default)]
struct Off {
    resources: Vec<String>,
    env: Vec<String>,
    env_from: Vec<String>,
}

impl Off {
    /// Takes off `c` those of a dialect's resource `words` it sets (HAMi's, Volcano's).
    fn resources(c: &Container, words: impl IntoIterator<Item = &'static str>) -> Self {
        Off {
            resources: words
                .into_iter()
                .filter(|r| word(c, r).is_some())
                .map(str::to_owned)
                .collect(),
            ..Off::default()
        }
    }
}

/// Plans container `c` for the slices `ask` comes to (every dialect's last step), or
/// refuses it; `off` is what the translation takes off it.
fn plan(
    (init, index, c): (bool, usize, &Container),
    ask: &Ask<'_>,
    off: Off,
    config: &Config,
    t: &mut Translation,
    refusals: &mut Vec<String>,
) {
    t.cap_compute |= ask.cores.is_some();
    match slices_for(ask, config, &mut t.warnings) {
        Ok((slices, exact)) => t.containers.push(ContainerPlan {
            init,
            index,
            name: c.name.clone(),
            slices,
            exact,
            remove: off.resources,
            remove_env: off.env,
            remove_env_from: off.env_from,
        }),
        Err(e) => refusals.push(e),
    }
}

/// The refusal of a container that asks for Tessera's own resource beside another
/// project's words for a GPU (`theirs`): two requests for one GPU share.
fn asks_both(c: &Container, theirs: &str) -> Option<String> {
    word(c, tessera_contract::labels::RESOURCE).map(|_| {
        format!(
            "container {:?} asks both for {} and for {theirs}; use one",
            c.name,
            tessera_contract::labels::RESOURCE
        )
    })
}

/// A whole number in a resource or annotation, with the refusal naming `field`.
fn whole(
    who: &str,
    field: &str,
    value: &str,
    min: u64,
    max: u64,
    unit: &str,
) -> Result<u64, String> {
    let v = value.trim();
    let n = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .then(|| v.parse::<u64>().ok())
        .flatten();
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(n) if n > max => Err(format!("{who}: {field}: {value:?} is over {max} ({unit})")),
        _ => Err(format!(
            "{who}: {field}: {value:?} is not a whole number of {unit} of at least {min}"
        )),
    }
}

fn hami_pod(
    containers: &[(bool, usize, &Container)],
    annotations: &BTreeMap<String, String>,
    config: &Config,
    t: &mut Translation,
    refusals: &mut Vec<String>,
) {
    gpu_lists(annotations, config, t, refusals);
    for key in [HAMI_GPU_SCHEDULER_POLICY, HAMI_NODE_SCHEDULER_POLICY] {
        match annotations.get(key).map(String::as_str) {
            None => {}
            Some(v @ ("binpack" | "spread")) => t.warnings.push(format!(
                "annotation {key}: {v:?} is not applied per pod: Tessera places by the cluster's policy (node config `placement`, scheduler extender `--policy`)"
            )),
            Some(v) => refusals.push(format!(
                "annotation {key}: {v:?} is not a policy; use \"binpack\" or \"spread\""
            )),
        }
    }
    let mut priorities = BTreeSet::new();
    for &(init, index, c) in containers {
        if !is_hami(c) {
            continue;
        }
        let who = format!("container {:?}", c.name);
        let before = refusals.len();
        if let Some(e) = asks_both(c, "HAMi's resources") {
            refusals.push(e);
            continue;
        }
        let words = match hami_words(c) {
            Ok(w) => w,
            Err(e) => {
                refusals.push(e);
                continue;
            }
        };
        if let Some(v) = words.vendor {
            match t.vendor {
                Some(other) if other != v => {
                    refusals.push(format!(
                        "{who} asks for {v} cards and another container for {other} cards; a pod's GPUs are one vendor's"
                    ));
                    continue;
                }
                _ => t.vendor = Some(v),
            }
        }
        let mut get = |field: &'static str, min: u64, max: u64, unit: &str| {
            word(c, field).map(|v| match whole(&who, field, &v, min, max, unit) {
                Ok(n) => Some((n, v)),
                Err(e) => {
                    refusals.push(e);
                    None
                }
            })
        };
        let gpus = get(words.gpu, 1, 64, "GPUs");
        let mem = get(words.gpumem, 1, u64::from(u32::MAX), "MiB");
        let pct = words
            .gpumem_percentage
            .and_then(|f| get(f, 1, 100, "percent of a GPU's memory"));
        let cores = get(words.gpucores, 0, 100, "percent of a GPU's compute");
        let priority = words
            .priority
            .and_then(|f| get(f, 0, 1, "priority (0 high, 1 low)"));
        if refusals.len() > before {
            continue;
        }
        let memory = match (&mem, &pct) {
            (Some(Some(_)), Some(Some(_))) => {
                refusals.push(format!(
                    "{who}: both {HAMI_GPUMEM} and {HAMI_GPUMEM_PERCENTAGE} are set; give one"
                ));
                continue;
            }
            (Some(Some((m, v))), _) => (Memory::Mib(*m), Some((words.gpumem, v.clone()))),
            (_, Some(Some((p, v)))) => (
                Memory::Percent(*p),
                Some((HAMI_GPUMEM_PERCENTAGE, v.clone())),
            ),
            // HAMi's defaultMem 0: the whole card's memory.
            _ => (Memory::Whole, None),
        };
        if let Some(Some((p, _))) = priority {
            priorities.insert(p);
        }
        let ask = Ask {
            container: &c.name,
            memory_field: memory.1,
            memory: memory.0,
            // gpucores 0 is HAMi's "no core limit": the slices' own share applies.
            cores: cores
                .flatten()
                .filter(|(n, _)| *n > 0)
                .map(|(n, _)| (words.gpucores, n)),
            // HAMi's defaultGPUNum: 1.
            gpus: gpus.flatten().map_or(1, |(n, _)| n as u32),
            gpus_field: Some(words.gpu),
        };
        let off = Off::resources(c, words.all());
        plan((init, index, c), &ask, off, config, t, refusals);
    }
    // HAMi's priority is per container; Tessera's is the pod's (one allocation each,
    // the same priority). 0 is HAMi's high: above the default 0 of other pods.
    match priorities.len() {
        0 => {}
        1 => {
            let mine = priorities.first().map(|&p| if p == 0 { 100 } else { 0 });
            let theirs = annotations.get(tessera_contract::labels::ANNOTATION_PRIORITY);
            match (mine, theirs) {
                (Some(p), Some(v)) if v.trim() != p.to_string() => refusals.push(format!(
                    "{HAMI_PRIORITY} asks for Tessera priority {p} but the annotation {}: {v:?} says otherwise; give one",
                    tessera_contract::labels::ANNOTATION_PRIORITY
                )),
                _ => t.priority = mine,
            }
        }
        _ => refusals.push(format!(
            "containers give different {HAMI_PRIORITY}; Tessera's priority is the pod's, give one value"
        )),
    }
}

/// HAMi's model and UUID lists into Tessera's own ([`HAMI_GPU_LISTS`]): the same lists,
/// matched by the same rule (`tessera_contract::gpu_filter`). A model list none of
/// whose entries is a model the cluster has (when [`Config::gpu_models`] says) is
/// refused: the pod could never run.
fn gpu_lists(
    annotations: &BTreeMap<String, String>,
    config: &Config,
    t: &mut Translation,
    refusals: &mut Vec<String>,
) {
    for (theirs, ours) in HAMI_GPU_LISTS {
        let Some(v) = annotations.get(theirs) else {
            continue;
        };
        let entries = tessera_contract::gpu_filter::split_list(v);
        if entries.is_empty() {
            refusals.push(format!(
                "annotation {theirs}: {v:?} names nothing; give a comma-separated list or remove it"
            ));
            continue;
        }
        if let Some(mine) = annotations.get(ours)
            && mine.trim() != v.trim()
        {
            refusals.push(format!(
                "annotation {theirs}: {v:?} and the annotation {ours}: {mine:?} say different things; remove one"
            ));
            continue;
        }
        if theirs == HAMI_USE_GPUTYPE
            && !config.gpu_models.is_empty()
            && known_models(&entries, &config.gpu_models).is_empty()
        {
            refusals.push(format!(
                "annotation {theirs}: {v:?} names no GPU model this cluster has ({}); \
                 an entry matches a model it occurs in, ignoring case",
                config.gpu_models.join(", ")
            ));
            continue;
        }
        t.gpu_lists.push((ours, v.clone()));
    }
}

/// HAMi's list annotations and the Tessera annotations they become.
pub const HAMI_GPU_LISTS: [(&str, &str); 4] = {
    use tessera_contract::gpu_filter::*;
    [
        (HAMI_USE_GPUTYPE, ANNOTATION_GPU_MODELS),
        (HAMI_NOUSE_GPUTYPE, ANNOTATION_GPU_MODELS_EXCLUDE),
        (HAMI_USE_GPUUUID, ANNOTATION_GPU_UUIDS),
        (HAMI_NOUSE_GPUUUID, ANNOTATION_GPU_UUIDS_EXCLUDE),
    ]
};

/// The models of `known` that some entry of a model list matches, by the rule the
/// device plugin applies (`gpu_filter::model_matches`, under any vendor's type).
pub fn known_models<'a>(entries: &[String], known: &'a [String]) -> Vec<&'a String> {
    known
        .iter()
        .filter(|m| {
            entries.iter().any(|e| {
                tessera_contract::Vendor::ALL
                    .iter()
                    .any(|v| tessera_contract::gpu_filter::model_matches(e, v.as_str(), m))
            })
        })
        .collect()
}

fn volcano_pod(
    containers: &[(bool, usize, &Container)],
    config: &Config,
    t: &mut Translation,
    refusals: &mut Vec<String>,
) {
    for &(init, index, c) in containers {
        if !VOLCANO_RESOURCES.iter().any(|r| word(c, r).is_some()) {
            continue;
        }
        let who = format!("container {:?}", c.name);
        if let Some(e) = asks_both(c, "Volcano's resources") {
            refusals.push(e);
            continue;
        }
        let before = refusals.len();
        let mut get = |field: &'static str, min: u64, max: u64, unit: &str| {
            word(c, field).and_then(|v| match whole(&who, field, &v, min, max, unit) {
                Ok(n) => Some((n, v)),
                Err(e) => {
                    refusals.push(e);
                    None
                }
            })
        };
        let number = get(VOLCANO_VGPU_NUMBER, 1, 64, "vGPUs");
        let mem = get(VOLCANO_VGPU_MEMORY, 1, u64::from(u32::MAX), "MiB");
        let pct = get(
            VOLCANO_VGPU_MEMORY_PERCENTAGE,
            1,
            100,
            "percent of a GPU's memory",
        );
        let cores = get(VOLCANO_VGPU_CORES, 0, 100, "percent of a GPU's compute");
        if refusals.len() > before {
            continue;
        }
        let memory = match (&mem, &pct) {
            (Some(_), Some(_)) => {
                refusals.push(format!(
                    "{who}: both {VOLCANO_VGPU_MEMORY} and {VOLCANO_VGPU_MEMORY_PERCENTAGE} are set; give one"
                ));
                continue;
            }
            (Some((m, v)), None) => (Memory::Mib(*m), Some((VOLCANO_VGPU_MEMORY, v.clone()))),
            (None, Some((p, v))) => (
                Memory::Percent(*p),
                Some((VOLCANO_VGPU_MEMORY_PERCENTAGE, v.clone())),
            ),
            (None, None) => (Memory::Whole, None),
        };
        let ask = Ask {
            container: &c.name,
            memory_field: memory.1,
            memory: memory.0,
            cores: cores
                .filter(|(n, _)| *n > 0)
                .map(|(n, _)| (VOLCANO_VGPU_CORES, n)),
            gpus: number.map_or(1, |(n, _)| n as u32),
            gpus_field: Some(VOLCANO_VGPU_NUMBER),
        };
        let off = Off::resources(c, VOLCANO_RESOURCES);
        plan((init, index, c), &ask, off, config, t, refusals);
    }
}

fn kai_pod(
    containers: &[(bool, usize, &Container)],
    annotations: &BTreeMap<String, String>,
    config: &Config,
    t: &mut Translation,
    refusals: &mut Vec<String>,
) {
    // With KAI picking the GPU its words stay: KAI must see a fraction to reserve a GPU
    // for it.
    if !config.kai_gpu_choice {
        t.remove_annotations = KAI_ANNOTATIONS
            .iter()
            .filter(|k| annotations.contains_key(**k))
            .map(|k| (*k).to_owned())
            .collect();
    }
    // KAI's fraction is for the named container, else the first (app) container.
    let target = match annotations.get(KAI_GPU_FRACTION_CONTAINER) {
        Some(name) => match containers.iter().find(|(_, _, c)| &c.name == name) {
            Some(c) => *c,
            None => {
                refusals.push(format!(
                    "annotation {KAI_GPU_FRACTION_CONTAINER}: {name:?} names no container of the pod"
                ));
                return;
            }
        },
        None => match containers.iter().find(|(init, _, _)| !init) {
            Some(c) => *c,
            None => return,
        },
    };
    let c = target.2;
    // With KAI's words kept, a pod this webhook already translated (a second pass, a
    // reinvocation) has its slices beside them: the same count is no contradiction.
    let own_slices = word(c, tessera_contract::labels::RESOURCE);
    if !config.kai_gpu_choice
        && let Some(e) = asks_both(c, "a KAI-Scheduler GPU share")
    {
        refusals.push(e);
        return;
    }
    let fraction = annotations.get(KAI_GPU_FRACTION);
    let memory = annotations.get(KAI_GPU_MEMORY);
    let devices = annotations.get(KAI_GPU_FRACTION_NUM_DEVICES);
    let before = refusals.len();
    let fraction_value = fraction.and_then(|v| match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Some(f),
        _ => {
            refusals.push(format!(
                "annotation {KAI_GPU_FRACTION}: {v:?} is not a fraction of a GPU above 0 and at most 1, like \"0.5\""
            ));
            None
        }
    });
    let memory_value = memory.and_then(|v| {
        whole(
            &format!("annotation {KAI_GPU_MEMORY}"),
            "value",
            v,
            1,
            u64::from(u32::MAX),
            "MiB",
        )
        .map_err(|e| refusals.push(e))
        .ok()
    });
    let gpus = match devices {
        None => 1,
        Some(v) => match whole(
            &format!("annotation {KAI_GPU_FRACTION_NUM_DEVICES}"),
            "value",
            v,
            1,
            64,
            "GPUs",
        ) {
            Ok(n) => n as u32,
            Err(e) => {
                refusals.push(e);
                1
            }
        },
    };
    if refusals.len() > before {
        return;
    }
    let (memory, field) = match (fraction_value, memory_value) {
        (Some(_), Some(_)) => {
            refusals.push(format!(
                "annotations {KAI_GPU_FRACTION} and {KAI_GPU_MEMORY} are both set; give one"
            ));
            return;
        }
        (Some(f), None) => (Memory::Fraction(f), (KAI_GPU_FRACTION, fraction)),
        (None, Some(m)) => (Memory::Mib(m), (KAI_GPU_MEMORY, memory)),
        (None, None) => {
            refusals.push(format!(
                "annotation {KAI_GPU_FRACTION_NUM_DEVICES} needs {KAI_GPU_FRACTION} (or {KAI_GPU_MEMORY}) beside it"
            ));
            return;
        }
    };
    let ask = Ask {
        container: &c.name,
        memory_field: Some((field.0, field.1.cloned().unwrap_or_default())),
        memory,
        cores: None,
        gpus,
        gpus_field: Some(KAI_GPU_FRACTION_NUM_DEVICES),
    };
    // What KAI's admission added for its binder's ConfigMaps (named from the prefix in
    // its annotation), which no binder will create for a translated pod.
    let prefix = annotations
        .get(KAI_CONFIGMAP_ANNOTATION)
        .map(|p| format!("{p}-"));
    let kais = |name: &str| prefix.as_deref().is_some_and(|p| name.starts_with(p));
    let env_from = c
        .env_from
        .iter()
        .flatten()
        .filter_map(|e| e.config_map_ref.as_ref())
        .map(|r| r.name.clone())
        .filter(|n| kais(n) && n.ends_with("-evar"))
        .collect();
    let off = if config.kai_gpu_choice {
        // KAI's binder writes its ConfigMaps for this pod; only the GPU it would name
        // comes off, the device plugin names it (a pod's env would win over it).
        let visible = tessera_contract::env::NVIDIA_VISIBLE_DEVICES;
        Off {
            env: kai_env(c, &kais)
                .into_iter()
                .filter(|n| n == visible)
                .collect(),
            ..Off::default()
        }
    } else {
        Off {
            resources: Vec::new(),
            env: kai_env(c, &kais),
            env_from,
        }
    };
    plan(target, &ask, off, config, t, refusals);
    if let Some(v) = own_slices
        && let Some(p) = t.containers.last()
        && v.trim() != p.slices.to_string()
    {
        let field = ask.memory_field.as_ref().map_or("", |f| f.0);
        refusals.push(format!(
            "container {:?} asks for {}: {v:?} beside annotation {field}, which is {} slices; use one",
            c.name,
            tessera_contract::labels::RESOURCE,
            p.slices
        ));
    }
}

/// The variables KAI-Scheduler's admission added to `c`: taken from a ConfigMap, named
/// `NVIDIA_VISIBLE_DEVICES` from KAI's older key (`RUNAI-VISIBLE-DEVICES`) or, from KAI's
/// own ConfigMap (`kais`), its current one (`NVIDIA_VISIBLE_DEVICES`), or one of KAI's
/// own names.
fn kai_env(c: &Container, kais: &dyn Fn(&str) -> bool) -> Vec<String> {
    c.env
        .iter()
        .flatten()
        .filter(|e| {
            let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.config_map_key_ref.as_ref())
            else {
                return false;
            };
            let visible = tessera_contract::env::NVIDIA_VISIBLE_DEVICES;
            (e.name == visible
                && (r.key == KAI_VISIBLE_DEVICES_KEY || (r.key == visible && kais(&r.name))))
                || KAI_ENV.contains(&e.name.as_str())
        })
        .map(|e| e.name.clone())
        .collect()
}

/// Applies a translation to the raw pod JSON: each container's dialect resources become
/// `tessera.dev/vgpu` in limits (and in requests where it had requests), KAI's
/// annotations come off, the original words go on.
pub fn apply(raw: &mut Value, t: &Translation) {
    let resource = tessera_contract::labels::RESOURCE;
    for plan in &t.containers {
        let list = if plan.init {
            "initContainers"
        } else {
            "containers"
        };
        let c = &mut raw["spec"][list][plan.index];
        if !c["resources"].is_object() {
            c["resources"] = json!({});
        }
        if let Some(env) = c["env"].as_array_mut() {
            env.retain(|e| {
                let name = e["name"].as_str().unwrap_or_default();
                !(plan.remove_env.iter().any(|n| n == name) && e.get("valueFrom").is_some())
            });
        }
        if let Some(from) = c["envFrom"].as_array_mut() {
            from.retain(|e| {
                let cm = e["configMapRef"]["name"].as_str().unwrap_or_default();
                !plan.remove_env_from.iter().any(|n| n == cm)
            });
            if from.is_empty()
                && let Some(o) = c.as_object_mut()
            {
                o.remove("envFrom");
            }
        }
        let res = &mut c["resources"];
        let had_requests = res["requests"]
            .as_object()
            .is_some_and(|r| plan.remove.iter().any(|k| r.contains_key(k)));
        for key in ["limits", "requests"] {
            if let Some(map) = res[key].as_object_mut() {
                for name in &plan.remove {
                    map.remove(name);
                }
            }
        }
        if !res["limits"].is_object() {
            res["limits"] = json!({});
        }
        res["limits"][resource] = json!(plan.slices.to_string());
        if had_requests {
            res["requests"][resource] = json!(plan.slices.to_string());
        }
        if let Some(r) = res.as_object_mut()
            && r.get("requests")
                .and_then(Value::as_object)
                .is_some_and(Map::is_empty)
        {
            r.remove("requests");
        }
    }
    if !t.remove_volumes.is_empty() {
        let gone = |v: &Value| {
            t.remove_volumes
                .iter()
                .any(|n| v["name"].as_str() == Some(n.as_str()))
        };
        if let Some(vols) = raw["spec"]["volumes"].as_array_mut() {
            vols.retain(|v| !gone(v));
        }
        for list in ["initContainers", "containers"] {
            for c in raw["spec"][list].as_array_mut().into_iter().flatten() {
                if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                    mounts.retain(|m| !gone(m));
                }
            }
        }
    }
    // Nothing rewritten (a pod in Tessera's words that also carries, say, HAMi's
    // scheduler-policy annotation): nothing to record, and a second pass must find
    // nothing to change.
    if t.containers.is_empty() && t.remove_annotations.is_empty() && t.gpu_lists.is_empty() {
        return;
    }
    if !raw["metadata"]["annotations"].is_object() {
        raw["metadata"]["annotations"] = json!({});
    }
    let ann = &mut raw["metadata"]["annotations"];
    if let Some(map) = ann.as_object_mut() {
        for k in &t.remove_annotations {
            map.remove(k);
        }
        map.insert(ANNOTATION_ORIGINAL.into(), json!(t.original.to_string()));
        // Always the webhook's on a translated pod: what the tenant wrote there goes.
        match exact_limits(t) {
            Some(v) => map.insert(ANNOTATION_EXACT_LIMITS.into(), json!(v)),
            None => map.remove(ANNOTATION_EXACT_LIMITS),
        };
        match exact_memory_percent(t) {
            Some(v) => map.insert(ANNOTATION_EXACT_MEMORY_PERCENT.into(), json!(v)),
            None => map.remove(ANNOTATION_EXACT_MEMORY_PERCENT),
        };
        if t.cap_compute {
            map.insert(
                tessera_contract::labels::ANNOTATION_COMPUTE_POLICY.into(),
                json!(tessera_contract::Policy::Guaranteed.name()),
            );
        }
        if let Some(p) = t.priority {
            map.insert(
                tessera_contract::labels::ANNOTATION_PRIORITY.into(),
                json!(p.to_string()),
            );
        }
        if let Some(v) = t.vendor {
            map.insert(
                tessera_contract::labels::ANNOTATION_GPU_VENDOR.into(),
                json!(v.as_str()),
            );
        }
        for (key, value) in &t.gpu_lists {
            map.insert((*key).into(), json!(value));
        }
    }
}

/// The value of [`ANNOTATION_EXACT_LIMITS`]: the containers whose ask in MiB or percent
/// of compute is below their slices; `None` when there are none.
pub fn exact_limits(t: &Translation) -> Option<String> {
    let mut m = Map::new();
    for plan in t
        .containers
        .iter()
        .filter(|p| p.exact.memory_mib.is_some() || p.exact.compute_percent.is_some())
    {
        let mut e = Map::new();
        e.insert("slices".into(), json!(plan.slices));
        if let Some(v) = plan.exact.memory_mib {
            e.insert("memoryMiB".into(), json!(v));
        }
        if let Some(v) = plan.exact.compute_percent {
            e.insert("computePercent".into(), json!(v));
        }
        m.insert(plan.name.clone(), Value::Object(e));
    }
    (!m.is_empty()).then(|| Value::Object(m).to_string())
}

/// The value of [`ANNOTATION_EXACT_MEMORY_PERCENT`]: the containers whose share of the
/// card's memory is below their slices', in percent (`30`, `33.3333`), with their share
/// of its compute where it is one too (a KAI fraction: `computePercent`); `None` when
/// there are none. Its own annotation, not a field of [`ANNOTATION_EXACT_LIMITS`]: an
/// older node refuses unknown fields there (and would fail the pod mid-upgrade), where
/// it ignores an annotation it does not know, or a field of this one, and keeps the
/// slices' limits.
pub fn exact_memory_percent(t: &Translation) -> Option<String> {
    // A whole percent as an integer (`30`, as `dropin-limits` writes it), else the
    // decimal (`33.3`): ppm / 10,000 is exact in f64 at this size.
    let percent = |ppm: u32| {
        if ppm.is_multiple_of(10_000) {
            json!(ppm / 10_000)
        } else {
            json!(f64::from(ppm) / 10_000.0)
        }
    };
    let mut m = Map::new();
    for plan in &t.containers {
        let Some(ppm) = plan.exact.memory_ppm else {
            continue;
        };
        let mut e = json!({"slices": plan.slices, "percent": percent(ppm)});
        if let Some(c) = plan.exact.compute_ppm {
            e["computePercent"] = percent(c);
        }
        m.insert(plan.name.clone(), e);
    }
    (!m.is_empty()).then(|| Value::Object(m).to_string())
}

/// Warnings for containers that set HAMi-core's variables: Tessera reads none of them.
pub fn hami_core_env_warnings(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        for e in c.env.iter().flatten() {
            if is_hami_core_env(&e.name) {
                out.push(format!(
                    "container {:?} sets {}, which HAMi-core reads; Tessera ignores it: the container's limits are its slices",
                    c.name, e.name
                ));
            }
        }
    }
    out
}

/// A pod asking for half a GPU in KAI's words, as KAI's own admission leaves
/// it: NVIDIA_VISIBLE_DEVICES (from `key` of KAI's GPU ConfigMap), KAI's other
/// GPU variables, its envFrom and its ConfigMap's volume (pkg/binder/common in
/// KAI-Scheduler). For this module's tests and `admission`'s.
#[cfg(test)]
pub(crate) fn kai_admitted_pod(key: &str) -> Value {
    let from = |key: &str| json!({"configMapKeyRef": {"name": "p-abc-runai-sh-gpu-0", "key": key}});
    json!({
        "metadata": {"name": "p", "annotations": {
            KAI_GPU_FRACTION: "0.5", KAI_CONFIGMAP_ANNOTATION: "p-abc-runai-sh-gpu"}},
        "spec": {"containers": [{"name": "main", "image": "x", "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": from(key)},
            {"name": "RUNAI_NUM_OF_GPUS", "valueFrom": from("RUNAI_NUM_OF_GPUS")},
            {"name": "GPU_PORTION", "valueFrom": from("GPU_PORTION")}
        ], "envFrom": [
            {"configMapRef": {"name": "p-abc-runai-sh-gpu-0-evar", "optional": false}}
        ], "volumeMounts": [{"name": "p-abc-runai-sh-gpu-0-vol", "mountPath": "/kai"}]}],
        "volumes": [
            {"name": "p-abc-runai-sh-gpu-0-vol", "configMap": {"name": "p-abc-runai-sh-gpu-0"}}
        ]}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod with one app container (`main`) and, if given, a second (`side`).
    fn pod(limits: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let limits: Map<String, Value> = limits
            .iter()
            .map(|(k, v)| ((*k).into(), json!(v)))
            .collect();
        let ann: Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).into(), json!(v)))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": ann},
            "spec": {"containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits}},
                {"name": "side", "image": "x"}
            ]}
        }))
        .expect("pod")
    }

    fn slices(p: &Pod, config: &Config) -> (Vec<(String, u32)>, Vec<String>) {
        let t = translate(p, config)
            .unwrap_or_else(|e| panic!("refused: {e:?}"))
            .expect("translated");
        (
            t.containers
                .iter()
                .map(|c| (c.name.clone(), c.slices))
                .collect(),
            t.warnings,
        )
    }

    fn refusal(p: &Pod, config: &Config) -> String {
        match translate(p, config) {
            Err(lines) => lines.join("; "),
            Ok(t) => panic!("admitted: {t:?}"),
        }
    }

    const MAIN: &str = "main";

    /// Resource or annotation words of a table row.
    type Words = &'static [(&'static str, &'static str)];

    #[test]
    fn hami_requests_become_slices_of_one_gpu() {
        let c = Config::default();
        // (limits, slices, rounded?)
        let table: &[(Words, u32, bool)] = &[
            (&[(HAMI_GPU, "1"), (HAMI_GPUMEM, "4096")], 1, false),
            (
                &[
                    (HAMI_GPU, "1"),
                    (HAMI_GPUMEM, "8192"),
                    (HAMI_GPUCORES, "25"),
                ],
                2,
                false,
            ),
            // 3000 MiB is 0.73 slice, 30% is 2.4 slices: 3 slices.
            (
                &[
                    (HAMI_GPU, "1"),
                    (HAMI_GPUMEM, "3000"),
                    (HAMI_GPUCORES, "30"),
                ],
                3,
                true,
            ),
            // Only gpucores: HAMi's default memory is the whole card.
            (&[(HAMI_GPU, "1"), (HAMI_GPUCORES, "30")], 8, false),
            // No nvidia.com/gpu: HAMi's default of one.
            (&[(HAMI_GPUMEM_PERCENTAGE, "50")], 4, false),
            // gpucores 0 is "no core limit".
            (
                &[(HAMI_GPU, "1"), (HAMI_GPUMEM, "4096"), (HAMI_GPUCORES, "0")],
                1,
                false,
            ),
            // Two whole cards.
            (
                &[(HAMI_GPU, "2"), (HAMI_GPUMEM_PERCENTAGE, "100")],
                16,
                false,
            ),
        ];
        for (limits, want, rounded) in table {
            let (got, warnings) = slices(&pod(limits, &[]), &c);
            assert_eq!(got, vec![(MAIN.to_string(), *want)], "{limits:?}");
            assert_eq!(!warnings.is_empty(), *rounded, "{limits:?}: {warnings:?}");
        }
    }

    #[test]
    fn hami_requests_tessera_cannot_honour_are_refused_naming_the_field() {
        let c = Config::default();
        let table: &[(Words, Words, &[&str])] = &[
            (
                &[(HAMI_GPUCORES, "150")],
                &[],
                &["nvidia.com/gpucores", "\"150\"", "over 100"],
            ),
            (
                &[(HAMI_GPUMEM, "100000")],
                &[],
                &["nvidia.com/gpumem", "\"100000\"", "more than one GPU"],
            ),
            (
                &[(HAMI_GPU, "2"), (HAMI_GPUMEM, "3000")],
                &[],
                &["nvidia.com/gpu", "\"2\"", "each of 2 GPUs"],
            ),
            (
                &[(HAMI_GPUMEM, "3000"), (HAMI_GPUMEM_PERCENTAGE, "50")],
                &[],
                &["both", "give one"],
            ),
            (
                &[(HAMI_GPUMEM, "3Gi")],
                &[],
                &["nvidia.com/gpumem", "\"3Gi\"", "MiB"],
            ),
            (
                &[(HAMI_GPUMEM_PERCENTAGE, "0")],
                &[],
                &["nvidia.com/gpumem-percentage", "\"0\""],
            ),
            (
                &[(HAMI_PRIORITY, "2")],
                &[],
                &["nvidia.com/priority", "\"2\""],
            ),
            (
                &[(HAMI_GPUMEM, "4096")],
                &[(HAMI_NOUSE_GPUUUID, " , ")],
                &["nvidia.com/nouse-gpuuuid", "names nothing"],
            ),
            (
                &[(HAMI_GPUMEM, "4096")],
                &[
                    (HAMI_USE_GPUTYPE, "A100"),
                    (tessera_contract::gpu_filter::ANNOTATION_GPU_MODELS, "H100"),
                ],
                &[
                    "nvidia.com/use-gputype",
                    "\"A100\"",
                    "tessera.dev/gpu-models",
                ],
            ),
            (
                &[(HAMI_GPUMEM, "4096")],
                &[(HAMI_GPU_SCHEDULER_POLICY, "best")],
                &["hami.io/gpu-scheduler-policy", "\"best\""],
            ),
            (
                &[(HAMI_GPUMEM, "4096"), ("tessera.dev/vgpu", "1")],
                &[],
                &["both"],
            ),
        ];
        for (limits, ann, words) in table {
            let msg = refusal(&pod(limits, ann), &c);
            for w in *words {
                assert!(msg.contains(w), "{limits:?} {ann:?}: {msg:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn hami_model_and_uuid_lists_become_tesseras_and_an_unknown_model_is_refused() {
        use tessera_contract::gpu_filter::*;
        let c = Config {
            gpu_models: vec!["NVIDIA A100-SXM4-80GB".into(), "NVIDIA L4".into()],
            ..Config::default()
        };
        let lists = [
            (HAMI_USE_GPUTYPE, "a100, NVIDIA-NVIDIA L4"),
            (HAMI_NOUSE_GPUTYPE, "V100"),
            (HAMI_USE_GPUUUID, "GPU-a,GPU-b"),
            (HAMI_NOUSE_GPUUUID, "GPU-b"),
        ];
        let p = pod(&[(HAMI_GPUMEM, "4096")], &lists);
        let t = translate(&p, &c).expect("admitted").expect("translated");
        assert_eq!(
            t.gpu_lists,
            vec![
                (ANNOTATION_GPU_MODELS, "a100, NVIDIA-NVIDIA L4".to_string()),
                (ANNOTATION_GPU_MODELS_EXCLUDE, "V100".to_string()),
                (ANNOTATION_GPU_UUIDS, "GPU-a,GPU-b".to_string()),
                (ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-b".to_string()),
            ]
        );
        let mut raw = serde_json::to_value(&p).expect("json");
        apply(&mut raw, &t);
        let ann = &raw["metadata"]["annotations"];
        assert_eq!(ann[ANNOTATION_GPU_MODELS], "a100, NVIDIA-NVIDIA L4");
        assert_eq!(ann[ANNOTATION_GPU_UUIDS_EXCLUDE], "GPU-b");
        let original: Value =
            serde_json::from_str(ann[ANNOTATION_ORIGINAL].as_str().expect("original"))
                .expect("json");
        assert_eq!(
            original["annotations"][HAMI_USE_GPUTYPE],
            "a100, NVIDIA-NVIDIA L4"
        );
        // A list that names no model the cluster has: refused with the pod's words.
        let e = refusal(
            &pod(&[(HAMI_GPUMEM, "4096")], &[(HAMI_USE_GPUTYPE, "H100,B200")]),
            &c,
        );
        assert!(
            e.contains("nvidia.com/use-gputype")
                && e.contains("\"H100,B200\"")
                && e.contains("NVIDIA L4"),
            "{e}"
        );
        // Unknown models here: not checked at admission (the node still holds the pod).
        let (got, _) = slices(
            &pod(&[(HAMI_GPUMEM, "4096")], &[(HAMI_USE_GPUTYPE, "H100")]),
            &Config::default(),
        );
        assert_eq!(got, vec![(MAIN.to_string(), 1)]);
        // A pod in Tessera's words with only HAMi's list: the list is translated too.
        let p = pod(
            &[("tessera.dev/vgpu", "1")],
            &[(HAMI_NOUSE_GPUUUID, "GPU-x")],
        );
        let t = translate(&p, &c).expect("admitted").expect("translated");
        let mut raw = serde_json::to_value(&p).expect("json");
        apply(&mut raw, &t);
        assert_eq!(
            raw["metadata"]["annotations"][ANNOTATION_GPU_UUIDS_EXCLUDE],
            "GPU-x"
        );
    }

    #[test]
    fn rounding_refuse_refuses_what_up_rounds() {
        let strict = Config {
            rounding: Rounding::Refuse,
            ..Config::default()
        };
        let msg = refusal(&pod(&[(HAMI_GPUMEM, "3000")], &[]), &strict);
        assert!(
            msg.contains("nvidia.com/gpumem: \"3000\"") && msg.contains("4096 MiB"),
            "{msg}"
        );
        let (got, warnings) = slices(&pod(&[(HAMI_GPUMEM, "3000")], &[]), &Config::default());
        assert_eq!(got, vec![(MAIN.to_string(), 1)]);
        assert!(
            warnings[0].contains("rounded up to 1 whole slices (4096 MiB"),
            "{warnings:?}"
        );
        // A multiple is admitted either way.
        assert_eq!(
            slices(&pod(&[(HAMI_GPUMEM, "8192")], &[]), &strict).0[0].1,
            2
        );
    }

    #[test]
    fn asks_below_their_slices_are_recorded_exactly_and_the_tenants_copy_is_replaced() {
        let c = Config::default();
        let exact = |p: &Pod| {
            let t = translate(p, &c).expect("ok").expect("translated");
            t.containers
                .iter()
                .map(|p| (p.slices, p.exact))
                .collect::<Vec<_>>()
        };
        let e = |m: Option<u64>, c: Option<u64>| Exact {
            memory_mib: m,
            compute_percent: c,
            memory_ppm: None,
            compute_ppm: None,
        };
        let share = |ppm: u32, c: Option<u64>| Exact {
            memory_ppm: Some(ppm),
            ..e(None, c)
        };
        // A KAI fraction: a share of the whole GPU, its memory and its compute.
        let fraction = |ppm: u32| Exact {
            compute_ppm: Some(ppm),
            ..share(ppm, None)
        };
        // 3000 MiB: one 4 GiB slice, limited to 3000 MiB.
        assert_eq!(
            exact(&pod(&[(HAMI_GPUMEM, "3000")], &[])),
            vec![(1, e(Some(3000), None))]
        );
        // 3000 MiB and 30%: three slices for the compute (37.5%), both exact.
        assert_eq!(
            exact(&pod(&[(HAMI_GPUMEM, "3000"), (HAMI_GPUCORES, "30")], &[])),
            vec![(3, e(Some(3000), Some(30)))]
        );
        // Whole slices: nothing to record.
        assert_eq!(
            exact(&pod(&[(HAMI_GPUMEM, "8192"), (HAMI_GPUCORES, "25")], &[])),
            vec![(2, e(None, None))]
        );
        // A share of the card's memory: the share, for the node to work out on the
        // card it lands on; in each project's words.
        assert_eq!(
            exact(&pod(&[(HAMI_GPUMEM_PERCENTAGE, "30")], &[])),
            vec![(3, share(300_000, None))]
        );
        assert_eq!(
            exact(&pod(&[(VOLCANO_VGPU_MEMORY_PERCENTAGE, "30")], &[])),
            vec![(3, share(300_000, None))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "0.3")])),
            vec![(3, fraction(300_000))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "0.33")])),
            vec![(3, fraction(330_000))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "0.333")])),
            vec![(3, fraction(333_000))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "0.1")])),
            vec![(1, fraction(100_000))]
        );
        // A fraction that is whole slices (0.5: 4 of 8): nothing, compute included.
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "0.5")])),
            vec![(4, e(None, None))]
        );
        // Beside a compute cap that takes more slices (50%: 4 of 8).
        assert_eq!(
            exact(&pod(
                &[(HAMI_GPUMEM_PERCENTAGE, "10"), (HAMI_GPUCORES, "50")],
                &[]
            )),
            vec![(4, share(100_000, None))]
        );
        // A share that is whole slices (25%: 2 of 8), or the whole card: nothing.
        assert_eq!(
            exact(&pod(&[(HAMI_GPUMEM_PERCENTAGE, "25")], &[])),
            vec![(2, e(None, None))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_FRACTION, "1")])),
            vec![(8, e(None, None))]
        );
        assert_eq!(
            exact(&pod(
                &[(VOLCANO_VGPU_MEMORY, "5000"), (VOLCANO_VGPU_CORES, "20")],
                &[]
            )),
            vec![(2, e(Some(5000), Some(20)))]
        );
        assert_eq!(
            exact(&pod(&[], &[(KAI_GPU_MEMORY, "7000")])),
            vec![(2, e(Some(7000), None))]
        );
        // Several GPUs are whole cards: no exact limit.
        assert_eq!(
            exact(&pod(&[(HAMI_GPU, "2"), (HAMI_GPUMEM, "32768")], &[])),
            vec![(16, e(None, None))]
        );

        // apply: the webhook's value goes on, over what the tenant wrote; a pod with
        // nothing below its slices loses the tenant's copy.
        let applied = |limits: &[(&str, &str)]| {
            let p = pod(
                limits,
                &[(
                    ANNOTATION_EXACT_LIMITS,
                    r#"{"main":{"slices":1,"memoryMiB":999999}}"#,
                )],
            );
            let t = translate(&p, &c).expect("ok").expect("translated");
            let mut raw = serde_json::to_value(&p).expect("json");
            apply(&mut raw, &t);
            raw["metadata"]["annotations"][ANNOTATION_EXACT_LIMITS].clone()
        };
        let v: Value = serde_json::from_str(
            applied(&[(HAMI_GPUMEM, "3000")])
                .as_str()
                .expect("a string"),
        )
        .expect("JSON");
        assert_eq!(v, json!({"main": {"slices": 1, "memoryMiB": 3000}}));
        assert_eq!(applied(&[(HAMI_GPUMEM, "4096")]), Value::Null);

        // The share of the card goes in its own annotation, over the tenant's.
        let shared = |limits: &[(&str, &str)], annotations: &[(&str, &str)]| {
            let mut with = vec![(
                ANNOTATION_EXACT_MEMORY_PERCENT,
                r#"{"main":{"slices":8,"percent":100}}"#,
            )];
            with.extend_from_slice(annotations);
            let p = pod(limits, &with);
            let t = translate(&p, &c).expect("ok").expect("translated");
            let mut raw = serde_json::to_value(&p).expect("json");
            apply(&mut raw, &t);
            let a = &raw["metadata"]["annotations"];
            let parse = |v: &Value| {
                v.as_str()
                    .map(|s| serde_json::from_str::<Value>(s).expect("JSON"))
            };
            (
                parse(&a[ANNOTATION_EXACT_MEMORY_PERCENT]),
                parse(&a[ANNOTATION_EXACT_LIMITS]),
            )
        };
        assert_eq!(
            shared(
                &[(HAMI_GPUMEM_PERCENTAGE, "30"), (HAMI_GPUCORES, "20")],
                &[]
            ),
            (
                Some(json!({"main": {"slices": 3, "percent": 30}})),
                Some(json!({"main": {"slices": 3, "computePercent": 20}}))
            )
        );
        assert_eq!(
            shared(&[], &[(KAI_GPU_FRACTION, "0.333")]),
            (
                Some(json!({"main": {"slices": 3, "percent": 33.3, "computePercent": 33.3}})),
                None
            )
        );
        assert_eq!(
            shared(&[], &[(KAI_GPU_FRACTION, "0.3")]),
            (
                Some(json!({"main": {"slices": 3, "percent": 30, "computePercent": 30}})),
                None
            )
        );
        assert_eq!(shared(&[(HAMI_GPUMEM_PERCENTAGE, "50")], &[]), (None, None));
    }

    #[test]
    fn hami_priority_and_policies() {
        let c = Config::default();
        let t = translate(
            &pod(&[(HAMI_GPUMEM, "4096"), (HAMI_PRIORITY, "0")], &[]),
            &c,
        )
        .expect("ok")
        .expect("hami");
        assert_eq!(t.priority, Some(100));
        let t = translate(
            &pod(
                &[(HAMI_GPUMEM, "4096"), (HAMI_PRIORITY, "1")],
                &[(HAMI_NODE_SCHEDULER_POLICY, "spread")],
            ),
            &c,
        )
        .expect("ok")
        .expect("hami");
        assert_eq!(t.priority, Some(0));
        assert!(
            t.warnings[0].contains("hami.io/node-scheduler-policy"),
            "{:?}",
            t.warnings
        );
        assert_eq!(
            t.original["annotations"][HAMI_NODE_SCHEDULER_POLICY],
            "spread"
        );
        assert_eq!(t.original["containers"][MAIN][HAMI_PRIORITY], "1");
        // Tessera's own annotation saying otherwise is a contradiction, not an override.
        let msg = refusal(
            &pod(
                &[(HAMI_GPUMEM, "4096"), (HAMI_PRIORITY, "0")],
                &[("tessera.dev/priority", "-5")],
            ),
            &c,
        );
        assert!(
            msg.contains("nvidia.com/priority") && msg.contains("\"-5\""),
            "{msg}"
        );
    }

    #[test]
    fn kai_annotations_become_slices_of_the_named_or_first_container() {
        let c = Config::default();
        let table: &[(Words, &str, u32, bool)] = &[
            (&[(KAI_GPU_FRACTION, "0.5")], MAIN, 4, false),
            (&[(KAI_GPU_FRACTION, "1")], MAIN, 8, false),
            (&[(KAI_GPU_FRACTION, "0.3")], MAIN, 3, true),
            (&[(KAI_GPU_MEMORY, "8192")], MAIN, 2, false),
            (&[(KAI_GPU_MEMORY, "2000")], MAIN, 1, true),
            (
                &[(KAI_GPU_FRACTION, "1"), (KAI_GPU_FRACTION_NUM_DEVICES, "2")],
                MAIN,
                16,
                false,
            ),
            (
                &[
                    (KAI_GPU_FRACTION, "0.25"),
                    (KAI_GPU_FRACTION_CONTAINER, "side"),
                ],
                "side",
                2,
                false,
            ),
        ];
        for (ann, who, want, rounded) in table {
            let p = pod(&[], ann);
            let t = translate(&p, &c).expect("ok").expect("kai");
            assert_eq!(t.dialect, Dialect::Kai);
            let got: Vec<(String, u32)> = t
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.slices))
                .collect();
            assert_eq!(got, vec![(who.to_string(), *want)], "{ann:?}");
            assert_eq!(
                !t.warnings.is_empty(),
                *rounded,
                "{ann:?}: {:?}",
                t.warnings
            );
            // KAI's words come off the pod (KAI would reserve a GPU for them) and stay
            // in the original-words annotation.
            assert_eq!(t.remove_annotations.len(), ann.len());
            for (k, v) in *ann {
                assert_eq!(t.original["annotations"][*k], *v);
            }
        }
    }

    #[test]
    fn kai_requests_tessera_cannot_honour_are_refused_naming_the_field() {
        let c = Config::default();
        let table: &[(Words, &[&str])] = &[
            (&[(KAI_GPU_FRACTION, "0")], &["gpu-fraction", "\"0\""]),
            (&[(KAI_GPU_FRACTION, "1.5")], &["gpu-fraction", "\"1.5\""]),
            (&[(KAI_GPU_FRACTION, "-0.5")], &["gpu-fraction", "\"-0.5\""]),
            (&[(KAI_GPU_FRACTION, "half")], &["gpu-fraction", "\"half\""]),
            (&[(KAI_GPU_FRACTION, "NaN")], &["gpu-fraction", "\"NaN\""]),
            (
                &[(KAI_GPU_MEMORY, "100000")],
                &["gpu-memory", "\"100000\"", "more than one GPU"],
            ),
            (&[(KAI_GPU_MEMORY, "2Gi")], &["gpu-memory", "\"2Gi\""]),
            (
                &[(KAI_GPU_FRACTION, "0.5"), (KAI_GPU_MEMORY, "2000")],
                &["both set"],
            ),
            (
                &[
                    (KAI_GPU_FRACTION, "0.5"),
                    (KAI_GPU_FRACTION_NUM_DEVICES, "2"),
                ],
                &["gpu-fraction-num-devices", "each of 2 GPUs"],
            ),
            (
                &[
                    (KAI_GPU_FRACTION, "0.5"),
                    (KAI_GPU_FRACTION_NUM_DEVICES, "0"),
                ],
                &["gpu-fraction-num-devices", "\"0\""],
            ),
            (
                &[
                    (KAI_GPU_FRACTION, "0.5"),
                    (KAI_GPU_FRACTION_CONTAINER, "nope"),
                ],
                &["gpu-fraction-container-name", "\"nope\""],
            ),
        ];
        for (ann, words) in table {
            let msg = refusal(&pod(&[], ann), &c);
            for w in *words {
                assert!(msg.contains(w), "{ann:?}: {msg:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn volcano_requests_become_slices_or_are_refused() {
        let c = Config::default();
        let table: &[(Words, u32, bool)] = &[
            (
                &[(VOLCANO_VGPU_NUMBER, "1"), (VOLCANO_VGPU_MEMORY, "1024")],
                1,
                true,
            ),
            (
                &[
                    (VOLCANO_VGPU_NUMBER, "1"),
                    (VOLCANO_VGPU_MEMORY, "8192"),
                    (VOLCANO_VGPU_CORES, "50"),
                ],
                4,
                false,
            ),
            (
                &[
                    (VOLCANO_VGPU_NUMBER, "1"),
                    (VOLCANO_VGPU_MEMORY_PERCENTAGE, "25"),
                ],
                2,
                false,
            ),
            (&[(VOLCANO_VGPU_NUMBER, "2")], 16, false),
            (&[(VOLCANO_VGPU_MEMORY, "4096")], 1, false),
        ];
        for (limits, want, rounded) in table {
            let (got, warnings) = slices(&pod(limits, &[]), &c);
            assert_eq!(got, vec![(MAIN.to_string(), *want)], "{limits:?}");
            assert_eq!(!warnings.is_empty(), *rounded, "{limits:?}: {warnings:?}");
        }
        let bad: &[(Words, &[&str])] = &[
            (
                &[(VOLCANO_VGPU_CORES, "101")],
                &["volcano.sh/vgpu-cores", "\"101\""],
            ),
            (
                &[(VOLCANO_VGPU_NUMBER, "2"), (VOLCANO_VGPU_MEMORY, "1024")],
                &["volcano.sh/vgpu-number", "each of 2 GPUs"],
            ),
            (
                &[(VOLCANO_VGPU_MEMORY_PERCENTAGE, "101")],
                &["volcano.sh/vgpu-memory-percentage", "\"101\""],
            ),
            (
                &[
                    (VOLCANO_VGPU_MEMORY, "1024"),
                    (VOLCANO_VGPU_MEMORY_PERCENTAGE, "10"),
                ],
                &["both"],
            ),
        ];
        for (limits, words) in bad {
            let msg = refusal(&pod(limits, &[]), &c);
            for w in *words {
                assert!(msg.contains(w), "{limits:?}: {msg:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn dialects_not_accepted_are_left_alone_and_mixing_is_refused() {
        let only_kai = Config {
            dialects: [Dialect::Kai].into_iter().collect(),
            ..Config::default()
        };
        assert_eq!(
            translate(&pod(&[(HAMI_GPUMEM, "4096")], &[]), &only_kai),
            Ok(None)
        );
        assert_eq!(
            translate(&pod(&[(VOLCANO_VGPU_MEMORY, "4096")], &[]), &only_kai),
            Ok(None)
        );
        // Bare nvidia.com/gpu is NVIDIA's device plugin's as much as HAMi's: left alone.
        assert_eq!(
            translate(&pod(&[(HAMI_GPU, "1")], &[]), &Config::default()),
            Ok(None)
        );
        let msg = refusal(
            &pod(&[(HAMI_GPUMEM, "4096")], &[(KAI_GPU_FRACTION, "0.5")]),
            &Config::default(),
        );
        assert!(msg.contains("hami, kai"), "{msg}");
    }

    #[test]
    fn a_compute_share_is_a_cap_guaranteed_policy() {
        let c = Config::default();
        let t = |limits, ann| {
            translate(&pod(limits, ann), &c)
                .expect("ok")
                .expect("translated")
        };
        assert!(t(&[(HAMI_GPUMEM, "4096"), (HAMI_GPUCORES, "25")], &[]).cap_compute);
        assert!(t(&[(VOLCANO_VGPU_CORES, "50")], &[]).cap_compute);
        // gpucores 0 is no limit; memory alone is no compute ask; KAI sets none.
        assert!(!t(&[(HAMI_GPUMEM, "4096"), (HAMI_GPUCORES, "0")], &[]).cap_compute);
        assert!(!t(&[(HAMI_GPUMEM, "4096")], &[]).cap_compute);
        assert!(!t(&[], &[(KAI_GPU_FRACTION, "0.5")]).cap_compute);
        // The user's own guaranteed agrees; burst contradicts the cap.
        assert!(
            t(
                &[(HAMI_GPUCORES, "25")],
                &[("tessera.dev/compute-policy", "guaranteed")]
            )
            .cap_compute
        );
        let msg = refusal(
            &pod(
                &[(HAMI_GPUCORES, "25")],
                &[("tessera.dev/compute-policy", "burst")],
            ),
            &c,
        );
        assert!(
            msg.contains("tessera.dev/compute-policy: \"burst\""),
            "{msg}"
        );
    }

    #[test]
    fn kais_own_gpu_env_comes_off_the_translated_container() {
        let from =
            |key: &str| json!({"configMapKeyRef": {"name": "p-abc-runai-sh-gpu-0", "key": key}});
        // KAI's older key, and its current one (NVIDIA_VISIBLE_DEVICES from its own
        // ConfigMap), with the envFrom and the ConfigMap volume its admission adds
        // (pkg/binder/common in KAI-Scheduler).
        for key in [KAI_VISIBLE_DEVICES_KEY, "NVIDIA_VISIBLE_DEVICES"] {
            let raw = json!({
                "metadata": {"name": "p", "annotations": {
                    KAI_GPU_FRACTION: "0.5", KAI_CONFIGMAP_ANNOTATION: "p-abc-runai-sh-gpu"}},
                "spec": {"containers": [{"name": "main", "image": "x", "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": from(key)},
                    {"name": "RUNAI_NUM_OF_GPUS", "valueFrom": from("RUNAI_NUM_OF_GPUS")},
                    {"name": "GPU_PORTION", "valueFrom": from("GPU_PORTION")},
                    {"name": "HOME", "value": "/root"}
                ], "envFrom": [
                    {"configMapRef": {"name": "p-abc-runai-sh-gpu-0-evar", "optional": false}},
                    {"configMapRef": {"name": "mine"}}
                ], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [
                    {"name": "p-abc-runai-sh-gpu-0-vol", "configMap": {"name": "p-abc-runai-sh-gpu-0"}},
                    {"name": "data", "emptyDir": {}}
                ]}
            });
            let p: Pod = serde_json::from_value(raw.clone()).expect("pod");
            let t = translate(&p, &Config::default()).expect("ok").expect("kai");
            let mut out = raw.clone();
            apply(&mut out, &t);
            let c = &out["spec"]["containers"][0];
            assert_eq!(
                c["env"],
                json!([{"name": "HOME", "value": "/root"}]),
                "{key}"
            );
            assert_eq!(c["envFrom"], json!([{"configMapRef": {"name": "mine"}}]));
            assert_eq!(
                out["spec"]["volumes"],
                json!([{"name": "data", "emptyDir": {}}])
            );
            assert_eq!(c["volumeMounts"].as_array().map(Vec::len), Some(1));
            // The whole admission of this pod: admission.rs's
            // `kai_pods_are_admitted_whole_and_a_second_pass_changes_nothing`.
        }
        // A pod's own NVIDIA_VISIBLE_DEVICES from its own ConfigMap stays (and is refused
        // as for any slice container).
        let own = json!({
            "metadata": {"name": "p", "annotations": {
                KAI_GPU_FRACTION: "0.5", KAI_CONFIGMAP_ANNOTATION: "p-abc-runai-sh-gpu"}},
            "spec": {"containers": [{"name": "main", "image": "x", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "mine", "key": "NVIDIA_VISIBLE_DEVICES"}}}
            ]}]}
        });
        let p: Pod = serde_json::from_value(own).expect("pod");
        let t = translate(&p, &Config::default()).expect("ok").expect("kai");
        assert!(t.containers[0].remove_env.is_empty());
        let raw = json!({
            "metadata": {"name": "p", "annotations": {
                KAI_GPU_FRACTION: "0.5", KAI_CONFIGMAP_ANNOTATION: "p-abc-runai-sh-gpu"}},
            "spec": {"containers": [{"name": "main", "image": "x"}]}
        });
        let p: Pod = serde_json::from_value(raw.clone()).expect("pod");
        let t = translate(&p, &Config::default()).expect("ok").expect("kai");
        let mut out = raw.clone();
        apply(&mut out, &t);
        let ann = out["metadata"]["annotations"]
            .as_object()
            .expect("annotations");
        assert!(!ann.contains_key(KAI_CONFIGMAP_ANNOTATION) && !ann.contains_key(KAI_GPU_FRACTION));
        // KAI's admission alone (its ConfigMap annotation, no fraction) is not a request.
        let only_cm = pod(&[], &[(KAI_CONFIGMAP_ANNOTATION, "x")]);
        assert_eq!(translate(&only_cm, &Config::default()), Ok(None));
    }

    #[test]
    fn with_kai_picking_the_gpu_its_words_stay_and_only_the_gpu_env_goes() {
        let kai_picks = Config {
            kai_gpu_choice: true,
            ..Config::default()
        };
        let mut raw = kai_admitted_pod("NVIDIA_VISIBLE_DEVICES");
        raw["spec"]["schedulerName"] = json!("kai-scheduler");
        let p: Pod = serde_json::from_value(raw.clone()).expect("pod");
        let t = translate(&p, &kai_picks).expect("ok").expect("kai");
        assert!(t.remove_annotations.is_empty() && t.remove_volumes.is_empty());
        let mut out = raw.clone();
        apply(&mut out, &t);
        let c = &out["spec"]["containers"][0];
        assert_eq!(
            c["resources"]["limits"][tessera_contract::labels::RESOURCE],
            "4"
        );
        // Only the GPU KAI's binder would name comes off: the device plugin names it.
        let names: Vec<&str> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(names, ["RUNAI_NUM_OF_GPUS", "GPU_PORTION"]);
        assert_eq!(c["envFrom"], raw["spec"]["containers"][0]["envFrom"]);
        assert_eq!(out["spec"]["volumes"], raw["spec"]["volumes"]);
        assert_eq!(
            c["volumeMounts"],
            raw["spec"]["containers"][0]["volumeMounts"]
        );
        // KAI's words stay (KAI places a fraction and its binder reserves the GPU), and
        // are recorded too.
        let ann = &out["metadata"]["annotations"];
        assert_eq!(ann[KAI_GPU_FRACTION], "0.5");
        assert_eq!(ann[KAI_CONFIGMAP_ANNOTATION], "p-abc-runai-sh-gpu");
        assert!(
            ann[ANNOTATION_ORIGINAL]
                .as_str()
                .expect("original")
                .contains("0.5")
        );

        // The whole admission, twice: admission.rs's
        // `kai_pods_are_admitted_whole_and_a_second_pass_changes_nothing`.
        // With KAI's words kept, the same slices beside them are no contradiction;
        // others are, naming both.
        let with = |n: &str| {
            pod(
                &[(tessera_contract::labels::RESOURCE, n)],
                &[(KAI_GPU_FRACTION, "0.5")],
            )
        };
        assert_eq!(
            translate(&with("4"), &kai_picks)
                .expect("same")
                .expect("kai")
                .containers[0]
                .slices,
            4
        );
        let msg = refusal(&with("8"), &kai_picks);
        assert!(
            msg.contains("tessera.dev/vgpu: \"8\"")
                && msg.contains(KAI_GPU_FRACTION)
                && msg.contains("4 slices"),
            "{msg}"
        );
        // Without KAI picking, Tessera's resource beside KAI's words is refused as before.
        assert!(refusal(&with("4"), &Config::default()).contains("asks both"));
    }

    #[test]
    fn hami_words_for_amd_and_hygon_cards_become_slices_on_that_vendor() {
        use tessera_contract::Vendor;
        let c = Config::default();
        for (words, vendor) in [(HAMI_AMD, Vendor::Amd), (HAMI_HYGON, Vendor::Hygon)] {
            let p = pod(
                &[
                    (words.gpu, "1"),
                    (words.gpumem, "8192"),
                    (words.gpucores, "25"),
                ],
                &[],
            );
            let t = translate(&p, &c).expect("accepted").expect("translated");
            assert_eq!(t.dialect, Dialect::Hami);
            assert_eq!(t.vendor, Some(vendor));
            // 8 GiB and 25% of 4 GiB, 12.5% slices: 2 slices.
            assert_eq!(t.containers[0].slices, 2, "{vendor}");
            assert!(t.cap_compute);
            let mut remove = t.containers[0].remove.clone();
            remove.sort();
            let mut want = vec![words.gpu, words.gpumem, words.gpucores];
            want.sort();
            assert_eq!(remove, want);
            let mut raw = serde_json::to_value(&p).expect("json");
            apply(&mut raw, &t);
            assert_eq!(
                raw["metadata"]["annotations"][tessera_contract::labels::ANNOTATION_GPU_VENDOR],
                vendor.as_str()
            );
            assert!(raw["spec"]["containers"][0]["resources"]["limits"][words.gpumem].is_null());
        }
        // The count alone is the vendor's own device plugin's word: not HAMi's, left alone.
        assert_eq!(translate(&pod(&[(HAMI_AMD.gpu, "1")], &[]), &c), Ok(None));
        // NVIDIA's words keep meaning any GPU.
        let t = translate(&pod(&[(HAMI_GPUMEM, "4096")], &[]), &c)
            .unwrap()
            .unwrap();
        assert_eq!(t.vendor, None);
    }

    #[test]
    fn one_pod_one_vendor() {
        let c = Config::default();
        let e = refusal(
            &pod(
                &[(HAMI_AMD.gpumem, "4096"), (HAMI_HYGON.gpumem, "4096")],
                &[],
            ),
            &c,
        );
        assert!(e.contains("several vendors"), "{e}");
        let e = refusal(
            &pod(
                &[(HAMI_AMD.gpumem, "4096")],
                &[(tessera_contract::labels::ANNOTATION_GPU_VENDOR, "nvidia")],
            ),
            &c,
        );
        assert!(e.contains("says otherwise"), "{e}");
        let e = refusal(&pod(&[(HAMI_AMD.gpumem, "lots")], &[]), &c);
        assert!(
            e.contains("amd.com/gpumem") && e.contains("\"lots\""),
            "{e}"
        );
    }

    #[test]
    fn apply_rewrites_resources_and_keeps_the_words() {
        let p = pod(&[(HAMI_GPU, "1"), (HAMI_GPUMEM, "8192")], &[]);
        let mut raw = serde_json::to_value(&p).expect("json");
        raw["spec"]["containers"][0]["resources"]["requests"] =
            json!({HAMI_GPU: "1", HAMI_GPUMEM: "8192", "cpu": "1"});
        raw["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("2");
        let t = translate(&p, &Config::default())
            .expect("ok")
            .expect("hami");
        apply(&mut raw, &t);
        let res = &raw["spec"]["containers"][0]["resources"];
        assert_eq!(res["limits"], json!({"cpu": "2", "tessera.dev/vgpu": "2"}));
        assert_eq!(
            res["requests"],
            json!({"cpu": "1", "tessera.dev/vgpu": "2"})
        );
        let original: Value = serde_json::from_str(
            raw["metadata"]["annotations"][ANNOTATION_ORIGINAL]
                .as_str()
                .expect("annotation"),
        )
        .expect("json");
        assert_eq!(
            original,
            json!({"dialect": "hami", "containers": {"main": {HAMI_GPU: "1", HAMI_GPUMEM: "8192"}}})
        );
    }
}
