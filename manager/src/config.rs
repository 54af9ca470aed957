//! The manager's configuration: flags, then environment variables (both
//! through clap), then an optional YAML file, then defaults — the first that
//! says something wins. Parsed once at start-up into a [`Config`].

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tessera_shm::Policy;

use tessera_contract::units::{UnitError, parse_duration};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tessera";
/// Default host path of the hook library handed to containers.
pub const DEFAULT_HOOK_LIBRARY: &str = tessera_contract::paths::HOST_HOOK_LIBRARY;
/// Default listen address of the metrics endpoint (dcgm-exporter's port).
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9400";
/// XIDs caused by the application, not the GPU: the same list NVIDIA's own
/// device plugin skips. 13 graphics engine exception, 31 GPU memory page
/// fault, 43 GPU stopped processing, 45 preemptive cleanup after earlier
/// errors, 68 video processor exception.
pub const DEFAULT_IGNORED_XIDS: [u64; 5] = [13, 31, 43, 45, 68];

/// Command-line flags of `tessera manager`; each can also come from the
/// environment variable named beside it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ManagerArgs {
    /// YAML configuration file; flags and environment variables override it.
    #[arg(long, env = "TESSERA_MANAGER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Unix socket of the manager API [default: /run/tessera/manager.sock].
    #[arg(long, env = tessera_contract::env::SOCKET, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Group that may use the socket (besides root).
    #[arg(long, env = "TESSERA_SOCKET_GROUP", value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// State directory: allocation files and records [default: /var/lib/tessera].
    #[arg(long, env = "TESSERA_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Host path of the hook library handed out to allocations
    /// [default: /var/lib/tessera/lib/libtessera.so].
    #[arg(long, env = "TESSERA_HOOK_LIBRARY", value_name = "PATH")]
    pub hook_library: Option<PathBuf>,
    /// Metrics listen address, or `off` [default: 0.0.0.0:9400].
    #[arg(long, env = "TESSERA_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// NVML library to load [default: libnvidia-ml.so.1 from the loader path].
    #[arg(long, env = "TESSERA_NVML_LIBRARY", value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,
    /// ROCm SMI library to load for AMD GPUs [default: librocm_smi64.so.5
    /// from the loader path, if there is one].
    #[arg(long, env = "TESSERA_ROCM_SMI_LIBRARY", value_name = "PATH")]
    pub rocm_smi_library: Option<PathBuf>,
    /// Node name for metrics and status [default: the kernel's hostname].
    #[arg(long, env = tessera_contract::node::NODE_NAME_ENV, value_name = "NAME")]
    pub hostname: Option<String>,
    /// Compute policy of allocations that do not name one [default: burst].
    #[arg(long, env = "TESSERA_DEFAULT_POLICY", value_name = "guaranteed|burst")]
    pub default_policy: Option<String>,
    /// XIDs that are the application's fault and leave a GPU healthy,
    /// comma-separated [default: 13,31,43,45,68].
    #[arg(
        long,
        env = "TESSERA_IGNORED_XIDS",
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub ignored_xids: Option<Vec<u64>>,
    /// How long a GPU stays unhealthy after a critical XID [default: 5m].
    #[arg(long, env = "TESSERA_XID_RECOVERY", value_name = "DURATION")]
    pub xid_recovery: Option<String>,
    /// Stop (SIGKILL) processes that use a GPU without the shim or beyond
    /// their allocation, in the pass of the sample that shows them
    /// [default: true; false: report only].
    #[arg(long, env = "TESSERA_BACKSTOP_KILL", value_name = "BOOL")]
    pub backstop_kill: Option<bool>,
    /// What an allocation may hold on a GPU beyond its limit by the
    /// driver's count before the backstop stops its processes: one amount
    /// per allocation and GPU, whatever its processes [default: 64Mi; see
    /// docs/security.md].
    #[arg(long, env = "TESSERA_BACKSTOP_TOLERANCE", value_name = "SIZE")]
    pub backstop_tolerance: Option<String>,
    /// No longer used (it was a tolerance per process); accepted so that
    /// old settings still start, with a warning. Use --backstop-tolerance.
    #[arg(long, env = "TESSERA_BACKSTOP_SLACK", value_name = "SIZE", hide = true)]
    pub backstop_slack: Option<String>,
    /// Device memory charged per CUDA context on a GPU where the manager
    /// could not measure what a context holds at start-up (the shim settles
    /// each context to the driver's figure where NVML attributes the
    /// process) [default: 518Mi].
    #[arg(long, env = "TESSERA_CONTEXT_OVERHEAD", value_name = "SIZE")]
    pub context_overhead: Option<String>,
    /// Length of one compute grant of the arbiter [default: 10ms].
    #[arg(long, env = "TESSERA_QUANTUM", value_name = "DURATION")]
    pub quantum: Option<String>,
    /// The nice value of the compute arbiter's threads, -20..=0 (0: the
    /// manager's own): every hand-over of a GPU waits for its thread to
    /// wake, and on a busy node a higher priority keeps it prompt. Needs
    /// CAP_SYS_NICE [default: -10; see docs/compute-slices.md].
    #[arg(
        long,
        env = "TESSERA_ARBITER_NICE",
        value_name = "NICE",
        allow_negative_numbers = true
    )]
    pub arbiter_nice: Option<i32>,
    /// How often GPUs are sampled (metrics, health, backstop) [default: 1s].
    #[arg(long, env = "TESSERA_SAMPLE_INTERVAL", value_name = "DURATION")]
    pub sample_interval: Option<String>,
    /// How often dead processes are looked for [default: 100ms].
    #[arg(long, env = "TESSERA_REAP_INTERVAL", value_name = "DURATION")]
    pub reap_interval: Option<String>,
    /// Exit once no allocation has existed for this long and no client
    /// holds `users.lock` beside the socket (the private manager `tessera
    /// run` starts; see the `idle` module) [default: never]. Flag and
    /// environment only: a node's manager never idles out.
    #[arg(long, env = "TESSERA_IDLE_EXIT", value_name = "DURATION")]
    pub idle_exit: Option<String>,
}

