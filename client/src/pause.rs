//! `tessera pause` and `tessera resume`: hold an allocation's processes
//! (no compute grants; launches and memory requests block in the shim,
//! they do not fail; memory stays reserved) and let them go again.

use tessera_proto::manager::v1 as pb;

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera pause` / `tessera resume` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct PauseArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// The allocation's id (`tessera status` lists them).
    pub id: String,
}

/// Pauses (`pause` true) or resumes the allocation; prints one line.
pub fn pause(args: &PauseArgs, pause: bool) -> Result<(), CliError> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut c = client::connect(&args.socket.socket).await?;
        let req = pb::PauseAllocationRequest {
            id: args.id.clone(),
        };
        let a = if pause {
            c.pause_allocation(req).await?
        } else {
            c.resume_allocation(req).await?
        }
        .into_inner();
        println!("{} {}", if pause { "paused" } else { "resumed" }, a.id);
        Ok(())
    })
}
