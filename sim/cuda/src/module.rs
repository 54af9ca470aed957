//! Modules, functions and (CUDA 12) libraries and kernels: handles over the code
//! [`crate::image`] read and parsed. Their attributes and occupancy are
//! [`crate::occupancy`]'s.
//!
//! Globals get real device memory (charged to the device) when first looked up, holding
//! their initial values, so a program can copy to and from them.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_uint, c_void};
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex};

use tessera_ffi::cuda::*;
use tessera_sim::image::Global;
use tessera_sim::module::Cost;

use crate::image::{Code, KernelSpec, Raw, code_of, log, read_file, read_image};
use crate::registry::{Registry, handle_of};
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, guard, put, put_opt};

pub static MODULES: Registry<Module> = Registry::new();
pub static FUNCTIONS: Registry<Function> = Registry::new();
pub static LIBRARIES: Registry<Library> = Registry::new();

/// A function not bound to a device (a kernel of a context-independent library).
pub const ANY_DEVICE: usize = usize::MAX;

/// The device's compute capability as `major * 10 + minor`.
pub(crate) fn arch_of(rt: &Runtime, device: usize) -> u32 {
    rt.node
        .device_info(device as u32)
        .map(|i| i.cc_major * 10 + i.cc_minor)
        .unwrap_or(90)
}

/// `CUDA_ERROR_NOT_FOUND` for a name an image lacks, with its line (a framework that asks
/// for a kernel its image does not have is worth knowing about).
fn not_found(what: &str, name: &str) -> CUresult {
    log(
        "not found",
        format_args!("no {what} {name:?} in the module"),
    );
    CUresult::CUDA_ERROR_NOT_FOUND
}

#[derive(Debug)]
pub struct Module {
    pub ctx_id: u64,
    pub device: usize,
    pub code: Arc<Code>,
    /// Function handles made so far.
    functions: Made,
    /// The globals' device memory (base, name → address and size), once looked up.
    globals: Mutex<Option<Globals>>,
}

#[derive(Debug)]
struct Globals {
    base: Option<u64>,
    at: HashMap<String, (u64, u64)>,
}

impl Module {
    fn new(ctx_id: u64, device: usize, code: Arc<Code>) -> Module {
        Module {
            ctx_id,
            device,
            code,
            functions: Made::default(),
            globals: Mutex::new(None),
        }
    }

    /// The function handle of a kernel, made on first request.
    pub fn function(&self, name: &str, self_handle: usize) -> CuResult<usize> {
        self.functions.get_or_make(&self.code, name, |spec| {
            new_function(spec, self.device, self.ctx_id, self_handle, 0)
        })
    }

    /// A global's device address and size, allocating every global of the module the
    /// first time.
    fn global(&self, rt: &Runtime, name: &str) -> CuResult<(u64, u64)> {
        let contents = self.code.contents()?;
        let mut g = self.globals.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(allocate_globals(rt, self.ctx_id, &contents.globals)?);
        }
        g.as_ref()
            .and_then(|g| g.at.get(name).copied())
            .ok_or_else(|| not_found("global", name))
    }

    /// Drops the module's functions and, with `rt`, frees its globals (`None` when its
    /// context is gone: the context freed them, and the address may already be another
    /// allocation's).
    fn release(&self, rt: Option<&Runtime>) {
        self.functions.remove_all();
        let globals = self
            .globals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let (Some(rt), Some(Globals { base: Some(b), .. })) = (rt, globals) {
            // An error means the program freed it itself (cuMemFree): nothing left to do.
            let _ = crate::memory::free_device(rt, b);
        }
    }
}