/// The YAML file: the same settings, camelCase, every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    pub socket: Option<PathBuf>,
    pub socket_group: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub hook_library: Option<PathBuf>,
    pub metrics_addr: Option<String>,
    pub nvml_library: Option<PathBuf>,
    pub rocm_smi_library: Option<PathBuf>,
    pub hostname: Option<String>,
    pub default_policy: Option<String>,
    pub ignored_xids: Option<Vec<u64>>,
    pub xid_recovery: Option<String>,
    pub backstop_kill: Option<bool>,
    pub backstop_tolerance: Option<String>,
    /// Replaced by `backstopTolerance`: read, checked and ignored with a
    /// warning (`Config::warnings`).
    pub backstop_slack: Option<String>,
    pub context_overhead: Option<String>,
    pub quantum: Option<String>,
    pub arbiter_nice: Option<i32>,
    pub sample_interval: Option<String>,
    pub reap_interval: Option<String>,
}

/// A configuration that cannot be used, naming the setting and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
}

/// What an allocation may hold on a GPU beyond its limit by the driver's
/// count before the backstop stops its processes: one amount per allocation
/// and GPU. The shim charges contexts (settled to what the driver holds),
/// workspaces and pools inside the limit, so an honest allocation's driver
/// figure is within its limit; this covers what the driver takes for a
/// process after its context was measured without the shim seeing it
/// (lazily loaded modules, small-allocation rounding on a GPU; nothing on
/// the simulator). See docs/security.md.
pub const DEFAULT_BACKSTOP_TOLERANCE: u64 = 64 << 20;

/// The default per-context charge where the manager could not measure one
/// at start-up ([`crate::cuda_info::measure_contexts`]): 518 MiB, what a
/// primary context held on an H200 with CUDA 13 (the largest measured; the
/// simulator's default too). Charged up rather than down: a smaller GPU's
/// context is settled to the driver's figure right after it is made, while
/// too small a charge lets contexts made at once take the device past the
/// limit before they settle (300 MiB, the figure before, let 32 of them
/// take a 10 GiB allocation's device to 16.4 GiB).
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 518 << 20;

