//! `tessera dra-plugin`: the kubelet DRA plugin; its flags and everything it
//! does are in `tessera_dra_plugin`.

use tessera_dra_plugin::DraPluginArgs;

/// Logging is set up by `main` (text or JSON, `--log-format`).
pub fn main(args: DraPluginArgs) -> anyhow::Result<()> {
    let opts = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tessera_dra_plugin::run(opts, crate::terminated()))?;
    Ok(())
}
