//! What this process holds: each live allocation (device pointer, array)
//! with the device and bytes it was charged, so a free returns exactly what
//! its allocation reserved, and a destroyed context returns what the driver
//! freed with it; and each VMM physical allocation with its references and
//! mappings ([`Vmm`]), since the driver frees it only when both are gone;
//! and the memory the driver keeps for the process beyond its live
//! allocations, stream-ordered pools and graph memory ([`PoolBooks`]).
//!
//! Alloc and free are not the launch path, but they are frequent: the map is
//! split into shards behind uncontended `parking_lot` locks, hashed with a
//! multiply (device pointers are aligned, so their low bits say nothing).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use parking_lot::Mutex;

/// What an allocation is known by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// A device pointer (`cuMemAlloc*`, pools, managed memory).
    Ptr(u64),
    /// A `CUarray`.
    Array(usize),
    /// A `CUmipmappedArray`.
    Mipmapped(usize),
}

impl Key {
    fn raw(self) -> u64 {
        match self {
            Key::Ptr(v) => v,
            Key::Array(v) | Key::Mipmapped(v) => v as u64,
        }
    }
}

/// What an allocation was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rec {
    /// The allocation's device index (control-file order).
    pub dev: usize,
    pub bytes: u64,
    /// The context that owns it and frees it when destroyed; 0 for memory
    /// that outlives contexts (pools).
    pub ctx: usize,
}

/// A multiplicative hasher: keys are single words.
#[derive(Default)]
pub struct WordHasher(u64);

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Map = HashMap<Key, Rec, BuildHasherDefault<WordHasher>>;

const SHARDS: usize = 16;

/// The process's live allocations.
#[derive(Debug, Default)]
pub struct Ledger {
    shards: [Mutex<Map>; SHARDS],
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    fn shard(&self, key: Key) -> &Mutex<Map> {
        let mut h = WordHasher::default();
        key.raw().hash(&mut h);
        &self.shards[(h.finish() >> 60) as usize % SHARDS]
    }

    /// Records a live allocation. Returns the record it replaced: the driver
    /// handed out a key the ledger still held, so that one was freed by a
    /// route the hook did not see.
    pub fn insert(&self, key: Key, rec: Rec) -> Option<Rec> {
        self.shard(key).lock().insert(key, rec)
    }

    /// Forgets an allocation, returning what it was charged.
    pub fn remove(&self, key: Key) -> Option<Rec> {
        self.shard(key).lock().remove(&key)
    }

    /// Forgets every allocation owned by context `ctx` (the driver freed
    /// them with it).
    pub fn drain_context(&self, ctx: usize) -> Vec<Rec> {
        let mut out = Vec::new();
        for s in &self.shards {
            s.lock().retain(|_, r| {
                if r.ctx == ctx {
                    out.push(*r);
                    false
                } else {
                    true
                }
            });
        }
        out
    }

    /// Bytes held on `dev`, and number of allocations.
    pub fn held(&self, dev: usize) -> (u64, usize) {
        self.shards.iter().fold((0, 0), |(b, n), s| {
            s.lock()
                .values()
                .filter(|r| r.dev == dev)
                .fold((b, n), |(b, n), r| (b + r.bytes, n + 1))
        })
    }

    /// The shards, for the fork handlers, which must hold every lock
    /// across `fork()`.
    pub(crate) fn shards(&self) -> &[Mutex<Map>] {
        &self.shards
    }
}

/// A physical allocation made with `cuMemCreate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmHandle {
    /// The handle the driver gave.
    pub handle: u64,
    /// The allocation's device index.
    pub dev: usize,
    pub bytes: u64,
    /// Handle references: 1 at creation, one more per
    /// `cuMemRetainAllocationHandle`, one less per `cuMemRelease`.
    pub refs: u32,
    /// Live mappings of it (`cuMemMap` less `cuMemUnmap`).
    pub mappings: u32,
}

