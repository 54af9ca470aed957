//! The slice configuration file: parsing, validation (errors name the field),
//! per-node resolution (defaults plus overrides), and slice layout per GPU.
//!
//! Parsing is two steps: serde reads a loose `Raw*` shape (so that unknown
//! fields and wrong types are caught with their path), then `validate` turns
//! it into the typed [`Config`], naming the offending field on every error.

use std::collections::BTreeMap;

use serde::Deserialize;
use tessera_contract::yaml::{YamlError, from_yaml};

use crate::selector::{LabelSelector, SelectorError};

/// Slices per GPU are capped so the device list stays small (the kubelet
/// keeps every device ID in memory and in one gRPC message).
pub const MAX_SLICES_PER_GPU: u32 = 128;
/// A smaller memory slice would only produce absurd device counts.
pub const MIN_SLICE_MEMORY: u64 = 64 << 20;
/// A compute slice below 1% cannot be honoured by a time-slice arbiter.
pub const MIN_COMPUTE_PPM: u32 = 10_000;
/// One GPU's whole time, in parts per million (defined in the contract).
pub use tessera_contract::units::FULL_COMPUTE_PPM;
/// Slices per GPU when the file (or its default section) says nothing.
pub const DEFAULT_SLICES_PER_GPU: u32 = 4;
/// Default `sharedThreshold`: the placement engine's own.
pub use tessera_placement::policy::DEFAULT_SHARED_THRESHOLD;

/// A configuration error. `Invalid` names the field by its path in the file
/// (`overrides[1].slice.memory`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file is empty (or only comments)")]
    Empty,
    /// YAML syntax, an unknown field or a wrong type: the message names the
    /// field's path and the line.
    #[error("config is not valid: {0}")]
    Syntax(YamlError),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

// Not `#[from]`: that would also make the YAML error the `source`, and
// error reports would print its message twice.
impl From<YamlError> for ConfigError {
    fn from(e: YamlError) -> Self {
        Self::Syntax(e)
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// How the arbiter treats an allocation's compute share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputePolicy {
    /// The share is a hard cap, even on an idle GPU.
    Guaranteed,
    /// The share is a floor; idle time goes to whoever has work.
    Burst,
}

impl ComputePolicy {
    fn parse(field: &str, s: &str) -> Result<Self, ConfigError> {
        match s {
            "guaranteed" => Ok(Self::Guaranteed),
            "burst" => Ok(Self::Burst),
            other => Err(invalid(
                field,
                format!("unknown compute policy {other:?}; expected \"guaranteed\" or \"burst\""),
            )),
        }
    }

    /// The name used in the config file and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burst => "burst",
        }
    }
}

/// How GetPreferredAllocation chooses among GPUs that can hold a request:
/// one of the placement engine's policies (`tessera-placement`), by the
/// engine's own names (`defrag`, `fgd`, `binpack`, `spread`,
/// `shared-threshold`). A node whose config names none gets the engine's
/// default, [`Placement::Defrag`].
pub use tessera_placement::Policy as Placement;

/// Parses a `placement` value with the engine's parser. `shared-threshold`
/// takes its threshold from the node's `sharedThreshold` (one number, one
/// place): the engine's `shared-threshold:T` form is refused here.
fn parse_placement(field: &str, s: &str) -> Result<Placement, ConfigError> {
    let names = Placement::ALL.map(|p| p.to_string()).join(", ");
    if s.contains(':') {
        return Err(invalid(
            field,
            format!(
                "{s:?}: a node config gives the threshold as sharedThreshold, not in the \
                 placement name; expected one of {names}"
            ),
        ));
    }
    s.parse::<Placement>().map_err(|_| {
        invalid(
            field,
            format!("unknown placement {s:?}; expected one of {names}"),
        )
    })
}

/// How a container is told its GPUs, as NVIDIA's device plugin does it: the
/// NVIDIA container toolkit on the node reads one of these. Any non-empty set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<uuid>,...` in the container's env: read by the
    /// toolkit unless `accept-nvidia-visible-devices-envvar-when-unprivileged = false`.
    pub envvar: bool,
    /// One mount per GPU at `/var/run/nvidia-container-devices/<uuid>` (from
    /// `/dev/null`): read when `accept-nvidia-visible-devices-as-volume-mounts = true`;
    /// unlike env, no pod spec can forge it.
    pub volume_mounts: bool,
    /// CDI device names in the Allocate response (`cdi_devices`): the
    /// toolkit's `nvidia.com/gpu=<uuid>` and the plugin's own `tessera.dev/gpu=<uuid>`
    /// (whose spec the plugin writes); for runtimes with CDI enabled.
    pub cdi: bool,
}

impl DeviceListStrategy {
    /// What docs/install.md recommends with the toolkit settings it gives.
    pub const DEFAULT: Self = Self {
        envvar: false,
        volume_mounts: true,
        cdi: false,
    };

    fn parse(field: &str, names: &[String]) -> Result<Self, ConfigError> {
        let mut s = Self {
            envvar: false,
            volume_mounts: false,
            cdi: false,
        };
        if names.is_empty() {
            return Err(invalid(
                field,
                "give at least one of envvar, volume-mounts, cdi",
            ));
        }
        for n in names {
            match n.as_str() {
                "envvar" => s.envvar = true,
                "volume-mounts" => s.volume_mounts = true,
                "cdi" | "cdi-cri" => s.cdi = true,
                other => {
                    return Err(invalid(
                        field,
                        format!(
                            "unknown device list strategy {other:?}; expected \"envvar\", \"volume-mounts\" or \"cdi\""
                        ),
                    ));
                }
            }
        }
        Ok(s)
    }

    /// The names, as the config file spells them.
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.envvar {
            v.push("envvar");
        }
        if self.volume_mounts {
            v.push("volume-mounts");
        }
        if self.cdi {
            v.push("cdi");
        }
        v
    }
}

impl Default for DeviceListStrategy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How the DRA plugin publishes a node's GPUs in its ResourceSlices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraLayout {
    /// Each GPU's slices are devices (any Kubernetes 1.34+).
    Slices,
    /// One device per GPU with consumable `memory` and `compute` capacity,
    /// shared by many claims (1.34+ with `DRAConsumableCapacity`).
    Shared,
}

