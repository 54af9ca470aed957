//! `tessera run`: runs one command under the shim with a fresh allocation,
//! for GPU sharing on a single machine without Kubernetes. One round trip
//! to the manager (CreateAllocation, GPUs named as the user named them),
//! then `exec`: the command takes this process's place, so its exit status
//! and signals are its own, and the manager, which bound the allocation to
//! this process from the connection's peer credentials, deletes it once the
//! process is gone. A manager that does not say so (`cli-tracked`, an
//! older one) gets the old way: the command runs as a child, its exit code
//! (or 128 + its signal) becomes ours, and we delete the allocation.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitStatus;

use tessera_proto::manager::v1 as pb;

use tessera_contract::Policy;
use tessera_contract::env;
use tessera_contract::labels::{CLI_TRACKED, RunOwner};
use tessera_contract::paths::CONTAINER_HOOK_LIBRARY;
use tessera_contract::units::{parse_share_ppm, parse_size};

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera run` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// The GPUs: each an index or UUID (a unique prefix of the UUID is
    /// enough), comma-separated (`0,1`) or the flag repeated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub gpu: Vec<String>,
    /// Memory limit per GPU, e.g. 4Gi or 512Mi (see `tessera_contract::units`):
    /// one value for every GPU, or one per GPU in `--gpu`'s order (`4Gi,8Gi`).
    #[arg(long, value_name = "SIZE", value_delimiter = ',', required = true)]
    pub memory: Vec<String>,
    /// Compute share per GPU, a percentage, e.g. 30%: one value for every
    /// GPU, or one per GPU (`30%,50%`).
    #[arg(
        long,
        value_name = "PERCENT",
        value_delimiter = ',',
        default_value = "100%"
    )]
    pub compute: Vec<String>,
    /// Compute policy: guaranteed (share is a cap) or burst (share is a floor).
    #[arg(long, value_name = "guaranteed|burst")]
    pub policy: Option<String>,
    /// Priority for burst time: idle GPU time beyond the shares goes to the
    /// highest priority first (-1000..=1000, default 0).
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// The hook library to preload [default: what the manager hands out].
    #[arg(long, value_name = "PATH")]
    pub hook_library: Option<PathBuf>,
    /// Without a node manager: how long the session's private manager, when
    /// this run starts it, stays after the last run ends (a duration: 30s,
    /// 5m, 1h), so that the next runs find it ready.
    #[arg(
        long,
        env = "TESSERA_PRIVATE_GRACE",
        value_name = "DURATION",
        default_value = crate::private::DEFAULT_GRACE
    )]
    pub private_grace: String,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// This process, as the owner of the allocation it creates (the manager
/// deletes the allocation should it die without doing so).
fn current_owner() -> RunOwner {
    let me = tessera_shm::ProcIdentity::current();
    RunOwner {
        pid: me.pid,
        pidns: me.pidns,
        start_time: me.start_time,
    }
}

/// Finds the GPU `want` names: an index, a UUID or a unique UUID prefix
/// (the manager resolves a run's names the same way).
pub fn resolve_gpu<'a>(st: &'a pb::NodeStatus, want: &str) -> Result<&'a pb::GpuStatus, CliError> {
    let names: Vec<(u32, &str)> = st.gpus.iter().map(|g| (g.index, g.uuid.as_str())).collect();
    tessera_contract::uuid::resolve_gpu_name(&names, want)
        .map(|k| &st.gpus[k])
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// One GPU's limits as `tessera run` was asked for them: the GPU as the
/// user named it, its memory limit in bytes, its share in ppm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLimits {
    pub gpu: String,
    pub memory: u64,
    pub share_ppm: u32,
}

/// Pairs `--gpu`, `--memory` and `--compute`: a list of one value applies to
/// every GPU, otherwise each list has one value per GPU, in order. Sizes and
/// shares are parsed here, so a bad one is reported before the manager is
/// asked.
pub fn limits(args: &RunArgs) -> Result<Vec<GpuLimits>, CliError> {
    let n = args.gpu.len();
    if n == 0 || args.gpu.iter().any(|g| g.trim().is_empty()) {
        return Err(CliError::Usage(
            "--gpu needs a GPU index or UUID (several: --gpu 0,1)".into(),
        ));
    }
    crate::check_per_gpu("--memory", &args.memory, n)?;
    crate::check_per_gpu("--compute", &args.compute, n)?;
    let pick = |values: &[String], i: usize| values[if values.len() == 1 { 0 } else { i }].clone();
    (0..n)
        .map(|i| {
            Ok(GpuLimits {
                gpu: args.gpu[i].trim().to_owned(),
                memory: parse_size(pick(&args.memory, i).trim())?,
                share_ppm: parse_share_ppm(pick(&args.compute, i).trim())?,
            })
        })
        .collect()
}

/// Resolves every GPU of `limits` on the node; a GPU named twice (by index
/// and by UUID, say) is refused.
pub fn resolve_gpus<'a>(
    st: &'a pb::NodeStatus,
    limits: &[GpuLimits],
) -> Result<Vec<&'a pb::GpuStatus>, CliError> {
    let mut out: Vec<&pb::GpuStatus> = Vec::with_capacity(limits.len());
    for l in limits {
        let g = resolve_gpu(st, &l.gpu)?;
        if out.iter().any(|o| o.uuid == g.uuid) {
            return Err(CliError::Usage(format!(
                "GPU {} ({}) is named twice in --gpu",
                g.index, g.uuid
            )));
        }
        out.push(g);
    }
    Ok(out)
}

/// The allocation request for `tessera run`: one allocation with a device
/// entry per GPU, in `--gpu`'s order; `gpus` are UUIDs, or the names as the
/// user gave them for the manager to resolve.
pub fn request(
    args: &RunArgs,
    gpus: &[&str],
    id: String,
) -> Result<pb::CreateAllocationRequest, CliError> {
    let limits = limits(args)?;
    if limits.len() != gpus.len() {
        return Err(CliError::Usage(format!(
            "{} GPUs named, {} resolved",
            limits.len(),
            gpus.len()
        )));
    }
    let policy = match args.policy.as_deref() {
        None => pb::ComputePolicy::Unspecified,
        Some(p) => match Policy::parse(p) {
            Some(Policy::Guaranteed) => pb::ComputePolicy::Guaranteed,
            Some(Policy::Burst) => pb::ComputePolicy::Burst,
            None => {
                return Err(CliError::Usage(format!(
                    "bad --policy {p:?}: use guaranteed or burst"
                )));
            }
        },
    };
    let mut labels: HashMap<String, String> = current_owner().labels().into_iter().collect();
    if let Some(cmd) = args.command.first() {
        let name = cmd.rsplit('/').next().unwrap_or(cmd);
        labels.insert("command".to_owned(), name.chars().take(200).collect());
    }
    Ok(pb::CreateAllocationRequest {
        id,
        devices: gpus
            .iter()
            .zip(&limits)
            .map(|(g, l)| pb::DeviceRequest {
                gpu_uuid: (*g).to_owned(),
                memory_limit_bytes: l.memory,
                compute_share_ppm: l.share_ppm,
                slices: 0,
            })
            .collect(),
        policy: policy as i32,
        device_ids: vec![],
        labels,
    })
}

/// The environment the command runs with: the allocation's files by their
/// host paths (no container, no mounts), the hook preloaded ahead of any
/// existing preload, and CUDA restricted to the allocation's GPUs, by UUID
/// in the allocation's order (so device 0 in the command is the first
/// `--gpu`, device 1 the second, ...).
pub fn child_env(
    alloc: &pb::Allocation,
    hook: &str,
    existing_preload: Option<&str>,
) -> Vec<(String, String)> {
    let preload = match existing_preload {
        Some(p) if !p.is_empty() => format!("{hook}:{p}"),
        _ => hook.to_owned(),
    };
    let uuids: Vec<&str> = alloc.devices.iter().map(|d| d.gpu_uuid.as_str()).collect();
    vec![
        (env::CONTROL.into(), alloc.control_path.clone()),
        (env::STATE.into(), alloc.state_path.clone()),
        (env::ALLOCATION.into(), alloc.id.clone()),
        (env::LD_PRELOAD.into(), preload),
        ("CUDA_VISIBLE_DEVICES".into(), uuids.join(",")),
    ]
}

/// Our exit code for the command's status: its code, or 128 + its signal
/// as shells report it.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// The host path of the hook library the manager hands out.
fn hook_path(alloc: &pb::Allocation) -> Option<String> {
    alloc
        .mounts
        .iter()
        .find(|m| m.container_path == CONTAINER_HOOK_LIBRARY)
        .map(|m| m.host_path.clone())
}

/// Runs `tessera run`; returns the exit code to leave with (when the
/// command was not exec'd in our place).
pub fn run(args: &RunArgs) -> Result<i32, CliError> {
    // Bad sizes, lists and durations are reported before the manager is
    // even asked.
    limits(args)?;
    tessera_contract::units::parse_duration(&args.private_grace)
        .map_err(|e| CliError::Usage(format!("--private-grace {:?}: {e}", args.private_grace)))?;
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: &RunArgs) -> Result<i32, CliError> {
    match client::connect(&args.socket.socket).await {
        Ok(c) => run_with(args, c, None).await,
        Err(client::ClientError::NotRunning(_) | client::ClientError::Refused(_)) => {
            // No manager: the session's private one (started if need be).
            let hook = match &args.hook_library {
                Some(p) => std::path::absolute(p).unwrap_or_else(|_| p.clone()),
                None => crate::private::default_hook().ok_or_else(|| {
                    CliError::Usage(format!(
                        "no manager on {} and no libtessera.so beside this program to start a \
                         private one with: pass --hook-library",
                        args.socket.socket.display()
                    ))
                })?,
            };
            let dir = crate::private::session_dir();
            let p = crate::private::Private::join(&dir, &hook, &args.private_grace)?;
            if p.started {
                eprintln!(
                    "tessera run: no manager on {}; started this session's private manager ({}), \
                     which stays {} after the last run (--private-grace)",
                    args.socket.socket.display(),
                    p.dir.display(),
                    args.private_grace
                );
            }
            let c = client::connect(&p.socket).await?;
            run_with(args, c, Some(p)).await
        }
        Err(e) => Err(e.into()),
    }
}

type Client = tessera_proto::manager::v1::manager_client::ManagerClient<tonic::transport::Channel>;

/// CreateAllocation with the GPUs as the user named them: one round trip.
/// A manager that does not resolve names (an older one) refuses them as
/// invalid; then the names are resolved here from its status and asked
/// again.
async fn create(args: &RunArgs, c: &mut Client) -> Result<pb::Allocation, CliError> {
    let limits = limits(args)?;
    let id = format!("run-{}-{:04x}", std::process::id(), rand::random::<u16>());
    let names: Vec<&str> = limits.iter().map(|l| l.gpu.as_str()).collect();
    let first = match c
        .create_allocation(request(args, &names, id.clone())?)
        .await
    {
        Ok(a) => return Ok(a.into_inner()),
        Err(s) if s.code() == tonic::Code::InvalidArgument => s,
        Err(s) => return Err(s.into()),
    };
    let st = c
        .get_node_status(pb::NodeStatusRequest {})
        .await?
        .into_inner();
    let gpus = resolve_gpus(&st, &limits)?;
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    if uuids == names {
        return Err(first.into());
    }
    Ok(c.create_allocation(request(args, &uuids, id)?)
        .await?
        .into_inner())
}

async fn delete(c: &mut Client, alloc: &pb::Allocation) {
    if let Err(e) = c
        .delete_allocation(pb::DeleteAllocationRequest {
            id: alloc.id.clone(),
        })
        .await
    {
        eprintln!(
            "tessera run: could not delete allocation {}: {}",
            alloc.id,
            client::ClientError::from(e)
        );
    }
}

async fn run_with(
    args: &RunArgs,
    mut c: Client,
    private: Option<crate::private::Private>,
) -> Result<i32, CliError> {
    let alloc = create(args, &mut c).await?;
    let prepared = prepare(args, &mut c, &alloc).await;
    let hook = match prepared {
        Ok(h) => h,
        Err(e) => {
            delete(&mut c, &alloc).await;
            return Err(e);
        }
    };
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    let existing = std::env::var(env::LD_PRELOAD).ok();
    cmd.envs(child_env(&alloc, &hook, existing.as_deref()));
    if alloc.labels.get(CLI_TRACKED).map(String::as_str) == Some("true") {
        // The manager deletes the allocation when this process (the
        // command, from here on) is gone. The private manager's users lock
        // closes with the exec (close-on-exec): our allocation holds it now.
        use std::os::unix::process::CommandExt;
        let error = cmd.exec();
        delete(&mut c, &alloc).await;
        return Err(CliError::Io {
            what: format!("cannot start {:?}", args.command[0]),
            error,
        });
    }
    drop(private);
    let signals = catch_signals();
    let result = run_child(args, tokio::process::Command::from(cmd), signals).await;
    delete(&mut c, &alloc).await;
    result
}

/// What comes between the allocation and the command: the priority, when
/// asked (ResizeAllocation: a second round trip), and the hook library's
/// path, which must exist.
async fn prepare(
    args: &RunArgs,
    c: &mut Client,
    alloc: &pb::Allocation,
) -> Result<String, CliError> {
    if let Some(p) = args.priority {
        c.resize_allocation(pb::ResizeAllocationRequest {
            id: alloc.id.clone(),
            devices: vec![],
            priority: Some(p),
        })
        .await?;
    }
    let hook = match &args.hook_library {
        Some(p) => std::path::absolute(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string(),
        None => hook_path(alloc).unwrap_or_default(),
    };
    if hook.is_empty() || !std::path::Path::new(&hook).exists() {
        return Err(CliError::Usage(format!(
            "the hook library {hook:?} does not exist: build it (cargo build -p tessera-hook) and \
             start the manager with --hook-library pointing at libtessera.so, or pass \
             --hook-library here"
        )));
    }
    Ok(hook)
}

/// Catches the signals `tessera run` passes on, from before the allocation
/// exists, so none of them kills us between creating it and deleting it.
/// Each signal comes with whether it is to be passed on to the command.
fn catch_signals() -> tokio::sync::mpsc::UnboundedReceiver<(i32, bool)> {
    use tokio::signal::unix::{SignalKind, signal};
    // On a terminal, ^C and ^\ reach the command directly (same process
    // group): we only survive them. Otherwise they came from kill(1) aimed
    // at us, and we pass them on like every other signal.
    let tty = std::io::stdin().is_terminal();
    let kinds = [
        (SignalKind::interrupt(), !tty),
        (SignalKind::quit(), !tty),
        (SignalKind::terminate(), true),
        (SignalKind::hangup(), true),
        (SignalKind::user_defined1(), true),
        (SignalKind::user_defined2(), true),
    ];
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (kind, forward) in kinds {
        let Ok(mut s) = signal(kind) else { continue };
        let tx = tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                if tx.send((kind.as_raw_value(), forward)).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

/// The old way, for a manager that does not track the run: the command
/// as our child, signals passed on, its exit code ours.
async fn run_child(
    args: &RunArgs,
    mut cmd: tokio::process::Command,
    mut signals: tokio::sync::mpsc::UnboundedReceiver<(i32, bool)>,
) -> Result<i32, CliError> {
    let mut child = cmd.spawn().map_err(|error| CliError::Io {
        what: format!("cannot start {:?}", args.command[0]),
        error,
    })?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok());

    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|error| CliError::Io {
                    what: "waiting for the command".into(),
                    error,
                })?;
                return Ok(exit_code(status));
            }
            Some((raw, forward)) = signals.recv() => {
                if !forward {
                    continue;
                }
                if let (Some(pid), Ok(sig)) = (pid, nix::sys::signal::Signal::try_from(raw)) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    /// What a request asks of each GPU: (UUID, memory, compute share).
    pub(crate) fn asked(devices: &[pb::DeviceRequest]) -> Vec<(&str, u64, u32)> {
        devices
            .iter()
            .map(|d| {
                (
                    d.gpu_uuid.as_str(),
                    d.memory_limit_bytes,
                    d.compute_share_ppm,
                )
            })
            .collect()
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RunArgs,
    }

    fn args(extra: &[&str]) -> RunArgs {
        let mut v = vec!["run", "--gpu", "0", "--memory", "4Gi"];
        v.extend_from_slice(extra);
        Cli::parse_from(v).args
    }

    #[test]
    fn the_command_keeps_its_own_flags() {
        let a = args(&[
            "--compute",
            "30%",
            "--",
            "python",
            "-c",
            "x",
            "--memory",
            "1",
        ]);
        assert_eq!(a.command, ["python", "-c", "x", "--memory", "1"]);
        assert_eq!(a.compute, ["30%"]);
    }

    #[test]
    fn gpus_by_index_uuid_and_prefix() {
        let st = crate::status::tests::sample();
        assert_eq!(resolve_gpu(&st, "1").unwrap().uuid, "GPU-b");
        assert_eq!(resolve_gpu(&st, "GPU-a").unwrap().index, 0);
        let e = resolve_gpu(&st, "7").unwrap_err().to_string();
        assert!(
            e.contains("no GPU \"7\"") && e.contains("0 (GPU-a), 1 (GPU-b)"),
            "{e}"
        );
        let e = resolve_gpu(&st, "GPU-").unwrap_err().to_string();
        assert!(e.contains("matches several GPUs"), "{e}");
    }

    #[test]
    fn the_request_carries_limits_policy_and_labels() {
        let a = args(&[
            "--compute",
            "30%",
            "--policy",
            "guaranteed",
            "--",
            "/usr/bin/python3",
        ]);
        let r = request(&a, &["GPU-a"], "run-1".into()).unwrap();
        assert_eq!(r.devices[0].memory_limit_bytes, 4 << 30);
        assert_eq!(r.devices[0].compute_share_ppm, 300_000);
        assert_eq!(r.policy, pb::ComputePolicy::Guaranteed as i32);
        assert_eq!(r.labels["source"], "cli");
        assert_eq!(r.labels["command"], "python3");
        let bad = args(&["--policy", "fast", "--", "x"]);
        let e = request(&bad, &["GPU-a"], "r".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad --policy \"fast\""), "{e}");
        let bad = args(&["--compute", "300%", "--", "x"]);
        assert!(request(&bad, &["GPU-a"], "r".into()).is_err());
    }

    fn multi(argv: &[&str]) -> RunArgs {
        let mut v = vec!["run"];
        v.extend_from_slice(argv);
        v.extend_from_slice(&["--", "x"]);
        Cli::parse_from(v).args
    }

    #[test]
    fn several_gpus_pair_with_their_limits() {
        let st = crate::status::tests::sample();
        let a = multi(&[
            "--gpu",
            "0,1",
            "--memory",
            "4Gi,8Gi",
            "--compute",
            "30%,50%",
        ]);
        let l = limits(&a).unwrap();
        assert_eq!(
            l,
            [
                GpuLimits {
                    gpu: "0".into(),
                    memory: 4 << 30,
                    share_ppm: 300_000
                },
                GpuLimits {
                    gpu: "1".into(),
                    memory: 8 << 30,
                    share_ppm: 500_000
                },
            ]
        );
        let gpus = resolve_gpus(&st, &l).unwrap();
        let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
        let r = request(&a, &uuids, "run-2".into()).unwrap();
        let got = asked(&r.devices);
        assert_eq!(
            got,
            [("GPU-a", 4 << 30, 300_000), ("GPU-b", 8 << 30, 500_000)]
        );

        // One value applies to every GPU; the flag may be repeated instead.
        let a = multi(&[
            "--gpu",
            "1",
            "--gpu",
            "0",
            "--memory",
            "2Gi",
            "--compute",
            "25%",
        ]);
        let l = limits(&a).unwrap();
        assert_eq!(l.len(), 2);
        assert!(
            l.iter()
                .all(|g| g.memory == 2 << 30 && g.share_ppm == 250_000)
        );
        let gpus = resolve_gpus(&st, &l).unwrap();
        assert_eq!(gpus[0].uuid, "GPU-b");
        assert_eq!(gpus[1].uuid, "GPU-a");
        // Per-GPU values with the flags repeated pair in order too.
        let a = multi(&[
            "--gpu", "0", "--memory", "1Gi", "--gpu", "1", "--memory", "3Gi",
        ]);
        let mem: Vec<u64> = limits(&a).unwrap().iter().map(|g| g.memory).collect();
        assert_eq!(mem, [1 << 30, 3 << 30]);
    }

    #[test]
    fn bad_gpu_lists_are_refused_with_the_reason() {
        let st = crate::status::tests::sample();
        let e = limits(&multi(&["--gpu", "0,1", "--memory", "1Gi,2Gi,3Gi"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--memory has 3 values for 2 GPUs"), "{e}");
        let e = limits(&multi(&[
            "--gpu",
            "0,1,1",
            "--memory",
            "1Gi",
            "--compute",
            "1%,2%",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--compute has 2 values for 3 GPUs"), "{e}");
        let e = limits(&multi(&["--gpu", "0,", "--memory", "1Gi"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--gpu needs a GPU"), "{e}");
        let e = limits(&multi(&["--gpu", "0,1", "--memory", "1Gi,2Gx"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad memory size \"2Gx\""), "{e}");
        // The same GPU by index and by UUID.
        let l = limits(&multi(&["--gpu", "0,GPU-a", "--memory", "1Gi"])).unwrap();
        let e = resolve_gpus(&st, &l).unwrap_err().to_string();
        assert!(e.contains("GPU 0 (GPU-a) is named twice"), "{e}");
    }

    #[test]
    fn several_gpus_are_visible_in_allocation_order() {
        let alloc = pb::Allocation {
            id: "run-3".into(),
            devices: ["GPU-b", "GPU-a"]
                .iter()
                .map(|u| pb::DeviceRequest {
                    gpu_uuid: (*u).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let env: HashMap<_, _> = child_env(&alloc, "/h.so", None).into_iter().collect();
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-b,GPU-a");
    }

    #[test]
    fn a_bad_size_is_refused_before_contacting_the_manager() {
        let mut a = args(&["--", "true"]);
        a.memory = vec!["4Gx".into()];
        a.socket.socket = "/nonexistent/socket".into();
        let e = run(&a).unwrap_err().to_string();
        assert!(e.contains("bad memory size \"4Gx\""), "{e}");
    }

    #[test]
    fn run_owner_labels_round_trip() {
        let me = current_owner();
        assert_eq!(me.pid, std::process::id());
        let labels = me.labels().into_iter().collect();
        assert_eq!(RunOwner::from_labels(&labels), Some(me));
        let mut other = labels.clone();
        other.insert("source".into(), "device-plugin".into());
        assert_eq!(RunOwner::from_labels(&other), None);
        other = labels;
        other.remove("cli-start");
        assert_eq!(RunOwner::from_labels(&other), None);
    }

    #[test]
    fn the_child_environment() {
        let alloc = pb::Allocation {
            id: "run-1".into(),
            control_path: "/s/allocations/run-1/control".into(),
            state_path: "/s/allocations/run-1/state".into(),
            devices: vec![pb::DeviceRequest {
                gpu_uuid: "GPU-a".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let env: HashMap<_, _> = child_env(&alloc, "/lib/libtessera.so", Some("/other.so"))
            .into_iter()
            .collect();
        assert_eq!(env["TESSERA_CONTROL"], "/s/allocations/run-1/control");
        assert_eq!(env["TESSERA_STATE"], "/s/allocations/run-1/state");
        assert_eq!(env["TESSERA_ALLOCATION"], "run-1");
        assert_eq!(env["LD_PRELOAD"], "/lib/libtessera.so:/other.so");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a");
        let env: HashMap<_, _> = child_env(&alloc, "/h.so", None).into_iter().collect();
        assert_eq!(env["LD_PRELOAD"], "/h.so");
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
