//! `tessera resize`, `pause` and `resume`: changes to a running allocation.

use tessera_client::pause::{PauseArgs, pause};
use tessera_client::resize::{ResizeArgs, resize};

pub fn main(args: ResizeArgs) -> anyhow::Result<()> {
    resize(&args)?;
    Ok(())
}

pub fn pause_main(args: PauseArgs, paused: bool) -> anyhow::Result<()> {
    pause(&args, paused)?;
    Ok(())
}
