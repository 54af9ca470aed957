//! Gives the cdylib AMD's soname and the symbol version nodes CuPy-ROCm's modules were
//! linked against (`hip_4.2`, and `hip_4.3` after it): a reference like
//! `hipMalloc@hip_4.2` binds only to a definition of that version. Which symbol carries
//! which version is set in the code (`hip_api!`, by `.symver`); the script only declares
//! the nodes, because rustc's own export list already decides what is global.
use std::io::Write;

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let script = out.join("hip.map");
    let mut f = std::fs::File::create(&script).expect("creating the version script");
    f.write_all(b"hip_4.2 { };\nhip_4.3 { } hip_4.2;\n")
        .expect("writing the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libamdhip64.so.5");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
