//! Modules, functions and (CUDA 12) libraries and kernels, loaded from the simulated
//! module format of `tessera_sim::module` (plain text: `kernel <name> <duration>` lines).
//! Anything else (a real cubin, fatbin or PTX) is `CUDA_ERROR_INVALID_IMAGE`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

use tessera_ffi::cuda::*;
use tessera_sim::module::{Cost, ModuleSpec, parse_module};

use crate::registry::{Registry, handle_of};
use crate::runtime::{current, rt};
use crate::{CuResult, guard, put};

pub static MODULES: Registry<Module> = Registry::new();
pub static FUNCTIONS: Registry<Function> = Registry::new();
pub static LIBRARIES: Registry<Library> = Registry::new();

/// A function not bound to a device (a kernel of a context-independent library).
pub const ANY_DEVICE: usize = usize::MAX;

#[derive(Debug)]
pub struct Module {
    pub ctx_id: u64,
    /// Function handles by kernel name, in declaration order (set once, right after the
    /// module has its handle, which the functions record).
    pub functions: OnceLock<Vec<(String, usize)>>,
}

impl Module {
    pub fn function(&self, name: &str) -> Option<usize> {
        self.functions
            .get()?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, h)| *h)
    }
}

#[derive(Debug)]
pub struct Function {
    pub name: CString,
    pub cost: Cost,
    pub device: usize,
    pub ctx_id: u64,
    /// The handle of the module it came from (0 for library kernels).
    pub module: usize,
    pub max_dynamic_shared: AtomicI32,
}

#[derive(Debug)]
pub struct Library {
    pub functions: Vec<(String, usize)>,
}

/// Longest module text read (a text without a NUL in its first MiB is not one of ours).
const MAX_IMAGE: usize = 1 << 20;

/// Reads a NUL-terminated module text.
///
/// # Safety
/// `image` must point to readable memory up to its NUL terminator (or `MAX_IMAGE` bytes).
pub unsafe fn image_text(image: *const c_void) -> CuResult<String> {
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let p = image.cast::<u8>();
    let mut len = 0;
    // SAFETY: reading byte by byte up to the terminator, within what the caller promises.
    while len < MAX_IMAGE && unsafe { p.add(len).read() } != 0 {
        len += 1;
    }
    if len == MAX_IMAGE {
        return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: the `len` bytes before the terminator were just read.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    String::from_utf8(bytes.to_vec()).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)
}

fn parse(text: &str) -> CuResult<ModuleSpec> {
    parse_module(text).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)
}

fn register_functions(
    spec: &ModuleSpec,
    device: usize,
    ctx_id: u64,
    module: usize,
) -> Vec<(String, usize)> {
    spec.kernels
        .iter()
        .map(|(name, cost)| {
            let h = FUNCTIONS.insert(Arc::new(Function {
                name: CString::new(name.as_str()).unwrap_or_default(),
                cost: *cost,
                device,
                ctx_id,
                module,
                max_dynamic_shared: AtomicI32::new(0),
            }));
            (name.clone(), h)
        })
        .collect()
}

fn load(module: *mut CUmodule, text: CuResult<String>) -> CuResult<()> {
    rt()?;
    let ctx = current()?;
    if module.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let spec = parse(&text?)?;
    let m = Arc::new(Module {
        ctx_id: ctx.id,
        functions: OnceLock::new(),
    });
    let handle = MODULES.insert(m.clone());
    let _ = m
        .functions
        .set(register_functions(&spec, ctx.device, ctx.id, handle));
    // SAFETY: checked non-null above.
    unsafe { module.write(handle as CUmodule) };
    Ok(())
}

/// `cuModuleLoadData`: `image` is a NUL-terminated simulated module text.
///
/// # Safety
/// `module` must be null or writable; `image` null or a NUL-terminated buffer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: the caller passes a NUL-terminated image or null (rejected).
    guard(|| load(module, unsafe { image_text(image) }))
}

/// `cuModuleLoadDataEx`: JIT options are accepted and ignored (nothing is compiled).
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller passes a NUL-terminated image or null (rejected).
    guard(|| load(module, unsafe { image_text(image) }))
}

/// `cuModuleLoadFatBinary`: only simulated module texts load.
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut CUmodule,
    fatCubin: *const c_void,
) -> CUresult {
    // SAFETY: the caller passes a NUL-terminated image or null (rejected).
    guard(|| load(module, unsafe { image_text(fatCubin) }))
}

fn read_file(fname: *const c_char) -> CuResult<String> {
    if fname.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&path).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
    String::from_utf8(bytes).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)
}

/// `cuModuleLoad`: reads a simulated module text from a file.
///
/// # Safety
/// `module` must be null or writable; `fname` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard(|| load(module, read_file(fname)))
}

/// `cuModuleUnload`: its functions become invalid handles.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guard(|| {
        rt()?;
        let m = MODULES
            .remove(hmod as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for (_, f) in m.functions.get().into_iter().flatten() {
            FUNCTIONS.remove(*f);
        }
        Ok(())
    })
}

/// Unloads the modules of a destroyed context.
pub fn unload_context(ctx_id: u64) {
    for m in MODULES.remove_where(|m| m.ctx_id == ctx_id) {
        for (_, f) in m.functions.get().into_iter().flatten() {
            FUNCTIONS.remove(*f);
        }
    }
}

