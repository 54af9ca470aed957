//! Pool and graph-memory accounting: what the driver keeps for this
//! process beyond its live allocations (a stream-ordered pool's unused
//! reserve, graph memory) is charged until the driver says it gave it
//! back, and trimmed to make room when an admission is over the limit.
//! The driver is asked through the [`PoolDriver`] the core was handed.

use std::sync::atomic::Ordering;

use tessera_ffi::cuda::{CUdevice, CUresult};

use super::governed::{Governed, PoolDriver};
use super::quota::Tries;
use crate::ledger::{GraphMem, PoolBooks, growth};
use crate::log::Level;

const CUDA_SUCCESS: CUresult = CUresult::CUDA_SUCCESS;

impl Governed {
    /// Brings pool `id`'s charge to what the driver says it has reserved.
    /// Returns `(reserved, used)`, or `None` when the driver cannot say.
    fn reconcile_pool(
        &self,
        drv: &dyn PoolDriver,
        books: &mut PoolBooks,
        id: u64,
    ) -> Option<(u64, u64)> {
        let p = books.pools.get_mut(&id)?;
        if p.destroyed {
            return None;
        }
        let (reserved, used) = drv.pool_usage(p.handle)?;
        let (dev, mut charged) = (p.dev, p.charged);
        self.settle_charge(dev, &mut charged, reserved);
        p.charged = charged;
        Some((reserved, used))
    }

    /// Brings the graph-memory charge of `device` to what the driver says
    /// it has reserved.
    fn reconcile_graph(&self, drv: &dyn PoolDriver, books: &mut PoolBooks, device: CUdevice) {
        let Some((reserved, _)) = drv.graph_usage(device) else {
            return;
        };
        let dev = self.index_of(device);
        let g = books
            .graph
            .entry(device)
            .or_insert(GraphMem { dev, charged: 0 });
        let mut charged = g.charged;
        self.settle_charge(dev, &mut charged, reserved);
        g.charged = charged;
    }

    /// Every pool's charge brought to what the driver holds (after a
    /// synchronisation, where pools give back what exceeds their release
    /// threshold, or before the memory view is shown).
    pub fn reconcile_pools(&self) {
        let Some(drv) = self.pool_driver() else {
            return;
        };
        let mut books = self.books.lock();
        self.pool_slack.store(false, Ordering::Release);
        let ids: Vec<u64> = books.pools.keys().copied().collect();
        for id in ids {
            self.reconcile_pool(drv, &mut books, id);
        }
    }

    /// Trims this process's pools and graph memory on `dev` of what they
    /// keep unused, and returns the quota. Whether anything came back.
    pub(super) fn make_room(
        &self,
        drv: &dyn PoolDriver,
        books: &mut PoolBooks,
        dev: usize,
    ) -> bool {
        // Exported memory kept for an importer may be closed by now.
        let back = self.sharing.load(Ordering::Acquire) && (self.hooks.settle_shared)(self);
        let before = books.charged_on(dev);
        for id in books.pools_on(dev) {
            if let Some(p) = books.pools.get(&id) {
                drv.pool_trim(p.handle);
            }
            self.reconcile_pool(drv, books, id);
        }
        let graphs: Vec<CUdevice> = books
            .graph
            .iter()
            .filter(|(_, g)| g.dev == Some(dev))
            .map(|(&d, _)| d)
            .collect();
        for device in graphs {
            drv.graph_trim(device);
            self.reconcile_graph(drv, books, device);
        }
        let after = books.charged_on(dev);
        if after < before {
            crate::log!(
                Level::Info,
                "device {dev}: trimmed own pools and graph memory: {} bytes back",
                before - after
            );
        }
        back || after < before
    }

