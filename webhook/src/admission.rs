//! The admission decision: a pure function from an AdmissionReview request to its response.
//!
//! Nothing here does I/O. Reads go through the typed `Pod` (so a malformed pod is refused
//! with serde's message); edits go to the raw JSON the API server sent, and the JSON patch
//! is the difference between the two. Editing the raw JSON rather than re-serialising the
//! typed `Pod` matters: fields newer than our k8s-openapi version would otherwise show up
//! as removals in the patch.
//!
//! The webhook writes nothing under `tessera.dev/` but a translated pod's original words
//! (and HAMi's priority as Tessera's): every decision is re-derived from the pod spec, so
//! a second pass (reinvocation, or a pod that was already injected) finds nothing to
//! change and produces an empty patch.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize as _;
use serde_json::{Map, Value, json};

// The names this module shares with the device plugin, the manager and the
// shim are the contract's: the extended resource, where the device plugin
// mounts the shim, the pod annotations and node label, the environment
// variables, and the compute policies a pod may ask for.
use tessera_contract::env::LD_PRELOAD;
pub use tessera_contract::env::{
    COMPUTE_POLICY as ENV_COMPUTE_POLICY, NO_GPUS, NVIDIA_VISIBLE_DEVICES as ENV_VISIBLE_DEVICES,
};
pub use tessera_contract::labels::{
    ANNOTATION_COMPUTE_POLICY, ANNOTATION_GPU_CLASS, ANNOTATION_GPU_VENDOR, ANNOTATION_PRIORITY,
    NODE_GPU_CLASS as LABEL_GPU_CLASS, RESOURCE,
};
use tessera_contract::labels::{NODE_GPU_MODEL_PREFIX, model_label_value};
pub use tessera_contract::paths::CONTAINER_HOOK_LIBRARY as HOOK_PATH;
use tessera_contract::{Policy, env, gpu_filter};

use crate::dropin::{self, Config};

/// Variables the device plugin's `Allocate` sets. A pod that sets them itself would
/// override the device plugin (pod env comes after device env, and the last one wins), and
/// could point the shim at a control file of its own making or see every GPU.
const DEVICE_PLUGIN_ENV: [&str; 4] = [
    env::CONTROL,
    env::STATE,
    env::ALLOCATION,
    ENV_VISIBLE_DEVICES,
];

/// Pod annotations a user may set under `tessera.dev/`. The GPU lists only narrow the
/// pod's own choice of GPU, so a tenant gains nothing by writing them.
const USER_ANNOTATIONS: [&str; 8] = [
    ANNOTATION_GPU_CLASS,
    ANNOTATION_COMPUTE_POLICY,
    ANNOTATION_PRIORITY,
    ANNOTATION_GPU_VENDOR,
    gpu_filter::ANNOTATION_GPU_MODELS,
    gpu_filter::ANNOTATION_GPU_MODELS_EXCLUDE,
    gpu_filter::ANNOTATION_GPU_UUIDS,
    gpu_filter::ANNOTATION_GPU_UUIDS_EXCLUDE,
];

/// Annotations under `tessera.dev/` the webhook itself writes: the original words of a
/// translated pod, informational only (nothing decides anything from it), and its exact
/// limits (MiB and compute, and a share of the card's memory), which the node enforces only as the smaller of them and the pod's slices. So a
/// copy a user wrote can mislead a reader, or lower the user's own limits, never more. A
/// translated pod's are always the webhook's (written over, or taken off).
const WEBHOOK_ANNOTATIONS: [&str; 3] = [
    tessera_contract::dropin::ANNOTATION_ORIGINAL,
    tessera_contract::dropin::ANNOTATION_EXACT_LIMITS,
    tessera_contract::dropin::ANNOTATION_EXACT_MEMORY_PERCENT,
];

