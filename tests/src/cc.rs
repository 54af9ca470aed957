//! Compiling the small C programs the tests and the bench run (the probes,
//! the compute workload, test clients): one place that calls `cc`, installs
//! the result atomically (test binaries running side by side may build the
//! same program) and reports the compiler's output when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the C file `src` into `out` with `cc -Wall`; `args` follow the
/// source (optimisation, defines, `-L`/`-l`, `-shared`). The result is
/// built under a temporary name and renamed into place.
///
/// # Errors
/// The compiler's output when it cannot be run or fails, or the rename's
/// error.
pub fn cc(src: &Path, out: &Path, args: &[&str]) -> Result<(), String> {
    let tmp = PathBuf::from(format!("{}.tmp{}", out.display(), std::process::id()));
    let o = Command::new("cc")
        .arg("-Wall")
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .args(args)
        .output()
        .map_err(|e| format!("running cc (a C compiler is needed for the e2e tests): {e}"))?;
    if !o.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "cc {} failed:\n{}{}",
            src.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    std::fs::rename(&tmp, out).map_err(|e| format!("moving {} into place: {e}", out.display()))
}

/// As [`cc`], from C source text, written next to `out` (as `out` with a
/// `.c` ending, kept for reading after a failure).
///
/// # Errors
/// As [`cc`], or the source cannot be written.
pub fn cc_text(text: &str, out: &Path, args: &[&str]) -> Result<(), String> {
    let src = PathBuf::from(format!("{}.{}.c", out.display(), std::process::id()));
    std::fs::write(&src, text).map_err(|e| format!("{}: {e}", src.display()))?;
    cc(&src, out, args)?;
    let _ = std::fs::remove_file(&src);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_built_and_a_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("hello");
        cc_text(
            "int main(void) { return 3; }\n",
            &out,
            &["-O1", "-DUNUSED=1"],
        )
        .unwrap();
        let status = Command::new(&out).status().unwrap();
        assert_eq!(status.code(), Some(3));
        let e = cc_text("int main(void) { return }\n", &dir.path().join("bad"), &[]).unwrap_err();
        assert!(e.contains("failed") && e.contains("error"), "{e}");
        assert!(!dir.path().join("bad").exists());
    }
}
