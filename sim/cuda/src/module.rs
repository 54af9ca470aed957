//! Modules, functions and (CUDA 12) libraries and kernels.
//!
//! An image is one of: the simulated module text of `tessera_sim::module` (`kernel <name>
//! <duration>` lines, explicit durations), or what real programs load — a fat binary (its
//! `__fatBinC_Wrapper_t` or the container itself), a cubin, or PTX text — parsed by
//! `tessera_sim::image` for kernel names, globals and resource hints; real kernels run for
//! the duration model of `tessera_sim::module::KernelTime` (`TESSERA_SIM_KERNEL_TIME`).
//!
//! Images arrive as bare pointers. They are copied out with `process_vm_readv` on this
//! process, which fails (`EFAULT`) instead of faulting on unmapped memory, reading exactly
//! the extent the image's headers claim, so a truncated or garbage image is an error code
//! and one line on stderr, never a crash. A fat binary's entry is decompressed and parsed
//! when a kernel or global is first asked for (as the driver's lazy loading does), so a
//! framework that registers hundreds of fat binaries at start pays only for what it uses.
//!
//! Globals get real device memory (charged to the device) when first looked up, holding
//! their initial values, so a program can copy to and from them.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tessera_ffi::cuda::*;
use tessera_sim::image::{self, Extent, FATBIN_MAGIC, Global, ImageError, WRAPPER_MAGIC};
use tessera_sim::module::{Cost, KernelTime, ModuleSpec, parse_module};

use crate::registry::{Registry, handle_of};
use crate::runtime::{Runtime, current, rt};
use crate::{CuResult, guard, put, put_opt};

pub static MODULES: Registry<Module> = Registry::new();
pub static FUNCTIONS: Registry<Function> = Registry::new();
pub static LIBRARIES: Registry<Library> = Registry::new();

/// A function not bound to a device (a kernel of a context-independent library).
pub const ANY_DEVICE: usize = usize::MAX;

/// Longest text image read (PTX of a large program is a few MiB).
const MAX_TEXT: usize = 64 << 20;
/// Most containers a version-2 fat binary wrapper may list.
const MAX_WRAPPED: usize = 4096;

/// One line on stderr for a rejected image or a bad setting: without it a framework shows
/// only an error code. The driver's one other place that writes is `cuInit`.
fn log(what: &str, e: impl std::fmt::Display) {
    let line = format!("tessera-sim libcuda: {what}: {e}\n");
    // One write(2) to the process's stderr: the line stays whole when threads log at once,
    // and it reaches fd 2 even where Rust's stderr is redirected (a test harness).
    // SAFETY: writes `line.len()` bytes of an owned buffer to fd 2.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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

// ---- what an image holds ----

/// One kernel as a module knows it.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    pub name: String,
    pub cost: Cost,
    pub regs: Option<u32>,
    pub shared: Option<u32>,
    pub local: Option<u32>,
    pub max_threads: Option<u32>,
    pub params: Option<Vec<(u32, u32)>>,
}

/// Kernels and globals of an image, once parsed.
#[derive(Debug, Default)]
pub struct Contents {
    pub kernels: Vec<KernelSpec>,
    pub globals: Vec<Global>,
    /// The image's architecture (`90`), when it says.
    pub arch: Option<u32>,
}

impl Contents {
    fn kernel(&self, name: &str) -> Option<&KernelSpec> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

#[derive(Debug)]
enum Source {
    /// Parsed at load: the simulated text, a cubin, PTX.
    Ready,
    /// Fat binary entries chosen for the device, parsed on first use.
    Entries(Vec<image::fatbin::Entry<'static>>),
}

/// The code of a module or library: shared by a library's per-context modules.
#[derive(Debug)]
pub struct Code {
    source: Source,
    model: KernelTime,
    contents: OnceLock<Result<Contents, CUresult>>,
}

impl Code {
    fn ready(contents: Contents) -> Code {
        Code {
            source: Source::Ready,
            model: KernelTime::default(),
            contents: OnceLock::from(Ok(contents)),
        }
    }