/// Why a pod is refused. Each message names the container (or annotation) and says what
/// to change, because it is what `kubectl apply` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A pod in another project's words that Tessera cannot honour; the message names the
    /// field and quotes the pod's value (`dropin::translate`).
    #[error("{0}")]
    DropIn(String),
    #[error("the object is not a valid Pod: {reason}")]
    NotAPod { reason: String },
    #[error(
        "annotation {key:?} is in Tessera's namespace and only Tessera may set it; users may set only {}",
        USER_ANNOTATIONS.join(", ")
    )]
    ForgedAnnotation { key: String },
    #[error(
        "annotation {ANNOTATION_COMPUTE_POLICY}={value:?} is not a compute policy; use \"guaranteed\" or \"burst\""
    )]
    BadComputePolicy { value: String },
    /// `reason` is the contract's one line: the value and the range.
    #[error("{reason}")]
    BadPriority { value: String, reason: String },
    #[error(
        "annotation {ANNOTATION_GPU_CLASS}={value:?} is not a valid label value (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
    )]
    BadGpuClass { value: String },
    #[error("annotation {ANNOTATION_GPU_VENDOR}={value:?}: {reason}")]
    BadGpuVendor { value: String, reason: String },
    /// A GPU list annotation that is malformed; `reason` names it.
    #[error("{reason}")]
    BadGpuList { reason: String },
    #[error(
        "annotation {}={value:?} names no GPU model this cluster has ({known}); an entry matches a model it occurs in, ignoring case",
        gpu_filter::ANNOTATION_GPU_MODELS
    )]
    UnknownGpuModel { value: String, known: String },
    #[error(
        "annotation {ANNOTATION_GPU_CLASS}={class:?} contradicts nodeSelector {LABEL_GPU_CLASS}={selector:?}; the pod could never be scheduled"
    )]
    GpuClassConflict { class: String, selector: String },
    #[error(
        "container {container:?}: {RESOURCE} must be a whole number of slices of at least 1, like \"2\"; got {value:?}"
    )]
    BadSliceCount { container: String, value: String },
    #[error(
        "container {container:?}: {RESOURCE} is set in requests ({requests:?}) but not in limits; set it in limits (requests may be left out)"
    )]
    RequestsWithoutLimits { container: String, requests: String },
    #[error(
        "container {container:?}: {RESOURCE} requests ({requests:?}) and limits ({limits:?}) disagree; slices cannot be overcommitted, set them equal or leave requests out"
    )]
    RequestsLimitsDiffer {
        container: String,
        requests: String,
        limits: String,
    },
    #[error(
        "container {container:?} is privileged and requests {RESOURCE}; a privileged container sees every GPU on the node and bypasses its slice limits"
    )]
    Privileged { container: String },
    #[error(
        "container {container:?} requests both {RESOURCE} and {other}; a container gets either whole GPUs or Tessera slices, not both"
    )]
    MixedGpuResources { container: String, other: String },
    #[error(
        "container {container:?} sets {name}, which Tessera's device plugin sets for containers with slices; remove it from the pod spec"
    )]
    ReservedEnv { container: String, name: String },
    #[error(
        "container {container:?} sets LD_PRELOAD from a ConfigMap or Secret; Tessera must put its shim first in LD_PRELOAD, so give LD_PRELOAD as a plain value"
    )]
    LdPreloadFromSource { container: String },
    #[error(
        "container {container:?} sets {ENV_COMPUTE_POLICY}; ask for a compute policy with the pod annotation {ANNOTATION_COMPUTE_POLICY} instead"
    )]
    ComputePolicyEnv { container: String },
    #[error(
        "container {container:?} requests no {RESOURCE} but sets {ENV_VISIBLE_DEVICES}={value:?}; in a pod with slices, containers without slices see no GPU. Request slices for it instead"
    )]
    GpuWithoutSlices { container: String, value: String },
}

/// All the reasons a pod was refused; shown to the user together so one `kubectl apply`
/// tells them everything to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusals(pub Vec<Refusal>);

impl fmt::Display for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tessera refused this pod: ")?;
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// A request body that is not an AdmissionReview we can answer. The server turns these into
/// HTTP 400 with the message; the API server then reports the webhook call as failed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not an AdmissionReview: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error(
        "expected apiVersion \"admission.k8s.io/v1\" kind \"AdmissionReview\", got apiVersion {api_version:?} kind {kind:?}"
    )]
    WrongType { api_version: String, kind: String },
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("cannot serialise the response: {0}")]
    Serialise(#[source] serde_json::Error),
}

/// Answers one AdmissionReview body with the default drop-in config (every dialect).
pub fn review(body: &[u8]) -> Result<Vec<u8>, ReviewError> {
    review_with(body, &Config::default())
}

/// Answers one AdmissionReview body: parse, decide, serialise. Pure.
pub fn review_with(body: &[u8], config: &Config) -> Result<Vec<u8>, ReviewError> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(ReviewError::Malformed)?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(ReviewError::WrongType {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let response = mutate_with(&request, config);
    let mut out = serde_json::to_value(response.into_review()).map_err(ReviewError::Serialise)?;
    // The API defines `patch` as base64 text (Go's []byte); kube-core writes a number array.
    if let Some(patch) = out.pointer_mut("/response/patch")
        && let Ok(bytes) = serde_json::from_value::<Vec<u8>>(patch.clone())
    {
        use base64::Engine as _;
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    serde_json::to_vec(&out).map_err(ReviewError::Serialise)
}

/// The webhook's decision for one request, with the default drop-in config.
pub fn mutate(request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    mutate_with(request, &Config::default())
}

/// The webhook's decision for one request.
pub fn mutate_with(
    request: &AdmissionRequest<DynamicObject>,
    config: &Config,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let kind = &request.kind;
    if !kind.group.is_empty() || kind.version != "v1" || kind.kind != "Pod" {
        let group = if kind.group.is_empty() {
            String::new()
        } else {
            format!("{}/", kind.group)
        };
        return response.deny(format!(
            "Tessera's webhook only handles v1 Pods, got {group}{}/{}; check the rules of the MutatingWebhookConfiguration",
            kind.version, kind.kind
        ));
    }
    // Only CREATE can add environment or affinity: a running pod's containers are fixed.
    if request.operation != Operation::Create || request.sub_resource.is_some() {
        return response;
    }
    let Some(object) = &request.object else {
        return response.deny("AdmissionReview for a pod CREATE carries no object");
    };
    let raw = match serde_json::to_value(object) {
        Ok(v) => v,
        Err(e) => return response.deny(format!("cannot read the pod: {e}")),
    };
    match mutate_pod_with(&raw, config) {
        Ok((patched, warnings)) => {
            let mut response = response;
            if !warnings.is_empty() {
                response.warnings = Some(warnings);
            }
            let patch = json_patch::diff(&raw, &patched);
            if patch.0.is_empty() {
                return response;
            }
            match response.clone().with_patch(patch) {
                Ok(r) => r,
                Err(e) => response.deny(format!("cannot serialise the patch: {e}")),
            }
        }
        Err(refusals) => response.deny(refusals.to_string()),
    }
}

/// Which of the pod's container lists a container is in; also its JSON field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Init,
    App,
}

impl List {
    fn field(self) -> &'static str {
        match self {
            List::Init => "initContainers",
            List::App => "containers",
        }
    }
}

