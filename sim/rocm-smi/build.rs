//! Gives the cdylib the real ROCm SMI library's soname, `librocm_smi64.so.5` (ROCm 5.x).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librocm_smi64.so.5");
}
