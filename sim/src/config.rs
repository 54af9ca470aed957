//! The simulated node's configuration: defaults, environment variables, and parsing of
//! their values (sizes like `16Gi`, compute capabilities like `9.0`).

use crate::layout::{ARCH_LEN, MAX_DEVICES, NAME_LEN};
/// Sizes are the contract's syntax (`16Gi`, `512Mi`, `2G`, bytes), as every other part
/// reads them; re-exported for the tests that build nodes from size strings.
pub use tessera_contract::units::parse_size;

/// Environment variable naming the node state file.
pub const ENV_STATE: &str = "TESSERA_SIM_STATE";
/// Number of devices (1..=16), default 2.
pub const ENV_DEVICES: &str = "TESSERA_SIM_DEVICES";
/// Memory per device, bytes or with a unit (`16Gi`, `512Mi`, `1G`), default 16Gi.
pub const ENV_MEMORY: &str = "TESSERA_SIM_MEMORY";
/// Streaming multiprocessors per device, default 132.
pub const ENV_SMS: &str = "TESSERA_SIM_SMS";
/// Compute capability `major.minor`, default `9.0`.
pub const ENV_CC: &str = "TESSERA_SIM_CC";
/// Device name, default `Tessera Simulated GPU`.
pub const ENV_NAME: &str = "TESSERA_SIM_NAME";
/// The node's GPUs one by one, comma-separated: `nvidia` or `amd`, optionally with a model
/// (`amd:AMD Instinct MI300X`) and, for an AMD model the simulator does not know, its
/// architecture (`amd:My Card:gfx90a`). When set, the list's length is the device count.
pub const ENV_GPUS: &str = "TESSERA_SIM_GPUS";
/// Seed of the devices' UUIDs (decimal or 0x-hex u64); default derived from the host name.
pub const ENV_SEED: &str = "TESSERA_SIM_SEED";
/// The CUDA version the simulated driver reports (`cuDriverGetVersion`), per process:
/// `12.9` or `12090` form, 12.0 to 13.9; default [`DEFAULT_DRIVER_VERSION`].
pub const ENV_DRIVER_VERSION: &str = "TESSERA_SIM_DRIVER_VERSION";
/// CUDA 12.9, what the simulator's headers are.
pub const DEFAULT_DRIVER_VERSION: i32 = 12090;

/// The driver version this process reports: [`ENV_DRIVER_VERSION`] if set, else 12.9.
/// Accepts `major.minor` (`13.0`) or CUDA's integer form (`13000`); majors 12 and 13.
pub fn driver_version_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<i32, ConfigError> {
    let Some(v) = lookup(ENV_DRIVER_VERSION) else {
        return Ok(DEFAULT_DRIVER_VERSION);
    };
    let bad = || {
        invalid(
            ENV_DRIVER_VERSION,
            &v,
            "must look like 12.9 or 12090 (CUDA 12.0 to 13.9)",
        )
    };
    let t = v.trim();
    let version = match t.split_once('.') {
        Some((major, minor)) => {
            let major: i32 = major.parse().map_err(|_| bad())?;
            let minor: i32 = minor.parse().map_err(|_| bad())?;
            if !(0..=9).contains(&minor) {
                return Err(bad());
            }
            major * 1000 + minor * 10
        }
        None => {
            let n: i32 = t.parse().map_err(|_| bad())?;
            if n % 10 != 0 || (n % 1000) / 10 > 9 {
                return Err(bad());
            }
            n
        }
    };
    if !(12000..=13090).contains(&version) {
        return Err(bad());
    }
    Ok(version)
}

/// A configuration value that cannot be used; names the variable and the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        /// Why, and what would have parsed (the contract's message, for sizes).
        reason: String,
    },
}

/// Whose GPU a simulated device is, which decides the libraries that show it: NVIDIA's
/// (`libcuda.so.1`, `libnvidia-ml.so.1`) or AMD's (`libamdhip64.so.5`, rocm-smi). The
/// ground truth (memory, busy time per process) is the same for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum Vendor {
    #[default]
    Nvidia = 0,
    Amd = 1,
}

impl Vendor {
    /// The spelling of [`ENV_GPUS`] and of reports: `nvidia`, `amd`.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }

