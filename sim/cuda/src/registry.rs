//! Handle tables: a driver handle (`CUstream`, `CUfunction`, ...) is the address of the
//! object it names, and is valid only while its table holds the object, so a stale or
//! made-up handle is reported as an error instead of being dereferenced.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use tessera_ffi::cuda::CUresult;

use crate::CuResult;

/// Live objects of one kind, by handle.
#[derive(Debug)]
pub struct Registry<T> {
    map: RwLock<BTreeMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Registry<T> {
    pub const fn new() -> Self {
        Registry {
            map: RwLock::new(BTreeMap::new()),
        }
    }

    /// Adds an object and returns its handle.
    pub fn insert(&self, obj: Arc<T>) -> usize {
        let handle = Arc::as_ptr(&obj) as usize;
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, obj);
        handle
    }

    #[inline]
    pub fn get(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .cloned()
    }

    /// The object a handle names; `CUDA_ERROR_INVALID_HANDLE` for a stale or made-up one.
    #[inline]
    pub fn lookup(&self, handle: usize) -> CuResult<Arc<T>> {
        self.get(handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Removes the object a handle names; `CUDA_ERROR_INVALID_HANDLE` for a stale or
    /// made-up one.
    pub fn take(&self, handle: usize) -> CuResult<Arc<T>> {
        self.remove(handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn remove(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
    }

    /// Removes and returns every object for which `pred` holds.
    pub fn remove_where(&self, pred: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let doomed: Vec<usize> = map
            .iter()
            .filter(|(_, v)| pred(v))
            .map(|(k, _)| *k)
            .collect();
        doomed.iter().filter_map(|k| map.remove(k)).collect()
    }

    pub fn all(&self) -> Vec<Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// The handle of an object held in a registry.
pub fn handle_of<T>(obj: &Arc<T>) -> usize {
    Arc::as_ptr(obj) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_valid_until_removed() {
        let r: Registry<u32> = Registry::new();
        let h = r.insert(Arc::new(5));
        assert_eq!(r.get(h).as_deref(), Some(&5));
        assert!(r.get(h + 1).is_none());
        assert_eq!(r.remove(h).as_deref(), Some(&5));
        assert!(r.get(h).is_none());
        let _a = r.insert(Arc::new(1));
        let _b = r.insert(Arc::new(2));
        assert_eq!(r.remove_where(|v| *v == 2).len(), 1);
        assert_eq!(r.all().len(), 1);
    }
}
