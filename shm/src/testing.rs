//! For the tests of the crates that share these files (the shim's, the
//! manager's): a slot left behind by a process that died, as a crash leaves
//! it, for reclaim and drains to find. No production path uses this.

use crate::process::{Liveness, ProcIdentity, pidns_of};

/// The identity of a process that has exited: a real child of this one,
/// reaped, in this pid namespace.
///
/// # Panics
///
/// When `true` cannot be run or waited for.
pub fn exited_process() -> ProcIdentity {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = ProcIdentity {
        pid: child.id(),
        pidns: pidns_of("self").expect("own pid namespace"),
        start_time: 1,
    };
    child.wait().expect("wait for true");
    dead
}

/// Takes every process for alive: joins [`exited_process`] into a slot as
/// though it still ran.
#[derive(Debug, Clone, Copy)]
pub struct AssumeAlive;

impl Liveness for AssumeAlive {
    fn check(&self, _: &ProcIdentity) -> Option<bool> {
        Some(true)
    }
}
