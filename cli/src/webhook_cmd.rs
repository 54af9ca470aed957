//! `tessera webhook`: runs the admission webhook; everything it does is in `tessera_webhook`.

use tessera_webhook::run::{WebhookArgs, run};

pub fn main(args: WebhookArgs) -> anyhow::Result<()> {
    // Logs go to stderr, filtered by RUST_LOG (the chart sets it); a subscriber that
    // main already installed wins.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args.options(), crate::terminated()))?;
    Ok(())
}
