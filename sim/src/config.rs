//! The simulated node's configuration: defaults, environment variables, and parsing of
//! their values (sizes like `16Gi`, compute capabilities like `9.0`).

use crate::layout::{MAX_DEVICES, NAME_LEN};
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
        Ok(config)
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