/// One block of device memory for all of a module's globals, 256-byte aligned each,
/// holding their initial values.
fn allocate_globals(rt: &Runtime, ctx_id: u64, globals: &[Global]) -> CuResult<Globals> {
    let mut at = HashMap::new();
    let mut offset = 0u64;
    let mut places = Vec::with_capacity(globals.len());
    for g in globals {
        places.push(offset);
        offset = offset
            .checked_add(g.size.div_ceil(256) * 256)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    }
    if offset == 0 {
        return Ok(Globals { base: None, at });
    }
    let ctx = crate::context::CONTEXTS
        .all()
        .into_iter()
        .find(|c| c.id == ctx_id)
        .ok_or(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
    let base = crate::memory::alloc_device(rt, &ctx, offset, crate::memory::Kind::Plain, offset)?;
    for (g, off) in globals.iter().zip(places) {
        let addr = base + off;
        if !g.init.is_empty() {
            // SAFETY: `addr..addr + init.len()` lies inside the allocation just made
            // (init is at most the global's size), which is mapped read-write.
            unsafe {
                std::ptr::copy_nonoverlapping(g.init.as_ptr(), addr as *mut u8, g.init.len())
            };
        }
        at.insert(g.name.clone(), (addr, g.size));
    }
    Ok(Globals {
        base: Some(base),
        at,
    })
}

/// The function handles made from one image's kernels, by kernel name: the same name
/// gives the same handle (a module's functions, a library's kernels).
#[derive(Debug, Default)]
struct Made(Mutex<Vec<(String, usize)>>);

impl Made {
    /// The handle of kernel `name` of `code`, made by `make` on first request.
    fn get_or_make(
        &self,
        code: &Code,
        name: &str,
        make: impl FnOnce(&KernelSpec) -> usize,
    ) -> CuResult<usize> {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, h)) = made.iter().find(|(n, _)| n == name) {
            return Ok(*h);
        }
        let spec = code
            .contents()?
            .kernel(name)
            .ok_or_else(|| not_found("kernel", name))?;
        let h = make(spec);
        made.push((name.to_string(), h));
        Ok(h)
    }

    /// Takes every handle made out of [`FUNCTIONS`] (the module or library is going).
    fn remove_all(&self) {
        for (_, f) in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            FUNCTIONS.remove(f);
        }
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
    /// The handle of the library it came from (0 for module functions).
    pub library: usize,
    pub regs: Option<u32>,
    pub shared: Option<u32>,
    pub local: Option<u32>,
    pub max_threads: Option<u32>,
    /// Offset and size of each parameter (`None`: the image does not say).
    pub params: Option<Vec<(u32, u32)>>,
    pub max_dynamic_shared: AtomicI32,
    /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
    pub non_portable_cluster: AtomicI32,
}

fn new_function(
    spec: &KernelSpec,
    device: usize,
    ctx_id: u64,
    module: usize,
    library: usize,
) -> usize {
    FUNCTIONS.insert(Arc::new(Function {
        name: CString::new(spec.name.as_str()).unwrap_or_default(),
        cost: spec.cost,
        device,
        ctx_id,
        module,
        library,
        regs: spec.regs,
        shared: spec.shared,
        local: spec.local,
        max_threads: spec.max_threads,
        params: spec.params.clone(),
        max_dynamic_shared: AtomicI32::new(0),
        non_portable_cluster: AtomicI32::new(0),
    }))
}

fn load(module: *mut CUmodule, raw: CuResult<Raw>) -> CuResult<()> {
    let rt = rt()?;
    let ctx = current()?;
    if module.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let code = code_of(raw?, arch_of(rt, ctx.device))?;
    let handle = MODULES.insert(Arc::new(Module::new(ctx.id, ctx.device, Arc::new(code))));
    // SAFETY: checked non-null above.
    unsafe { module.write(handle as CUmodule) };
    Ok(())
}

/// `cuModuleLoadData`: a fat binary (wrapper or container), cubin, PTX or simulated text.
///
/// # Safety
/// `module` must be null or writable; `image` null or an image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| load(module, read_image(image)))
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
    guard(|| load(module, read_image(image)))
}

/// `cuModuleLoadFatBinary`: as `cuModuleLoadData`.
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut CUmodule,
    fatCubin: *const c_void,
) -> CUresult {
    guard(|| load(module, read_image(fatCubin)))
}