/// Returns the pod (raw JSON) as it should be admitted (default drop-in config), or every
/// reason to refuse it.
pub fn mutate_pod(raw: &Value) -> Result<Value, Refusals> {
    mutate_pod_with(raw, &Config::default()).map(|(pod, _)| pod)
}

/// Returns the pod (raw JSON) as it should be admitted and the warnings for the user, or
/// every reason to refuse it. A pod in an accepted dialect is first translated
/// (`dropin::translate`), then judged and injected like any pod asking for slices.
pub fn mutate_pod_with(raw: &Value, config: &Config) -> Result<(Value, Vec<String>), Refusals> {
    let not_a_pod = |e: serde_json::Error| {
        Refusals(vec![Refusal::NotAPod {
            reason: e.to_string(),
        }])
    };
    // Deserialised from the borrowed JSON (no copy of it): see below.
    let pod = Pod::deserialize(raw).map_err(not_a_pod)?;
    let mut warnings = Vec::new();
    // A review's memory is budgeted per body byte (server::PARSE_COST): the pod's JSON is
    // copied once, into the answer, whether or not it is translated.
    let (raw, pod) = match dropin::translate(&pod, config) {
        Ok(None) => (raw.clone(), pod),
        Ok(Some(t)) => {
            // The untranslated pod goes before the translated one is built, so a
            // translated review holds no more at once than an untranslated one.
            drop(pod);
            let mut v = raw.clone();
            dropin::apply(&mut v, &t);
            warnings.extend(t.warnings);
            let pod = Pod::deserialize(&v).map_err(not_a_pod)?;
            // Moved on, not copied again: it is the copy the pod is injected into.
            (v, pod)
        }
        Err(lines) => return Err(Refusals(lines.into_iter().map(Refusal::DropIn).collect())),
    };
    let out = mutate_translated(raw, &pod, &config.gpu_models)?;
    // Only pods that get slices run under the shim, which reads none of these.
    if has_slices(&pod) {
        warnings.extend(dropin::hami_core_env_warnings(&pod));
    }
    Ok((out, warnings))
}

fn has_slices(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .any(|c| gpu_resources(c).iter().any(|r| r == RESOURCE))
}

