//! `tessera resize`: changes a running allocation's memory limits and
//! compute shares (the manager's ResizeAllocation). The limits live in the
//! allocation's control file, which the shim reads on every call, so a
//! process under the shim sees a new limit at its next memory call.

use tessera_contract::units::{format_bytes, format_ppm, parse_share_ppm, parse_size};
use tessera_proto::manager::v1 as pb;

use crate::run::resolve_gpu;
use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera resize` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct ResizeArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// The allocation's id (`tessera status` lists them).
    pub id: String,
    /// The GPUs to change (index or UUID, comma-separated or repeated)
    /// [default: every GPU of the allocation].
    #[arg(long, value_delimiter = ',')]
    pub gpu: Vec<String>,
    /// New memory limit: one value for every GPU, or one per GPU.
    #[arg(long, value_name = "SIZE", value_delimiter = ',')]
    pub memory: Vec<String>,
    /// New compute share: one value for every GPU, or one per GPU.
    #[arg(long, value_name = "PERCENT", value_delimiter = ',')]
    pub compute: Vec<String>,
    /// New priority for burst time (higher first, -1000..=1000).
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i32>,
}

/// The request for `args`, given the allocation's GPUs (`alloc_gpus`, its
/// UUIDs in order) and the node's status (to resolve `--gpu`).
pub fn request(
    args: &ResizeArgs,
    alloc_gpus: &[String],
    st: &pb::NodeStatus,
) -> Result<pb::ResizeAllocationRequest, CliError> {
    if args.memory.is_empty() && args.compute.is_empty() && args.priority.is_none() {
        return Err(CliError::Usage(
            "nothing to change: give --memory, --compute or --priority".into(),
        ));
    }
    if args.memory.is_empty() && args.compute.is_empty() {
        return Ok(pb::ResizeAllocationRequest {
            id: args.id.clone(),
            devices: vec![],
            priority: args.priority,
        });
    }
    let uuids: Vec<String> = if args.gpu.is_empty() {
        alloc_gpus.to_vec()
    } else {
        let mut v: Vec<String> = Vec::new();
        for g in &args.gpu {
            let u = resolve_gpu(st, g.trim())?.uuid.clone();
            if !alloc_gpus.contains(&u) {
                return Err(CliError::Usage(format!(
                    "allocation {} is not on GPU {g} ({u})",
                    args.id
                )));
            }
            if v.contains(&u) {
                return Err(CliError::Usage(format!("GPU {u} is named twice in --gpu")));
            }
            v.push(u);
        }
        v
    };
    let n = uuids.len();
    // Neither is required: a flag not given leaves that limit as it is.
    for (flag, values) in [("--memory", &args.memory), ("--compute", &args.compute)] {
        if !values.is_empty() {
            crate::check_per_gpu(flag, values, n)?;
        }
    }
    let pick = |values: &[String], i: usize| -> Option<String> {
        match values.len() {
            0 => None,
            1 => Some(values[0].trim().to_owned()),
            _ => Some(values[i].trim().to_owned()),
        }
    };
    let devices = uuids
        .into_iter()
        .enumerate()
        .map(|(i, gpu_uuid)| {
            Ok(pb::DeviceRequest {
                gpu_uuid,
                memory_limit_bytes: pick(&args.memory, i)
                    .map(|m| parse_size(&m))
                    .transpose()?
                    .unwrap_or(0),
                compute_share_ppm: pick(&args.compute, i)
                    .map(|c| parse_share_ppm(&c))
                    .transpose()?
                    .unwrap_or(0),
                slices: 0,
            })
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    Ok(pb::ResizeAllocationRequest {
        id: args.id.clone(),
        devices,
        priority: args.priority,
    })
}

/// One line saying what the allocation now has on each GPU.
pub fn summary(alloc: &pb::Allocation) -> String {
    let gpus: Vec<String> = alloc
        .devices
        .iter()
        .map(|d| {
            format!(
                "{} {} {}",
                d.gpu_uuid,
                format_bytes(d.memory_limit_bytes),
                format_ppm(d.compute_share_ppm)
            )
        })
        .collect();
    if alloc.priority != 0 {
        format!(
            "{}: {}, priority {}",
            alloc.id,
            gpus.join(", "),
            alloc.priority
        )
    } else {
        format!("{}: {}", alloc.id, gpus.join(", "))
    }
}

/// Runs `tessera resize`: prints the allocation's new limits.
pub fn resize(args: &ResizeArgs) -> Result<(), CliError> {
    // Sizes and shares are checked before the manager is asked.
    for m in &args.memory {
        parse_size(m.trim())?;
    }
    for c in &args.compute {
        parse_share_ppm(c.trim())?;
    }
    let rt = runtime()?;
    rt.block_on(async {
        let mut c = client::connect(&args.socket.socket).await?;
        let st = c
            .get_node_status(pb::NodeStatusRequest {})
            .await?
            .into_inner();
        let alloc = st
            .allocations
            .iter()
            .filter_map(|a| a.allocation.as_ref())
            .find(|a| a.id == args.id)
            .ok_or_else(|| CliError::Usage(format!("no allocation {:?} on this node", args.id)))?;
        let gpus: Vec<String> = alloc.devices.iter().map(|d| d.gpu_uuid.clone()).collect();
        let req = request(args, &gpus, &st)?;
        let done = c.resize_allocation(req).await?.into_inner();
        println!("resized {}", summary(&done));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ResizeArgs,
    }

    fn args(v: &[&str]) -> ResizeArgs {
        let mut all = vec!["resize", "run-1"];
        all.extend_from_slice(v);
        Cli::parse_from(all).args
    }

    #[test]
    fn every_gpu_by_default_and_zero_for_unchanged() {
        let st = crate::status::tests::sample();
        let gpus = vec!["GPU-a".to_owned(), "GPU-b".to_owned()];
        let r = request(&args(&["--memory", "2Gi"]), &gpus, &st).unwrap();
        assert_eq!(r.id, "run-1");
        let got = crate::run::tests::asked(&r.devices);
        assert_eq!(got, [("GPU-a", 2 << 30, 0), ("GPU-b", 2 << 30, 0)]);
        let r = request(&args(&["--gpu", "1", "--compute", "40%"]), &gpus, &st).unwrap();
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].gpu_uuid, "GPU-b");
        assert_eq!(r.devices[0].memory_limit_bytes, 0);
        assert_eq!(r.devices[0].compute_share_ppm, 400_000);
        let r = request(&args(&["--memory", "1Gi,3Gi"]), &gpus, &st).unwrap();
        assert_eq!(r.devices[1].memory_limit_bytes, 3 << 30);
    }

    #[test]
    fn bad_requests_say_why() {
        let st = crate::status::tests::sample();
        let one = vec!["GPU-a".to_owned()];
        let e = |a: &[&str]| request(&args(a), &one, &st).unwrap_err().to_string();
        assert!(e(&[]).contains("nothing to change"), "{}", e(&[]));
        let m = e(&["--gpu", "1", "--memory", "1Gi"]);
        assert!(m.contains("allocation run-1 is not on GPU 1"), "{m}");
        let m = e(&["--memory", "1Gi,2Gi"]);
        assert!(m.contains("--memory has 2 values for 1 GPUs"), "{m}");
        let m = e(&["--compute", "0%"]);
        assert!(m.contains("0%"), "{m}");
        let r = request(&args(&["--priority", "-5"]), &one, &st).unwrap();
        assert_eq!(r.priority, Some(-5));
        assert!(r.devices.is_empty());
    }

    #[test]
    fn the_summary_names_each_gpu() {
        let a = pb::Allocation {
            id: "run-1".into(),
            devices: vec![pb::DeviceRequest {
                gpu_uuid: "GPU-a".into(),
                memory_limit_bytes: 3 << 30,
                compute_share_ppm: 250_000,
                slices: 0,
            }],
            ..Default::default()
        };
        assert_eq!(summary(&a), "run-1: GPU-a 3Gi 25%");
    }
}
