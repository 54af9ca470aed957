//! `tessera scheduler-extender`: runs the kube-scheduler extender; everything it does is in
//! `tessera_extender`.

use tessera_extender::{SchedulerExtenderArgs, run};

pub fn main(args: SchedulerExtenderArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args, crate::terminated()))?;
    Ok(())
}
