//! `tessera device-plugin`: the kubelet device plugin; its flags and
//! everything it does are in `tessera_device_plugin`.

use tessera_device_plugin::args::DevicePluginArgs;

/// Logging is set up by `main` (text or JSON, `--log-format`).
pub fn main(args: DevicePluginArgs) -> anyhow::Result<()> {
    let opts = args.options()?;
    tracing::info!(node = %opts.node_name, dir = %opts.device_plugin_dir.display(), "starting the device plugin");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tessera_device_plugin::run(opts, crate::terminated()))?;
    Ok(())
}
