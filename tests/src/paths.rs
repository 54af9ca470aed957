//! Where things are: the build's working directory for the tests, the installed simulated
//! driver directory, the shim library.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessera_sim::LibDir;

/// `target/<profile>/tessera-e2e/`: shared by every test binary of one build, so the
/// probe and the library links are made once (each write is an atomic rename).
pub fn work_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let dir = dir.join("tessera-e2e");
    // Nothing to do if it fails here; the callers' own writes report the error.
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// The simulated `libcuda.so.1` / `libnvidia-ml.so.1` directory (for `LD_LIBRARY_PATH`),
/// installed once per process.
///
/// # Panics
/// If the simulated libraries were not built (they are dependencies of this crate, so
/// cargo builds them with the tests).
pub fn sim_lib_dir() -> &'static LibDir {
    static DIR: OnceLock<LibDir> = OnceLock::new();
    DIR.get_or_init(|| {
        tessera_sim::install_lib_dir(&work_dir().join("lib"))
            .unwrap_or_else(|e| panic!("installing the simulated driver: {e}"))
    })
}

/// The shim, `libtessera.so`, if it has been built (next to the test executable, in its
/// `deps/`, or in the profile directory).
pub fn hook_library() -> Option<PathBuf> {
    tessera_sim::libs::search_dirs()
        .into_iter()
        .map(|d| d.join("libtessera.so"))
        .find(|p| p.is_file())
}

/// The simulated NVML as tools load it: `libnvidia-ml.so.1` in [`sim_lib_dir`].
pub fn sim_nvml_library() -> PathBuf {
    sim_lib_dir().dir.join("libnvidia-ml.so.1")
}

/// The simulated ROCm SMI (`librocm_smi64.so.5`), as cargo built it: the manager loads
/// it by path (`--rocm-smi-library`), so it needs no link in [`sim_lib_dir`].
///
/// # Panics
/// If it was not built (it is a dependency of this crate, so cargo builds it with the
/// tests).
pub fn sim_rocm_smi_library() -> PathBuf {
    tessera_sim::libs::find_built_library("libtessera_sim_rocm_smi.so")
        .unwrap_or_else(|e| panic!("the simulated ROCm SMI: {e}"))
}
