//! The shared-memory contract between the hook (inside containers) and the
//! manager (on the host): one *control* file and one *state* file per
//! allocation.
//!
//! - The control file holds limits (per GPU: UUID, memory limit, compute
//!   share, policy) and the arbiter's grant words. The manager writes it;
//!   containers mount it read-only, so no process can raise its own limits.
//! - The state file holds what the allocation's processes use: one slot per
//!   process and per-device reserved totals. Only that allocation's
//!   processes (and the manager) can write it.
//!
//! Both are fixed-size `#[repr(C)]` layouts of atomics ([`layout`]), with a
//! magic, ABI version and size in their headers. Every update is an atomic
//! operation; see [`state`] for how reservations stay exact when processes
//! are killed at any instruction.

pub mod atomics;
pub mod control;
pub mod gate;
pub mod layout;
mod map;
pub mod pause;
pub mod process;
pub mod protocol;
pub mod state;
pub mod sys;
pub mod testing;

use std::path::{Path, PathBuf};

pub use control::{Control, ControlSpec, DeviceSpec, Policy, create_control_file};
pub use process::{Liveness, LocalLiveness, ProcIdentity};
pub use protocol::Refused;
pub use state::{Member, ProcessInfo, Reclaimed, State, create_state_file};

/// Everything that can be wrong with a control or state file.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: truncated: {len} bytes, need {need}")]
    Truncated { path: PathBuf, len: u64, need: u64 },
    #[error("{path}: not a Tessera file (magic {found:#018x})")]
    BadMagic { path: PathBuf, found: u64 },
    #[error(
        "{path}: ABI version {found}, this build speaks {expected}: written by another \
         release of Tessera with another file layout (docs/upgrade.md)"
    )]
    AbiMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{path}: corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0}: opened read-only")]
    ReadOnly(PathBuf),
    #[error("{0}: every process slot is taken")]
    Full(PathBuf),
    #[error("invalid allocation: {0}")]
    BadSpec(String),
}

impl ShmError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ShmError::Io {
            path: path.to_owned(),
            source,
        }
    }
    pub(crate) fn corrupt(path: &Path, reason: String) -> Self {
        ShmError::Corrupt {
            path: path.to_owned(),
            reason,
        }
    }
}

/// Creates both files of an allocation: `control` and `state` in `dir`.
/// Returns their paths.
pub fn create_allocation_files(
    dir: &Path,
    spec: &ControlSpec,
) -> Result<(PathBuf, PathBuf), ShmError> {
    spec.validate()?;
    std::fs::create_dir_all(dir).map_err(|e| ShmError::io(dir, e))?;
    let control = dir.join("control");
    let state = dir.join("state");
    create_state_file(&state, &spec.alloc_id)?;
    create_control_file(&control, spec)?;
    Ok((control, state))
}

/// CRC-32 (IEEE), bitwise: it runs once per file open, where a table would
/// only cost start-up time.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}