/// The judgement and injection of a pod in Tessera's own words.
/// `raw` is the JSON `pod` was read from; it is edited into the answer. `gpu_models`: the
/// cluster's GPU models where the config names them (`dropin::Config::gpu_models`).
fn mutate_translated(raw: Value, pod: &Pod, gpu_models: &[String]) -> Result<Value, Refusals> {
    let mut refusals = Vec::new();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let (class, policy) = check_annotations(&annotations, &mut refusals);
    // The models a model list allows, where the cluster's are known: none is a pod that
    // could never run; some become node affinity below.
    let mut models = Vec::new();
    if let Some(v) = annotations.get(gpu_filter::ANNOTATION_GPU_MODELS)
        && !gpu_models.is_empty()
    {
        let entries = gpu_filter::split_list(v);
        models = dropin::known_models(&entries, gpu_models);
        if models.is_empty() && !entries.is_empty() {
            refusals.push(Refusal::UnknownGpuModel {
                value: v.clone(),
                known: gpu_models.join(", "),
            });
        }
    }

    let spec = pod.spec.clone().unwrap_or_default();
    if let (Some(class), Some(selector)) = (
        &class,
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get(LABEL_GPU_CLASS)),
    ) && class != selector
    {
        refusals.push(Refusal::GpuClassConflict {
            class: class.clone(),
            selector: selector.clone(),
        });
    }

    let lists = [
        (List::Init, spec.init_containers.clone().unwrap_or_default()),
        (List::App, spec.containers.clone()),
    ];
    let mut plans = Vec::new();
    let mut any_slices = false;
    for (list, containers) in &lists {
        for (index, c) in containers.iter().enumerate() {
            let plan = plan_container(c, policy.as_deref(), &mut refusals);
            any_slices |= matches!(plan, Plan::Inject { .. });
            plans.push((*list, index, plan));
        }
    }
    if !refusals.is_empty() {
        return Err(Refusals(refusals));
    }
    let mut out = raw;
    // A pod without slices is left exactly as it came: it only reached us for its
    // annotations, and those passed.
    if !any_slices {
        return Ok(out);
    }
    for (list, index, plan) in plans {
        let env = env_list(&mut out, list, index);
        match plan {
            Plan::Inject { ld_preload } => {
                match ld_preload {
                    LdPreload::Absent => env.push(env_var(LD_PRELOAD, HOOK_PATH)),
                    LdPreload::Rewrite { position, value } => {
                        env[position] = env_var(LD_PRELOAD, &value);
                    }
                    LdPreload::AlreadyFirst => {}
                }
                if let Some(policy) = &policy
                    && !env.iter().any(|e| is_env(e, ENV_COMPUTE_POLICY))
                {
                    env.push(env_var(ENV_COMPUTE_POLICY, policy));
                }
            }
            Plan::HideGpus => env.push(env_var(ENV_VISIBLE_DEVICES, NO_GPUS)),
            Plan::Leave => {}
        }
        drop_empty_env(&mut out, list, index);
    }
    if let Some(class) = class {
        require_gpu_class(&mut out, &class);
    }
    // Checked above: a vendor that does not parse is refused.
    if let Some(v) = annotations
        .get(ANNOTATION_GPU_VENDOR)
        .and_then(|v| v.parse::<tessera_contract::Vendor>().ok())
    {
        let requirement = json!({ "key": v.node_label(), "operator": "Exists" });
        require_node(&mut out, requirement);
    }
    // A node with one of the models: its per-model label exists. Excluded models and
    // UUIDs have no such label (a node may have an excluded model beside an allowed
    // one); the device plugin and the extender hold the pod to those.
    if !models.is_empty() {
        let requirements = models
            .iter()
            .map(|m| {
                let key = format!("{NODE_GPU_MODEL_PREFIX}{}", model_label_value(m));
                json!({ "key": key, "operator": "Exists" })
            })
            .collect();
        require_node_any(&mut out, requirements);
    }
    Ok(out)
}

/// Validates the pod's `tessera.dev/` annotations; returns the class and policy asked for.
fn check_annotations(
    annotations: &BTreeMap<String, String>,
    refusals: &mut Vec<Refusal>,
) -> (Option<String>, Option<String>) {
    for key in annotations.keys() {
        if in_tessera_namespace(key)
            && !USER_ANNOTATIONS.contains(&key.as_str())
            && !WEBHOOK_ANNOTATIONS.contains(&key.as_str())
        {
            refusals.push(Refusal::ForgedAnnotation { key: key.clone() });
        }
    }
    let class = annotations.get(ANNOTATION_GPU_CLASS).cloned();
    if let Some(c) = &class
        && !is_label_value(c)
    {
        refusals.push(Refusal::BadGpuClass { value: c.clone() });
    }
    if let Some(v) = annotations.get(ANNOTATION_GPU_VENDOR)
        && let Err(e) = v.parse::<tessera_contract::Vendor>()
    {
        refusals.push(Refusal::BadGpuVendor {
            value: v.clone(),
            reason: e.to_string(),
        });
    }
    // The vendor was judged above; the lists are the rest of the GPU filter.
    let lists: BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| gpu_filter::LIST_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Err(reason) = gpu_filter::GpuFilter::from_annotations(&lists) {
        refusals.push(Refusal::BadGpuList { reason });
    }
    let policy = annotations.get(ANNOTATION_COMPUTE_POLICY).cloned();
    if let Some(p) = &policy
        && Policy::parse(p).is_none()
    {
        refusals.push(Refusal::BadComputePolicy { value: p.clone() });
    }
    if let Some(p) = annotations.get(ANNOTATION_PRIORITY)
        && let Err(reason) = tessera_contract::labels::parse_priority(p)
    {
        refusals.push(Refusal::BadPriority {
            value: p.clone(),
            reason,
        });
    }
    (class, policy)
}

/// `tessera.dev/x` and `anything.tessera.dev/x` are Tessera's; `tessera.dev.example/x` is not.
fn in_tessera_namespace(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, _)) => prefix == "tessera.dev" || prefix.ends_with(".tessera.dev"),
        None => false,
    }
}

