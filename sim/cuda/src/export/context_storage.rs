//! `CONTEXT_LOCAL_STORAGE_INTERFACE_V0301` (`c693336e-1121-df11-a8c3-68f355d89593`): a
//! key/value store per context, where the runtime keeps its per-context state. This table
//! has no size slot: slot 0 is already a function.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | `put(CUcontext, void *key, void *value, dtor)` | stores the value (NULL context: the current one) |
//! | 1 | `delete(CUcontext, void *key)` | removes it |
//! | 2 | `get(void **value, CUcontext, void *key)` | the value, or `CUDA_ERROR_INVALID_HANDLE` when none |
//! | 3 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |
//!
//! Values are kept per context *id*, never per handle, so a context created later at a
//! recycled handle starts empty. The destructor callback is not called when a context is
//! destroyed (the runtime's state for it is then simply dropped).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use tessera_ffi::cuda::{CUcontext, CUresult};

use super::{Slots, guid, stub};
use crate::{CuResult, guard};

pub const GUID: [u8; 16] = guid("c693336e-1121-df11-a8c3-68f355d89593");
const T: usize = 3;

pub static TABLE: Slots<4> = Slots([
    put as *const c_void,
    delete as *const c_void,
    get as *const c_void,
    stub::<T, 3>(),
]);

type Dtor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

/// (context id, key) → value. Addresses are stored as integers: they belong to the caller.
static STORE: Mutex<Option<HashMap<(u64, usize), usize>>> = Mutex::new(None);

/// The id of `ctx`, or of the current context when `ctx` is NULL.
fn context_id(ctx: CUcontext) -> CuResult<u64> {
    let ctx = if ctx.is_null() {
        let mut cur: CUcontext = std::ptr::null_mut();
        // SAFETY: a local out pointer.
        let rc = unsafe { crate::context::cuCtxGetCurrent(&mut cur) };
        if rc != CUresult::CUDA_SUCCESS {
            return Err(rc);
        }
        if cur.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        cur
    } else {
        ctx
    };
    Ok(crate::context::lookup(ctx)?.id)
}

fn with_store<R>(f: impl FnOnce(&mut HashMap<(u64, usize), usize>) -> R) -> R {
    let mut s = STORE.lock().unwrap_or_else(|e| e.into_inner());
    f(s.get_or_insert_with(HashMap::new))
}

unsafe extern "C" fn put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    _dtor: Dtor,
) -> CUresult {
    guard(|| {
        let id = context_id(ctx)?;
        with_store(|s| s.insert((id, key as usize), value as usize));
        Ok(())
    })
}

unsafe extern "C" fn delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        let id = context_id(ctx)?;
        with_store(|s| s.remove(&(id, key as usize)));
        Ok(())
    })
}

unsafe extern "C" fn get(value: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = context_id(ctx)?;
        let v = with_store(|s| s.get(&(id, key as usize)).copied())
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { value.write(v as *mut c_void) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_registered_under_its_index() {
        assert_eq!(super::super::TABLES[T].guid, GUID);
    }

    #[test]
    fn unknown_context_is_an_error() {
        let mut v: *mut c_void = std::ptr::null_mut();
        // SAFETY: a bogus handle is looked up, never dereferenced.
        unsafe {
            assert_ne!(
                put(
                    0x1234 as CUcontext,
                    0x10 as *mut c_void,
                    2 as *mut c_void,
                    None
                ),
                CUresult::CUDA_SUCCESS
            );
            assert_ne!(
                get(&mut v, 0x1234 as CUcontext, 0x10 as *mut c_void),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                get(
                    std::ptr::null_mut(),
                    0x1234 as CUcontext,
                    0x10 as *mut c_void
                ),
                CUresult::CUDA_ERROR_INVALID_VALUE
            );
        }
    }
}