/// The configuration in force.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub socket_group: Option<String>,
    pub state_dir: PathBuf,
    pub hook_library: PathBuf,
    /// `None`: metrics off.
    pub metrics_addr: Option<SocketAddr>,
    pub nvml_library: Option<PathBuf>,
    /// `None`: ROCm SMI by its soname, and no AMD GPUs if it is not there.
    pub rocm_smi_library: Option<PathBuf>,
    pub hostname: String,
    /// Slices per GPU for the slice metrics where the device plugin has not
    /// published the node's count (`slices.json` beside the socket): no flag,
    /// so the node's config stays the one place the count is set.
    pub slices_per_gpu: u32,
    pub default_policy: Policy,
    pub ignored_xids: BTreeSet<u64>,
    pub xid_recovery: Duration,
    pub backstop_kill: bool,
    /// What an allocation may hold on a GPU beyond its limit by the
    /// driver's count ([`DEFAULT_BACKSTOP_TOLERANCE`]).
    pub backstop_tolerance_bytes: u64,
    pub context_overhead_bytes: u64,
    /// The compute arbiter's settings (its quantum is configurable).
    pub arbiter: crate::arbiter::ArbiterConfig,
    pub sample_interval: Duration,
    pub reap_interval: Duration,
    /// Exit after this long idle (`--idle-exit`); `None`: never.
    pub idle_exit: Option<Duration>,
    /// Settings that were accepted but mean nothing any more, each with
    /// what to do instead; the daemon logs them at start-up.
    pub warnings: Vec<String>,
}

impl Config {
    /// Defaults for everything, rooted at `state_dir`, with the socket
    /// inside it and metrics off: what tests and embedders start from.
    pub fn for_state_dir(state_dir: &Path) -> Self {
        Config {
            socket: state_dir.join("manager.sock"),
            socket_group: None,
            state_dir: state_dir.to_owned(),
            hook_library: PathBuf::from(DEFAULT_HOOK_LIBRARY),
            metrics_addr: None,
            nvml_library: None,
            rocm_smi_library: None,
            hostname: local_hostname(),
            slices_per_gpu: 10,
            default_policy: Policy::Burst,
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            xid_recovery: Duration::from_secs(300),
            backstop_kill: true,
            backstop_tolerance_bytes: DEFAULT_BACKSTOP_TOLERANCE,
            context_overhead_bytes: DEFAULT_CONTEXT_OVERHEAD,
            arbiter: crate::arbiter::ArbiterConfig::default(),
            sample_interval: Duration::from_secs(1),
            reap_interval: Duration::from_millis(100),
            idle_exit: None,
            warnings: Vec::new(),
        }
    }

    /// Resolves flags and environment (already in `args`) over the file
    /// named by `args.config`, over the defaults.
    pub fn load(args: &ManagerArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Self::resolve(args, file)
    }