impl DraLayout {
    fn parse(field: &str, s: &str) -> Result<Self, ConfigError> {
        match s {
            "slices" => Ok(Self::Slices),
            "shared" => Ok(Self::Shared),
            other => Err(invalid(
                field,
                format!("unknown DRA layout {other:?}; expected \"slices\" or \"shared\""),
            )),
        }
    }

    /// The name used in the config file and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slices => "slices",
            Self::Shared => "shared",
        }
    }
}

/// Default smallest memory a claim takes of a shared device.
pub const DEFAULT_DRA_MEMORY_MINIMUM: u64 = 256 << 20;
/// Default granule of memory requests on a shared device.
pub const DEFAULT_DRA_MEMORY_STEP: u64 = 64 << 20;
/// Smallest `dra.memoryStep`: a finer granule only multiplies rounding work.
pub const MIN_DRA_MEMORY_STEP: u64 = 1 << 20;

/// The `dra:` settings in force on a node (the DRA plugin's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraConfig {
    pub layout: DraLayout,
    /// `shared` layout: the least memory a claim is given (its request
    /// policy's minimum, and its default when it names none).
    pub memory_minimum: u64,
    /// `shared` layout: memory requests are rounded up to the minimum plus a
    /// multiple of this.
    pub memory_step: u64,
}

impl Default for DraConfig {
    fn default() -> Self {
        Self {
            layout: DraLayout::Slices,
            memory_minimum: DEFAULT_DRA_MEMORY_MINIMUM,
            memory_step: DEFAULT_DRA_MEMORY_STEP,
        }
    }
}

/// A `dra:` block as a section gives it: each field it names replaces the
/// one before (unlike `slice`, whose fields only mean something together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraSettings {
    pub layout: Option<DraLayout>,
    pub memory_minimum: Option<u64>,
    pub memory_step: Option<u64>,
}

impl DraSettings {
    fn apply_to(&self, dra: &mut DraConfig) {
        set(&mut dra.layout, self.layout);
        set(&mut dra.memory_minimum, self.memory_minimum);
        set(&mut dra.memory_step, self.memory_step);
    }
}

/// A slice size: any of memory, compute and count; the tightest wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SliceSpec {
    pub memory_bytes: Option<u64>,
    pub compute_ppm: Option<u32>,
    pub slices_per_gpu: Option<u32>,
}

/// What a slice of one particular GPU is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceLayout {
    /// Devices advertised for this GPU.
    pub slices: u32,
    /// Memory limit one slice grants.
    pub memory_bytes: u64,
    /// Compute share one slice grants, ppm of the GPU's time.
    pub compute_ppm: u32,
    /// True when the memory-derived count exceeded [`MAX_SLICES_PER_GPU`].
    pub capped: bool,
}

impl SliceSpec {
    /// Lays slices out on a GPU with `gpu_memory` bytes.
    ///
    /// Count: the smallest of `gpu_memory / memory`, `100% / compute` and
    /// `slicesPerGpu` among those given, capped at [`MAX_SLICES_PER_GPU`].
    /// Size: the given memory and compute, or, where one is not given, an
    /// equal share of the GPU (`gpu_memory / count`, `100% / count`).
    pub fn layout(&self, gpu_memory: u64) -> SliceLayout {
        let limits = [
            self.memory_bytes.map(|m| gpu_memory / m.max(1)),
            self.compute_ppm
                .map(|c| u64::from(FULL_COMPUTE_PPM / c.max(1))),
            self.slices_per_gpu.map(u64::from),
        ];
        let tightest = limits
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(u64::from(DEFAULT_SLICES_PER_GPU));
        // Only a memory size can exceed the cap: the count and the compute
        // share are validated to stay below it.
        let capped = tightest > u64::from(MAX_SLICES_PER_GPU);
        let count = tightest.min(u64::from(MAX_SLICES_PER_GPU));
        // count <= MAX_SLICES_PER_GPU, so it fits in u32.
        let slices = u32::try_from(count).unwrap_or(MAX_SLICES_PER_GPU);
        let memory_bytes = match (self.memory_bytes, slices) {
            (Some(m), _) => m,
            (None, 0) => 0,
            (None, n) => gpu_memory / u64::from(n),
        };
        let compute_ppm = match (self.compute_ppm, slices) {
            (Some(c), _) => c,
            (None, 0) => 0,
            (None, n) => FULL_COMPUTE_PPM / n,
        };
        SliceLayout {
            slices,
            memory_bytes,
            compute_ppm,
            capped,
        }
    }
}

/// The settings in force on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    pub slice: SliceSpec,
    pub compute_policy: ComputePolicy,
    pub placement: Placement,
    pub shared_threshold: f64,
    /// Mount a `/etc/ld.so.preload` naming the hook into every container.
    pub ld_so_preload: bool,
    /// How containers are told their GPUs.
    pub device_list_strategy: DeviceListStrategy,
    /// What the DRA plugin publishes.
    pub dra: DraConfig,
    /// Indexes of the overrides that matched, in order (for logs).
    pub matched_overrides: Vec<usize>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            slice: SliceSpec {
                slices_per_gpu: Some(DEFAULT_SLICES_PER_GPU),
                ..SliceSpec::default()
            },
            compute_policy: ComputePolicy::Burst,
            placement: Placement::default(),
            shared_threshold: DEFAULT_SHARED_THRESHOLD,
            ld_so_preload: false,
            device_list_strategy: DeviceListStrategy::DEFAULT,
            dra: DraConfig::default(),
            matched_overrides: Vec::new(),
        }
    }
}

/// Settings of the default section or of one override; `None` = not set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Settings {
    pub slice: Option<SliceSpec>,
    pub compute_policy: Option<ComputePolicy>,
    pub placement: Option<Placement>,
    pub shared_threshold: Option<f64>,
    pub ld_so_preload: Option<bool>,
    pub device_list_strategy: Option<DeviceListStrategy>,
    pub dra: Option<DraSettings>,
}

impl Settings {
    fn apply_to(&self, node: &mut NodeConfig) {
        // A slice block replaces the whole slice: mixing a default memory
        // size with an override's count would surprise.
        set(&mut node.slice, self.slice);
        set(&mut node.compute_policy, self.compute_policy);
        set(&mut node.placement, self.placement);
        set(&mut node.shared_threshold, self.shared_threshold);
        set(&mut node.ld_so_preload, self.ld_so_preload);
        set(&mut node.device_list_strategy, self.device_list_strategy);
        if let Some(d) = &self.dra {
            d.apply_to(&mut node.dra);
        }
    }
}