/// VMM bookkeeping. The driver frees a physical allocation when its last
/// handle reference is released *and* its last mapping unmapped, in either
/// order (creating, mapping and releasing the handle at once, then freeing
/// by unmapping, is the usual pattern); its quota returns then, not before.
#[derive(Debug, Default)]
pub struct Vmm {
    handles: HashMap<u64, VmmHandle>,
    /// Mapped ranges by start address: (size, handle).
    maps: BTreeMap<u64, (u64, u64)>,
    /// Sparse or deferred-mapping array regions mapped onto a handle
    /// (`cuMemMapArrayAsync`): region → handle.
    array_maps: HashMap<ArrayRegion, u64>,
}

/// One region of a sparse or deferred-mapping array that
/// `cuMemMapArrayAsync` maps: the array (or mipmapped array), and the
/// subresource's words (type, level, layer, offsets, extents) as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArrayRegion {
    pub array: usize,
    pub sub: [u64; 8],
}

impl Vmm {
    /// A new physical allocation, charged `bytes` on `dev`.
    pub fn created(&mut self, handle: u64, dev: usize, bytes: u64) -> Option<VmmHandle> {
        self.handles.insert(
            handle,
            VmmHandle {
                handle,
                dev,
                bytes,
                refs: 1,
                mappings: 0,
            },
        )
    }

    /// One more handle reference.
    pub fn retained(&mut self, handle: u64) {
        if let Some(h) = self.handles.get_mut(&handle) {
            h.refs += 1;
        }
    }

    /// A handle reference released: the allocation if the driver freed it.
    pub fn released(&mut self, handle: u64) -> Option<VmmHandle> {
        let h = self.handles.get_mut(&handle)?;
        h.refs = h.refs.saturating_sub(1);
        self.freed(handle)
    }

    /// `[ptr, ptr + size)` mapped onto `handle` (one of ours or not).
    pub fn mapped(&mut self, ptr: u64, size: u64, handle: u64) {
        if let Some(h) = self.handles.get_mut(&handle) {
            h.mappings += 1;
            self.maps.insert(ptr, (size, handle));
        }
    }

    /// Every mapping starting in `[ptr, ptr + size)` unmapped: the
    /// allocations the driver freed with them.
    pub fn unmapped(&mut self, ptr: u64, size: u64) -> Vec<VmmHandle> {
        let end = ptr.saturating_add(size);
        let gone: Vec<(u64, u64)> = self
            .maps
            .range(ptr..end)
            .map(|(&start, &(_, handle))| (start, handle))
            .collect();
        let mut freed = Vec::new();
        for (start, handle) in gone {
            self.maps.remove(&start);
            if let Some(h) = self.handles.get_mut(&handle) {
                h.mappings = h.mappings.saturating_sub(1);
            }
            freed.extend(self.freed(handle));
        }
        freed
    }

    /// An array region mapped onto `handle`: one more mapping that keeps
    /// the physical allocation alive. A region mapped again first drops
    /// its previous mapping (what the driver does); that may free one.
    pub fn array_mapped(&mut self, region: ArrayRegion, handle: u64) -> Option<VmmHandle> {
        let freed = self.array_unmapped(region);
        if let Some(h) = self.handles.get_mut(&handle) {
            h.mappings += 1;
            self.array_maps.insert(region, handle);
        }
        freed
    }

    /// An array region unmapped: the allocation the driver freed with it.
    pub fn array_unmapped(&mut self, region: ArrayRegion) -> Option<VmmHandle> {
        let handle = self.array_maps.remove(&region)?;
        let h = self.handles.get_mut(&handle)?;
        h.mappings = h.mappings.saturating_sub(1);
        self.freed(handle)
    }

    /// An array destroyed: every region of it is unmapped.
    pub fn array_destroyed(&mut self, array: usize) -> Vec<VmmHandle> {
        let regions: Vec<ArrayRegion> = self
            .array_maps
            .keys()
            .filter(|r| r.array == array)
            .copied()
            .collect();
        regions
            .into_iter()
            .filter_map(|r| self.array_unmapped(r))
            .collect()
    }

    fn freed(&mut self, handle: u64) -> Option<VmmHandle> {
        match self.handles.get(&handle) {
            Some(h) if h.refs == 0 && h.mappings == 0 => self.handles.remove(&handle),
            _ => None,
        }
    }