    /// The kernels and globals, parsing fat binary entries the first time.
    pub fn contents(&self) -> CuResult<&Contents> {
        let parsed = self.contents.get_or_init(|| {
            let Source::Entries(entries) = &self.source else {
                return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
            };
            let mut all = Contents::default();
            for e in entries {
                let img = e.image().map_err(|err| {
                    log("fat binary entry", &err);
                    CUresult::CUDA_ERROR_INVALID_IMAGE
                })?;
                merge(&mut all, img, self.model);
            }
            Ok(all)
        });
        parsed.as_ref().map_err(|e| *e)
    }
}

fn merge(all: &mut Contents, img: image::Image, model: KernelTime) {
    all.arch = all.arch.or(img.arch);
    for k in img.kernels {
        if all.kernel(&k.name).is_none() {
            all.kernels.push(KernelSpec {
                name: k.name,
                cost: Cost::Modelled(model),
                regs: k.regs,
                shared: k.shared,
                local: k.local,
                max_threads: k.max_threads,
                params: k.params,
            });
        }
    }
    for g in img.globals {
        if !all.globals.iter().any(|h| h.name == g.name) {
            all.globals.push(g);
        }
    }
}

fn from_spec(spec: &ModuleSpec) -> Contents {
    Contents {
        kernels: spec
            .kernels
            .iter()
            .map(|(name, cost)| KernelSpec {
                name: name.clone(),
                cost: *cost,
                regs: None,
                shared: None,
                local: None,
                max_threads: None,
                params: None,
            })
            .collect(),
        globals: Vec::new(),
        arch: None,
    }
}

/// The duration model of real kernels, read once per process.
fn kernel_time() -> CuResult<KernelTime> {
    static MODEL: OnceLock<Result<KernelTime, String>> = OnceLock::new();
    MODEL
        .get_or_init(KernelTime::from_env)
        .clone()
        .map_err(|e| {
            log("kernel time", e);
            CUresult::CUDA_ERROR_INVALID_VALUE
        })
}

fn image_error(e: &ImageError) -> CUresult {
    match e {
        ImageError::NoBinaryForGpu { .. } => CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
        ImageError::Ptx { .. } => CUresult::CUDA_ERROR_INVALID_PTX,
        _ => CUresult::CUDA_ERROR_INVALID_IMAGE,
    }
}

/// The bytes of an image, by kind, as read from the program's memory.
#[derive(Debug)]
pub enum Raw {
    /// A fat binary container, cubin, or a text without its NUL.
    Bytes(Vec<u8>),
    /// The containers a fat binary wrapper points to.
    Containers(Vec<Vec<u8>>),
}

/// Parses what [`read_image`] (or a file) gave, for a device of compute capability
/// `arch` (`major * 10 + minor`).
pub fn code_of(raw: Raw, arch: u32) -> CuResult<Code> {
    let containers = match raw {
        Raw::Containers(c) => c,
        Raw::Bytes(b) if b.starts_with(&FATBIN_MAGIC.to_le_bytes()) => vec![b],
        Raw::Bytes(b) if b.starts_with(&image::ELF_MAGIC) || image::looks_like_ptx(&b) => {
            let model = kernel_time()?;
            let img = image::parse(&b, arch).map_err(|e| {
                log("image", &e);
                image_error(&e)
            })?;
            let mut contents = Contents::default();
            merge(&mut contents, img, model);
            return Ok(Code {
                model,
                ..Code::ready(contents)
            });
        }
        Raw::Bytes(b) => {
            let text = std::str::from_utf8(&b).map_err(|_| {
                log(
                    "image",
                    "neither a fat binary, cubin, PTX nor a simulated module",
                );
                CUresult::CUDA_ERROR_INVALID_IMAGE
            })?;
            let spec = parse_module(text).map_err(|e| {
                log("simulated module", e);
                CUresult::CUDA_ERROR_INVALID_IMAGE
            })?;
            return Ok(Code::ready(from_spec(&spec)));
        }
    };
    let model = kernel_time()?;
    let mut entries = Vec::new();
    for c in &containers {
        let fb = image::fatbin::Fatbin::parse(c).map_err(|e| {
            log("fat binary", &e);
            image_error(&e)
        })?;
        let entry = fb.select(arch).map_err(|e| {
            log("fat binary", &e);
            image_error(&e)
        })?;
        entries.push(entry.clone().into_owned());
    }
    Ok(Code {
        source: Source::Entries(entries),
        model,
        contents: OnceLock::new(),
    })
}

// ---- reading images from pointers ----

/// Copies `len` bytes at `addr` of this process, or fails if any of them is not mapped.
fn read_mem(addr: usize, len: usize) -> CuResult<Vec<u8>> {
    let mut out = vec![0u8; len];
    if len == 0 {
        return Ok(out);
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: len,
    };
    // SAFETY: reads this process's own memory into `out` (len bytes, owned); the kernel
    // checks the source range and reports EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == len as isize {
        return Ok(out);
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    if n < 0 && matches!(errno, Some(libc::ENOSYS) | Some(libc::EPERM)) {
        // The call is filtered (a seccomp profile): trust the pointer, as the driver does.
        // SAFETY: the caller of the driver promised `len` readable bytes at `addr`.
        return Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec());
    }
    Err(CUresult::CUDA_ERROR_INVALID_IMAGE)
}

fn read_u32(addr: usize) -> CuResult<u32> {
    let b = read_mem(addr, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn read_u64(addr: usize) -> CuResult<u64> {
    let b = read_mem(addr, 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(&b);
    Ok(u64::from_le_bytes(a))
}

/// Reads the image an entry point was given: follows a fat binary wrapper to its
/// containers, reads containers and cubins to the extent their headers give, and texts
/// (PTX, the simulated format) to their NUL.
pub fn read_image(image: *const c_void) -> CuResult<Raw> {
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let addr = image as usize;
    let fail = |e: ImageError| {
        log("image", &e);
        image_error(&e)
    };
    let magic = read_u32(addr).inspect_err(|_| log("image", "unreadable"))?;
    if magic == WRAPPER_MAGIC {
        let version = read_u32(addr + 4)?;
        let data = read_u64(addr + 8)? as usize;
        let list = read_u64(addr + 16)? as usize;
        let mut containers = Vec::new();
        match version {
            1 => containers.push(read_extent(data).map_err(fail)?),
            2 => {
                // Version 2 (relocatable device code): a null-terminated list of prelinked
                // containers.
                for i in 0..MAX_WRAPPED {
                    let p = read_u64(list + i * 8)? as usize;
                    if p == 0 {
                        break;
                    }
                    containers.push(read_extent(p).map_err(fail)?);
                }
                if containers.is_empty() && data != 0 {
                    containers.push(read_extent(data).map_err(fail)?);
                }
            }
            v => {
                return Err(fail(ImageError::Field {
                    what: "fat binary wrapper version",
                    value: v.into(),
                }));
            }
        }
        return Ok(Raw::Containers(containers));
    }
    read_extent(addr).map(Raw::Bytes).map_err(fail)
}

/// Reads one image at `addr` to the extent its headers claim.
fn read_extent(addr: usize) -> Result<Vec<u8>, ImageError> {
    let unreadable = ImageError::Truncated("image memory is not readable");
    if addr == 0 {
        return Err(unreadable);
    }
    let mut have = read_mem(addr, 4).map_err(|_| unreadable.clone())?;
    loop {
        match image::extent(&have)? {
            Extent::Known(n) => {
                return read_mem(addr, n as usize).map_err(|_| unreadable);
            }
            Extent::AtLeast(n) => {
                if n as usize <= have.len() {
                    return Err(ImageError::Truncated("image header"));
                }
                have = read_mem(addr, n as usize).map_err(|_| unreadable.clone())?;
            }
            Extent::NulTerminated => return read_text(addr),
        }
    }
}

/// Reads a NUL-terminated text in pages (the text may end just before unmapped memory).
fn read_text(addr: usize) -> Result<Vec<u8>, ImageError> {
    let mut text = Vec::new();
    let mut at = addr;
    while text.len() < MAX_TEXT {
        // Never read across a page boundary in one call: the next page may not exist.
        let chunk = 4096 - at % 4096;
        let bytes = read_mem(at, chunk)
            .map_err(|_| ImageError::Truncated("text without a terminating NUL"))?;
        if let Some(n) = bytes.iter().position(|&b| b == 0) {
            text.extend_from_slice(&bytes[..n]);
            return Ok(text);
        }
        text.extend_from_slice(&bytes);
        at += chunk;
    }
    Err(ImageError::TooLarge(MAX_TEXT as u64))
}

/// The device's compute capability as `major * 10 + minor`.
fn arch_of(rt: &Runtime, device: usize) -> u32 {
    rt.node
        .device_info(device as u32)
        .map(|i| i.cc_major * 10 + i.cc_minor)
        .unwrap_or(90)
}

// ---- modules and functions ----

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

impl Function {
    /// Largest block a launch of this function may use.
    pub fn max_block(&self) -> u32 {
        let by_regs = self
            .regs
            .filter(|r| *r > 0)
            .map_or(1024, |r| (REGS_PER_SM / r / 32 * 32).max(32));
        self.max_threads.unwrap_or(1024).min(1024).min(by_regs)
    }
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

fn read_file(fname: *const c_char) -> CuResult<Raw> {
    if fname.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let mut bytes = std::fs::read(&path).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
    if !bytes.starts_with(&FATBIN_MAGIC.to_le_bytes()) && !bytes.starts_with(&image::ELF_MAGIC) {
        // A text file may end with a NUL (NVRTC's PTX does).
        if let Some(n) = bytes.iter().position(|&b| b == 0) {
            bytes.truncate(n);
        }
    }
    Ok(Raw::Bytes(bytes))
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

// ---- attributes and occupancy (an H100's limits) ----

const REGS_PER_SM: u32 = 65536;
const THREADS_PER_SM: u32 = 2048;
const BLOCKS_PER_SM: u32 = 32;
const SHARED_PER_SM: u64 = 228 << 10;
const SHARED_PER_BLOCK_OPTIN: i32 = 227 << 10;
/// Shared memory a block may use without opting in.
const SHARED_PER_BLOCK: u64 = 48 << 10;

fn attribute(f: &Function, attrib: CUfunction_attribute, arch: u32) -> CuResult<c_int> {
    use CUfunction_attribute as A;
    Ok(match attrib {
        A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => f.max_block() as c_int,
        A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => f.shared.unwrap_or(0) as c_int,
        A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => f.local.unwrap_or(0) as c_int,
        A::CU_FUNC_ATTRIBUTE_NUM_REGS => f.regs.unwrap_or(32) as c_int,
        A::CU_FUNC_ATTRIBUTE_PTX_VERSION | A::CU_FUNC_ATTRIBUTE_BINARY_VERSION => arch as c_int,
        A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            match f.max_dynamic_shared.load(Ordering::Relaxed) {
                0 => (SHARED_PER_BLOCK as i32 - f.shared.unwrap_or(0) as i32).max(0),
                v => v,
            }
        }
        A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
        A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            f.non_portable_cluster.load(Ordering::Relaxed)
        }
        a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => 0,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

fn set_attribute(f: &Function, attrib: CUfunction_attribute, value: c_int) -> CuResult<()> {
    use CUfunction_attribute as A;
    match attrib {
        A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            let fixed = f.shared.unwrap_or(0) as i32;
            if value < 0 || value + fixed > SHARED_PER_BLOCK_OPTIN {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            f.max_dynamic_shared.store(value, Ordering::Relaxed);
            Ok(())
        }
        A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            if !(0..=1).contains(&value) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            f.non_portable_cluster.store(value, Ordering::Relaxed);
            Ok(())
        }
        a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => Ok(()),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn function_arch(rt: &Runtime, f: &Function) -> u32 {
    let module_arch = MODULES
        .get(f.module)
        .and_then(|m| m.code.contents().ok().and_then(|c| c.arch));
    let device = if f.device == ANY_DEVICE { 0 } else { f.device };
    module_arch.unwrap_or_else(|| arch_of(rt, device))
}

/// `cuFuncGetAttribute`: registers, static shared and local memory from the image where
/// it says (else 32 registers and none), an H100's limits otherwise.
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
        let rt = rt()?;
        let f = function(hfunc)?;
        let v = attribute(&f, attrib, function_arch(rt, &f))?;
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
        set_attribute(&*function(hfunc)?, attrib, value)
    })
}

/// Checks a cache preference for a function (`CU_FUNC_CACHE_PREFER_*`, 0 to 3); it has no
/// effect here.
fn check_cache_config(f: CUfunction, config: CUfunc_cache) -> CuResult<()> {
    function(f)?;
    if config.0 > 3 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuFuncSetCacheConfig`: accepted, no effect.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache) -> CUresult {
    guard(|| {
        rt()?;
        check_cache_config(hfunc, config)
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

/// Blocks of `block` threads with `dynamic` bytes of dynamic shared memory that fit on
/// one SM at once (threads, blocks, registers and shared memory of an H100's SM).
fn active_blocks(f: &Function, block: c_int, dynamic: usize) -> CuResult<c_int> {
    if block <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let block = block as u32;
    if block > f.max_block() {
        return Ok(0);
    }
    let warps = block.div_ceil(32) * 32;
    let by_threads = THREADS_PER_SM / warps;
    let regs = f.regs.unwrap_or(32).max(1) * warps;
    let by_regs = REGS_PER_SM / regs;
    let shared = u64::from(f.shared.unwrap_or(0)) + dynamic as u64;
    let by_shared = if shared == 0 {
        BLOCKS_PER_SM
    } else {
        (SHARED_PER_SM / shared.div_ceil(1024).max(1) / 1024).min(u64::from(BLOCKS_PER_SM)) as u32
    };
    Ok(by_threads.min(by_regs).min(by_shared).min(BLOCKS_PER_SM) as c_int)
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
///
/// # Safety
/// `numBlocks` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    numBlocks: *mut c_int,
    func: CUfunction,
    blockSize: c_int,
    dynamicSMemSize: usize,
) -> CUresult {
    guard(|| {
        rt()?;
        let n = active_blocks(&*function(func)?, blockSize, dynamicSMemSize)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(numBlocks, n) }
    })
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`: the flags change nothing here.
///
/// # Safety
/// `numBlocks` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    numBlocks: *mut c_int,
    func: CUfunction,
    blockSize: c_int,
    dynamicSMemSize: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe {
        cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize)
    }
}

fn potential_block_size(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    to_dynamic: CUoccupancyB2DSize,
    dynamic: usize,
    limit: c_int,
) -> CuResult<()> {
    let rt = rt()?;
    let f = function(func)?;
    if min_grid.is_null() || block_size.is_null() || limit < 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut top = f.max_block() as c_int;
    if limit > 0 {
        top = top.min(limit);
    }
    let mut best = (0, 0, 0);
    let mut size = top;
    while size > 0 {
        let dyn_bytes = match to_dynamic {
            // SAFETY: the program's callback, called as the driver calls it.
            Some(cb) => unsafe { cb(size) },
            None => dynamic,
        };
        let blocks = active_blocks(&f, size, dyn_bytes)?;
        if blocks * size > best.0 {
            best = (blocks * size, size, blocks);
        }
        size = if size % 32 == 0 {
            size - 32
        } else {
            size / 32 * 32
        };
    }
    let sms = rt
        .node
        .device_info(if f.device == ANY_DEVICE {
            0
        } else {
            f.device as u32
        })
        .map(|i| i.sms as c_int)
        .unwrap_or(132);
    // SAFETY: both checked non-null above; writable by the caller's contract.
    unsafe {
        min_grid.write(best.2 * sms);
        block_size.write(best.1);
    }
    Ok(())
}

/// `cuOccupancyMaxPotentialBlockSize`: the block size with the most resident threads per
/// SM, and the grid that fills the device with it.
///
/// # Safety
/// `minGridSize` and `blockSize` must be null or writable; the callback, if any, callable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    minGridSize: *mut c_int,
    blockSize: *mut c_int,
    func: CUfunction,
    blockSizeToDynamicSMemSize: CUoccupancyB2DSize,
    dynamicSMemSize: usize,
    blockSizeLimit: c_int,
) -> CUresult {
    guard(|| {
        potential_block_size(
            minGridSize,
            blockSize,
            func,
            blockSizeToDynamicSMemSize,
            dynamicSMemSize,
            blockSizeLimit,
        )
    })
}

/// `cuOccupancyMaxPotentialBlockSizeWithFlags`.
///
/// # Safety
/// As `cuOccupancyMaxPotentialBlockSize`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    minGridSize: *mut c_int,
    blockSize: *mut c_int,
    func: CUfunction,
    blockSizeToDynamicSMemSize: CUoccupancyB2DSize,
    dynamicSMemSize: usize,
    blockSizeLimit: c_int,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract; the flags change nothing here.
    unsafe {
        cuOccupancyMaxPotentialBlockSize(
            minGridSize,
            blockSize,
            func,
            blockSizeToDynamicSMemSize,
            dynamicSMemSize,
            blockSizeLimit,
        )
    }
}

/// `cuOccupancyAvailableDynamicSMemPerBlock`.
///
/// # Safety
/// `dynamicSmemSize` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    dynamicSmemSize: *mut usize,
    func: CUfunction,
    numBlocks: c_int,
    blockSize: c_int,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(func)?;
        if numBlocks <= 0 || blockSize <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if active_blocks(&f, blockSize, 0)? < numBlocks {
            // SAFETY: the caller passes a writable pointer or null (rejected).
            return unsafe { put(dynamicSmemSize, 0) };
        }
        let per_block = (SHARED_PER_SM / numBlocks as u64 / 1024 * 1024)
            .min(SHARED_PER_BLOCK_OPTIN as u64)
            .saturating_sub(u64::from(f.shared.unwrap_or(0)));
        // SAFETY: as above.
        unsafe { put(dynamicSmemSize, per_block as usize) }
    })
}

