//! The atomic words the gate's handshakes and the pause words are written
//! over ([`Atomic`]), so that one body of code runs on the mapped files'
//! `std` atomics and, under `--cfg loom`, on loom's, whose every
//! interleaving `shm/tests/loom_gate.rs` explores.
//!
//! The files' layout keeps `std`'s atomics whatever the cfg (their
//! `#[repr(C)]` is the ABI the hook and the manager share, and loom's
//! atomics are neither that size nor usable in a mapping), so the code is
//! generic over the word rather than a type swapped by the cfg. For `std`'s
//! atomics each method is the one `std` call of the same name, inlined:
//! the mapped files run exactly the instructions they ran before.

use std::sync::atomic::Ordering;

/// One atomic word, and the fence that orders it.
pub trait Atomic {
    type Value: Copy;
    fn load(&self, order: Ordering) -> Self::Value;
    fn store(&self, value: Self::Value, order: Ordering);
    fn swap(&self, value: Self::Value, order: Ordering) -> Self::Value;
    fn fetch_add(&self, value: Self::Value, order: Ordering) -> Self::Value;
    /// A fence of the same memory model as the word (`std`'s or loom's).
    fn fence(order: Ordering);
}

macro_rules! atomic {
    ($atomic:ty, $value:ty, $fence:path) => {
        impl Atomic for $atomic {
            type Value = $value;
            #[inline(always)]
            fn load(&self, order: Ordering) -> $value {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: $value, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: $value, order: Ordering) -> $value {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn fetch_add(&self, value: $value, order: Ordering) -> $value {
                <$atomic>::fetch_add(self, value, order)
            }
            #[inline(always)]
            fn fence(order: Ordering) {
                $fence(order)
            }
        }
    };
}

atomic!(std::sync::atomic::AtomicU32, u32, std::sync::atomic::fence);
atomic!(std::sync::atomic::AtomicU64, u64, std::sync::atomic::fence);
#[cfg(loom)]
atomic!(
    loom::sync::atomic::AtomicU32,
    u32,
    loom::sync::atomic::fence
);
#[cfg(loom)]
atomic!(
    loom::sync::atomic::AtomicU64,
    u64,
    loom::sync::atomic::fence
);
