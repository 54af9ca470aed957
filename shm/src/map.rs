//! A shared file mapping that hands out a typed reference to its contents
//! only after the file was checked to be at least that large.

use std::fs::File;
use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::path::Path;
use std::ptr::NonNull;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use crate::ShmError;

/// A `MAP_SHARED` mapping of a whole file, viewed as a `T`.
///
/// `T` must be a `#[repr(C)]` type whose every field is either an atomic or
/// plain data that no one writes after the file is published, so that
/// shared `&T` access from many processes is sound.
#[derive(Debug)]
pub struct Mapping<T> {
    ptr: NonNull<T>,
    len: usize,
    writable: bool,
    _t: PhantomData<T>,
}

// SAFETY: the mapped memory is shared between processes anyway; within one
// process every field of the mapped types is an atomic or immutable data, so
// sharing `&T` across threads adds nothing a second process could not do.
unsafe impl<T: Sync> Send for Mapping<T> {}
// SAFETY: as for Send.
unsafe impl<T: Sync> Sync for Mapping<T> {}

impl<T> Mapping<T> {
    /// Maps `file`, which must hold at least `size_of::<T>()` bytes.
    pub fn new(file: &File, path: &Path, writable: bool) -> Result<Self, ShmError> {
        let need = std::mem::size_of::<T>();
        let len = file.metadata().map_err(|e| ShmError::io(path, e))?.len();
        if len < need as u64 {
            return Err(ShmError::Truncated {
                path: path.to_owned(),
                len,
                need: need as u64,
            });
        }
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        let length = NonZeroUsize::new(need).expect("mapped types are not zero-sized");
        // SAFETY: we map a fresh region (no fixed address) of a file we
        // checked is large enough; the mapping is released only in Drop.
        let raw = unsafe { mmap(None, length, prot, MapFlags::MAP_SHARED, file, 0) }
            .map_err(|e| ShmError::io(path, std::io::Error::from(e)))?;
        Ok(Mapping {
            ptr: raw.cast(),
            len: need,
            writable,
            _t: PhantomData,
        })
    }

    /// Whether this mapping may be written through.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl<T> std::ops::Deref for Mapping<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping is page aligned, at least size_of::<T>() long
        // and lives as long as self; T's fields are atomics or immutable
        // data (see the type's contract), so shared references are sound.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for Mapping<T> {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned, unmapped once.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}
