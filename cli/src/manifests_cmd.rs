//! `tessera manifests`: prints the Helm chart's objects as plain YAML for `kubectl apply -f -`.

use std::io::Write;

use tessera_webhook::run::ManifestsArgs;

pub fn main(args: ManifestsArgs) -> anyhow::Result<()> {
    let yaml = args.render()?;
    std::io::stdout().lock().write_all(yaml.as_bytes())?;
    Ok(())
}