    /// Admission of an allocation of `bytes` from pool `pool` on `device`:
    /// the pool is charged what it must grow by (what its unused reserve
    /// lacks), then, after the driver's call, exactly what it holds. If
    /// it grew by more than admitted and the rest does not fit, `undo(ptr)`
    /// frees the allocation again and the caller gets out-of-memory.
    /// `ptr` reads the allocation's address after a successful call.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_alloc(
        &self,
        drv: &dyn PoolDriver,
        pool: usize,
        device: CUdevice,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        ptr: impl FnOnce() -> u64,
        undo: impl FnOnce(u64),
    ) -> CUresult {
        let index = self.index_of(device);
        let mut books = self.books.lock();
        let id = books.pool(pool, index, device);
        let mut tries = Tries::default();
        let mut grow = 0;
        let mut admitted = false;
        for attempt in 0..2 {
            let charged = books.pools.get(&id).map_or(0, |p| p.charged);
            let (reserved, used) = self
                .reconcile_pool(drv, &mut books, id)
                .unwrap_or((charged, charged));
            grow = growth(reserved, used, bytes, drv.page());
            if grow == 0 {
                admitted = true;
                break;
            }
            let Some(dev) = index else { break };
            if self.try_quota(dev, grow, &mut tries).is_ok() {
                admitted = true;
                break;
            }
            if attempt == 0 && !self.make_room(drv, &mut books, dev) {
                break;
            }
        }
        if let Some(dev) = index
            && let Err(e) = tries.done(self, dev, admitted)
        {
            return e;
        }
        if !admitted {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
        let r = call();
        let Some(p) = books.pools.get_mut(&id) else {
            return r;
        };
        if r != CUDA_SUCCESS {
            self.release(index, grow);
            return r;
        }
        p.charged += grow;
        let (handle, dev, charged) = (p.handle, p.dev, p.charged);
        let addr = ptr();
        let held = drv
            .pool_usage(handle)
            .map_or(charged, |(reserved, _)| reserved);
        if held > charged {
            // Grew by more than its reserve lacked (fragmentation, the
            // driver's granularity): admit the rest, or undo.
            let fits = dev.is_some_and(|d| {
                let mut t = Tries::default();
                let ok = self.try_quota(d, held - charged, &mut t).is_ok();
                let _ = t.done(self, d, ok);
                ok
            });
            if !fits {
                undo(addr);
                drv.pool_trim(handle);
                self.reconcile_pool(drv, &mut books, id);
                return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            }
        } else if held < charged {
            self.release(dev, charged - held);
        }
        if let Some(p) = books.pools.get_mut(&id) {
            p.charged = held;
        }
        books.live.insert(addr, (id, bytes));
        r
    }

    /// A free of `ptr` if it came from a pool: `None` when it did not (the
    /// caller frees it its own way). The pool keeps the memory, charged,
    /// until the driver says it gave it back; a destroyed pool's memory
    /// returns with the free.
    pub fn pool_free(&self, ptr: u64, call: impl FnOnce() -> CUresult) -> Option<CUresult> {
        let mut books = self.books.lock();
        let (id, bytes) = books.live.remove(&ptr)?;
        let r = call();
        if r != CUDA_SUCCESS {
            books.live.insert(ptr, (id, bytes));
            return Some(r);
        }
        let destroyed = books.pools.get(&id).is_none_or(|p| p.destroyed);
        if destroyed {
            self.settle_destroyed(&mut books, id);
        } else {
            self.pool_slack.store(true, Ordering::Release);
        }
        Some(r)
    }

    /// `cuMemPoolDestroy`: the driver releases the pool's unused reserve at
    /// once; memory of live allocations stays until they are freed.
    pub fn pool_destroy(&self, pool: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let mut books = self.books.lock();
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        if let Some(id) = books.destroyed(pool) {
            self.settle_destroyed(&mut books, id);
        }
        r
    }

    /// A destroyed pool (its reserve released by the driver) stays charged
    /// for its live allocations only, and is forgotten once none is left.
    fn settle_destroyed(&self, books: &mut PoolBooks, id: u64) {
        let left = books.live_bytes(id);
        if let Some(p) = books.pools.get_mut(&id) {
            let (dev, mut charged) = (p.dev, p.charged);
            self.settle_charge(dev, &mut charged, left);
            p.charged = charged;
        }
        if left == 0 {
            books.pools.remove(&id);
        }
    }

    /// A pool operation that may release memory (`cuMemPoolTrimTo`, a
    /// lowered release threshold): the call, then the pool reconciled.
    pub fn pool_changed(&self, pool: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS
            && let Some(drv) = self.pool_driver()
        {
            let mut books = self.books.lock();
            if let Some(&id) = books.by_handle.get(&pool) {
                self.reconcile_pool(drv, &mut books, id);
            }
        }
        r
    }

    /// Whether the process has used graph memory (graph launches are then
    /// accounted).
    pub fn graph_memory_used(&self) -> bool {
        self.graph_memory.load(Ordering::Acquire)
    }

    /// A graph gained an allocation node of `bytes` on `device`.
    pub fn graph_alloc_node(&self, graph: usize, device: CUdevice, bytes: u64) {
        self.graph_memory.store(true, Ordering::Release);
        let mut books = self.books.lock();
        let list = books.graphs.entry(graph).or_default();
        crate::ledger::add_bytes(list, device, bytes);
    }

    /// `graph` copied into `to` (a clone, or an instantiation: `exec`).
    pub fn graph_copied(&self, graph: usize, to: usize, exec: bool) {
        if !self.graph_memory.load(Ordering::Acquire) {
            return;
        }
        let mut books = self.books.lock();
        let Some(bytes) = books.graphs.get(&graph).cloned() else {
            return;
        };
        if exec {
            books.execs.insert(to, crate::ledger::ExecRec { bytes });
        } else {
            books.graphs.insert(to, bytes);
        }
    }

    /// A graph or an executable graph destroyed.
    pub fn graph_gone(&self, handle: usize, exec: bool) {
        if !self.graph_memory.load(Ordering::Acquire) {
            return;
        }
        let mut books = self.books.lock();
        if exec {
            books.execs.remove(&handle);
        } else {
            books.graphs.remove(&handle);
        }
    }

    /// Launch or upload of `exec`: the memory its allocation nodes map is
    /// admitted first: what the device's graph memory would have to grow by
    /// (its live allocations plus this graph's, less what it has reserved;
    /// nothing when a freed reserve covers it, as for a graph launched
    /// again after its allocation was freed). Graphs share the reserve, so
    /// an earlier launch or upload of this graph proves nothing. After the
    /// call, the charge follows what the driver has reserved.
    pub fn graph_launch(&self, exec: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        if !self.graph_memory.load(Ordering::Acquire) {
            return call();
        }
        let Some(drv) = self.pool_driver() else {
            return call();
        };
        let mut books = self.books.lock();
        let Some(e) = books.execs.get(&exec).cloned() else {
            drop(books);
            return call();
        };
        // Admitted so far: (device, index, bytes).
        let mut admitted: Vec<(CUdevice, Option<usize>, u64)> = Vec::new();
        let undo = |books: &mut PoolBooks, admitted: &[(CUdevice, Option<usize>, u64)]| {
            for &(device, index, grow) in admitted {
                if let Some(g) = books.graph.get_mut(&device) {
                    g.charged -= grow;
                }
                self.release(index, grow);
            }
        };
        {
            for &(device, bytes) in &e.bytes {
                let index = self.index_of(device);
                // What the device's graph memory must grow by, asked again
                // after a trim (which leaves less to reuse).
                let need = |books: &mut PoolBooks| {
                    self.reconcile_graph(drv, books, device);
                    let (reserved, used) = drv.graph_usage(device).unwrap_or((0, 0));
                    growth(reserved, used, bytes, drv.page())
                };
                let mut grow = need(&mut books);
                let ok = match index {
                    _ if grow == 0 => true,
                    None => false,
                    Some(dev) => {
                        let mut t = Tries::default();
                        let mut ok = self.try_quota(dev, grow, &mut t).is_ok();
                        if !ok && self.make_room(drv, &mut books, dev) {
                            grow = need(&mut books);
                            ok = self.try_quota(dev, grow, &mut t).is_ok();
                        }
                        let _ = t.done(self, dev, ok);
                        ok
                    }
                };
                if !ok {
                    undo(&mut books, &admitted);
                    return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
                }
                let g = books.graph.entry(device).or_insert(GraphMem {
                    dev: index,
                    charged: 0,
                });
                g.charged += grow;
                admitted.push((device, index, grow));
            }
        }
        let r = call();
        if r != CUDA_SUCCESS {
            undo(&mut books, &admitted);
            return r;
        }
        for &(device, _) in &e.bytes {
            self.reconcile_graph(drv, &mut books, device);
        }
        r
    }

    /// `cuDeviceGraphMemTrim` by the program: mappings are gone, charges
    /// follow the driver.
    pub fn graph_trimmed(&self, device: CUdevice) {
        let Some(drv) = self.pool_driver() else {
            return;
        };
        let mut books = self.books.lock();
        self.reconcile_graph(drv, &mut books, device);
    }
}