/// A setting the section names replaces what an earlier one set; one it
/// leaves out keeps it.
fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// Settings for the nodes an override selects.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Matches these node names (empty: any name).
    pub node_names: Vec<String>,
    /// Matches nodes whose labels satisfy this (None: any labels).
    pub node_selector: Option<LabelSelector>,
    pub settings: Settings,
}

impl Override {
    /// An override applies when every criterion it gives matches.
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.node_names.is_empty() || self.node_names.iter().any(|n| n == node_name))
            && self
                .node_selector
                .as_ref()
                .is_none_or(|s| s.matches(labels))
    }
}

/// Maps GPU product names to a class (`high-performance`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuClass {
    pub name: String,
    /// Glob patterns (`*`, `?`), matched case-insensitively.
    pub products: Vec<String>,
    /// The vendors whose GPUs the class takes (`vendors: [amd]`); empty: any.
    pub vendors: Vec<tessera_contract::Vendor>,
}

/// A validated configuration file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub default: Settings,
    pub overrides: Vec<Override>,
    pub gpu_classes: Vec<GpuClass>,
}

impl Config {
    /// Parses and validates the YAML text of a config file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // Comments only is empty too: most likely everything was commented
        // out by mistake, and defaults would silently replace the config.
        let raw: RawConfig = from_yaml(text)?.ok_or(ConfigError::Empty)?;
        raw.validate()
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The settings for one node: built-in defaults, then the default
    /// section, then every matching override in file order (later wins).
    pub fn resolve(&self, node_name: &str, labels: &BTreeMap<String, String>) -> NodeConfig {
        let mut node = NodeConfig::default();
        self.default.apply_to(&mut node);
        for (i, o) in self.overrides.iter().enumerate() {
            if o.matches(node_name, labels) {
                o.settings.apply_to(&mut node);
                node.matched_overrides.push(i);
            }
        }
        node
    }

    /// The class of an NVIDIA GPU product: the first class with a matching pattern.
    pub fn classify(&self, product: &str) -> Option<&str> {
        self.classify_gpu(tessera_contract::Vendor::Nvidia, product)
    }

    /// The class of one vendor's GPU product: the first class that takes the vendor
    /// and has a matching pattern. `vendor` as the manager spells it (`amd`); empty,
    /// from a manager older than vendors, is NVIDIA.
    pub fn classify_vendor(&self, vendor: &str, product: &str) -> Option<&str> {
        let v = if vendor.is_empty() {
            Ok(tessera_contract::Vendor::Nvidia)
        } else {
            vendor.parse()
        };
        // A vendor this build does not know is in no class that names vendors.
        match v {
            Ok(v) => self.classify_gpu(v, product),
            Err(_) => self
                .gpu_classes
                .iter()
                .find(|c| c.vendors.is_empty() && c.products.iter().any(|p| glob_match(p, product)))
                .map(|c| c.name.as_str()),
        }
    }

    /// [`Config::classify_vendor`] with the vendor known.
    pub fn classify_gpu(&self, vendor: tessera_contract::Vendor, product: &str) -> Option<&str> {
        self.gpu_classes
            .iter()
            .find(|c| {
                (c.vendors.is_empty() || c.vendors.contains(&vendor))
                    && c.products.iter().any(|p| glob_match(p, product))
            })
            .map(|c| c.name.as_str())
    }
}

/// Case-insensitive glob with `*` (any run) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    // Iterative matcher with backtracking to the last `*`: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Parses a memory quantity, in the one syntax every Tessera input uses
/// ([`tessera_contract::units`]): bytes, or a number with a unit (`Ki Mi Gi
/// Ti` binary, `k M G T` decimal); a fraction (`1.5Gi`) is rounded down to a byte.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    tessera_contract::units::size_arg(s)
}

/// Parses a compute share `"10%"` or `"12.5%"` into ppm (the shared syntax).
pub fn parse_percent(s: &str) -> Result<u32, String> {
    tessera_contract::units::percent_arg(s)
}

/// True for a valid Kubernetes label value (what classes become).
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))))
}

// ---- the loose shape serde reads ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    version: Option<u32>,
    #[serde(default)]
    default: Option<RawSettings>,
    #[serde(default)]
    overrides: Vec<RawOverride>,
    #[serde(default)]
    gpu_classes: Vec<RawGpuClass>,
}

