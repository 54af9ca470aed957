//! Compiling the small C programs the tests and the bench run (the probes,
//! the compute workload, test clients): one place that calls `cc`, installs
//! the result atomically (test binaries running side by side may build the
//! same program) and reports the compiler's output when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A suffix no other build in flight has: the process (test binaries run side by
/// side) and a count within it (tests in one binary run on parallel threads, and two
/// of them may build the same program: with the pid alone they shared a temporary
/// file, and the second rename found it gone).
fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Compiles the C file `src` into `out` with `cc -Wall`; `args` follow the
/// source (optimisation, defines, `-L`/`-l`, `-shared`). The result is
/// built under a temporary name and renamed into place.
///
/// # Errors
/// The compiler's output when it cannot be run or fails, or the rename's
/// error.
pub fn cc(src: &Path, out: &Path, args: &[&str]) -> Result<(), String> {
    let tmp = PathBuf::from(format!("{}.tmp{}", out.display(), unique_suffix()));
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

/// The declarations of the CUDA driver API and NVML that the C clients share
/// (`probe/cuda_abi.h`). A client beside it includes it as any header; one
/// compiled from its text ([`cc_text`]) has it inlined.
pub const CUDA_ABI_H: &str = include_str!("../probe/cuda_abi.h");

const CUDA_ABI_INCLUDE: &str = "#include \"cuda_abi.h\"";

/// `text` with its `#include "cuda_abi.h"` replaced by the header itself: a
/// client compiled from an `include_str!` copy of its text needs no source
/// tree when it is built (the bench binary runs from anywhere).
pub fn with_cuda_abi(text: &str) -> String {
    text.replace(CUDA_ABI_INCLUDE, CUDA_ABI_H)
}

/// A name for a build of C source `text` as compiled (the shared header
/// inlined): a 64-bit FNV-1a hash in hex, so a changed source or header gets a
/// binary of its own while an unchanged one is reused across test binaries.
pub fn fingerprint(text: &str) -> String {
    let h = with_cuda_abi(text)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    format!("{h:016x}")
}

/// As [`cc`], from C source text ([`with_cuda_abi`] applied), written next to
/// `out` (as `out` with a `.c` ending, kept for reading after a failure).
///
/// # Errors
/// As [`cc`], or the source cannot be written.
pub fn cc_text(text: &str, out: &Path, args: &[&str]) -> Result<(), String> {
    let src = PathBuf::from(format!("{}.{}.c", out.display(), unique_suffix()));
    std::fs::write(&src, with_cuda_abi(text)).map_err(|e| format!("{}: {e}", src.display()))?;
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

    #[test]
    fn threads_building_the_same_program_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("same");
        std::thread::scope(|s| {
            let builds: Vec<_> = (0..6)
                .map(|_| s.spawn(|| cc_text("int main(void) { return 4; }\n", &out, &["-O1"])))
                .collect();
            for b in builds {
                b.join().unwrap().unwrap();
            }
        });
        assert_eq!(Command::new(&out).status().unwrap().code(), Some(4));
    }

    #[test]
    fn text_gets_the_shared_header_and_a_name_that_follows_it() {
        let text =
            "#include \"cuda_abi.h\"\nint main(void) { CUdeviceptr p = 0; return (int)p; }\n";
        let expanded = with_cuda_abi(text);
        assert!(expanded.contains("typedef unsigned long long CUdeviceptr;"));
        assert!(!expanded.contains(CUDA_ABI_INCLUDE));
        assert_eq!(fingerprint(text), fingerprint(text));
        assert_ne!(fingerprint(text), fingerprint(&text.replace("0;", "1;")));
        // Built from the text alone, away from the header.
        let dir = tempfile::tempdir().unwrap();
        cc_text(text, &dir.path().join("abi"), &[]).unwrap();
    }
}
