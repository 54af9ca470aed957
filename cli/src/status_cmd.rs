//! `tessera status` and `tessera top`: the node's GPUs and allocations, once or live.

use tessera_client::status::{StatusArgs, status};
use tessera_client::top::{TopArgs, top};

pub fn status_main(args: StatusArgs) -> anyhow::Result<()> {
    status(&args)?;
    Ok(())
}

pub fn top_main(args: TopArgs) -> anyhow::Result<()> {
    top(&args)?;
    Ok(())
}
