//! `tessera run`: runs one command under the shim with a fresh allocation,
//! for GPU sharing on a single machine without Kubernetes. The allocation
//! is created before the command starts and deleted after it ends; the
//! command's exit code (or 128 + its signal) becomes ours.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitStatus;

use tessera_proto::manager::v1 as pb;

use tessera_contract::Policy;
use tessera_contract::env;
use tessera_contract::labels::RunOwner;
use tessera_contract::paths::CONTAINER_HOOK_LIBRARY;
use tessera_contract::units::{parse_share_ppm, parse_size};

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera run` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// The GPU: its index or UUID (a unique prefix of the UUID is enough).
    #[arg(long)]
    pub gpu: String,
    /// Memory limit, e.g. 4Gi or 512Mi (see `tessera_contract::units`).
    #[arg(long, value_name = "SIZE")]
    pub memory: String,
    /// Compute share, a percentage, e.g. 30%.
    #[arg(long, value_name = "PERCENT", default_value = "100%")]
    pub compute: String,
    /// Compute policy: guaranteed (share is a cap) or burst (share is a floor).
    #[arg(long, value_name = "guaranteed|burst")]
    pub policy: Option<String>,
    /// The hook library to preload [default: what the manager hands out].
    #[arg(long, value_name = "PATH")]
    pub hook_library: Option<PathBuf>,
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

/// Finds the GPU `want` names: an index, a UUID or a unique UUID prefix.
pub fn resolve_gpu<'a>(st: &'a pb::NodeStatus, want: &str) -> Result<&'a pb::GpuStatus, CliError> {
    let list = || {
        st.gpus
            .iter()
            .map(|g| format!("{} ({})", g.index, g.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found: Vec<&pb::GpuStatus> = if let Ok(i) = want.parse::<u32>() {
        st.gpus.iter().filter(|g| g.index == i).collect()
    } else {
        match st.gpus.iter().find(|g| g.uuid == want) {
            Some(g) => vec![g],
            None => st
                .gpus
                .iter()
                .filter(|g| g.uuid.starts_with(want))
                .collect(),
        }
    };
    match found.as_slice() {
        [g] => Ok(g),
        [] => Err(CliError::Usage(format!(
            "no GPU {want:?} on this node; GPUs here: {}",
            list()
        ))),
        _ => Err(CliError::Usage(format!(
            "{want:?} matches several GPUs; give more of the UUID ({})",
            list()
        ))),
    }
}

/// The allocation request for `tessera run`.
pub fn request(
    args: &RunArgs,
    gpu: &pb::GpuStatus,
    id: String,
) -> Result<pb::CreateAllocationRequest, CliError> {
    let memory = parse_size(&args.memory)?;
    let share = parse_share_ppm(&args.compute)?;
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
        devices: vec![pb::DeviceRequest {
            gpu_uuid: gpu.uuid.clone(),
            memory_limit_bytes: memory,
            compute_share_ppm: share,
            slices: 0,
        }],
        policy: policy as i32,
        device_ids: vec![],
        labels,
    })
}

/// The environment the command runs with: the allocation's files by their
/// host paths (no container, no mounts), the hook preloaded ahead of any
/// existing preload, and CUDA restricted to the allocation's GPUs.
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

/// Runs `tessera run`; returns the exit code to leave with.
pub fn run(args: &RunArgs) -> Result<i32, CliError> {
    // Bad sizes are reported before the manager is even asked.
    parse_size(&args.memory)?;
    parse_share_ppm(&args.compute)?;
    let rt = runtime()?;
    rt.block_on(run_async(args))
}

async fn run_async(args: &RunArgs) -> Result<i32, CliError> {
    let signals = catch_signals();
    let mut c = client::connect(&args.socket.socket).await?;
    let st = c
        .get_node_status(pb::NodeStatusRequest {})
        .await?
        .into_inner();
    let gpu = resolve_gpu(&st, &args.gpu)?;
    let id = format!("run-{}-{:04x}", std::process::id(), rand::random::<u16>());
    let req = request(args, gpu, id)?;
    let alloc = c.create_allocation(req).await?.into_inner();
    let result = run_child(args, &alloc, signals).await;
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
    result
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

async fn run_child(
    args: &RunArgs,
    alloc: &pb::Allocation,
    mut signals: tokio::sync::mpsc::UnboundedReceiver<(i32, bool)>,
) -> Result<i32, CliError> {
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
    // A signal before the command starts (^C while the allocation was being
    // made, say) ends the run: the allocation is deleted, nothing runs.
    if let Ok((raw, _)) = signals.try_recv() {
        return Ok(128 + raw);
    }
    let existing = std::env::var(env::LD_PRELOAD).ok();
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    cmd.envs(child_env(alloc, &hook, existing.as_deref()));
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
mod tests {
    use super::*;
    use clap::Parser;

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
        assert_eq!(a.compute, "30%");
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
        let st = crate::status::tests::sample();
        let a = args(&[
            "--compute",
            "30%",
            "--policy",
            "guaranteed",
            "--",
            "/usr/bin/python3",
        ]);
        let r = request(&a, &st.gpus[0], "run-1".into()).unwrap();
        assert_eq!(r.devices[0].memory_limit_bytes, 4 << 30);
        assert_eq!(r.devices[0].compute_share_ppm, 300_000);
        assert_eq!(r.policy, pb::ComputePolicy::Guaranteed as i32);
        assert_eq!(r.labels["source"], "cli");
        assert_eq!(r.labels["command"], "python3");
        let bad = args(&["--policy", "fast", "--", "x"]);
        let e = request(&bad, &st.gpus[0], "r".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad --policy \"fast\""), "{e}");
        let bad = args(&["--compute", "300%", "--", "x"]);
        assert!(request(&bad, &st.gpus[0], "r".into()).is_err());
    }

    #[test]
    fn a_bad_size_is_refused_before_contacting_the_manager() {
        let mut a = args(&["--", "true"]);
        a.memory = "4Gx".into();
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
