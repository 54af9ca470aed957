//! Gives the cdylib AMD's soname and the symbol version nodes of ROCm 5.2's
//! `libamdhip64.so.5` (`hip_4.2`, each later release's node after it): a reference like
//! `hipMalloc@hip_4.2` binds only to a definition of that version. Which symbol carries
//! which version is set in the code (`hip_api!`, by `.symver`); the script only declares
//! the nodes, because rustc's own export list already decides what is global.
use std::io::Write;

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let script = out.join("hip.map");
    let mut f = std::fs::File::create(&script).expect("creating the version script");
    let nodes = [
        "hip_4.2", "hip_4.3", "hip_4.4", "hip_4.5", "hip_5.0", "hip_5.1", "hip_5.2",
        // ROCm 6's node, for its one function the simulator has
        // (hipGetDevicePropertiesR0600, which hip-python 6 calls).
        "hip_6.0",
    ];
    for (i, node) in nodes.iter().enumerate() {
        match i.checked_sub(1).map(|p| nodes[p]) {
            None => writeln!(f, "{node} {{ }};"),
            Some(parent) => writeln!(f, "{node} {{ }} {parent};"),
        }
        .expect("writing the version script");
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libamdhip64.so.5");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
