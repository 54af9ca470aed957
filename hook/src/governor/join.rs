//! Joining the allocation: the membership word (a slot and its
//! generation, packed in one atomic), the join itself (once, at `cuInit`,
//! and again in a forked child), and the one fail-closed line a process
//! prints when it cannot be governed.

use std::sync::atomic::{AtomicBool, Ordering};

use tessera_ffi::cuda::CUresult;
use tessera_shm::{Member, ProcIdentity};

use super::governed::Governed;
use crate::log::{self, Level};

static REPORTED: AtomicBool = AtomicBool::new(false);

/// The error every governed CUDA entry point returns when the process
/// fails closed: the driver was never initialised through the shim, and
/// this is what an uninitialised driver answers.
pub const CUDA_REFUSED: CUresult = CUresult::CUDA_ERROR_NOT_INITIALIZED;

/// Prints the one fail-closed line (once per process) and logs it.
pub(super) fn report(reason: &str) {
    if !REPORTED.swap(true, Ordering::AcqRel) {
        log::stderr_line(&format!("tessera: GPU access refused: {reason}"));
    }
    crate::log!(Level::Error, "GPU access refused: {reason}");
}

pub(super) fn pack(m: Member) -> u64 {
    1 << 63 | u64::from(m.generation) << 32 | m.slot as u64
}

pub(super) fn unpack(w: u64) -> Option<Member> {
    (w >> 63 == 1).then_some(Member {
        slot: (w & 0xffff_ffff) as usize,
        generation: ((w >> 32) & 0x7fff_ffff) as u32,
    })
}

impl Governed {
    pub fn member(&self) -> Option<Member> {
        unpack(self.member.load(Ordering::Acquire))
    }

    /// Joins if not joined (first use, or in a forked child).
    pub fn ensure_member(&self) -> Result<&Self, CUresult> {
        if self.member().is_some() {
            return Ok(self);
        }
        let _g = self.join_lock.lock();
        if self.member().is_some() {
            return Ok(self);
        }
        match self
            .files
            .state
            .join(&ProcIdentity::current(), &self.files.live)
        {
            Ok(m) => {
                self.member.store(pack(m), Ordering::Release);
                crate::log!(
                    Level::Debug,
                    "joined allocation {} in slot {}",
                    self.files.control.alloc_id(),
                    m.slot
                );
                (self.hooks.on_join)(self);
                Ok(self)
            }
            Err(e) => {
                report(&e.to_string());
                Err(CUDA_REFUSED)
            }
        }
    }
}
