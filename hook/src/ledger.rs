//! What this process holds: each live allocation (device pointer, array,
//! VMM handle) with the device and bytes it was charged, so a free returns
//! exactly what its allocation reserved, and a destroyed context returns
//! what the driver freed with it.
//!
//! Alloc and free are not the launch path, but they are frequent: the map is
//! split into shards behind uncontended `parking_lot` locks, hashed with a
//! multiply (device pointers are aligned, so their low bits say nothing).

use std::collections::HashMap;
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
    /// A `CUmemGenericAllocationHandle` (`cuMemCreate`).
    Vmm(u64),
}

impl Key {
    fn raw(self) -> u64 {
        match self {
            Key::Ptr(v) | Key::Vmm(v) => v,
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
    /// that outlives contexts (VMM handles, pools).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_kinds_do_not_collide() {
        let l = Ledger::new();
        let r = |dev, bytes| Rec { dev, bytes, ctx: 7 };
        assert_eq!(l.insert(Key::Ptr(0x1000), r(0, 10)), None);
        assert_eq!(l.insert(Key::Vmm(0x1000), r(1, 20)), None);
        assert_eq!(l.held(0), (10, 1));
        assert_eq!(l.remove(Key::Ptr(0x1000)), Some(r(0, 10)));
        assert_eq!(
            l.remove(Key::Ptr(0x1000)),
            None,
            "a double free finds nothing"
        );
        assert_eq!(l.remove(Key::Vmm(0x1000)), Some(r(1, 20)));
        assert_eq!(l.insert(Key::Array(5), r(0, 1)), None);
        assert_eq!(l.insert(Key::Array(5), r(0, 2)), Some(r(0, 1)));
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
}