/// Largest thread block cluster: 8 blocks portably, 16 on an H100 when the kernel allows
/// non-portable sizes.
fn max_cluster(f: &Function) -> c_int {
    if f.non_portable_cluster.load(Ordering::Relaxed) != 0 {
        16
    } else {
        8
    }
}

/// The cluster size a launch configuration asks for (1 without the attribute).
///
/// # Safety
/// `config` must be null or a valid `CUlaunchConfig` with `numAttrs` attributes.
unsafe fn cluster_of<'a>(config: *const CUlaunchConfig) -> CuResult<(&'a CUlaunchConfig, u64)> {
    // SAFETY: the caller's contract.
    let c: &CUlaunchConfig =
        unsafe { config.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut size = 1u64;
    for i in 0..c.numAttrs as usize {
        // SAFETY: `numAttrs` attributes at `attrs`.
        let a = unsafe { &*c.attrs.add(i) };
        if a.id == CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
            // SAFETY: for this id the union holds `clusterDim`.
            let d = unsafe { a.value.clusterDim };
            size = u64::from(d.x.max(1)) * u64::from(d.y.max(1)) * u64::from(d.z.max(1));
        }
    }
    Ok((c, size))
}

/// `cuOccupancyMaxPotentialClusterSize`: 8, or 16 with non-portable sizes allowed, fewer
/// when the blocks of a cluster would not fit on the SMs of a GPC (an H100 has 16 or 18).
///
/// # Safety
/// `clusterSize` must be null or writable; `config` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    clusterSize: *mut c_int,
    func: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(func)?;
        // SAFETY: the caller's contract.
        let (c, _) = unsafe { cluster_of(config) }?;
        let block = (u64::from(c.blockDimX) * u64::from(c.blockDimY) * u64::from(c.blockDimZ))
            .min(i32::MAX as u64) as c_int;
        let per_sm = active_blocks(&f, block, c.sharedMemBytes as usize)?;
        let size = if per_sm == 0 { 0 } else { max_cluster(&f) };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(clusterSize, size) }
    })
}