/// The settings a section may give, declared once for the two kinds of
/// section that hold them, with the one validation they share.
macro_rules! raw_settings {
    ($(#[$attr:meta])* $name:ident) => {
        #[derive(Debug, Deserialize, Default)]
        $(#[$attr])*
        struct $name {
            slice: Option<RawSlice>,
            compute_policy: Option<String>,
            placement: Option<String>,
            shared_threshold: Option<f64>,
            ld_so_preload: Option<bool>,
            device_list_strategy: Option<OneOrMany>,
            dra: Option<RawDra>,
        }

        impl $name {
            fn validate(self, field: &str) -> Result<Settings, ConfigError> {
                let device_list_strategy = self
                    .device_list_strategy
                    .map(|d| {
                        let at = format!("{field}.deviceListStrategy");
                        DeviceListStrategy::parse(&at, &d.into_vec())
                    })
                    .transpose()?;
                let slice = self
                    .slice
                    .map(|s| s.validate(&format!("{field}.slice")))
                    .transpose()?;
                let compute_policy = self
                    .compute_policy
                    .map(|p| ComputePolicy::parse(&format!("{field}.computePolicy"), &p))
                    .transpose()?;
                let placement = self
                    .placement
                    .map(|p| parse_placement(&format!("{field}.placement"), &p))
                    .transpose()?;
                let dra = self
                    .dra
                    .map(|d| d.validate(&format!("{field}.dra")))
                    .transpose()?;
                if let Some(t) = self.shared_threshold
                    && !(0.0..=1.0).contains(&t)
                {
                    return Err(invalid(
                        format!("{field}.sharedThreshold"),
                        format!("{t} is not a fraction between 0 and 1"),
                    ));
                }
                Ok(Settings {
                    slice,
                    compute_policy,
                    placement,
                    shared_threshold: self.shared_threshold,
                    ld_so_preload: self.ld_so_preload,
                    device_list_strategy,
                    dra,
                })
            }
        }
    };
}

raw_settings!(
    /// The `default` section.
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    RawSettings
);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSlice {
    memory: Option<NumOrString>,
    compute: Option<String>,
    slices_per_gpu: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDra {
    layout: Option<String>,
    memory_minimum: Option<NumOrString>,
    memory_step: Option<NumOrString>,
}

impl RawDra {
    fn validate(self, field: &str) -> Result<DraSettings, ConfigError> {
        if self.layout.is_none() && self.memory_minimum.is_none() && self.memory_step.is_none() {
            return Err(invalid(
                field,
                "give at least one of layout (slices or shared), memoryMinimum or memoryStep",
            ));
        }
        let layout = self
            .layout
            .map(|l| DraLayout::parse(&format!("{field}.layout"), &l))
            .transpose()?;
        let memory_minimum = self
            .memory_minimum
            .map(|m| {
                let f = format!("{field}.memoryMinimum");
                let b = m.bytes(&f)?;
                if b < MIN_SLICE_MEMORY {
                    return Err(invalid(
                        f,
                        format!(
                            "{b} bytes is below the smallest share, {}Mi",
                            MIN_SLICE_MEMORY >> 20
                        ),
                    ));
                }
                Ok(b)
            })
            .transpose()?;
        let memory_step = self
            .memory_step
            .map(|m| {
                let f = format!("{field}.memoryStep");
                let b = m.bytes(&f)?;
                if b < MIN_DRA_MEMORY_STEP {
                    return Err(invalid(
                        f,
                        format!("{b} bytes is below the smallest step, 1Mi"),
                    ));
                }
                Ok(b)
            })
            .transpose()?;
        Ok(DraSettings {
            layout,
            memory_minimum,
            memory_step,
        })
    }
}

/// `deviceListStrategy: cdi` or `deviceListStrategy: [envvar, cdi]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NumOrString {
    Num(i64),
    Str(String),
}

impl NumOrString {
    /// A memory size in bytes; `field` names it in the error.
    fn bytes(self, field: &str) -> Result<u64, ConfigError> {
        match self {
            Self::Num(n) => {
                u64::try_from(n).map_err(|_| invalid(field, format!("{n} is negative")))
            }
            Self::Str(s) => parse_memory(&s).map_err(|e| invalid(field, e)),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOverride {
    node_names: Option<Vec<String>>,
    node_selector: Option<crate::selector::RawSelector>,
    #[serde(flatten)]
    settings: RawOverrideSettings,
}

raw_settings!(
    /// An override's settings, flattened beside its selectors. `flatten` and
    /// `deny_unknown_fields` do not combine in serde, so this one leaves
    /// unknown names to the override, which refuses them.
    #[serde(rename_all = "camelCase")]
    RawOverrideSettings
);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpuClass {
    name: String,
    products: Vec<String>,
    #[serde(default)]
    vendors: Vec<String>,
}

impl RawConfig {
    fn validate(self) -> Result<Config, ConfigError> {
        if let Some(v) = self.version
            && v != 1
        {
            return Err(invalid(
                "version",
                format!("unsupported version {v}; this plugin reads version 1"),
            ));
        }
        let default = match self.default {
            Some(d) => d.validate("default")?,
            None => Settings::default(),
        };
        let mut overrides = Vec::with_capacity(self.overrides.len());
        for (i, o) in self.overrides.into_iter().enumerate() {
            overrides.push(o.validate(&format!("overrides[{i}]"))?);
        }
        let mut gpu_classes: Vec<GpuClass> = Vec::with_capacity(self.gpu_classes.len());
        for (i, c) in self.gpu_classes.into_iter().enumerate() {
            let field = format!("gpuClasses[{i}]");
            if c.name.is_empty() {
                return Err(invalid(format!("{field}.name"), "must not be empty"));
            }
            if !is_label_value(&c.name) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!(
                        "{:?} is not a valid label value (letters, digits, '-', '_', '.'; at most 63; alphanumeric at both ends)",
                        c.name
                    ),
                ));
            }
            if gpu_classes.iter().any(|g| g.name == c.name) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("class {:?} is defined twice", c.name),
                ));
            }
            if c.products.is_empty() {
                return Err(invalid(
                    format!("{field}.products"),
                    "must list at least one product pattern",
                ));
            }
            if let Some(j) = c.products.iter().position(|p| p.trim().is_empty()) {
                return Err(invalid(
                    format!("{field}.products[{j}]"),
                    "must not be empty",
                ));
            }
            let mut vendors = Vec::with_capacity(c.vendors.len());
            for (j, v) in c.vendors.iter().enumerate() {
                match v.parse::<tessera_contract::Vendor>() {
                    Ok(v) => vendors.push(v),
                    Err(e) => return Err(invalid(format!("{field}.vendors[{j}]"), e.to_string())),
                }
            }
            gpu_classes.push(GpuClass {
                name: c.name,
                products: c.products,
                vendors,
            });
        }
        Ok(Config {
            default,
            overrides,
            gpu_classes,
        })
    }
}

impl RawSlice {
    fn validate(self, field: &str) -> Result<SliceSpec, ConfigError> {
        if self.memory.is_none() && self.compute.is_none() && self.slices_per_gpu.is_none() {
            return Err(invalid(
                field,
                "give at least one of memory (e.g. 4Gi), compute (e.g. 10%) or slicesPerGpu",
            ));
        }
        let memory_bytes = match self.memory {
            None => None,
            Some(m) => {
                let f = format!("{field}.memory");
                let bytes = m.bytes(&f)?;
                if bytes < MIN_SLICE_MEMORY {
                    return Err(invalid(
                        f,
                        format!(
                            "{bytes} bytes is below the smallest slice, {}Mi",
                            MIN_SLICE_MEMORY >> 20
                        ),
                    ));
                }
                Some(bytes)
            }
        };
        let compute_ppm = match self.compute {
            None => None,
            Some(c) => {
                let f = format!("{field}.compute");
                let ppm = parse_percent(&c).map_err(|e| invalid(&f, e))?;
                if !(MIN_COMPUTE_PPM..=FULL_COMPUTE_PPM).contains(&ppm) {
                    return Err(invalid(f, format!("{c:?} is not between 1% and 100%")));
                }
                Some(ppm)
            }
        };
        let slices_per_gpu = match self.slices_per_gpu {
            None => None,
            Some(n) => {
                if !(1..=i64::from(MAX_SLICES_PER_GPU)).contains(&n) {
                    return Err(invalid(
                        format!("{field}.slicesPerGpu"),
                        format!("{n} is not between 1 and {MAX_SLICES_PER_GPU}"),
                    ));
                }
                u32::try_from(n).ok()
            }
        };
        Ok(SliceSpec {
            memory_bytes,
            compute_ppm,
            slices_per_gpu,
        })
    }
}

