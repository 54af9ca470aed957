//! Helpers for the `hook_*` tests: the built `libtessera.so`, small C
//! programs compiled at test time, and running them under `LD_PRELOAD`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `libtessera.so` cargo built alongside this test (the newest one in
/// the test executable's directory or its `deps/`).
pub fn hook_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("test executable directory");
    let candidates = [
        dir.join("libtessera.so"),
        dir.join("deps/libtessera.so"),
        dir.join("../libtessera.so"),
        dir.join("../deps/libtessera.so"),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("libtessera.so not built next to {}", exe.display()))
}

/// Compiles C source `src` into `out` with `cc`, panicking with the
/// compiler's output on failure.
pub fn cc(src: &str, out: &Path, args: &[&str]) {
    let dir = out.parent().expect("output directory");
    let c = out.with_extension("c");
    std::fs::write(&c, src).expect("write C source");
    let o = Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-o")
        .arg(out)
        .arg(&c)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc {} failed:\n{}",
        c.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// stdout of a finished process, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr of a finished process, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