/// `cuOccupancyMaxActiveClusters`: clusters of the configured size that fit on the device
/// at once.
///
/// # Safety
/// `numClusters` must be null or writable; `config` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    numClusters: *mut c_int,
    func: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let f = function(func)?;
        // SAFETY: the caller's contract.
        let (c, size) = unsafe { cluster_of(config) }?;
        if size > max_cluster(&f) as u64 {
            return Err(CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let block = (u64::from(c.blockDimX) * u64::from(c.blockDimY) * u64::from(c.blockDimZ))
            .min(i32::MAX as u64) as c_int;
        let per_sm = active_blocks(&f, block, c.sharedMemBytes as usize)? as u64;
        let device = if f.device == ANY_DEVICE {
            0
        } else {
            f.device as u32
        };
        let sms = rt
            .node
            .device_info(device)
            .map_or(132, |i| u64::from(i.sms));
        let n = (per_sm * sms / size).min(i32::MAX as u64) as c_int;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(numClusters, n) }
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

/// `cuLibraryLoadData`: a context-independent library (any image `cuModuleLoadData`
/// takes); its kernels run on the device of the stream they are launched on.
///
/// # Safety
/// `library` must be null or writable; `code` null or an image.
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
    guard(|| library_load(library, read_image(code)))
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

/// `cuKernelGetAttribute`: as `cuFuncGetAttribute` (`dev` must be a visible device).
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?.index;
        let f = function(kernel as CUfunction)?;
        let arch = MODULES
            .get(f.module)
            .and_then(|m| m.code.contents().ok().and_then(|c| c.arch))
            .or_else(|| {
                LIBRARIES
                    .get(f.library)
                    .and_then(|l| l.code.contents().ok().and_then(|c| c.arch))
            })
            .unwrap_or_else(|| arch_of(rt, d));
        let v = attribute(&f, attrib, arch)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, v) }
    })
}