/// `cuModuleLoad`: reads an image (any format `cuModuleLoadData` takes) from a file.
///
/// # Safety
/// `module` must be null or writable; `fname` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard(|| load(module, read_file(fname)))
}

/// `cuModuleUnload`: its functions become invalid handles and its globals are freed.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let m = MODULES.take(hmod as usize)?;
        m.release(Some(rt));
        Ok(())
    })
}

/// Unloads the modules of a destroyed context (its memory, globals included, is freed
/// with the context).
pub fn unload_context(ctx_id: u64) {
    for m in MODULES.remove_where(|m| m.ctx_id == ctx_id) {
        m.release(None);
    }
    for l in LIBRARIES.all() {
        l.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(c, _)| *c != ctx_id);
    }
}

fn c_name<'a>(name: *const c_char) -> CuResult<std::borrow::Cow<'a, str>> {
    if name.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated name.
    Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy())
}

fn module(hmod: CUmodule) -> CuResult<Arc<Module>> {
    MODULES.lookup(hmod as usize)
}

/// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` for a name the module lacks.
///
/// # Safety
/// `hfunc` must be null or writable; `name` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { get_kernel::<Module>(hfunc, hmod, name) })
}

fn put_global(dptr: *mut CUdeviceptr, bytes: *mut usize, (addr, size): (u64, u64)) -> CuResult<()> {
    // Either output may be null, as with the driver.
    // SAFETY: each null or writable by the caller's contract.
    unsafe {
        put_opt(dptr, addr as CUdeviceptr);
        put_opt(bytes, size as usize);
    }
    Ok(())
}

/// `cuModuleGetGlobal_v2`: the global's device memory (allocated on first lookup, with
/// its initial value) and size; `CUDA_ERROR_NOT_FOUND` for an unknown name.
///
/// # Safety
/// `dptr` and `bytes` must be null or writable; `name` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| get_global::<Module>(dptr, bytes, hmod, name))
}

/// What a module and a library share: code, kernel handles made by name and globals.
/// Each pair of twin entry points (`cuModuleGetFunction` and `cuLibraryGetKernel`, ...)
/// runs one generic body over this; they differ in handle types and lookup.
trait Loaded: Sized {
    /// The handle of a module or library (`CUmodule`, `CUlibrary`).
    type Handle: Copy;
    /// The handle of one of its kernels (`CUfunction`, `CUkernel`).
    type Kernel;
    /// The object a handle names.
    fn lookup(h: Self::Handle) -> CuResult<Arc<Self>>;
    fn code(&self) -> &Code;
    /// The handle of kernel `name`, made on first request; `me` is this object's handle.
    fn kernel_handle(&self, name: &str, me: Self::Handle) -> CuResult<Self::Kernel>;
    /// A global's device address and size (a library's, in the current context).
    fn global_in(&self, rt: &Runtime, name: &str) -> CuResult<(u64, u64)>;
}

impl Loaded for Module {
    type Handle = CUmodule;
    type Kernel = CUfunction;
    fn lookup(h: CUmodule) -> CuResult<Arc<Module>> {
        module(h)
    }
    fn code(&self) -> &Code {
        &self.code
    }
    fn kernel_handle(&self, name: &str, me: CUmodule) -> CuResult<CUfunction> {
        Ok(self.function(name, me as usize)? as CUfunction)
    }
    fn global_in(&self, rt: &Runtime, name: &str) -> CuResult<(u64, u64)> {
        self.global(rt, name)
    }
}

/// `cuModuleGetFunction`, `cuLibraryGetKernel`: `CUDA_ERROR_NOT_FOUND` for a name the
/// image lacks.
///
/// # Safety
/// `out` must be null (rejected) or writable; `name` null (rejected) or a C string.
unsafe fn get_kernel<L: Loaded>(
    out: *mut L::Kernel,
    h: L::Handle,
    name: *const c_char,
) -> CuResult<()> {
    rt()?;
    let l = L::lookup(h)?;
    let name = c_name(name)?;
    let k = l.kernel_handle(&name, h)?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(out, k) }
}

