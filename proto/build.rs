//! Compiles the kubelet and manager `.proto` files with a vendored `protoc`,
//! so a fresh clone builds with cargo alone.
//!
//! The DRA plugin API's v1beta1 is v1's messages and service in another package
//! (k8s.io/kubelet/pkg/apis/dra/v1beta1 and v1 publish the same definitions), so
//! `dra_v1beta1.proto` is written here from `proto/dra_v1.proto` with only the package
//! changed: the two cannot drift apart.

use std::path::PathBuf;

const DRA_V1_PACKAGE: &str = "package k8s.io.kubelet.pkg.apis.dra.v1;";
const DRA_V1BETA1_PACKAGE: &str = "package k8s.io.kubelet.pkg.apis.dra.v1beta1;";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sources = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/tessera_manager_v1.proto",
        "proto/dra_v1.proto",
        "proto/pluginregistration_v1.proto",
    ];
    for p in sources {
        println!("cargo:rerun-if-changed={p}");
    }
    let derived = PathBuf::from(std::env::var("OUT_DIR")?).join("proto");
    std::fs::create_dir_all(&derived)?;
    let v1 = std::fs::read_to_string("proto/dra_v1.proto")?;
    if v1.matches(DRA_V1_PACKAGE).count() != 1 {
        return Err(format!("proto/dra_v1.proto must declare `{DRA_V1_PACKAGE}` once").into());
    }
    let v1beta1 = derived.join("dra_v1beta1.proto");
    std::fs::write(
        &v1beta1,
        format!(
            "// Written by proto/build.rs from proto/dra_v1.proto; only the package differs.\n{}",
            v1.replacen(DRA_V1_PACKAGE, DRA_V1BETA1_PACKAGE, 1)
        ),
    )?;
    let mut protos: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    protos.push(v1beta1);
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &protos, &[PathBuf::from("proto"), derived])?;
    Ok(())
}