/// `cuKernelSetAttribute`: as `cuFuncSetAttribute`, for every device.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: CUfunction_attribute,
    val: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(dev)?;
        set_attribute(&*function(kernel as CUfunction)?, attrib, val)
    })
}

/// `cuKernelSetCacheConfig`: accepted, no effect.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetCacheConfig(
    kernel: CUkernel,
    config: CUfunc_cache,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(dev)?;
        check_cache_config(kernel as CUfunction, config)
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

// ---- other driver functions PyTorch resolves by name ----
//
// PyTorch looks these up through `cudaGetDriverEntryPoint` when it initialises CUDA; a
// lookup that fails leaves `cudaErrorSymbolNotFound` as the runtime's last error, which
// PyTorch's next error check then reports. So they exist, doing what the simulator can.

/// Checks that `addr` is 4 aligned bytes of device memory, then waits until the work
/// queued on `stream` so far has ended: the start of a stream memory operation.
fn after_stream_work(stream: CUstream, addr: CUdeviceptr, pt: bool) -> CuResult<()> {
    let t = crate::stream::resolve(stream, pt)?;
    crate::memory::check_device_range(addr, 4)?;
    if !addr.is_multiple_of(4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    tessera_sim::clock::sleep_until(t.last_end());
    Ok(())
}

/// `cuStreamWriteValue32`: writes `value` at `addr` once the stream's earlier work has
/// ended (the calling thread waits for that, as `cuLaunchHostFunc` does here).
fn write_value32(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
    pt: bool,
) -> CuResult<()> {
    rt()?;
    if flags & !1 != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    after_stream_work(stream, addr, pt)?;
    // SAFETY: 4 aligned bytes of live device memory (checked above), mapped read-write in
    // this process.
    unsafe { (addr as *mut u32).write_volatile(value) };
    Ok(())
}

/// `cuStreamWriteValue32` and `cuStreamWaitValue32` (each with `_v2`, `_ptsz`): the same
/// parameters, one body `$op` (`write_value32`, `wait_value32`), per-thread stream or not.
macro_rules! value32 {
    ($op:ident: $($name:ident $pt:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "` (see `", stringify!($op), "`).")]
        ///
        /// # Safety
        /// No pointer arguments are dereferenced unchecked.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint) -> CUresult {
            guard(|| $op(stream, addr, value, flags, $pt))
        }
    )*};
}

