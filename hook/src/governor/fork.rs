//! What fork and exit do to the governor: every lock is held across
//! `fork()` (so the child never inherits one that a thread of the parent,
//! absent in the child, held), the child forgets its parent's allocations
//! and joins again if it calls `cuInit`, and a process that holds nothing
//! leaves its slot at exit. `process.rs` installs the handlers and adds its
//! own lock around these.

use std::sync::atomic::Ordering;

use tessera_shm::layout::MAX_DEVICES;

use super::governed::{Contexts, Governed};
use crate::ledger::Shared;

impl Governed {
    /// At exit a process that holds nothing leaves its slot. One that still
    /// holds memory keeps it: the driver frees that memory only as the
    /// process dies, after exit handlers, and returning the quota earlier
    /// would let another process allocate it first. Its quota is reclaimed
    /// once it is gone (by the next process that joins, an allocation over
    /// the limit, or the manager).
    pub(crate) fn at_exit(&self) {
        let Some(m) = self.member() else { return };
        // Another thread mid-operation: leave the slot for reclaim.
        let Some(_j) = self.join_lock.try_lock() else {
            return;
        };
        let held: Vec<_> = self.op_locks.iter().map_while(|l| l.try_lock()).collect();
        if held.len() != MAX_DEVICES {
            return;
        }
        if self.holds_nothing(m) {
            self.files.state.leave(m);
            self.member.store(0, Ordering::Release);
        }
    }

    /// Takes every lock of the governor before `fork()`, in the order the
    /// wrappers nest them: contexts, pools, pool books, shared memory, VMM,
    /// the per-device operation locks, the ledger's shards. They stay held
    /// (their guards forgotten) until [`Governed::unlock_all`].
    pub(crate) fn lock_all(&self) {
        std::mem::forget(self.join_lock.lock());
        std::mem::forget(self.contexts.lock());
        std::mem::forget(self.pools.lock());
        std::mem::forget(self.books.lock());
        std::mem::forget(self.shared.lock());
        std::mem::forget(self.vmm.lock());
        for l in &self.op_locks {
            std::mem::forget(l.lock());
        }
        for s in self.ledger.shards() {
            std::mem::forget(s.lock());
        }
    }

    /// Releases what [`Governed::lock_all`] took.
    ///
    /// # Safety
    ///
    /// Only after `lock_all` locked every lock, in the same process.
    pub(crate) unsafe fn unlock_all(&self) {
        // SAFETY: (all below) lock_all locked each of these and forgot its
        // guard; this is the one matching unlock, with the stateless marker
        // a parking_lot acquisition carries.
        unsafe {
            for s in self.ledger.shards() {
                s.force_unlock(Default::default());
            }
            for l in &self.op_locks {
                l.force_unlock(Default::default());
            }
            self.vmm.force_unlock(Default::default());
            self.shared.force_unlock(Default::default());
            self.books.force_unlock(Default::default());
            self.pools.force_unlock(Default::default());
            self.contexts.force_unlock(Default::default());
            self.join_lock.force_unlock(Default::default());
        }
    }

    /// In the child of a `fork()`: a new process holds no allocation of its
    /// parent (CUDA state is not inherited), so it forgets them, and joins
    /// again, in a slot of its own, if it calls `cuInit` (the driver
    /// requires that too). Then every lock is released.
    ///
    /// # Safety
    ///
    /// Only in the child, on the thread that forked, after `lock_all` ran in
    /// the parent: this thread holds every lock, and the child has no other
    /// thread to race with.
    pub(crate) unsafe fn forget_parent(&self) {
        self.member.store(0, Ordering::Release);
        // SAFETY: this thread holds every lock (per the contract), so no
        // other reference to the data exists.
        unsafe {
            for s in self.ledger.shards() {
                (*s.data_ptr()).clear();
            }
            *self.contexts.data_ptr() = Contexts::default();
            (*self.pools.data_ptr()).clear();
            (*self.vmm.data_ptr()).clear();
            (*self.books.data_ptr()).clear();
            *self.shared.data_ptr() = Shared::default();
            self.unlock_all();
        }
    }
}