    /// The vendor a state file's word names; `None` for a word no build wrote.
    pub fn from_word(word: u32) -> Option<Vendor> {
        match word {
            0 => Some(Vendor::Nvidia),
            1 => Some(Vendor::Amd),
            _ => None,
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Vendor {
    type Err = String;
    fn from_str(s: &str) -> Result<Vendor, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvidia" => Ok(Vendor::Nvidia),
            "amd" => Ok(Vendor::Amd),
            other => Err(format!("unknown vendor {other:?} (nvidia or amd)")),
        }
    }
}

/// One AMD model the simulator knows: its marketing name as `hipGetDeviceProperties` and
/// rocm-smi give it, its architecture (`gcnArchName`) and its compute units per device.
/// Figures from AMD's product pages (compute units) and LLVM's AMDGPU processor table
/// (architecture); the `sramecc+:xnack-` features are what ROCm reports on these parts in
/// their default mode. An MI250X is two devices to HIP, one per die, so its row is one die.
pub const AMD_MODELS: &[(&str, &str, u32)] = &[
    ("AMD Instinct MI100", "gfx908:sramecc+:xnack-", 120),
    ("AMD Instinct MI210", "gfx90a:sramecc+:xnack-", 104),
    ("AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", 110),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 304),
];

/// The AMD model a `TESSERA_SIM_GPUS` entry of `amd` alone stands for.
pub const DEFAULT_AMD_MODEL: &str = "AMD Instinct MI210";

/// What one device of the node is, as configured. Fields left `None` take the node's
/// defaults ([`NodeConfig::name`], [`NodeConfig::sms`], the compute capability) for an
/// NVIDIA device and the [`AMD_MODELS`] row for an AMD one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    pub vendor: Vendor,
    pub model: Option<String>,
    /// AMD only: the architecture name, required for a model not in [`AMD_MODELS`].
    pub arch: Option<String>,
}

impl GpuSpec {
    /// An NVIDIA device with the node's name.
    pub fn nvidia() -> GpuSpec {
        GpuSpec {
            vendor: Vendor::Nvidia,
            model: None,
            arch: None,
        }
    }

    /// An AMD device of a model in [`AMD_MODELS`] (`None`: [`DEFAULT_AMD_MODEL`]).
    pub fn amd(model: Option<&str>) -> GpuSpec {
        GpuSpec {
            vendor: Vendor::Amd,
            model: model.map(str::to_string),
            arch: None,
        }
    }

    /// One entry of [`ENV_GPUS`]: `vendor[:model[:arch]]`.
    pub fn parse(entry: &str) -> Result<GpuSpec, String> {
        let mut parts = entry.trim().splitn(3, ':');
        let vendor: Vendor = parts.next().unwrap_or_default().parse()?;
        let model = parts.next().map(|m| m.trim().to_string());
        let arch = parts.next().map(|a| a.trim().to_string());
        let spec = GpuSpec {
            vendor,
            model,
            arch,
        };
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(m) = &self.model
            && (m.is_empty() || m.len() >= NAME_LEN || m.contains('\0'))
        {
            return Err(format!(
                "model {m:?} must be 1 to 63 bytes without NUL characters"
            ));
        }
        match (self.vendor, &self.arch) {
            (Vendor::Nvidia, Some(_)) => {
                Err("an architecture is for AMD devices (NVIDIA's is TESSERA_SIM_CC)".into())
            }
            (Vendor::Nvidia, None) => Ok(()),
            (Vendor::Amd, Some(arch)) => amd_version(arch).map(|_| ()),
            (Vendor::Amd, None) => {
                let model = self.model.as_deref().unwrap_or(DEFAULT_AMD_MODEL);
                if AMD_MODELS.iter().any(|(m, _, _)| *m == model) {
                    Ok(())
                } else {
                    let known: Vec<&str> = AMD_MODELS.iter().map(|(m, _, _)| *m).collect();
                    Err(format!(
                        "AMD model {model:?} is not one the simulator knows ({}); \
                         give its architecture too: amd:{model}:gfx90a",
                        known.join(", ")
                    ))
                }
            }
        }
    }
}