value32! {
    write_value32:
    cuStreamWriteValue32 false;
    cuStreamWriteValue32_v2 false;
    cuStreamWriteValue32_ptsz true;
    cuStreamWriteValue32_v2_ptsz true;
}

/// `cuMulticastCreate`: multicast objects need NVLink switches the simulated node lacks.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastCreate(
    _mcHandle: *mut CUmemGenericAllocationHandle,
    _prop: *const CUmulticastObjectProp,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastAddDevice`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastAddDevice(
    _mcHandle: CUmemGenericAllocationHandle,
    _dev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastBindMem`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastBindMem(
    _mcHandle: CUmemGenericAllocationHandle,
    _mcOffset: usize,
    _memHandle: CUmemGenericAllocationHandle,
    _memOffset: usize,
    _size: usize,
    _flags: std::ffi::c_ulonglong,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastUnbind`: not supported (no multicast objects).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastUnbind(
    _mcHandle: CUmemGenericAllocationHandle,
    _dev: CUdevice,
    _mcOffset: usize,
    _size: usize,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// Writes the opaque descriptor of a tensor map here: just the address, for a rank from
/// `min_rank` to 5.
///
/// # Safety
/// `tensorMap` must be null (rejected) or writable.
unsafe fn put_tensor_map(
    tensorMap: *mut CUtensorMap,
    rank: cuuint32_t,
    min_rank: cuuint32_t,
    globalAddress: *mut c_void,
) -> CuResult<()> {
    if !(min_rank..=5).contains(&rank) || globalAddress.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut map = CUtensorMap { opaque: [0; 16] };
    map.opaque[0] = globalAddress as u64;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(tensorMap, map) }
}

/// `cuTensorMapEncodeTiled`: checks the rank and writes an opaque descriptor (zeros with
/// the address first); kernels never read it here.
///
/// # Safety
/// `tensorMap` must be null or writable; the array arguments are not read.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    tensorMap: *mut CUtensorMap,
    _tensorDataType: CUtensorMapDataType,
    tensorRank: cuuint32_t,
    globalAddress: *mut c_void,
    _globalDim: *const cuuint64_t,
    _globalStrides: *const cuuint64_t,
    _boxDim: *const cuuint32_t,
    _elementStrides: *const cuuint32_t,
    _interleave: CUtensorMapInterleave,
    _swizzle: CUtensorMapSwizzle,
    _l2Promotion: CUtensorMapL2promotion,
    _oobFill: CUtensorMapFloatOOBfill,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put_tensor_map(tensorMap, tensorRank, 1, globalAddress) })
}

/// `cuLogsRegisterCallback`: accepted; the simulated driver logs nothing through it.
///
/// # Safety
/// `callback_out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callbackFunc: CUlogsCallback,
    _userData: *mut c_void,
    callback_out: *mut CUlogsCallbackHandle,
) -> CUresult {
    guard(|| {
        if callbackFunc.is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // A non-null handle that names nothing: unregistering it is accepted.
        if !callback_out.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { callback_out.write(std::ptr::dangling_mut()) };
        }
        Ok(())
    })
}