    /// Forgets everything (a forked child holds none of it).
    pub fn clear(&mut self) {
        self.handles.clear();
        self.maps.clear();
        self.array_maps.clear();
    }
}

/// An allocation shared with other processes, as this process knows it: a
/// device pointer (IPC) or a VMM handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharedKey {
    Ptr(u64),
    Vmm(u64),
}

/// Memory shared between processes of the allocation (see cuda/ipc.rs).
#[derive(Debug, Default)]
pub struct Shared {
    /// What this process exported, with its identity in the exports list.
    pub exported: HashMap<SharedKey, String>,
    /// What this process imported, with the identity it was exported as.
    pub imported: HashMap<SharedKey, String>,
    /// Exported memory this process freed while an importer still had it
    /// open (the driver keeps the pages): (identity, device index, bytes),
    /// charged until the importers close it.
    pub deferred: Vec<(String, usize, u64)>,
}

/// A memory pool's charge: the bytes the allocation was charged for what the
/// pool has taken from the device, live allocations and retained reserve
/// alike. Kept at least what the driver says the pool has reserved
/// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`) after every operation the shim
/// sees, and brought down to it whenever the shim asks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRec {
    /// The pool's handle while the program may still use it.
    pub handle: usize,
    /// The allocation's index of the pool's device (`None`: a device
    /// outside the allocation, whose limit is 0).
    pub dev: Option<usize>,
    /// The pool's device as the driver numbers it.
    pub device: i32,
    /// Bytes charged.
    pub charged: u64,
    /// Destroyed while allocations from it lived: the driver keeps their
    /// memory until each is freed, and `charged` is theirs.
    pub destroyed: bool,
}

/// A device's graph memory (the memory graph allocation nodes use), charged
/// like a pool: at least the driver's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphMem {
    pub dev: Option<usize>,
    pub charged: u64,
}

/// An instantiated graph whose allocation nodes take memory when launched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecRec {
    /// Bytes of its allocation nodes per device (`CUdevice`).
    pub bytes: Vec<(i32, u64)>,
}

/// Memory the driver keeps for the process beyond what a free returns at
/// once: stream-ordered pools and graph memory. Pools are known by an id of
/// the shim's own (a destroyed pool's handle may be handed out again while
/// its allocations live on).
#[derive(Debug, Default)]
pub struct PoolBooks {
    pub pools: HashMap<u64, PoolRec>,
    /// Live pool handle → pool id.
    pub by_handle: HashMap<usize, u64>,
    next_id: u64,
    /// Live allocations from pools: pointer → (pool id, bytes).
    pub live: HashMap<u64, (u64, u64)>,
    /// Graph memory per device (`CUdevice`).
    pub graph: HashMap<i32, GraphMem>,
    /// Graphs with allocation nodes: graph handle → bytes per device.
    pub graphs: HashMap<usize, Vec<(i32, u64)>>,
    /// Instantiated graphs with allocation nodes.
    pub execs: HashMap<usize, ExecRec>,
}

/// How much a pool must take from the device to hand out `bytes` more: what
/// its unused reserve lacks, in whole `page`s (the device's page, see
/// sizes.rs: charged up to it before the call; the charge settles to what
/// the driver reports after it).
pub fn growth(reserved: u64, used: u64, bytes: u64, page: u64) -> u64 {
    used.saturating_add(bytes)
        .checked_next_multiple_of(page.max(1))
        .unwrap_or(u64::MAX)
        .saturating_sub(reserved)
}

/// Adds `bytes` on `device` to a per-device list.
pub fn add_bytes(list: &mut Vec<(i32, u64)>, device: i32, bytes: u64) {
    match list.iter_mut().find(|(d, _)| *d == device) {
        Some((_, b)) => *b = b.saturating_add(bytes),
        None => list.push((device, bytes)),
    }
}

