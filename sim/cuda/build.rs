//! Gives the cdylib the real driver's soname, so programs linked against it (or that check
//! the soname) see `libcuda.so.1`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