/// `cuLogsUnregisterCallback`: accepted.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(_callback: CUlogsCallbackHandle) -> CUresult {
    CUresult::CUDA_SUCCESS
}

/// Green contexts (SM partitions) are not simulated: every call is
/// `CUDA_ERROR_NOT_SUPPORTED`, which PyTorch takes as "no green contexts here".
macro_rules! no_green_contexts {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: `CUDA_ERROR_NOT_SUPPORTED` (no green contexts).")]
        ///
        /// # Safety
        /// No pointer is dereferenced.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            $(let _ = $arg;)*
            CUresult::CUDA_ERROR_NOT_SUPPORTED
        }
    )*};
}

no_green_contexts! {
    cuCtxFromGreenCtx(pContext: *mut CUcontext, hCtx: CUgreenCtx);
    cuGreenCtxCreate(phCtx: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint);
    cuGreenCtxDestroy(hCtx: CUgreenCtx);
    cuGreenCtxStreamCreate(phStream: *mut CUstream, greenCtx: CUgreenCtx, flags: c_uint, priority: c_int);
    cuDevSmResourceSplitByCount(result: *mut CUdevResource, nbGroups: *mut c_uint, input: *const CUdevResource, remaining: *mut CUdevResource, useFlags: c_uint, minCount: c_uint);
    cuDeviceGetDevResource(dev: CUdevice, result: *mut CUdevResource, type_: CUdevResourceType);
    cuDevResourceGenerateDesc(phDesc: *mut CUdevResourceDesc, resources: *mut CUdevResource, nbResources: c_uint);
}

