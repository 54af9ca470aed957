//! Compiles the kubelet and manager `.proto` files with a vendored `protoc`,
//! so a fresh clone builds with cargo alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/tessera_manager_v1.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/pluginregistration_v1.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