impl RawOverride {
    fn validate(self, field: &str) -> Result<Override, ConfigError> {
        let node_names = match self.node_names {
            None => Vec::new(),
            Some(names) => {
                if names.is_empty() {
                    return Err(invalid(
                        format!("{field}.nodeNames"),
                        "is empty; list node names or leave it out",
                    ));
                }
                if let Some(j) = names.iter().position(|n| n.trim().is_empty()) {
                    return Err(invalid(
                        format!("{field}.nodeNames[{j}]"),
                        "must not be empty",
                    ));
                }
                names
            }
        };
        let node_selector = self
            .node_selector
            .map(|s| {
                s.validate().map_err(|e: SelectorError| {
                    invalid(format!("{field}.nodeSelector{}", e.field), e.reason)
                })
            })
            .transpose()?;
        if node_names.is_empty() && node_selector.is_none() {
            return Err(invalid(
                field,
                "selects no node: give nodeNames, nodeSelector, or both",
            ));
        }
        let settings = self.settings.validate(field)?;
        if settings == Settings::default() {
            return Err(invalid(
                field,
                "sets nothing: give slice, computePolicy, placement, sharedThreshold, ldSoPreload, deviceListStrategy or dra",
            ));
        }
        Ok(Override {
            node_names,
            node_selector,
            settings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn err(text: &str) -> String {
        match Config::parse(text) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const FULL: &str = r#"
version: 1
default:
  slice:
    memory: 4Gi
  computePolicy: burst
  placement: binpack
  sharedThreshold: 0.3
overrides:
  - nodeNames: [node-a]
    slice:
      slicesPerGpu: 2
    computePolicy: guaranteed
  - nodeSelector:
      matchLabels:
        pool: inference
      matchExpressions:
        - key: zone
          operator: In
          values: [z1, z2]
    placement: spread
    ldSoPreload: true
gpuClasses:
  - name: high-performance
    products: ["*A100*", "NVIDIA H100*"]
  - name: general-purpose
    products: ["*"]
"#;

    #[test]
    fn full_example_parses_and_resolves_per_node() {
        let c = Config::parse(FULL).expect("valid");
        let plain = c.resolve("node-z", &labels(&[]));
        assert_eq!(plain.slice.memory_bytes, Some(4 * GI));
        assert_eq!(plain.slice.slices_per_gpu, None);
        assert_eq!(plain.placement, Placement::Binpack);
        assert_eq!(plain.shared_threshold, 0.3);
        assert!(!plain.ld_so_preload);
        assert!(plain.matched_overrides.is_empty());

        let a = c.resolve("node-a", &labels(&[]));
        assert_eq!(
            a.slice,
            SliceSpec {
                slices_per_gpu: Some(2),
                ..SliceSpec::default()
            },
            "an override's slice replaces the default slice as a whole"
        );
        assert_eq!(a.compute_policy, ComputePolicy::Guaranteed);
        assert_eq!(a.placement, Placement::Binpack);

        let inf = c.resolve("node-a", &labels(&[("pool", "inference"), ("zone", "z2")]));
        assert_eq!(inf.matched_overrides, vec![0, 1]);
        assert_eq!(inf.placement, Placement::Spread);
        assert_eq!(inf.compute_policy, ComputePolicy::Guaranteed);
        assert!(inf.ld_so_preload);
        let wrong_zone = c.resolve("node-b", &labels(&[("pool", "inference"), ("zone", "z3")]));
        assert!(wrong_zone.matched_overrides.is_empty());
    }

    #[test]
    fn minimal_file_gets_builtin_defaults() {
        let c = Config::parse("version: 1\n").expect("valid");
        let n = c.resolve("x", &labels(&[]));
        assert_eq!(n, NodeConfig::default());
        assert_eq!(n.slice.slices_per_gpu, Some(DEFAULT_SLICES_PER_GPU));
        assert_eq!(n.shared_threshold, 0.2);
        assert_eq!(n.compute_policy, ComputePolicy::Burst);
    }

    #[test]
    fn later_override_wins() {
        let c = Config::parse(
            r#"
overrides:
  - nodeNames: [n]
    sharedThreshold: 0.5
  - nodeNames: [n]
    sharedThreshold: 0.7
"#,
        )
        .expect("valid");
        assert_eq!(c.resolve("n", &labels(&[])).shared_threshold, 0.7);
    }

    #[test]
    fn override_with_names_and_selector_needs_both() {
        let c = Config::parse(
            r#"
overrides:
  - nodeNames: [n]
    nodeSelector: {matchLabels: {a: b}}
    placement: spread
"#,
        )
        .expect("valid");
        assert_eq!(c.resolve("n", &labels(&[])).placement, Placement::Defrag);
        assert_eq!(
            c.resolve("m", &labels(&[("a", "b")])).placement,
            Placement::Defrag
        );
        assert_eq!(
            c.resolve("n", &labels(&[("a", "b")])).placement,
            Placement::Spread
        );
    }

    #[test]
    fn layout_takes_the_tightest_of_the_three() {
        let gpu = 80 * GI;
        // (memory, compute, count) -> (slices, memory per slice, compute per slice)
        let cases = [
            ((Some(4 * GI), None, None), (20, 4 * GI, 50_000)),
            ((Some(4 * GI), Some(250_000), None), (4, 4 * GI, 250_000)),
            ((Some(4 * GI), Some(100_000), Some(8)), (8, 4 * GI, 100_000)),
        ];
        for ((memory_bytes, compute_ppm, slices_per_gpu), want) in cases {
            let spec = SliceSpec {
                memory_bytes,
                compute_ppm,
                slices_per_gpu,
            };
            let l = spec.layout(gpu);
            assert_eq!((l.slices, l.memory_bytes, l.compute_ppm), want, "{spec:?}");
        }

        let count = SliceSpec {
            slices_per_gpu: Some(3),
            ..Default::default()
        };
        let l = count.layout(gpu);
        assert_eq!(l.slices, 3);
        assert_eq!(l.memory_bytes, gpu / 3);
        assert_eq!(l.compute_ppm, 333_333);
        assert!(!l.capped);
    }

    #[test]
    fn layout_caps_tiny_memory_slices_and_handles_small_gpus() {
        let l = SliceSpec {
            memory_bytes: Some(MIN_SLICE_MEMORY),
            ..Default::default()
        }
        .layout(80 * GI);
        assert_eq!(l.slices, MAX_SLICES_PER_GPU);
        assert!(l.capped);
        assert_eq!(l.memory_bytes, MIN_SLICE_MEMORY);

        let l = SliceSpec {
            memory_bytes: Some(MIN_SLICE_MEMORY),
            compute_ppm: None,
            slices_per_gpu: Some(8),
        }
        .layout(80 * GI);
        assert_eq!(l.slices, 8);
        assert!(!l.capped, "an explicit count below the cap is not capping");

        let l = SliceSpec {
            memory_bytes: Some(16 * GI),
            ..Default::default()
        }
        .layout(8 * GI);
        assert_eq!(l.slices, 0, "a GPU smaller than one slice gets no devices");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_memory("4Gi"), Ok(4 * GI));
        assert_eq!(parse_memory("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory("1.5Gi"), Ok(3 * GI / 2));
        assert_eq!(parse_memory("2G"), Ok(2_000_000_000));
        assert_eq!(parse_memory("1048576"), Ok(1 << 20));
        assert!(parse_memory("4GB").is_err());
        assert!(parse_memory("Gi").is_err());
        assert!(parse_memory("1.2.3Gi").is_err());
        assert!(parse_memory("-4Gi").is_err());
        assert!(parse_memory("99999999999999Ti").is_err());
        assert_eq!(parse_percent("10%"), Ok(100_000));
        assert_eq!(parse_percent("12.5%"), Ok(125_000));
        assert_eq!(parse_percent("100%"), Ok(1_000_000));
        assert!(parse_percent("10").is_err());
        assert!(parse_percent("%").is_err());
        assert!(parse_percent("-5%").is_err());
        assert!(parse_percent("ten%").is_err());
    }

    #[test]
    fn globs_and_classes() {
        assert!(glob_match("*A100*", "NVIDIA A100-SXM4-80GB"));
        assert!(glob_match("nvidia h100*", "NVIDIA H100 80GB HBM3"));
        assert!(glob_match("T?", "t4"));
        assert!(!glob_match("*A100", "NVIDIA A100-SXM4"));
        assert!(glob_match("*", ""));
        let c = Config::parse(FULL).expect("valid");
        assert_eq!(
            c.classify("NVIDIA A100-SXM4-80GB"),
            Some("high-performance")
        );
        assert_eq!(c.classify("Tesla T4"), Some("general-purpose"));
        let none = Config::parse("gpuClasses: [{name: hp, products: ['*H100*']}]").expect("ok");
        assert_eq!(none.classify("Tesla T4"), None);
        // A class may take one vendor's GPUs only.
        let mixed = Config::parse(
            "gpuClasses:\n  - {name: amd-big, vendors: [amd], products: ['*']}\n  - {name: any, products: ['*']}\n",
        )
        .expect("ok");
        assert_eq!(
            mixed.classify_vendor("amd", "AMD Instinct MI210"),
            Some("amd-big")
        );
        assert_eq!(mixed.classify_vendor("", "Tesla T4"), Some("any"));
        assert_eq!(mixed.classify_vendor("nvidia", "Tesla T4"), Some("any"));
        assert_eq!(mixed.classify_vendor("intel", "Arc"), Some("any"));
        let e = Config::parse("gpuClasses: [{name: a, vendors: [intel], products: ['*']}]")
            .expect_err("unknown vendor");
        assert!(e.to_string().contains("gpuClasses[0].vendors[0]"), "{e}");
    }

    // ---- every error case, each naming its field ----

    #[test]
    fn empty_file_is_an_error() {
        assert_eq!(err(""), "config file is empty (or only comments)");
        assert_eq!(
            err("  \n# only a comment\n"),
            "config file is empty (or only comments)"
        );
        assert_eq!(err("~\n"), "config file is empty (or only comments)");
    }

    #[test]
    fn yaml_syntax_error() {
        let e = err("default: [unclosed\n");
        assert!(e.starts_with("config is not valid:"), "{e}");
        assert!(e.contains("line"), "names the line: {e}");
    }

    /// Each bad text and what its one-line error must name: the field's
    /// path (as the file spells it) and the offending key or value.
    fn assert_named(cases: &[(&str, &[&str])]) {
        for (text, names) in cases {
            let e = err(text);
            assert!(e.starts_with("config is not valid:"), "{e}");
            assert!(!e.contains('\n'), "one line: {e}");
            for n in *names {
                assert!(e.contains(n), "{text:?}: {e} does not name {n}");
            }
        }
    }

    #[test]
    fn unknown_fields_are_named() {
        assert_named(&[
            (
                "default:\n  slice:\n    slicesPerGPU: 8\n",
                &["default.slice.slicesPerGPU", "line 3"],
            ),
            ("defaults: {}\n", &["defaults", "line 1"]),
            (
                "overrides:\n  - nodeNames: [a]\n    placment: spread\n",
                // Flattened settings: the line is the override's own.
                &["overrides[0]", "placment", "line"],
            ),
            (
                "gpuClasses:\n  - name: a\n    product: ['*']\n",
                &["gpuClasses[0].product", "line 3"],
            ),
        ]);
    }

    #[test]
    fn wrong_types_are_named() {
        assert_named(&[
            (
                "default:\n  slice:\n    slicesPerGpu: eight\n",
                &["default.slice.slicesPerGpu", "line 3"],
            ),
            (
                "default:\n  sharedThreshold: high\n",
                &["default.sharedThreshold", "line 2"],
            ),
            (
                "default:\n  ldSoPreload: maybe\n",
                &["default.ldSoPreload", "line 2"],
            ),
            ("overrides: {a: b}\n", &["overrides", "line 1"]),
        ]);
    }

    #[test]
    fn bad_version() {
        assert_eq!(
            err("version: 2\n"),
            "version: unsupported version 2; this plugin reads version 1"
        );
    }

    #[test]
    fn slice_needs_a_size() {
        assert_eq!(
            err("default:\n  slice: {}\n"),
            "default.slice: give at least one of memory (e.g. 4Gi), compute (e.g. 10%) or slicesPerGpu"
        );
    }

    #[test]
    fn bad_memory() {
        let e = err("default:\n  slice: {memory: 4 gigs}\n");
        assert!(
            e.starts_with("default.slice.memory: bad memory size \"4 gigs\""),
            "{e}"
        );
        let e = err("default:\n  slice: {memory: -5}\n");
        assert_eq!(e, "default.slice.memory: -5 is negative");
        let e = err("default:\n  slice: {memory: 1Mi}\n");
        assert_eq!(
            e,
            "default.slice.memory: 1048576 bytes is below the smallest slice, 64Mi"
        );
        let e = err("default:\n  slice: {memory: 0}\n");
        assert!(e.starts_with("default.slice.memory: 0 bytes"), "{e}");
        let e = err("overrides:\n  - nodeNames: [a]\n    slice: {memory: 'x.yGi'}\n");
        assert!(e.starts_with("overrides[0].slice.memory:"), "{e}");
    }

    #[test]
    fn bad_compute() {
        assert_eq!(
            err("default:\n  slice: {compute: '10'}\n"),
            "default.slice.compute: bad percentage \"10\": use a number from 0 to 100 followed by %, e.g. 30% or 12.5%"
        );
        assert_eq!(
            err("default:\n  slice: {compute: 0%}\n"),
            "default.slice.compute: \"0%\" is not between 1% and 100%"
        );
        assert_eq!(
            err("default:\n  slice: {compute: 150%}\n"),
            "default.slice.compute: bad percentage \"150%\": use a number from 0 to 100 followed by %, e.g. 30% or 12.5%"
        );
        assert_eq!(
            err("default:\n  slice: {compute: 0.5%}\n"),
            "default.slice.compute: \"0.5%\" is not between 1% and 100%"
        );
    }

    #[test]
    fn bad_slice_count() {
        assert_eq!(
            err("default:\n  slice: {slicesPerGpu: 0}\n"),
            "default.slice.slicesPerGpu: 0 is not between 1 and 128"
        );
        assert_eq!(
            err("default:\n  slice: {slicesPerGpu: 129}\n"),
            "default.slice.slicesPerGpu: 129 is not between 1 and 128"
        );
        assert_eq!(
            err("default:\n  slice: {slicesPerGpu: -1}\n"),
            "default.slice.slicesPerGpu: -1 is not between 1 and 128"
        );
    }

    #[test]
    fn bad_policy_and_placement() {
        assert_eq!(
            err("default:\n  computePolicy: fair\n"),
            "default.computePolicy: unknown compute policy \"fair\"; expected \"guaranteed\" or \"burst\""
        );
        assert_eq!(
            err("overrides:\n  - nodeNames: [a]\n    placement: random\n"),
            "overrides[0].placement: unknown placement \"random\"; expected one of defrag, fgd, binpack, spread, shared-threshold"
        );
    }

    #[test]
    fn placement_takes_the_engines_policies_and_defaults_to_its_default() {
        let resolve = |text: &str| {
            Config::parse(text)
                .expect("valid")
                .resolve("n", &labels(&[]))
        };
        // No placement named: the engine's default (what `tessera simulate`
        // runs without --policy).
        assert_eq!(resolve("version: 1\n").placement, Placement::default());
        assert_eq!(Placement::default(), Placement::Defrag);
        for (name, want) in [
            ("defrag", Placement::Defrag),
            ("fgd", Placement::Fgd),
            ("binpack", Placement::Binpack),
            ("spread", Placement::Spread),
            (
                "shared-threshold",
                Placement::SharedThreshold(DEFAULT_SHARED_THRESHOLD),
            ),
        ] {
            let n = resolve(&format!("default:\n  placement: {name}\n"));
            assert_eq!(n.placement, want, "{name}");
            assert_eq!(n.placement.to_string(), name);
        }
        // An override may name any of them too.
        let c =
            Config::parse("overrides:\n  - nodeNames: [n]\n    placement: fgd\n").expect("valid");
        assert_eq!(c.resolve("n", &labels(&[])).placement, Placement::Fgd);
        assert_eq!(c.resolve("m", &labels(&[])).placement, Placement::Defrag);
        // The threshold is sharedThreshold's, never part of the name.
        assert_eq!(
            err("default:\n  placement: shared-threshold:0.5\n"),
            "default.placement: \"shared-threshold:0.5\": a node config gives the threshold as \
             sharedThreshold, not in the placement name; expected one of defrag, fgd, binpack, \
             spread, shared-threshold"
        );
    }

    #[test]
    fn bad_threshold() {
        assert_eq!(
            err("default:\n  sharedThreshold: 1.5\n"),
            "default.sharedThreshold: 1.5 is not a fraction between 0 and 1"
        );
        assert_eq!(
            err("default:\n  sharedThreshold: -0.1\n"),
            "default.sharedThreshold: -0.1 is not a fraction between 0 and 1"
        );
        assert_eq!(
            err("default:\n  sharedThreshold: .nan\n"),
            "default.sharedThreshold: NaN is not a fraction between 0 and 1"
        );
    }

    #[test]
    fn bad_overrides() {
        assert_eq!(
            err("overrides:\n  - placement: spread\n"),
            "overrides[0]: selects no node: give nodeNames, nodeSelector, or both"
        );
        assert_eq!(
            err("overrides:\n  - nodeNames: []\n    placement: spread\n"),
            "overrides[0].nodeNames: is empty; list node names or leave it out"
        );
        assert_eq!(
            err("overrides:\n  - nodeNames: [a, '']\n    placement: spread\n"),
            "overrides[0].nodeNames[1]: must not be empty"
        );
        assert_eq!(
            err("overrides:\n  - nodeNames: [a]\n"),
            "overrides[0]: sets nothing: give slice, computePolicy, placement, sharedThreshold, ldSoPreload, deviceListStrategy or dra"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeNames: [a]\n    placement: spread\n  - nodeNames: [b]\n    slice: {}\n"
            ),
            "overrides[1].slice: give at least one of memory (e.g. 4Gi), compute (e.g. 10%) or slicesPerGpu"
        );
    }

    #[test]
    fn bad_selectors() {
        assert_eq!(
            err("overrides:\n  - nodeSelector: {}\n    placement: spread\n"),
            "overrides[0].nodeSelector: selects nothing: give matchLabels or matchExpressions"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeSelector:\n      matchExpressions: [{key: a, operator: Near, values: [b]}]\n    placement: spread\n"
            ),
            "overrides[0].nodeSelector.matchExpressions[0].operator: unknown operator \"Near\"; expected In, NotIn, Exists or DoesNotExist"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeSelector:\n      matchExpressions: [{key: a, operator: In}]\n    placement: spread\n"
            ),
            "overrides[0].nodeSelector.matchExpressions[0].values: In needs at least one value"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeSelector:\n      matchExpressions: [{key: a, operator: Exists, values: [x]}]\n    placement: spread\n"
            ),
            "overrides[0].nodeSelector.matchExpressions[0].values: Exists takes no values"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeSelector:\n      matchExpressions: [{key: '', operator: Exists}]\n    placement: spread\n"
            ),
            "overrides[0].nodeSelector.matchExpressions[0].key: must not be empty"
        );
        assert_eq!(
            err(
                "overrides:\n  - nodeSelector:\n      matchLabels: {'': x}\n    placement: spread\n"
            ),
            "overrides[0].nodeSelector.matchLabels: a label key must not be empty"
        );
    }

