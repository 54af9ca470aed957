//! The allocation's two files, open: the control file (limits, written by
//! the manager, read-only here) and this process's view of the state file.

use tessera_shm::{Control, LocalLiveness, ShmError, State};

use crate::config::AllocFiles;
use crate::devices::same_uuid;

/// The allocation's two files, open.
#[derive(Debug)]
pub struct Files {
    pub control: Control,
    pub state: State,
    pub live: LocalLiveness,
}

impl Files {
    /// Opens and checks both files; the error is the line to print.
    pub fn open(a: &AllocFiles) -> Result<Files, ShmError> {
        crate::config::check_regular(a)?;
        let control = Control::open(&a.control)?;
        let state = State::open(&a.state, control.alloc_id())?;
        Ok(Files {
            control,
            state,
            live: LocalLiveness::quick(),
        })
    }

    /// The control-file index of the device with this UUID.
    pub fn find_uuid(&self, uuid: &str) -> Option<usize> {
        (0..self.control.n_devices()).find(|&i| same_uuid(self.control.uuid(i), uuid))
    }

    /// What a device looks like from inside the allocation: the memory
    /// total (the limit, or the physical size if smaller) and what the
    /// allocation's processes have reserved. A device outside the
    /// allocation has a total of 0.
    pub fn view(&self, index: Option<usize>, physical_total: u64) -> (u64, u64) {
        match index {
            Some(i) => (
                self.control.memory_limit(i).min(physical_total),
                self.state.reserved(i),
            ),
            None => (0, 0),
        }
    }
}