/// The (major, minor) HIP reports for an AMD architecture name, as HIP derives them from
/// the gfx number: `gfx90a` is 9.0, `gfx942` 9.4, `gfx1100` 11.0 (the last hex digit is
/// the stepping, which major.minor leaves out). Features after `:` are ignored.
pub fn amd_version(arch: &str) -> Result<(u32, u32), String> {
    let bad = || format!("architecture {arch:?} must look like gfx90a or gfx1100[:features]");
    if arch.len() >= ARCH_LEN || arch.contains('\0') {
        return Err(bad());
    }
    let base = arch.split(':').next().unwrap_or_default();
    let digits = base.strip_prefix("gfx").ok_or_else(bad)?;
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let (major, minor) = match digits.len() {
        3 => (&digits[..1], &digits[1..2]),
        4 => (&digits[..2], &digits[2..3]),
        _ => return Err(bad()),
    };
    let major: u32 = major.parse().map_err(|_| bad())?;
    let minor: u32 = minor.parse().map_err(|_| bad())?;
    Ok((major, minor))
}

/// One device as the state file records it: what [`GpuSpec`] and the node's defaults
/// resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel {
    pub vendor: Vendor,
    pub name: String,
    /// Empty for NVIDIA.
    pub arch: String,
    /// SMs (NVIDIA) or compute units (AMD).
    pub units: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
}

/// What a new node state file is initialised with. An existing file keeps its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub devices: u32,
    pub memory_per_device: u64,
    pub sms: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub name: String,
    pub seed: u64,
    /// Device i is `gpus[i]`; devices past the list's end are NVIDIA with the node's
    /// defaults, so an empty list (the default) is the all-NVIDIA node.
    pub gpus: Vec<GpuSpec>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            devices: 2,
            memory_per_device: 16 << 30,
            sms: 132,
            cc_major: 9,
            cc_minor: 0,
            name: "Tessera Simulated GPU".to_string(),
            seed: host_seed(),
            gpus: Vec::new(),
        }
    }
}

impl NodeConfig {
    /// Defaults overridden by the `TESSERA_SIM_*` variables of this process.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Defaults overridden by whatever `lookup` returns for each variable (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = NodeConfig::default();
        if let Some(v) = lookup(ENV_DEVICES) {
            let n = parse_u64(ENV_DEVICES, &v)?;
            if n == 0 || n > MAX_DEVICES as u64 {
                return Err(invalid(ENV_DEVICES, &v, "must be between 1 and 16"));
            }
            config.devices = n as u32;
        }
        if let Some(v) = lookup(ENV_MEMORY) {
            let bytes = parse_size(&v).map_err(|e| invalid(ENV_MEMORY, &v, e))?;
            if bytes < (1 << 20) {
                return Err(invalid(ENV_MEMORY, &v, "must be at least 1Mi"));
            }
            if bytes > (1 << 44) {
                return Err(invalid(ENV_MEMORY, &v, "must be at most 16Ti"));
            }
            config.memory_per_device = bytes;
        }
        if let Some(v) = lookup(ENV_SMS) {
            let n = parse_u64(ENV_SMS, &v)?;
            if n == 0 || n > 1024 {
                return Err(invalid(ENV_SMS, &v, "must be between 1 and 1024"));
            }
            config.sms = n as u32;
        }
        if let Some(v) = lookup(ENV_CC) {
            let (major, minor) = v
                .trim()
                .split_once('.')
                .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
                .ok_or_else(|| invalid(ENV_CC, &v, "must look like 9.0"))?;
            if !(1..=20).contains(&major) || minor > 9 {
                return Err(invalid(ENV_CC, &v, "major must be 1..20, minor 0..9"));
            }
            config.cc_major = major;
            config.cc_minor = minor;
        }
        if let Some(v) = lookup(ENV_NAME) {
            if v.is_empty() || v.len() >= NAME_LEN || v.contains('\0') {
                return Err(invalid(
                    ENV_NAME,
                    &v,
                    "must be 1 to 63 bytes without NUL characters",
                ));
            }
            config.name = v;
        }
        if let Some(v) = lookup(ENV_SEED) {
            config.seed = parse_u64(ENV_SEED, &v)?;
        }
        if let Some(v) = lookup(ENV_GPUS) {
            let gpus = v
                .split(',')
                .map(GpuSpec::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(ENV_GPUS, &v, e))?;
            if gpus.len() > MAX_DEVICES {
                return Err(invalid(ENV_GPUS, &v, "at most 16 devices"));
            }
            // Both variables set and disagreeing is a mistake worth naming, not a guess.
            if lookup(ENV_DEVICES).is_some() && gpus.len() != config.devices as usize {
                return Err(invalid(
                    ENV_GPUS,
                    &v,
                    format!(
                        "lists {} devices but {ENV_DEVICES} says {}",
                        gpus.len(),
                        config.devices
                    ),
                ));
            }
            config.devices = gpus.len() as u32;
            config.gpus = gpus;
        }
        Ok(config)
    }

    /// What device `index` is: its spec in [`NodeConfig::gpus`] resolved against the
    /// node's defaults and [`AMD_MODELS`].
    pub fn gpu(&self, index: usize) -> GpuModel {
        let spec = self
            .gpus
            .get(index)
            .cloned()
            .unwrap_or_else(GpuSpec::nvidia);
        match spec.vendor {
            Vendor::Nvidia => GpuModel {
                vendor: Vendor::Nvidia,
                name: spec.model.unwrap_or_else(|| self.name.clone()),
                arch: String::new(),
                units: self.sms,
                cc_major: self.cc_major,
                cc_minor: self.cc_minor,
            },
            Vendor::Amd => {
                let name = spec.model.unwrap_or_else(|| DEFAULT_AMD_MODEL.to_string());
                let known = AMD_MODELS.iter().find(|(m, _, _)| *m == name);
                let arch = spec
                    .arch
                    .or_else(|| known.map(|(_, a, _)| a.to_string()))
                    .unwrap_or_else(|| AMD_MODELS[1].1.to_string());
                let units = known.map_or(self.sms, |(_, _, cus)| *cus);
                let (cc_major, cc_minor) = amd_version(&arch).unwrap_or((9, 0));
                GpuModel {
                    vendor: Vendor::Amd,
                    name,
                    arch,
                    units,
                    cc_major,
                    cc_minor,
                }
            }
        }
    }
}

