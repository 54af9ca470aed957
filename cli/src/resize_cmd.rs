//! `tessera resize`: new limits for a running allocation.

use tessera_client::resize::{ResizeArgs, resize};

pub fn main(args: ResizeArgs) -> anyhow::Result<()> {
    resize(&args)?;
    Ok(())
}