fn c_name<'a>(name: *const c_char) -> CuResult<std::borrow::Cow<'a, str>> {
    if name.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated name.
    Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy())
}

/// `cuModuleGetFunction`.
///
/// # Safety
/// `hfunc` must be null or writable; `name` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        rt()?;
        let m = MODULES
            .get(hmod as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let name = c_name(name)?;
        let f = m.function(&name).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(hfunc, f as CUfunction) }
    })
}

/// `cuModuleGetGlobal_v2`: simulated modules declare no globals.
///
/// # Safety
/// `name` must be null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    _dptr: *mut CUdeviceptr,
    _bytes: *mut usize,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        rt()?;
        MODULES
            .get(hmod as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        c_name(name)?;
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    })
}

/// Looks up a function (or a library kernel used as one).
#[inline]
pub fn function(h: CUfunction) -> CuResult<Arc<Function>> {
    FUNCTIONS
        .get(h as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuFuncGetAttribute`: fixed, plausible values for a small kernel.
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    hfunc: CUfunction,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(hfunc)?;
        use CUfunction_attribute as A;
        let v = match attrib {
            A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
            A::CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
            A::CU_FUNC_ATTRIBUTE_PTX_VERSION | A::CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
            A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                f.max_dynamic_shared.load(Ordering::Relaxed)
            }
            A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => 0,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, v) }
    })
}

/// `cuFuncSetAttribute`: only the dynamic shared memory limit is kept.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(
    hfunc: CUfunction,
    attrib: CUfunction_attribute,
    value: c_int,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(hfunc)?;
        use CUfunction_attribute as A;
        match attrib {
            A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                if !(0..=227 << 10).contains(&value) {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                f.max_dynamic_shared.store(value, Ordering::Relaxed);
                Ok(())
            }
            a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => Ok(()),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// `cuFuncSetCacheConfig`: accepted, no effect.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache) -> CUresult {
    guard(|| {
        rt()?;
        function(hfunc)?;
        if config.0 > 3 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

/// `cuFuncGetName`.
///
/// # Safety
/// `name` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, hfunc: CUfunction) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(hfunc)?;
        // The Function lives in the registry until its module unloads, as the driver's
        // name string does.
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(name, f.name.as_ptr()) }
    })
}

/// `cuFuncGetModule`.
///
/// # Safety
/// `hmod` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(hmod: *mut CUmodule, hfunc: CUfunction) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(hfunc)?;
        if f.module == 0 {
            return Err(CUresult::CUDA_ERROR_NOT_FOUND);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(hmod, f.module as CUmodule) }
    })
}

// ---- CUDA 12 libraries ----

fn library_load(library: *mut CUlibrary, text: CuResult<String>) -> CuResult<()> {
    rt()?;
    if library.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let spec = parse(&text?)?;
    let functions = register_functions(&spec, ANY_DEVICE, 0, 0);
    let h = LIBRARIES.insert(Arc::new(Library { functions }));
    // SAFETY: checked non-null above.
    unsafe { library.write(h as CUlibrary) };
    Ok(())
}

/// `cuLibraryLoadData`: a context-independent library of simulated kernels; its kernels
/// run on the device of the stream they are launched on.
///
/// # Safety
/// `library` must be null or writable; `code` null or a NUL-terminated module text.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    _jitOptions: *mut CUjit_option,
    _jitOptionsValues: *mut *mut c_void,
    _numJitOptions: c_uint,
    _libraryOptions: *mut CUlibraryOption,
    _libraryOptionValues: *mut *mut c_void,
    _numLibraryOptions: c_uint,
) -> CUresult {
    // SAFETY: the caller passes a NUL-terminated text or null (rejected).
    guard(|| library_load(library, unsafe { image_text(code) }))
}

/// `cuLibraryLoadFromFile`.
///
/// # Safety
/// `library` must be null or writable; `fileName` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    fileName: *const c_char,
    _jitOptions: *mut CUjit_option,
    _jitOptionsValues: *mut *mut c_void,
    _numJitOptions: c_uint,
    _libraryOptions: *mut CUlibraryOption,
    _libraryOptionValues: *mut *mut c_void,
    _numLibraryOptions: c_uint,
) -> CUresult {
    guard(|| library_load(library, read_file(fileName)))
}

/// `cuLibraryUnload`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    guard(|| {
        rt()?;
        let l = LIBRARIES
            .remove(library as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        for (_, f) in &l.functions {
            FUNCTIONS.remove(*f);
        }
        Ok(())
    })
}

/// `cuLibraryGetKernel`. A `CUkernel` may also be passed where a `CUfunction` is expected,
/// as CUDA 12 allows.
///
/// # Safety
/// `pKernel` must be null or writable; `name` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pKernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        rt()?;
        let l = LIBRARIES
            .get(library as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let name = c_name(name)?;
        let h = l
            .functions
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, h)| *h)
            .ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pKernel, h as CUkernel) }
    })
}

/// `cuKernelGetFunction`: the same handle (kernels are functions here).
///
/// # Safety
/// `pFunc` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(pFunc: *mut CUfunction, kernel: CUkernel) -> CUresult {
    guard(|| {
        rt()?;
        current()?;
        let f = function(kernel as CUfunction)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pFunc, handle_of(&f) as CUfunction) }
    })
}