/// A Kubernetes label value, non-empty (an empty class would match unlabelled nodes).
fn is_label_value(v: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !v.is_empty()
        && v.len() <= 63
        && v.chars().all(ok_char)
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// What to do with one container.
#[derive(Debug)]
enum Plan {
    /// It holds slices: put the shim in front.
    Inject { ld_preload: LdPreload },
    /// It holds no slices and no other GPU resource: it must not see the node's GPUs.
    HideGpus,
    /// Nothing to change.
    Leave,
}

#[derive(Debug)]
enum LdPreload {
    Absent,
    AlreadyFirst,
    Rewrite { position: usize, value: String },
}

fn plan_container(c: &Container, policy: Option<&str>, refusals: &mut Vec<Refusal>) -> Plan {
    let before = refusals.len();
    let slices = slice_count(c, refusals);
    let env = c.env.clone().unwrap_or_default();
    let wants_slices = slices.is_some() || refusals.len() > before;
    if !wants_slices {
        return plan_without_slices(c, &env, refusals);
    }
    let name = &c.name;
    if c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
    {
        refusals.push(Refusal::Privileged {
            container: name.clone(),
        });
    }
    if let Some(other) = gpu_resources(c).into_iter().find(|r| r != RESOURCE) {
        refusals.push(Refusal::MixedGpuResources {
            container: name.clone(),
            other,
        });
    }
    for reserved in DEVICE_PLUGIN_ENV {
        if env.iter().any(|e| e.name == reserved) {
            refusals.push(Refusal::ReservedEnv {
                container: name.clone(),
                name: reserved.to_string(),
            });
        }
    }
    // The env entry is ours when it carries exactly the annotation's value (a previous pass
    // of this webhook); anything else would let the pod bypass the annotation's validation.
    for e in env.iter().filter(|e| e.name == ENV_COMPUTE_POLICY) {
        if e.value_from.is_some() || policy.is_none() || e.value.as_deref() != policy {
            refusals.push(Refusal::ComputePolicyEnv {
                container: name.clone(),
            });
            break;
        }
    }
    // Kubernetes keeps the last of duplicate names, so that is the one that counts.
    let ld_preload = match env.iter().rposition(|e| e.name == LD_PRELOAD) {
        None => LdPreload::Absent,
        Some(position) => {
            let var = &env[position];
            if var.value_from.is_some() {
                refusals.push(Refusal::LdPreloadFromSource {
                    container: name.clone(),
                });
                LdPreload::AlreadyFirst
            } else {
                preload_with_hook(var.value.as_deref().unwrap_or("")).map_or(
                    LdPreload::AlreadyFirst,
                    |value| LdPreload::Rewrite { position, value },
                )
            }
        }
    };
    Plan::Inject { ld_preload }
}

fn plan_without_slices(c: &Container, env: &[EnvVar], refusals: &mut Vec<Refusal>) -> Plan {
    // A container that gets whole GPUs from another device plugin keeps them: the NVIDIA
    // runtime needs the variable that plugin sets.
    if !gpu_resources(c).is_empty() {
        return Plan::Leave;
    }
    // A container with DRA claims gets its devices, and for Tessera's driver the
    // shim, from the claims' CDI edits (docs/dra.md): hiding the GPUs here would
    // override what CDI sets.
    if c.resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .is_some_and(|claims| !claims.is_empty())
    {
        return Plan::Leave;
    }
    match env.iter().rfind(|e| e.name == ENV_VISIBLE_DEVICES) {
        None => Plan::HideGpus,
        Some(e) if e.value_from.is_none() && e.value.as_deref() == Some(NO_GPUS) => Plan::Leave,
        Some(e) => {
            let value = match (&e.value, &e.value_from) {
                (_, Some(_)) => "(from a ConfigMap or Secret)".to_string(),
                (Some(v), None) => v.clone(),
                (None, None) => String::new(),
            };
            refusals.push(Refusal::GpuWithoutSlices {
                container: c.name.clone(),
                value,
            });
            Plan::Leave
        }
    }
}

/// The container's slice count, or `None` when it asks for none. Problems go to `refusals`.
fn slice_count(c: &Container, refusals: &mut Vec<Refusal>) -> Option<u32> {
    let res = c.resources.as_ref();
    let limit = res
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(RESOURCE))
        .map(|q| q.0.clone());
    let request = res
        .and_then(|r| r.requests.as_ref())
        .and_then(|l| l.get(RESOURCE))
        .map(|q| q.0.clone());
    let container = c.name.clone();
    match (limit, request) {
        (None, None) => None,
        (None, Some(requests)) => {
            refusals.push(Refusal::RequestsWithoutLimits {
                container,
                requests,
            });
            None
        }
        (Some(limits), requests) => {
            let count = match parse_slices(&limits) {
                Some(n) => n,
                None => {
                    refusals.push(Refusal::BadSliceCount {
                        container,
                        value: limits,
                    });
                    return None;
                }
            };
            if let Some(requests) = requests
                && parse_slices(&requests) != Some(count)
            {
                refusals.push(Refusal::RequestsLimitsDiffer {
                    container,
                    requests,
                    limits,
                });
                return None;
            }
            Some(count)
        }
    }
}

/// A slice count is a plain positive decimal integer (one parser, shared with the
/// scheduler extender).
pub use tessera_contract::labels::parse_slices;

