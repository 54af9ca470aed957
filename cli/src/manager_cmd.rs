//! `tessera manager`: the node daemon; everything it does is in `tessera_manager`.

use tessera_manager::{Config, ManagerArgs};

pub fn main(args: ManagerArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let config = Config::load(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tessera_manager::daemon::run(config))?;
    Ok(())
}
