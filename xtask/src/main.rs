//! Developer tasks. Filled by issue 2 (binding generation).
fn main() {
    eprintln!("usage: cargo run -p xtask -- bindings");
    std::process::exit(2);
}
