//! Finds the built simulated libraries and installs a directory that any program can use
//! with `LD_LIBRARY_PATH`: `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`,
//! `libnvidia-ml.so`, symlinks to the cdylibs cargo built; and, for the AMD node, the HIP
//! runtime under AMD's and Hygon's names with the ROCm library stubs
//! ([`install_hip_lib_dir`]).

use std::path::{Path, PathBuf};

/// File name of the simulated driver cdylib as cargo builds it.
pub const CUDA_CDYLIB: &str = "libtessera_sim_cuda.so";
/// File name of the simulated NVML cdylib as cargo builds it.
pub const NVML_CDYLIB: &str = "libtessera_sim_nvml.so";
/// File name of the simulated HIP runtime cdylib (`tessera-sim-hip`).
pub const HIP_CDYLIB: &str = "libtessera_sim_hip.so";
/// File name of the ROCm library stubs cdylib (`tessera-sim-hip-stubs`).
pub const HIP_STUBS_CDYLIB: &str = "libtessera_sim_hip_stubs.so";
/// The names the HIP runtime is installed under: AMD's soname, the development name
/// clients that `dlopen` it by hand use (hip-python), Hygon's soname.
pub const HIP_NAMES: &[&str] = &["libamdhip64.so.5", "libamdhip64.so", "libgalaxyhip.so.5"];
/// The sonames the stubs are installed under (what CuPy-ROCm's modules link).
pub const HIP_STUB_NAMES: &[&str] = &[
    "libhipblas.so.0",
    "librocblas.so.0",
    "librocsolver.so.0",
    "librocfft.so.0",
    "libhipfft.so",
    "libhipsparse.so.0",
    "libhiprand.so.1",
    "librccl.so.1",
    "libroctx64.so.1",
];
/// A directory holding the cdylibs, overriding the search next to the executable.
pub const ENV_LIB_DIR: &str = "TESSERA_SIM_LIB_DIR";

#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error(
        "{name} not found (looked in {searched}); build it with `cargo build -p tessera-sim-cuda -p tessera-sim-nvml` (`-p tessera-sim-hip -p tessera-sim-hip-stubs` for the AMD node) or set TESSERA_SIM_LIB_DIR"
    )]
    NotFound {
        name: &'static str,
        searched: String,
    },
    #[error("installing the simulated libraries into {dir}: {source}")]
    Install {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Where a built cdylib may be: `TESSERA_SIM_LIB_DIR`, then next to the running
/// executable, its `deps/`, and its parent (cargo leaves dependency cdylibs in
/// `target/<profile>/deps/`; test executables run from there).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os(ENV_LIB_DIR).filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("deps"));
        dirs.push(exe_dir.clone());
        if let Some(parent) = exe_dir.parent() {
            dirs.push(parent.to_path_buf());
            dirs.push(parent.join("deps"));
        }
    }
    dirs
}

/// The newest file called `name` in the search directories.
pub fn find_built_library(name: &'static str) -> Result<PathBuf, LibError> {
    let dirs = search_dirs();
    dirs.iter()
        .map(|d| d.join(name))
        .filter_map(|p| {
            let modified = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((modified, p))
        })
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p)
        .ok_or_else(|| LibError::NotFound {
            name,
            searched: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The installed library directory.
#[derive(Debug, Clone)]
pub struct LibDir {
    pub dir: PathBuf,
    /// The simulated driver cdylib the links point to.
    pub cuda: PathBuf,
    /// The simulated NVML cdylib the links point to.
    pub nvml: PathBuf,
}

/// Creates `dir` (if needed) with the four driver names linked to the built cdylibs.
pub fn install_lib_dir(dir: &Path) -> Result<LibDir, LibError> {
    let cuda = find_built_library(CUDA_CDYLIB)?;
    let nvml = find_built_library(NVML_CDYLIB)?;
    let install = |source| LibError::Install {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(install)?;
    for (target, names) in [
        (&cuda, ["libcuda.so.1", "libcuda.so"]),
        (&nvml, ["libnvidia-ml.so.1", "libnvidia-ml.so"]),
    ] {
        link_names(dir, target, &names).map_err(install)?;
    }
    Ok(LibDir {
        dir: dir.to_path_buf(),
        cuda,
        nvml,
    })
}

/// Links `names` in `dir` to `target`. A new link is renamed over the old one, so
/// processes sharing the directory never see it without the name.
fn link_names(dir: &Path, target: &Path, names: &[&str]) -> std::io::Result<()> {
    for name in names {
        let link = dir.join(name);
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(())
}

/// Creates `dir` (if needed) with the HIP runtime under [`HIP_NAMES`] and, when the
/// stubs are built too, the stubs under [`HIP_STUB_NAMES`] (a test of HIP alone needs no
/// stubs; CuPy-ROCm does). Returns the runtime cdylib the links point to.
pub fn install_hip_lib_dir(dir: &Path) -> Result<PathBuf, LibError> {
    let hip = find_built_library(HIP_CDYLIB)?;
    let install = |source| LibError::Install {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(install)?;
    link_names(dir, &hip, HIP_NAMES).map_err(install)?;
    if let Ok(stubs) = find_built_library(HIP_STUBS_CDYLIB) {
        link_names(dir, &stubs, HIP_STUB_NAMES).map_err(install)?;
    }
    Ok(hip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_linked_and_relinked_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a.so"), dir.path().join("b.so"));
        std::fs::write(&a, b"a").expect("a");
        std::fs::write(&b, b"b").expect("b");
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).expect("lib");
        link_names(&lib, &a, HIP_NAMES).expect("link");
        link_names(&lib, &b, &HIP_NAMES[..1]).expect("relink");
        let target = |n: &str| std::fs::read_link(lib.join(n)).expect("a link");
        assert_eq!(target("libamdhip64.so.5"), b);
        assert_eq!(target("libgalaxyhip.so.5"), a);
        let left: Vec<_> = std::fs::read_dir(&lib)
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "no temporary link left: {left:?}");
    }
}
