//! Finds the built simulated libraries and installs a directory that any program can use
//! with `LD_LIBRARY_PATH`: `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`,
//! `libnvidia-ml.so`, symlinks to the cdylibs cargo built.

use std::path::{Path, PathBuf};

/// File name of the simulated driver cdylib as cargo builds it.
pub const CUDA_CDYLIB: &str = "libtessera_sim_cuda.so";
/// File name of the simulated NVML cdylib as cargo builds it.
pub const NVML_CDYLIB: &str = "libtessera_sim_nvml.so";
/// A directory holding both cdylibs, overriding the search next to the executable.
pub const ENV_LIB_DIR: &str = "TESSERA_SIM_LIB_DIR";

#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error(
        "{name} not found (looked in {searched}); build it with `cargo build -p tessera-sim-cuda -p tessera-sim-nvml` or set TESSERA_SIM_LIB_DIR"
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
        for name in names {
            // A new link is renamed over the old one, so processes sharing the directory
            // never see it without the name.
            let link = dir.join(name);
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp).map_err(install)?;
            std::fs::rename(&tmp, &link).map_err(install)?;
        }
    }
    Ok(LibDir {
        dir: dir.to_path_buf(),
        cuda,
        nvml,
    })
}