pub(crate) fn invalid(var: &'static str, value: &str, reason: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_u64(var: &'static str, value: &str) -> Result<u64, ConfigError> {
    let v = value.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse::<u64>(),
    };
    parsed.map_err(|_| invalid(var, value, "not a non-negative integer"))
}

/// A stable per-host seed, so a host's simulated GPUs keep their UUIDs across runs but two
/// hosts do not share them.
fn host_seed() -> u64 {
    let host = tessera_contract::node::kernel_hostname().unwrap_or_default();
    fnv1a(host.as_bytes())
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<NodeConfig, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NodeConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_without_environment() {
        let c = with(&[]).expect("defaults");
        assert_eq!(c.devices, 2);
        assert_eq!(c.memory_per_device, 16 << 30);
        assert_eq!((c.cc_major, c.cc_minor), (9, 0));
    }

    #[test]
    fn overrides_are_applied() {
        let c = with(&[
            (ENV_DEVICES, "4"),
            (ENV_MEMORY, "512Mi"),
            (ENV_SMS, "8"),
            (ENV_CC, "8.6"),
            (ENV_NAME, "Mini"),
            (ENV_SEED, "0x10"),
        ])
        .expect("valid");
        assert_eq!(c.devices, 4);
        assert_eq!(c.memory_per_device, 512 << 20);
        assert_eq!(c.sms, 8);
        assert_eq!((c.cc_major, c.cc_minor), (8, 6));
        assert_eq!(c.name, "Mini");
        assert_eq!(c.seed, 16);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("16Gi"), Ok(16 << 30));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert!(parse_size("").is_err());
        assert!(parse_size("Gi").is_err());
        assert!(parse_size("12Qi").is_err());
        assert!(parse_size("-5").is_err());
        assert!(parse_size("99999999999999Ti").is_err());
    }

    #[test]
    fn driver_version() {
        let v = |s: Option<&str>| {
            driver_version_from_lookup(|k| {
                assert_eq!(k, ENV_DRIVER_VERSION);
                s.map(str::to_string)
            })
        };
        assert_eq!(v(None), Ok(12090));
        assert_eq!(v(Some("13.0")), Ok(13000));
        assert_eq!(v(Some(" 12.4 ")), Ok(12040));
        assert_eq!(v(Some("13020")), Ok(13020));
        for bad in [
            "", "13", "11.8", "14.0", "12.10", "12095", "1e4", "-12.0", "12.x",
        ] {
            assert!(
                matches!(
                    v(Some(bad)),
                    Err(ConfigError::Invalid {
                        var: ENV_DRIVER_VERSION,
                        ..
                    })
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_mixed_node_from_the_gpu_list() {
        let c = with(&[(
            ENV_GPUS,
            "nvidia, amd ,amd:AMD Instinct MI300X,amd:Hygon DCU Z100:gfx906,nvidia:H200",
        )])
        .expect("valid");
        assert_eq!(c.devices, 5, "the list's length is the device count");
        let g: Vec<GpuModel> = (0..5).map(|i| c.gpu(i)).collect();
        assert_eq!(g[0].vendor, Vendor::Nvidia);
        assert_eq!(g[0].name, "Tessera Simulated GPU");
        assert_eq!((g[0].units, g[0].cc_major), (132, 9));
        assert_eq!(g[1].vendor, Vendor::Amd);
        assert_eq!(g[1].name, "AMD Instinct MI210");
        assert_eq!(g[1].arch, "gfx90a:sramecc+:xnack-");
        assert_eq!(g[1].units, 104);
        assert_eq!((g[2].cc_major, g[2].cc_minor, g[2].units), (9, 4, 304));
        assert_eq!(g[3].arch, "gfx906");
        assert_eq!(
            g[3].units, 132,
            "an unknown model has the node's unit count"
        );
        assert_eq!(g[4].name, "H200");
        assert_eq!(g[4].arch, "");
        // Devices past the list are NVIDIA with the node's defaults.
        assert_eq!(c.gpu(9).vendor, Vendor::Nvidia);
    }

    #[test]
    fn amd_versions() {
        assert_eq!(amd_version("gfx90a"), Ok((9, 0)));
        assert_eq!(amd_version("gfx942:sramecc+:xnack-"), Ok((9, 4)));
        assert_eq!(amd_version("gfx1100"), Ok((11, 0)));
        for bad in ["", "gfx", "gfx9", "sm_90", "gfx12345", "gfxzz0"] {
            assert!(amd_version(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bad_gpu_lists_say_why() {
        for (value, why) in [
            ("intel", "unknown vendor"),
            ("amd:Radeon Toy", "give its architecture"),
            ("nvidia:H100:gfx90a", "for AMD devices"),
            ("amd:X:sm_90", "must look like gfx90a"),
            ("amd:", "1 to 63 bytes"),
            ("nvidia,", "unknown vendor"),
        ] {
            match with(&[(ENV_GPUS, value)]) {
                Err(ConfigError::Invalid { var, reason, .. }) => {
                    assert_eq!(var, ENV_GPUS);
                    assert!(reason.contains(why), "{value:?}: {reason}");
                }
                Ok(c) => panic!("{value:?} accepted: {c:?}"),
            }
        }
        let many = vec!["amd"; 17].join(",");
        assert!(with(&[(ENV_GPUS, &many)]).is_err());
        match with(&[(ENV_GPUS, "amd,amd"), (ENV_DEVICES, "3")]) {
            Err(ConfigError::Invalid { reason, .. }) => {
                assert!(reason.contains("TESSERA_SIM_DEVICES says 3"), "{reason}")
            }
            Ok(c) => panic!("disagreeing counts accepted: {c:?}"),
        }
        assert_eq!(
            with(&[(ENV_GPUS, "amd,amd"), (ENV_DEVICES, "2")])
                .expect("agreeing counts")
                .devices,
            2
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            (ENV_DEVICES, "0"),
            (ENV_DEVICES, "17"),
            (ENV_DEVICES, "two"),
            (ENV_MEMORY, "1Ki"),
            (ENV_MEMORY, "lots"),
            (ENV_SMS, "0"),
            (ENV_CC, "9"),
            (ENV_CC, "x.y"),
            (ENV_NAME, ""),
            (ENV_SEED, "-1"),
        ] {
            match with(&[(var, value)]) {
                Err(ConfigError::Invalid {
                    var: v, value: got, ..
                }) => {
                    assert_eq!(v, var);
                    assert_eq!(got, value);
                }
                Ok(c) => panic!("{var}={value} accepted: {c:?}"),
            }
        }
    }
}