/// GPU-like extended resources the container requests (`tessera.dev/vgpu`, `nvidia.com/*`).
fn gpu_resources(c: &Container) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(r) = &c.resources {
        for map in [&r.limits, &r.requests].into_iter().flatten() {
            for name in map.keys() {
                let gpu = name == RESOURCE || name.starts_with("nvidia.com/");
                if gpu && !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
    }
    names
}

/// The new LD_PRELOAD value with the shim first, or `None` when it already is first.
/// ld.so separates entries by colons or spaces.
fn preload_with_hook(current: &str) -> Option<String> {
    let entries: Vec<&str> = current
        .split([':', ' '])
        .filter(|s| !s.is_empty())
        .collect();
    if entries.first() == Some(&HOOK_PATH) {
        return None;
    }
    let mut out = String::from(HOOK_PATH);
    for e in entries.into_iter().filter(|e| *e != HOOK_PATH) {
        out.push(':');
        out.push_str(e);
    }
    Some(out)
}

fn env_var(name: &str, value: &str) -> Value {
    json!({ "name": name, "value": value })
}

fn is_env(v: &Value, name: &str) -> bool {
    v.get("name").and_then(Value::as_str) == Some(name)
}

/// The container's `env` array in the raw pod, created if absent. The indexes come from
/// parsing this same JSON, so they are in range.
fn env_list(pod: &mut Value, list: List, index: usize) -> &mut Vec<Value> {
    let env = &mut pod["spec"][list.field()][index]["env"];
    if !env.is_array() {
        *env = Value::Array(Vec::new());
    }
    match env {
        Value::Array(a) => a,
        _ => unreachable!("env was just made an array"),
    }
}

/// Undoes `env_list`'s creation of an empty `env` when nothing was added, so an untouched
/// container does not show up in the patch.
fn drop_empty_env(pod: &mut Value, list: List, index: usize) {
    if let Some(c) = pod["spec"][list.field()][index].as_object_mut()
        && c.get("env")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
    {
        c.remove("env");
    }
}

/// Adds `tessera.dev/gpu-class In [class]` to every required node selector term (terms are
/// ORed, so each one must carry it), or one term with it when there are none.
fn require_gpu_class(pod: &mut Value, class: &str) {
    let requirement = json!({ "key": LABEL_GPU_CLASS, "operator": "In", "values": [class] });
    require_node(pod, requirement);
}

/// Adds `requirement` to every required node selector term, or one term with it.
fn require_node(pod: &mut Value, requirement: Value) {
    let required = object_at(pod, &["spec", "affinity", "nodeAffinity"])
        .entry("requiredDuringSchedulingIgnoredDuringExecution")
        .or_insert_with(|| json!({}));
    if !required.is_object() {
        *required = json!({});
    }
    let terms = &mut required["nodeSelectorTerms"];
    let has_terms = terms.as_array().is_some_and(|t| !t.is_empty());
    if !has_terms {
        *terms = json!([{ "matchExpressions": [requirement] }]);
        return;
    }
    if let Value::Array(terms) = terms {
        for term in terms {
            if !term.is_object() {
                *term = json!({});
            }
            let exprs = &mut term["matchExpressions"];
            if !exprs.is_array() {
                *exprs = json!([]);
            }
            if let Value::Array(exprs) = exprs
                && !exprs.contains(&requirement)
            {
                exprs.push(requirement.clone());
            }
        }
    }
}

/// Requires a node to meet one of `requirements` as well as what it required before:
/// each required term (ORed) becomes one term per requirement, the term's expressions
/// and that one (ANDed).
fn require_node_any(pod: &mut Value, requirements: Vec<Value>) {
    if let [one] = requirements.as_slice() {
        return require_node(pod, one.clone());
    }
    let required = object_at(pod, &["spec", "affinity", "nodeAffinity"])
        .entry("requiredDuringSchedulingIgnoredDuringExecution")
        .or_insert_with(|| json!({}));
    if !required.is_object() {
        *required = json!({});
    }
    let before: Vec<Value> = match required["nodeSelectorTerms"].as_array() {
        Some(t) if !t.is_empty() => t.clone(),
        _ => vec![json!({})],
    };
    let mut terms = Vec::with_capacity(before.len() * requirements.len());
    for term in &before {
        for r in &requirements {
            let mut t = if term.is_object() {
                term.clone()
            } else {
                json!({})
            };
            if !t["matchExpressions"].is_array() {
                t["matchExpressions"] = json!([]);
            }
            if let Value::Array(exprs) = &mut t["matchExpressions"]
                && !exprs.contains(r)
            {
                exprs.push(r.clone());
            }
            terms.push(t);
        }
    }
    required["nodeSelectorTerms"] = Value::Array(terms);
}

/// The object at `path` under `root`, creating empty objects on the way.
fn object_at<'a>(root: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut cur = root;
    for key in path {
        if !cur.get(*key).is_some_and(Value::is_object) {
            cur[*key] = json!({});
        }
        cur = &mut cur[*key];
    }
    if !cur.is_object() {
        *cur = json!({});
    }
    match cur {
        Value::Object(m) => m,
        _ => unreachable!("just assigned an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KAI pods with what KAI's own admission adds (its GPU ConfigMap's env,
    /// envFrom and volume), through the whole admission: the translation
    /// itself is tested in `dropin.rs`, and its tests do not call back into
    /// this module (issue 35: no import circle, tests included).
    #[test]
    fn kai_pods_are_admitted_whole_and_a_second_pass_changes_nothing() {
        use crate::dropin::kai_admitted_pod;
        use tessera_contract::dropin::KAI_VISIBLE_DEVICES_KEY;
        // Tessera picks the GPU: KAI's older key and its current one
        // (NVIDIA_VISIBLE_DEVICES from its own ConfigMap) both come off with
        // the translation; before, the current key was left on and refused as
        // a pod's own NVIDIA_VISIBLE_DEVICES.
        for key in [KAI_VISIBLE_DEVICES_KEY, "NVIDIA_VISIBLE_DEVICES"] {
            let raw = kai_admitted_pod(key);
            let once = match mutate_pod(&raw) {
                Ok(v) => v,
                Err(e) => panic!("{key}: refused: {e:?}"),
            };
            assert_eq!(mutate_pod(&once).expect("again"), once, "{key}");
        }
        // KAI picks the GPU: its words stay, and a second pass changes nothing.
        let kai_picks = Config {
            kai_gpu_choice: true,
            ..Config::default()
        };
        let mut raw = kai_admitted_pod("NVIDIA_VISIBLE_DEVICES");
        raw["spec"]["schedulerName"] = json!("kai-scheduler");
        let (once, _) = mutate_pod_with(&raw, &kai_picks).expect("admitted");
        let (twice, _) = mutate_pod_with(&once, &kai_picks).expect("again");
        assert_eq!(once, twice);
    }

    #[test]
    fn slice_counts() {
        assert_eq!(parse_slices("2"), Some(2));
        assert_eq!(parse_slices("16"), Some(16));
        for bad in [
            "0",
            "",
            "500m",
            "1.5",
            "-1",
            "+2",
            "1k",
            "1e3",
            "99999999999",
        ] {
            assert_eq!(parse_slices(bad), None, "{bad}");
        }
    }

    #[test]
    fn ld_preload_merge() {
        assert_eq!(preload_with_hook(HOOK_PATH), None);
        assert_eq!(preload_with_hook(&format!("{HOOK_PATH}:/x.so")), None);
        assert_eq!(
            preload_with_hook("/a.so /b.so").as_deref(),
            Some(format!("{HOOK_PATH}:/a.so:/b.so").as_str())
        );
        assert_eq!(
            preload_with_hook(&format!("/a.so:{HOOK_PATH}")).as_deref(),
            Some(format!("{HOOK_PATH}:/a.so").as_str())
        );
        assert_eq!(preload_with_hook("").as_deref(), Some(HOOK_PATH));
    }

    #[test]
    fn tessera_namespace() {
        assert!(in_tessera_namespace("tessera.dev/allocation"));
        assert!(in_tessera_namespace("alloc.tessera.dev/id"));
        assert!(!in_tessera_namespace("tessera.dev.example.com/x"));
        assert!(!in_tessera_namespace("example.com/tessera.dev"));
        assert!(!in_tessera_namespace("tessera.dev"));
    }

    #[test]
    fn label_values() {
        assert!(is_label_value("high-performance"));
        assert!(is_label_value("a.b_c"));
        for bad in ["", "-a", "a-", "a b", "x".repeat(64).as_str(), "ä"] {
            assert!(!is_label_value(bad), "{bad}");
        }
    }

    fn pod_with_annotations(annotations: &[(&str, &str)]) -> Value {
        let ann: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect();
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": ann},
            "spec": {"containers": [{
                "name": "main",
                "image": "x",
                "resources": {"limits": {RESOURCE: "1"}}
            }]}
        })
    }

    #[test]
    fn a_vendor_annotation_must_name_a_vendor_and_becomes_node_affinity() {
        let out = mutate_pod(&pod_with_annotations(&[(ANNOTATION_GPU_VENDOR, "amd")]))
            .unwrap_or_else(|e| panic!("{e}"));
        let terms = &out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(
            terms,
            &serde_json::json!([{"matchExpressions": [
                {"key": "tessera.dev/gpu-vendor-amd", "operator": "Exists"}
            ]}])
        );
        let e = mutate_pod(&pod_with_annotations(&[(ANNOTATION_GPU_VENDOR, "intel")]))
            .expect_err("no such vendor")
            .to_string();
        assert!(
            e.contains("tessera.dev/gpu-vendor") && e.contains("intel"),
            "{e}"
        );
    }

    #[test]
    fn a_model_list_becomes_affinity_on_the_models_it_names_and_an_unknown_one_is_refused() {
        use tessera_contract::dropin::HAMI_USE_GPUTYPE;
        let config = Config {
            gpu_models: vec![
                "NVIDIA A100-SXM4-80GB".into(),
                "NVIDIA L4".into(),
                "AMD Instinct MI210".into(),
            ],
            ..Config::default()
        };
        let admit = |ann: &[(&str, &str)]| {
            mutate_pod_with(&pod_with_annotations(ann), &config)
                .map(|(p, _)| p)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let terms = |p: &Value| {
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"]
                .clone()
        };
        let exists = |m: &str| serde_json::json!({"key": format!("gpu-product.tessera.dev/{m}"), "operator": "Exists"});
        // HAMi's words, translated: one model, one term.
        let out = admit(&[(HAMI_USE_GPUTYPE, "a100")]);
        assert_eq!(
            out["metadata"]["annotations"][gpu_filter::ANNOTATION_GPU_MODELS],
            "a100"
        );
        assert_eq!(
            terms(&out),
            serde_json::json!([{"matchExpressions": [exists("NVIDIA-A100-SXM4-80GB")]}])
        );
        // Two models with a vendor: terms ORed, each with the vendor.
        let out = admit(&[
            (gpu_filter::ANNOTATION_GPU_MODELS, "L4,mi210"),
            (ANNOTATION_GPU_VENDOR, "amd"),
        ]);
        let vendor = serde_json::json!({"key": "tessera.dev/gpu-vendor-amd", "operator": "Exists"});
        assert_eq!(
            terms(&out),
            serde_json::json!([
                {"matchExpressions": [vendor.clone(), exists("NVIDIA-L4")]},
                {"matchExpressions": [vendor, exists("AMD-Instinct-MI210")]}
            ])
        );
        // Exclusions and UUIDs have no node label: no affinity from them.
        let out = admit(&[(gpu_filter::ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-1")]);
        assert!(terms(&out).is_null(), "{out}");
        // Models no node has: refused, in the pod's words.
        let e = mutate_pod_with(
            &pod_with_annotations(&[(gpu_filter::ANNOTATION_GPU_MODELS, "H100")]),
            &config,
        )
        .expect_err("no H100 here")
        .to_string();
        assert!(
            e.contains("tessera.dev/gpu-models") && e.contains("\"H100\""),
            "{e}"
        );
        let e = mutate_pod_with(
            &pod_with_annotations(&[(HAMI_USE_GPUTYPE, "H100")]),
            &config,
        )
        .expect_err("no H100 here")
        .to_string();
        assert!(
            e.contains("nvidia.com/use-gputype") && e.contains("\"H100\""),
            "{e}"
        );
        // A malformed list is named.
        let e = mutate_pod(&pod_with_annotations(&[(
            gpu_filter::ANNOTATION_GPU_UUIDS,
            ",",
        )]))
        .expect_err("empty list")
        .to_string();
        assert!(
            e.contains("tessera.dev/gpu-uuids") && e.contains("names nothing"),
            "{e}"
        );
    }

    #[test]
    fn priority_annotation_is_a_users_and_must_be_in_range() {
        for ok in ["10", "-1000", "1000", "0"] {
            assert!(
                mutate_pod(&pod_with_annotations(&[(ANNOTATION_PRIORITY, ok)])).is_ok(),
                "{ok} is a priority"
            );
        }
        for bad in ["1001", "-1001", "high", "", "2.5"] {
            let e =
                mutate_pod(&pod_with_annotations(&[(ANNOTATION_PRIORITY, bad)])).expect_err(bad);
            assert_eq!(e.0.len(), 1, "{e}");
            assert!(
                matches!(&e.0[0], Refusal::BadPriority { value, .. } if value == bad),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(ANNOTATION_PRIORITY) && msg.contains("-1000..=1000"),
                "{msg}"
            );
        }
        // Still refused: a tessera.dev/ annotation that is not a user's.
        let e = mutate_pod(&pod_with_annotations(&[
            (ANNOTATION_PRIORITY, "5"),
            ("tessera.dev/allocation", "x"),
        ]))
        .expect_err("forged");
        assert_eq!(
            e.0,
            vec![Refusal::ForgedAnnotation {
                key: "tessera.dev/allocation".into()
            }]
        );
        assert!(e.to_string().contains(ANNOTATION_PRIORITY), "{e}");
        // Only the scheduler extender writes a pod's GPU assignment (at bind,
        // after admission): a pod created with one is refused.
        let key = tessera_contract::labels::ANNOTATION_GPU_ASSIGNMENT;
        let e = mutate_pod(&pod_with_annotations(&[(
            key,
            r#"{"version":1,"node":"n","containers":[]}"#,
        )]))
        .expect_err("forged assignment");
        assert_eq!(e.0, vec![Refusal::ForgedAnnotation { key: key.into() }]);
    }

    #[test]
    fn a_dra_container_is_left_to_its_cdi_edits() {
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-5g-30"}],
                "containers": [
                    {"name": "dra", "image": "x", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "plain", "image": "x"}
                ]
            }
        });
        let out = mutate_pod(&pod).expect("admitted");
        // The DRA container is left as it was: CDI gives it its devices.
        assert_eq!(
            out["spec"]["containers"][0], pod["spec"]["containers"][0],
            "{out}"
        );
    }
}