/// `cuTensorMapEncodeIm2col`: as `cuTensorMapEncodeTiled`, an opaque descriptor holding
/// the address (rank 3 to 5).
///
/// # Safety
/// `tensorMap` must be null or writable; the array arguments are not read.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    tensorMap: *mut CUtensorMap,
    _tensorDataType: CUtensorMapDataType,
    tensorRank: cuuint32_t,
    globalAddress: *mut c_void,
    _globalDim: *const cuuint64_t,
    _globalStrides: *const cuuint64_t,
    _pixelBoxLowerCorner: *const c_int,
    _pixelBoxUpperCorner: *const c_int,
    _channelsPerPixel: cuuint32_t,
    _pixelsPerColumn: cuuint32_t,
    _elementStrides: *const cuuint32_t,
    _interleave: CUtensorMapInterleave,
    _swizzle: CUtensorMapSwizzle,
    _l2Promotion: CUtensorMapL2promotion,
    _oobFill: CUtensorMapFloatOOBfill,
) -> CUresult {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put_tensor_map(tensorMap, tensorRank, 3, globalAddress) })
}

/// `cuTensorMapReplaceAddress`: rewrites the address in a descriptor made here.
///
/// # Safety
/// `tensorMap` must be null or a valid, writable descriptor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(
    tensorMap: *mut CUtensorMap,
    globalAddress: *mut c_void,
) -> CUresult {
    guard(|| {
        if tensorMap.is_null() || globalAddress.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { (*tensorMap).opaque[0] = globalAddress as u64 };
        Ok(())
    })
}

/// `cuStreamWaitValue32`: once the stream's earlier work has ended, the calling thread
/// waits until the 32-bit value at `addr` satisfies the condition (`>=`, `==`, `& != 0`,
/// `!(a | b)`), as a stream would before running later work; at most 10 s, then
/// `CUDA_ERROR_TIMEOUT` (a real stream would hang; a host thread here must not).
fn wait_value32(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
    pt: bool,
) -> CuResult<()> {
    rt()?;
    let cond = flags & !(1 << 30);
    if cond > 3 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    after_stream_work(stream, addr, pt)?;
    let holds = || {
        // SAFETY: 4 aligned bytes of live device memory (checked above), mapped in this
        // process; another thread or process may write them, hence volatile.
        let v = unsafe { (addr as *const u32).read_volatile() };
        match cond {
            0 => (v as i32).wrapping_sub(value as i32) >= 0,
            1 => v == value,
            2 => v & value != 0,
            _ => !(v | value) != 0,
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !holds() {
        if std::time::Instant::now() > deadline {
            return Err(CUresult::CUDA_ERROR_TIMEOUT);
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    Ok(())
}

value32! {
    wait_value32:
    cuStreamWaitValue32 false;
    cuStreamWaitValue32_v2 false;
    cuStreamWaitValue32_ptsz true;
    cuStreamWaitValue32_v2_ptsz true;
}

/// `cuStreamBatchMemOp`: not supported (use `cuStreamWriteValue32`/`cuStreamWaitValue32`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp(
    _stream: CUstream,
    _count: c_uint,
    _paramArray: *mut CUstreamBatchMemOpParams,
    _flags: c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkCreate_v2`: no JIT linker here (nothing is compiled): `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
    _stateOut: *mut CUlinkState,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkAddData_v2`: no JIT linker (`CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    _state: CUlinkState,
    _type_: CUjitInputType,
    _data: *mut c_void,
    _size: usize,
    _name: *const c_char,
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkComplete`: no JIT linker (`CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    _state: CUlinkState,
    _cubinOut: *mut *mut c_void,
    _sizeOut: *mut usize,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuLinkDestroy`: no link state can exist (`CUDA_ERROR_INVALID_HANDLE`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkDestroy(_state: CUlinkState) -> CUresult {
    CUresult::CUDA_ERROR_INVALID_HANDLE
}

// cuBLASLt (behind torch.matmul) resolves these with dlsym when it creates a handle and
// refuses to start without them. Until graph.rs implements them they exist and answer
// `CUDA_ERROR_NOT_SUPPORTED` (no cuGetProcAddress entries: the graph family owns those).

/// `cuGraphNodeGetType`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(
    _hNode: CUgraphNode,
    _type_: *mut CUgraphNodeType,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuGraphKernelNodeGetParams`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    _hNode: CUgraphNode,
    _nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuGraphExecKernelNodeSetParams`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    _hGraphExec: CUgraphExec,
    _hNode: CUgraphNode,
    _nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