impl PoolBooks {
    /// The id of the live pool `handle`, registering it on first sight.
    pub fn pool(&mut self, handle: usize, dev: Option<usize>, device: i32) -> u64 {
        if let Some(&id) = self.by_handle.get(&handle) {
            return id;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.by_handle.insert(handle, id);
        self.pools.insert(
            id,
            PoolRec {
                handle,
                dev,
                device,
                charged: 0,
                destroyed: false,
            },
        );
        id
    }

    /// Bytes of live allocations from pool `id`.
    pub fn live_bytes(&self, id: u64) -> u64 {
        self.live
            .values()
            .filter(|(p, _)| *p == id)
            .map(|(_, b)| b)
            .sum()
    }

    /// The program destroyed pool `handle`: it is no longer reachable by
    /// its handle. Returns its id.
    pub fn destroyed(&mut self, handle: usize) -> Option<u64> {
        let id = self.by_handle.remove(&handle)?;
        if let Some(p) = self.pools.get_mut(&id) {
            p.destroyed = true;
        }
        Some(id)
    }

    /// The live pools on device index `dev`.
    pub fn pools_on(&self, dev: usize) -> Vec<u64> {
        self.pools
            .iter()
            .filter(|(_, p)| p.dev == Some(dev) && !p.destroyed)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Every charge of this process on device index `dev`: pools and graph
    /// memory.
    pub fn charged_on(&self, dev: usize) -> u64 {
        let pools: u64 = self
            .pools
            .values()
            .filter(|p| p.dev == Some(dev))
            .map(|p| p.charged)
            .sum();
        let graph: u64 = self
            .graph
            .values()
            .filter(|g| g.dev == Some(dev))
            .map(|g| g.charged)
            .sum();
        pools + graph
    }

    /// Forgets everything (a forked child holds none of it).
    pub fn clear(&mut self) {
        *self = PoolBooks::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_kinds_do_not_collide() {
        let l = Ledger::new();
        let r = |dev, bytes| Rec { dev, bytes, ctx: 7 };
        assert_eq!(l.insert(Key::Ptr(0x1000), r(0, 10)), None);
        assert_eq!(l.insert(Key::Array(0x1000), r(1, 20)), None);
        assert_eq!(l.held(0), (10, 1));
        assert_eq!(l.remove(Key::Ptr(0x1000)), Some(r(0, 10)));
        assert_eq!(
            l.remove(Key::Ptr(0x1000)),
            None,
            "a double free finds nothing"
        );
        assert_eq!(l.remove(Key::Array(0x1000)), Some(r(1, 20)));
        assert_eq!(l.insert(Key::Mipmapped(5), r(0, 1)), None);
        assert_eq!(l.insert(Key::Mipmapped(5), r(0, 2)), Some(r(0, 1)));
    }

    #[test]
    fn draining_a_context_takes_only_its_allocations() {
        let l = Ledger::new();
        for i in 0..100u64 {
            let ctx = if i % 3 == 0 { 1 } else { 2 };
            l.insert(
                Key::Ptr(i << 9),
                Rec {
                    dev: 0,
                    bytes: i,
                    ctx,
                },
            );
        }
        let drained = l.drain_context(1);
        assert_eq!(drained.len(), 34);
        assert_eq!(
            drained.iter().map(|r| r.bytes).sum::<u64>(),
            (0..100).filter(|i| i % 3 == 0).sum::<u64>()
        );
        assert_eq!(l.held(0).1, 66);
        assert!(l.drain_context(1).is_empty());
    }

    #[test]
    fn vmm_memory_is_freed_when_released_and_unmapped_in_either_order() {
        let mut v = Vmm::default();
        // Release first, unmap last (the usual pattern).
        v.created(1, 0, 100);
        v.mapped(0x10_0000, 100, 1);
        assert_eq!(v.released(1), None, "still mapped");
        let freed = v.unmapped(0x10_0000, 100);
        assert_eq!(freed.len(), 1);
        assert_eq!((freed[0].dev, freed[0].bytes), (0, 100));
        // Unmap first, release last.
        v.created(2, 1, 200);
        v.mapped(0x20_0000, 200, 2);
        assert!(v.unmapped(0x20_0000, 200).is_empty(), "handle still held");
        assert_eq!(v.released(2).map(|h| h.bytes), Some(200));
        // Two mappings and a retained reference.
        v.created(3, 0, 300);
        v.mapped(0x30_0000, 150, 3);
        v.mapped(0x30_0000 + 150, 150, 3);
        v.retained(3);
        assert_eq!(v.released(3), None);
        assert_eq!(v.released(3), None);
        assert!(v.unmapped(0x30_0000, 150).is_empty());
        // One unmap over a range covering the rest.
        assert_eq!(v.unmapped(0x30_0000, 300).len(), 1);
        // Unknown handles and ranges change nothing.
        assert_eq!(v.released(99), None);
        v.mapped(0x40_0000, 10, 99);
        assert!(v.unmapped(0, u64::MAX).is_empty());
        assert!(v.handles.is_empty() && v.maps.is_empty());
    }

    #[test]
    fn array_mappings_keep_a_released_handle_alive_until_unmapped_or_destroyed() {
        let mut v = Vmm::default();
        let region = |array, level| ArrayRegion {
            array,
            sub: [1, level, 0, 0, 0, 0, 0, 0],
        };
        v.created(1, 0, 2 << 20);
        assert_eq!(v.array_mapped(region(0xa, 0), 1), None);
        assert_eq!(v.array_mapped(region(0xa, 1), 1), None);
        assert_eq!(v.released(1), None, "still backs two regions");
        assert_eq!(v.array_unmapped(region(0xa, 0)), None);
        assert_eq!(v.array_unmapped(region(0xa, 0)), None, "unmapped once");
        let freed = v.array_destroyed(0xa);
        assert_eq!(freed.len(), 1);
        assert_eq!(freed[0].bytes, 2 << 20);
        // Mapping a region again replaces its mapping.
        v.created(2, 0, 10);
        v.created(3, 0, 20);
        v.array_mapped(region(0xb, 0), 2);
        v.released(2);
        let gone = v.array_mapped(region(0xb, 0), 3);
        assert_eq!(gone.map(|h| h.bytes), Some(10));
        // Mapping an unknown handle (not ours) changes nothing.
        assert_eq!(v.array_mapped(region(0xc, 0), 99), None);
        assert!(v.array_destroyed(0xc).is_empty());
    }

    #[test]
    fn a_pool_grows_only_by_the_pages_its_reserve_lacks() {
        const P: u64 = crate::sizes::DEVICE_PAGE;
        assert_eq!(growth(0, 0, 100, P), P, "a whole page, not the bytes asked");
        assert_eq!(growth(P, 0, 768, P), 0, "a freed reserve is reused");
        assert_eq!(growth(P, 500, P, P), P, "one page more covers the rest");
        assert_eq!(growth(2 * P, 500, P, P), 0);
        assert_eq!(growth(P, P, 0, P), 0);
        assert_eq!(growth(u64::MAX, 0, u64::MAX, P), 0);
        // In bytes (a driver that holds exactly what it hands out).
        assert_eq!(growth(768, 500, 768, 1), 500);
        assert_eq!(growth(0, 0, 0, 0), 0);
    }

    #[test]
    fn pools_are_known_by_id_even_when_a_handle_comes_back() {
        let mut b = PoolBooks::default();
        let a = b.pool(0x10, Some(0), 0);
        assert_eq!(b.pool(0x10, Some(0), 0), a, "same live handle, same pool");
        b.live.insert(0x1000, (a, 64));
        b.pools.get_mut(&a).unwrap().charged = 64;
        assert_eq!(b.destroyed(0x10), Some(a));
        assert_eq!(b.destroyed(0x10), None);
        // The driver hands the same handle out for a new pool.
        let c = b.pool(0x10, Some(1), 1);
        assert_ne!(a, c);
        assert_eq!(b.live_bytes(a), 64);
        assert_eq!(b.live_bytes(c), 0);
        assert_eq!(
            b.pools_on(0),
            Vec::<u64>::new(),
            "destroyed pools are not trimmed"
        );
        assert_eq!(b.pools_on(1), vec![c]);
        b.graph.insert(
            0,
            GraphMem {
                dev: Some(0),
                charged: 10,
            },
        );
        assert_eq!(b.charged_on(0), 74);
        let mut l = Vec::new();
        add_bytes(&mut l, 0, 5);
        add_bytes(&mut l, 1, 7);
        add_bytes(&mut l, 0, 5);
        assert_eq!(l, vec![(0, 10), (1, 7)]);
    }
}