    /// Merges `args` over `file` over the defaults and checks the result.
    pub fn resolve(args: &ManagerArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let state_dir = pick(args.state_dir.clone(), file.state_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let mut c = Config::for_state_dir(&state_dir);
        c.socket = pick(args.socket.clone(), file.socket)
            .unwrap_or_else(|| PathBuf::from(tessera_proto::manager::v1::DEFAULT_SOCKET));
        c.socket_group = pick(args.socket_group.clone(), file.socket_group);
        c.hook_library = pick(args.hook_library.clone(), file.hook_library)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HOOK_LIBRARY));
        let metrics = pick(args.metrics_addr.clone(), file.metrics_addr)
            .unwrap_or_else(|| DEFAULT_METRICS_ADDR.to_owned());
        c.metrics_addr = parse_metrics_addr(&metrics)?;
        c.nvml_library = pick(args.nvml_library.clone(), file.nvml_library);
        c.rocm_smi_library = pick(args.rocm_smi_library.clone(), file.rocm_smi_library);
        if let Some(h) = pick(args.hostname.clone(), file.hostname) {
            if h.is_empty() {
                return Err(invalid("hostname", "must not be empty".into()));
            }
            c.hostname = h;
        }
        if let Some(p) = pick(args.default_policy.clone(), file.default_policy) {
            c.default_policy = Policy::parse(&p).ok_or_else(|| {
                invalid("defaultPolicy", format!("{p:?}: use guaranteed or burst"))
            })?;
        }
        if let Some(x) = pick(args.ignored_xids.clone(), file.ignored_xids) {
            c.ignored_xids = x.into_iter().collect();
        }
        let dur = |setting: &'static str, v: Option<String>, min: Duration| {
            v.map(|s| {
                let d = parse_duration(&s).map_err(|e| invalid(setting, e.to_string()))?;
                if d < min {
                    return Err(invalid(
                        setting,
                        format!("{s} is below the minimum of {min:?}"),
                    ));
                }
                Ok(d)
            })
            .transpose()
        };
        if let Some(d) = dur(
            "xidRecovery",
            pick(args.xid_recovery.clone(), file.xid_recovery),
            Duration::from_millis(100),
        )? {
            c.xid_recovery = d;
        }
        if let Some(d) = dur(
            "sampleInterval",
            pick(args.sample_interval.clone(), file.sample_interval),
            Duration::from_millis(50),
        )? {
            c.sample_interval = d;
        }
        if let Some(d) = dur(
            "reapInterval",
            pick(args.reap_interval.clone(), file.reap_interval),
            Duration::from_millis(10),
        )? {
            // Dead processes' memory must come back within a second.
            if d > Duration::from_millis(500) {
                return Err(invalid(
                    "reapInterval",
                    "at most 500ms, so that dead processes' memory returns within a second".into(),
                ));
            }
            c.reap_interval = d;
        }
        c.idle_exit = dur("idleExit", args.idle_exit.clone(), Duration::ZERO)?;
        if let Some(k) = pick(args.backstop_kill, file.backstop_kill) {
            c.backstop_kill = k;
        }
        if let Some(s) = pick(args.backstop_tolerance.clone(), file.backstop_tolerance) {
            c.backstop_tolerance_bytes = tessera_contract::units::parse_size(&s)
                .map_err(|e: UnitError| invalid("backstopTolerance", e.to_string()))?;
        }
        // The old per-process slack let an allocation keep its limit plus
        // the slack for every process it started: ignored (a bad value is
        // still an error), so an old config starts with the tolerance.
        if let Some(s) = pick(args.backstop_slack.clone(), file.backstop_slack) {
            tessera_contract::units::parse_size(&s)
                .map_err(|e: UnitError| invalid("backstopSlack", e.to_string()))?;
            c.warnings.push(format!(
                "backstopSlack ({s}) is no longer used and is ignored: it was allowed per \
                 process, so an allocation kept more the more processes it started; the \
                 backstop now allows backstopTolerance ({} bytes) per allocation and GPU \
                 (--backstop-tolerance, TESSERA_BACKSTOP_TOLERANCE); remove backstopSlack \
                 (see docs/security.md)",
                c.backstop_tolerance_bytes
            ));
        }
        if let Some(q) = dur(
            "quantum",
            pick(args.quantum.clone(), file.quantum),
            Duration::from_micros(100),
        )? {
            c.arbiter.quantum = q;
            // An idle holder is released within a quantum at the latest.
            c.arbiter.idle_release = c.arbiter.idle_release.min(q);
            c.arbiter.contested_idle_release =
                c.arbiter.contested_idle_release.min(c.arbiter.idle_release);
            c.arbiter.poll = c.arbiter.poll.min(c.arbiter.idle_release);
            c.arbiter.grant_ahead = c.arbiter.grant_ahead.min(c.arbiter.contested_idle_release);
            c.arbiter
                .validate()
                .map_err(|e| invalid("quantum", e.to_string()))?;
        }
        if let Some(n) = pick(args.arbiter_nice, file.arbiter_nice) {
            c.arbiter.nice = n;
            c.arbiter
                .validate()
                .map_err(|e| invalid("arbiterNice", e.to_string()))?;
        }
        if let Some(s) = pick(args.context_overhead.clone(), file.context_overhead) {
            c.context_overhead_bytes = tessera_contract::units::parse_size(&s)
                .map_err(|e: UnitError| invalid("contextOverhead", e.to_string()))?;
        }
        if c.socket.as_os_str().is_empty() {
            return Err(invalid("socket", "must not be empty".into()));
        }
        if c.state_dir.as_os_str().is_empty() {
            return Err(invalid("stateDir", "must not be empty".into()));
        }
        // Paths are handed to containers and other processes, whose working
        // directory is not ours.
        for (setting, p) in [
            ("socket", &mut c.socket),
            ("stateDir", &mut c.state_dir),
            ("hookLibrary", &mut c.hook_library),
        ] {
            *p = std::path::absolute(&*p).map_err(|e| invalid(setting, e.to_string()))?;
        }
        Ok(c)
    }

    /// Where allocation directories live.
    pub fn allocations_dir(&self) -> PathBuf {
        self.state_dir.join("allocations")
    }
}