/// `cuModuleGetGlobal_v2`, `cuLibraryGetGlobal`: the global's device memory (allocated on
/// first lookup, with its initial value) and size; `CUDA_ERROR_NOT_FOUND` for an unknown
/// name. Either output may be null.
fn get_global<L: Loaded>(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    h: L::Handle,
    name: *const c_char,
) -> CuResult<()> {
    let rt = rt()?;
    let l = L::lookup(h)?;
    let name = c_name(name)?;
    put_global(dptr, bytes, l.global_in(rt, &name)?)
}

/// `cuModuleGetFunctionCount`, `cuLibraryGetKernelCount`: how many kernels the image has.
///
/// # Safety
/// `count` must be null (rejected) or writable.
unsafe fn kernel_count<L: Loaded>(count: *mut c_uint, h: L::Handle) -> CuResult<()> {
    rt()?;
    let n = L::lookup(h)?.code().contents()?.kernels.len();
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(count, n as c_uint) }
}

/// `cuModuleEnumerateFunctions`, `cuLibraryEnumerateKernels`: the handles of the first
/// `wanted` kernels, in image order; more than the image has is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` must be null (rejected) or hold `wanted` writable handles.
unsafe fn enumerate_kernels<L: Loaded>(
    out: *mut L::Kernel,
    wanted: c_uint,
    h: L::Handle,
) -> CuResult<()> {
    rt()?;
    let l = L::lookup(h)?;
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let names: Vec<String> = l
        .code()
        .contents()?
        .kernels
        .iter()
        .map(|k| k.name.clone())
        .collect();
    if (wanted as usize) > names.len() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for (i, n) in names.iter().take(wanted as usize).enumerate() {
        let k = l.kernel_handle(n, h)?;
        // SAFETY: the caller passes room for `wanted` handles.
        unsafe { out.add(i).write(k) };
    }
    Ok(())
}

/// `cuModuleGetFunctionCount`.
///
/// # Safety
/// `count` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut c_uint, hmod: CUmodule) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { kernel_count::<Module>(count, hmod) })
}

/// `cuModuleEnumerateFunctions`: the first `numFunctions` kernels, in image order.
///
/// # Safety
/// `functions` must be null or hold `numFunctions` writable handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    numFunctions: c_uint,
    hmod: CUmodule,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { enumerate_kernels::<Module>(functions, numFunctions, hmod) })
}

/// `cuModuleGetLoadingMode`: lazy unless `CUDA_MODULE_LOADING=EAGER` (the driver's default
/// since CUDA 12.2; fat binary entries are parsed on first use either way).
///
/// # Safety
/// `mode` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut CUmoduleLoadingMode) -> CUresult {
    guard(|| {
        rt()?;
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
        let m = if eager {
            CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING
        } else {
            CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(mode, m) }
    })
}

/// Looks up a function (or a library kernel used as one).
#[inline]
pub fn function(h: CUfunction) -> CuResult<Arc<Function>> {
    FUNCTIONS.lookup(h as usize)
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

fn param_info(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) -> CuResult<()> {
    rt()?;
    let f = function(f)?;
    // The simulated format declares no parameters: every index is out of range.
    let (o, s) = f
        .params
        .as_deref()
        .unwrap_or_default()
        .get(index)
        .copied()
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: `offset` null (rejected) or writable, `size` null or writable, by the
    // caller's contract.
    unsafe {
        put(offset, o as usize)?;
        put_opt(size, s as usize);
    }
    Ok(())
}

/// `cuFuncGetParamInfo`: a parameter's offset and size in the kernel's parameter buffer,
/// from the image; `CUDA_ERROR_INVALID_VALUE` past the last one.
///
/// # Safety
/// `paramOffset` must be null or writable; `paramSize` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    func: CUfunction,
    paramIndex: usize,
    paramOffset: *mut usize,
    paramSize: *mut usize,
) -> CUresult {
    guard(|| param_info(func, paramIndex, paramOffset, paramSize))
}

