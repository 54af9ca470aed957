//! Memory admission: a reservation before the driver allocates, retried
//! once after this process's own pools and graph memory are trimmed of
//! what they keep unused, and the settlement of an estimate to the real
//! size.

use tessera_ffi::cuda::CUresult;

use super::governed::Governed;
use super::quota::Tries;
use crate::ledger::{Key, Rec};
use crate::log::Level;

impl Governed {
    /// Reserves `bytes` on device `index` before the driver allocates.
    /// Over the limit, the quota of dead processes is reclaimed, and this
    /// process's own pools and graph memory are trimmed of what they keep
    /// unused (a program that frees and allocates again must not see an
    /// out-of-memory a smaller GPU would not give it), and the reservation
    /// tried again. A device outside the allocation has a limit of 0.
    pub fn reserve(&self, index: Option<usize>, bytes: u64) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(dev) = index else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        let mut tries = Tries::default();
        if self.try_quota(dev, bytes, &mut tries).is_ok() {
            return tries.done(self, dev, true);
        }
        let room = match self.pool_driver() {
            Some(drv) => self.make_room(drv, &mut self.books.lock(), dev),
            None => false,
        };
        let ok = room && self.try_quota(dev, bytes, &mut tries).is_ok();
        tries.done(self, dev, ok)
    }

    /// Settles a reservation made with an estimate to the real size: gives
    /// back the surplus, or reserves the shortfall (which may be refused).
    pub fn settle(&self, index: Option<usize>, reserved: u64, real: u64) -> Result<(), CUresult> {
        if real > reserved {
            self.reserve(index, real - reserved)
        } else {
            self.release(index, reserved - real);
            Ok(())
        }
    }

    /// Records a live allocation after the driver made it, the last step of
    /// an admission (CUDA's and HIP's alike). A key the ledger still held was
    /// freed by a route the shim did not see: its quota is returned now, or
    /// it would stay charged for the life of the process.
    pub fn record(&self, key: Key, rec: Rec) {
        if let Some(old) = self.ledger.insert(key, rec) {
            crate::log!(
                Level::Warn,
                "{key:?} handed out again while recorded live ({} bytes); returning its quota",
                old.bytes
            );
            self.release(Some(old.dev), old.bytes);
        }
    }
}