fn pick<T>(flag_or_env: Option<T>, file: Option<T>) -> Option<T> {
    flag_or_env.or(file)
}

fn invalid(setting: &'static str, message: String) -> ConfigError {
    ConfigError::Invalid { setting, message }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    // An empty file (or only comments) sets nothing: every default stands.
    tessera_contract::yaml::from_yaml(&text)
        .map(Option::unwrap_or_default)
        .map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

fn parse_metrics_addr(s: &str) -> Result<Option<SocketAddr>, ConfigError> {
    if s == "off" {
        return Ok(None);
    }
    // A bare port means every interface.
    let full = if s.parse::<u16>().is_ok() {
        format!("0.0.0.0:{s}")
    } else {
        s.to_owned()
    };
    full.parse().map(Some).map_err(|_| {
        invalid(
            "metricsAddr",
            format!("{s:?}: use HOST:PORT (e.g. 0.0.0.0:9400), a port, or off"),
        )
    })
}

/// The kernel's hostname, or `localhost` if it cannot be read.
pub fn local_hostname() -> String {
    tessera_contract::node::kernel_hostname()
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ManagerArgs,
    }

    fn yaml(s: &str) -> FileConfig {
        tessera_contract::yaml::from_yaml(s)
            .expect("test YAML parses")
            .expect("not empty")
    }

    #[test]
    fn defaults() {
        let c = Config::resolve(&ManagerArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/tessera/manager.sock"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/tessera"));
        assert_eq!(c.hook_library, PathBuf::from(DEFAULT_HOOK_LIBRARY));
        assert_eq!(c.metrics_addr, Some("0.0.0.0:9400".parse().unwrap()));
        assert_eq!(
            c.ignored_xids,
            [13, 31, 43, 45, 68].into_iter().collect::<BTreeSet<u64>>()
        );
        assert_eq!(c.default_policy, Policy::Burst);
        assert!(c.backstop_kill, "enforcement is on by default");
        assert_eq!(
            c.arbiter.nice, -10,
            "the arbiter thread is raised by default"
        );
        assert_eq!(c.backstop_tolerance_bytes, DEFAULT_BACKSTOP_TOLERANCE);
        assert!(c.warnings.is_empty());
        assert_eq!(
            c.allocations_dir(),
            PathBuf::from("/var/lib/tessera/allocations")
        );
    }

    #[test]
    fn flags_override_the_file() {
        let cli = Cli::parse_from([
            "x",
            "--state-dir",
            "/tmp/a",
            "--metrics-addr",
            "127.0.0.1:9999",
            "--ignored-xids",
            "13,31",
            "--backstop-kill",
            "false",
            "--arbiter-nice",
            "-5",
        ]);
        let file = yaml(
            "stateDir: /tmp/b\nsocket: /tmp/b/s.sock\nmetricsAddr: 'off'\n\
             xidRecovery: 2s\ndefaultPolicy: guaranteed\nquantum: 5ms\narbiterNice: -20\n",
        );
        let c = Config::resolve(&cli.args, file).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/tmp/a"));
        assert_eq!(c.socket, PathBuf::from("/tmp/b/s.sock"));
        assert_eq!(c.metrics_addr, Some("127.0.0.1:9999".parse().unwrap()));
        assert_eq!(c.xid_recovery, Duration::from_secs(2));
        assert_eq!(c.arbiter.quantum, Duration::from_millis(5));
        assert_eq!(c.arbiter.nice, -5);
        assert_eq!(c.default_policy, Policy::Guaranteed);
        assert_eq!(c.ignored_xids, [13, 31].into_iter().collect());
        assert!(!c.backstop_kill);
    }

    #[test]
    fn the_old_per_process_slack_loads_with_a_warning_and_changes_nothing() {
        let c = Config::resolve(&ManagerArgs::default(), yaml("backstopSlack: 1Gi\n")).unwrap();
        assert_eq!(c.backstop_tolerance_bytes, DEFAULT_BACKSTOP_TOLERANCE);
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("backstopSlack (1Gi) is no longer used")
                && c.warnings[0].contains("backstopTolerance"),
            "{:?}",
            c.warnings
        );
        // The flag (or TESSERA_BACKSTOP_SLACK) the same; the new setting wins.
        let cli = Cli::parse_from([
            "x",
            "--backstop-slack",
            "2Gi",
            "--backstop-tolerance",
            "16Mi",
        ]);
        let c = Config::resolve(&cli.args, FileConfig::default()).unwrap();
        assert_eq!(c.backstop_tolerance_bytes, 16 << 20);
        assert_eq!(c.warnings.len(), 1);
        let c = Config::resolve(&ManagerArgs::default(), yaml("backstopTolerance: 0\n")).unwrap();
        assert_eq!(c.backstop_tolerance_bytes, 0);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn relative_paths_become_absolute() {
        let yaml = yaml("stateDir: s\nsocket: s/m.sock\nhookLibrary: lib/libtessera.so\n");
        let c = Config::resolve(&ManagerArgs::default(), yaml).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c.state_dir, cwd.join("s"));
        assert_eq!(c.socket, cwd.join("s/m.sock"));
        assert_eq!(c.hook_library, cwd.join("lib/libtessera.so"));
        assert_eq!(c.allocations_dir(), cwd.join("s/allocations"));
    }

    #[test]
    fn metrics_off_and_bare_port() {
        let off = yaml("metricsAddr: 'off'");
        assert_eq!(
            Config::resolve(&ManagerArgs::default(), off)
                .unwrap()
                .metrics_addr,
            None
        );
        let port = yaml("metricsAddr: '9500'");
        assert_eq!(
            Config::resolve(&ManagerArgs::default(), port)
                .unwrap()
                .metrics_addr,
            Some("0.0.0.0:9500".parse().unwrap())
        );
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cases = [
            ("metricsAddr: nowhere", "metricsAddr"),
            ("defaultPolicy: fast", "defaultPolicy"),
            ("xidRecovery: soon", "xidRecovery"),
            ("sampleInterval: 1ms", "sampleInterval"),
            ("reapInterval: 2s", "reapInterval"),
            ("backstopSlack: 4Gx", "backstopSlack"),
            ("backstopTolerance: 4Gx", "backstopTolerance"),
            ("quantum: 20s", "quantum"),
            ("quantum: 10us", "quantum"),
            ("arbiterNice: 3", "arbiterNice"),
            ("arbiterNice: -21", "arbiterNice"),
        ];
        for (text, setting) in cases {
            let e = Config::resolve(&ManagerArgs::default(), yaml(text)).unwrap_err();
            assert!(e.to_string().starts_with(setting), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_yaml_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        std::fs::write(&path, "stateDirr: /x\n").unwrap();
        let args = ManagerArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("m.yaml") && e.contains("stateDirr"), "{e}");

        // The slice count is the node config's (the device plugin's), not the manager's.
        std::fs::write(&path, "slicesPerGpu: 4\n").unwrap();
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("slicesPerGpu"), "{e}");

        std::fs::write(&path, "stateDir: [1\n").unwrap();
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("m.yaml") && e.contains("line 1"), "{e}");

        std::fs::write(&path, "metricsAddr: off\nquantum: [10ms]\n").unwrap();
        let e = Config::load(&args).unwrap_err().to_string();
        assert!(e.contains("quantum: ") && e.contains("line 2"), "{e}");

        let missing = ManagerArgs {
            config: Some(dir.path().join("nope.yaml")),
            ..Default::default()
        };
        let e = Config::load(&missing).unwrap_err().to_string();
        assert!(
            e.contains("cannot read config file") && e.contains("nope.yaml"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_file_means_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        let args = ManagerArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        for text in ["", "\n", "# everything commented out\n# stateDir: /x\n"] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(Config::load(&args).unwrap().slices_per_gpu, 10, "{text:?}");
        }
    }
}