/// `cuKernelGetParamInfo`: as `cuFuncGetParamInfo`.
///
/// # Safety
/// As `cuFuncGetParamInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: CUkernel,
    paramIndex: usize,
    paramOffset: *mut usize,
    paramSize: *mut usize,
) -> CUresult {
    guard(|| param_info(kernel as CUfunction, paramIndex, paramOffset, paramSize))
}

/// `cuFuncIsLoaded`: always loaded (nothing is compiled or uploaded).
///
/// # Safety
/// `state` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(
    state: *mut CUfunctionLoadingState,
    hfunc: CUfunction,
) -> CUresult {
    guard(|| {
        rt()?;
        function(hfunc)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe {
            put(
                state,
                CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED,
            )
        }
    })
}

/// `cuFuncLoad`: nothing to do.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncLoad(hfunc: CUfunction) -> CUresult {
    guard(|| {
        rt()?;
        function(hfunc).map(|_| ())
    })
}

// ---- CUDA 12 libraries ----

#[derive(Debug)]
pub struct Library {
    pub code: Arc<Code>,
    /// Kernel handles made so far (context-independent functions).
    kernels: Made,
    /// The library's module in each context that asked for one (`cuLibraryGetModule`,
    /// `cuLibraryGetGlobal`).
    modules: Mutex<Vec<(u64, usize)>>,
}

impl Library {
    fn kernel(&self, name: &str, self_handle: usize) -> CuResult<usize> {
        self.kernels.get_or_make(&self.code, name, |spec| {
            new_function(spec, ANY_DEVICE, 0, 0, self_handle)
        })
    }

    /// The library's module in the current context, made on first request.
    fn module(&self) -> CuResult<(usize, Arc<Module>)> {
        let ctx = current()?;
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mods
            .iter()
            .find(|(c, _)| *c == ctx.id)
            .and_then(|(_, h)| MODULES.get(*h).map(|m| (*h, m)))
        {
            return Ok(m);
        }
        let m = Arc::new(Module::new(ctx.id, ctx.device, self.code.clone()));
        let h = MODULES.insert(m.clone());
        mods.retain(|(c, _)| *c != ctx.id);
        mods.push((ctx.id, h));
        Ok((h, m))
    }
}

impl Loaded for Library {
    type Handle = CUlibrary;
    type Kernel = CUkernel;
    fn lookup(h: CUlibrary) -> CuResult<Arc<Library>> {
        library(h)
    }
    fn code(&self) -> &Code {
        &self.code
    }
    fn kernel_handle(&self, name: &str, me: CUlibrary) -> CuResult<CUkernel> {
        Ok(self.kernel(name, me as usize)? as CUkernel)
    }
    fn global_in(&self, rt: &Runtime, name: &str) -> CuResult<(u64, u64)> {
        self.module()?.1.global(rt, name)
    }
}

fn library(h: CUlibrary) -> CuResult<Arc<Library>> {
    LIBRARIES.lookup(h as usize)
}

fn library_load(library: *mut CUlibrary, raw: CuResult<Raw>) -> CuResult<()> {
    let rt = rt()?;
    if library.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // A library is not bound to a context: its entries are chosen for the current
    // context's device, else the first visible device.
    let device = current()
        .map(|c| c.device)
        .unwrap_or_else(|_| rt.devices.first().map_or(0, |d| d.index));
    let code = code_of(raw?, arch_of(rt, device))?;
    let h = LIBRARIES.insert(Arc::new(Library {
        code: Arc::new(code),
        kernels: Made::default(),
        modules: Mutex::new(Vec::new()),
    }));
    // SAFETY: checked non-null above.
    unsafe { library.write(h as CUlibrary) };
    Ok(())
}