    #[test]
    fn bad_gpu_classes() {
        assert_eq!(
            err("gpuClasses: [{name: '', products: ['*']}]"),
            "gpuClasses[0].name: must not be empty"
        );
        assert!(
            err("gpuClasses: [{name: 'high performance', products: ['*']}]")
                .starts_with("gpuClasses[0].name: \"high performance\" is not a valid label value")
        );
        assert_eq!(
            err("gpuClasses: [{name: a, products: ['*']}, {name: a, products: ['*']}]"),
            "gpuClasses[1].name: class \"a\" is defined twice"
        );
        assert_eq!(
            err("gpuClasses: [{name: a, products: []}]"),
            "gpuClasses[0].products: must list at least one product pattern"
        );
        assert_eq!(
            err("gpuClasses: [{name: a, products: ['*', ' ']}]"),
            "gpuClasses[0].products[1]: must not be empty"
        );
        let e = err("gpuClasses: [{products: ['*']}]");
        assert!(e.contains("gpuClasses[0]") && e.contains("name"), "{e}");
    }

    #[test]
    fn label_values() {
        assert!(is_label_value("high-performance"));
        assert!(is_label_value("NVIDIA-A100-SXM4-80GB"));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value("a b"));
        assert!(!is_label_value(&"a".repeat(64)));
    }

    #[test]
    fn device_list_strategy_defaults_to_volume_mounts_and_overrides_per_node() {
        let c = Config::parse(
            "default:\n  deviceListStrategy: envvar\noverrides:\n  - nodeNames: [cdi-node]\n    deviceListStrategy: [cdi, volume-mounts]\n",
        )
        .expect("parse");
        let plain = c.resolve("n", &labels(&[])).device_list_strategy;
        assert_eq!(plain.names(), ["envvar"]);
        let cdi = c.resolve("cdi-node", &labels(&[])).device_list_strategy;
        assert_eq!(cdi.names(), ["volume-mounts", "cdi"]);
        let none = Config::parse("version: 1\n").expect("parse");
        assert_eq!(
            none.resolve("n", &labels(&[])).device_list_strategy,
            DeviceListStrategy::DEFAULT
        );
        assert_eq!(DeviceListStrategy::DEFAULT.names(), ["volume-mounts"]);
        let e = err("default:\n  deviceListStrategy: magic\n");
        assert!(
            e.contains("default.deviceListStrategy") && e.contains("magic"),
            "{e}"
        );
        let e = err("default:\n  deviceListStrategy: []\n");
        assert!(e.contains("default.deviceListStrategy"), "{e}");
    }

    #[test]
    fn dra_section_defaults_merges_field_by_field_and_follows_label_overrides() {
        let none = Config::parse("version: 1\n").expect("parse");
        assert_eq!(none.resolve("n", &labels(&[])).dra, DraConfig::default());
        assert_eq!(DraConfig::default().layout, DraLayout::Slices);
        let c = Config::parse(
            "default:\n  dra: {layout: slices, memoryMinimum: 1Gi}\noverrides:\n  - nodeSelector: {matchLabels: {dra: shared}}\n    dra: {layout: shared, memoryStep: 128Mi}\n",
        )
        .expect("parse");
        let plain = c.resolve("n", &labels(&[])).dra;
        assert_eq!(
            plain,
            DraConfig {
                layout: DraLayout::Slices,
                memory_minimum: GI,
                memory_step: DEFAULT_DRA_MEMORY_STEP,
            }
        );
        let shared = c.resolve("n", &labels(&[("dra", "shared")]));
        assert_eq!(
            shared.dra,
            DraConfig {
                layout: DraLayout::Shared,
                // Left out by the override: the default section's stays.
                memory_minimum: GI,
                memory_step: 128 << 20,
            }
        );
        assert_eq!(shared.matched_overrides, vec![0]);
        assert_eq!(DraLayout::Shared.as_str(), "shared");
    }

    #[test]
    fn bad_dra_sections() {
        assert_eq!(
            err("default:\n  dra: {layout: partitioned}\n"),
            "default.dra.layout: unknown DRA layout \"partitioned\"; expected \"slices\" or \"shared\""
        );
        assert_eq!(
            err("default:\n  dra: {}\n"),
            "default.dra: give at least one of layout (slices or shared), memoryMinimum or memoryStep"
        );
        assert_eq!(
            err("overrides:\n  - nodeNames: [a]\n    dra: {memoryMinimum: 1Mi}\n"),
            "overrides[0].dra.memoryMinimum: 1048576 bytes is below the smallest share, 64Mi"
        );
        assert_eq!(
            err("default:\n  dra: {memoryStep: 1000}\n"),
            "default.dra.memoryStep: 1000 bytes is below the smallest step, 1Mi"
        );
        assert_eq!(
            err("default:\n  dra: {memoryStep: -5}\n"),
            "default.dra.memoryStep: -5 is negative"
        );
        let e = err("default:\n  dra: {memoryMinimum: lots}\n");
        assert!(e.starts_with("default.dra.memoryMinimum:"), "{e}");
        let e = err("default:\n  dra: {layuot: shared}\n");
        assert!(e.contains("layuot"), "{e}");
    }
}
