//! The compute gate's call site: every work-submission wrapper
//! (`cuLaunchKernel*`, `cuLaunchCooperativeKernel*`, `cuGraphLaunch*`,
//! the legacy `cuLaunch*`) calls [`before_submit`] before the driver sees
//! the work, in a governed process that has joined its allocation.
//!
//! Compute gating arrives with issue 4: until then this admits everything.
//! The hot path must stay one atomic load when the grant is held: no
//! locks, no system calls, no logging.

use tessera_ffi::cuda::{CUresult, CUstream};

use crate::governor::Governed;

/// Decides whether work for `stream` may be submitted now (waiting for the
/// allocation's grant if need be). `Err(code)` makes the wrapper return
/// `code` without submitting. `gov.device_of_stream(stream)` names the
/// allocation's device the work runs on.
#[inline(always)]
pub fn before_submit(gov: &Governed, stream: CUstream) -> Result<(), CUresult> {
    let _ = (gov, stream);
    Ok(())
}

/// Called once a process has joined its allocation (at `cuInit`, and again
/// in a forked child), before its first submission.
pub fn on_join(gov: &Governed) {
    let _ = gov;
}