/// The library loaders, which differ only in where the image comes from (`$read` of
/// `$src`): their JIT and library options, which the simulator ignores, written once.
macro_rules! library_loaders {
    ($($(#[$attr:meta])* fn $name:ident($src:ident: $ty:ty) => $read:ident;)*) => {$(
        $(#[$attr])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            library: *mut CUlibrary,
            $src: $ty,
            _jitOptions: *mut CUjit_option,
            _jitOptionsValues: *mut *mut c_void,
            _numJitOptions: c_uint,
            _libraryOptions: *mut CUlibraryOption,
            _libraryOptionValues: *mut *mut c_void,
            _numLibraryOptions: c_uint,
        ) -> CUresult {
            guard(|| library_load(library, $read($src)))
        }
    )*};
}

library_loaders! {
    /// `cuLibraryLoadData`: a context-independent library (any image `cuModuleLoadData`
    /// takes); its kernels run on the device of the stream they are launched on.
    ///
    /// # Safety
    /// `library` must be null or writable; `code` null or an image.
    fn cuLibraryLoadData(code: *const c_void) => read_image;

    /// `cuLibraryLoadFromFile`.
    ///
    /// # Safety
    /// `library` must be null or writable; `fileName` null or a C string.
    fn cuLibraryLoadFromFile(fileName: *const c_char) => read_file;
}

/// `cuLibraryUnload`: its kernels and per-context modules go with it.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let l = LIBRARIES.take(library as usize)?;
        l.kernels.remove_all();
        for (_, m) in l
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            if let Some(m) = MODULES.remove(m) {
                m.release(Some(rt));
            }
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
    library_: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { get_kernel::<Library>(pKernel, library_, name) })
}

/// `cuLibraryGetKernelCount`.
///
/// # Safety
/// `count` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { kernel_count::<Library>(count, lib) })
}

/// `cuLibraryEnumerateKernels`.
///
/// # Safety
/// `kernels` must be null or hold `numKernels` writable handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUkernel,
    numKernels: c_uint,
    lib: CUlibrary,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { enumerate_kernels::<Library>(kernels, numKernels, lib) })
}

/// `cuLibraryGetModule`: the library's module in the current context.
///
/// # Safety
/// `pMod` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(pMod: *mut CUmodule, library_: CUlibrary) -> CUresult {
    guard(|| {
        rt()?;
        let (h, _) = library(library_)?.module()?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pMod, h as CUmodule) }
    })
}

/// `cuLibraryGetGlobal`: the global in the current context (its memory is the context's).
///
/// # Safety
/// `dptr` and `bytes` must be null or writable; `name` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library_: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| get_global::<Library>(dptr, bytes, library_, name))
}

/// `CUDA_ERROR_NOT_FOUND` for a valid library and name: what the library lookups of
/// things no image has here answer (managed variables, unified functions).
fn absent(lib: CUlibrary, name: *const c_char) -> CuResult<()> {
    rt()?;
    library(lib)?;
    c_name(name)?;
    Err(CUresult::CUDA_ERROR_NOT_FOUND)
}

/// `cuLibraryGetManaged`: no image declares managed variables here.
///
/// # Safety
/// `name` must be null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetManaged(
    _dptr: *mut CUdeviceptr,
    _bytes: *mut usize,
    library_: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| absent(library_, name))
}

/// `cuLibraryGetUnifiedFunction`: no image has unified functions here.
///
/// # Safety
/// `symbol` must be null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetUnifiedFunction(
    _fptr: *mut *mut c_void,
    library_: CUlibrary,
    symbol: *const c_char,
) -> CUresult {
    guard(|| absent(library_, symbol))
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

/// `cuKernelGetName`.
///
/// # Safety
/// `name` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, hfunc: CUkernel) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuFuncGetName(name, hfunc as CUfunction) }
}

/// `cuKernelGetLibrary`.
///
/// # Safety
/// `pLib` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(pLib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(kernel as CUfunction)?;
        if f.library == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pLib, f.library as CUlibrary) }
    })
}
