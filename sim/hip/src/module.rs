//! Code objects, kernels and launches.
//!
//! The simulator's kernels do not compute; a launch occupies the device's engine for its
//! modelled time. A code object `hipModuleLoadData` accepts is one of two texts:
//!
//! - what this library's hiprtc compiles ([`CODE_MAGIC`], then `kernel <name>` lines):
//!   each kernel gets the duration model of real kernels, a fixed cost plus a cost per
//!   thread (`TESSERA_SIM_KERNEL_TIME`, default `2us+5ps/thread`, as the simulated
//!   `libcuda`);
//! - the simulated module format of `tessera_sim::module` (`kernel step 1ms`), which
//!   tests use to give a kernel a duration of their choosing.
//!
//! Kernels compiled into a program (`__hipRegisterFatBinary`/`__hipRegisterFunction`,
//! what hipcc's host code calls at load time) are known by their host stub and launched
//! with `hipLaunchKernel`; they get the same model.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tessera_sim::module::{Cost, KernelTime, parse_module};

use crate::stream;
use crate::*;

/// The first line of a code object made by this library's hiprtc.
pub const CODE_MAGIC: &str = "TESSERA-HIP-CODE 1";

/// A kernel of a loaded module (`hipFunction_t`).
#[derive(Debug)]
pub struct Function {
    pub name: String,
    pub cost: Cost,
}

/// A loaded module (`hipModule_t`): its kernels' handles.
#[derive(Debug)]
pub struct Module {
    pub functions: HashMap<String, usize>,
}

static MODULES: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static FUNCTIONS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// Host stub address -> kernel name, from `__hipRegisterFunction`.
static REGISTERED: Mutex<Option<HashMap<usize, String>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The duration model of real kernels, read once per process.
fn kernel_time() -> KernelTime {
    static MODEL: OnceLock<KernelTime> = OnceLock::new();
    *MODEL.get_or_init(|| {
        KernelTime::from_env().unwrap_or_else(|e| {
            eprintln!("tessera-sim libamdhip64: {e}; using the default");
            KernelTime::default()
        })
    })
}

/// The kernels a code object declares, with their costs.
pub fn parse_code(image: &[u8]) -> HipResult<Vec<(String, Cost)>> {
    let text = std::str::from_utf8(image).map_err(|_| hipErrorInvalidImage)?;
    let text = text.trim_end_matches('\0');
    if let Some(rest) = text.strip_prefix(CODE_MAGIC) {
        let model = Cost::Modelled(kernel_time());
        let kernels: Vec<(String, Cost)> = rest
            .lines()
            .filter_map(|l| l.strip_prefix("kernel "))
            .map(|name| (name.to_string(), model))
            .collect();
        return Ok(kernels);
    }
    parse_module(text)
        .map(|m| m.kernels)
        .map_err(|_| hipErrorInvalidImage)
}

fn load(image: &[u8]) -> HipResult<*mut c_void> {
    rt()?.current_touched()?;
    let kernels = parse_code(image)?;
    let mut functions = HashMap::new();
    let mut live = lock(&FUNCTIONS);
    for (name, cost) in kernels {
        let f = Box::into_raw(Box::new(Function {
            name: name.clone(),
            cost,
        })) as usize;
        live.get_or_insert_with(HashSet::new).insert(f);
        functions.insert(name, f);
    }
    let m = Box::into_raw(Box::new(Module { functions })) as usize;
    lock(&MODULES).get_or_insert_with(HashSet::new).insert(m);
    Ok(m as *mut c_void)
}

fn function(f: *mut c_void) -> HipResult<&'static Function> {
    if !lock(&FUNCTIONS)
        .as_ref()
        .is_some_and(|s| s.contains(&(f as usize)))
    {
        return Err(hipErrorInvalidHandle);
    }
    // SAFETY: a live `Function` box of this module; function boxes are never freed.
    Ok(unsafe { &*(f as *const Function) })
}

/// Queues one launch of `blocks` blocks of `threads` threads on a stream.
fn launch(cost: Cost, blocks: u64, threads: u64, s: *mut c_void) -> HipResult<()> {
    if blocks == 0 || threads == 0 || threads > 1024 {
        return Err(hipErrorInvalidValue);
    }
    let st = stream::resolve(s)?;
    costs().pay_launch();
    st.queue(cost.launch(blocks, threads))?;
    Ok(())
}

fn registered(host_fn: *const c_void) -> HipResult<Cost> {
    if lock(&REGISTERED)
        .as_ref()
        .is_some_and(|m| m.contains_key(&(host_fn as usize)))
    {
        Ok(Cost::Modelled(kernel_time()))
    } else {
        Err(hipErrorInvalidDeviceFunction)
    }
}

thread_local! {
    /// `__hipPushCallConfiguration`'s stack: the `<<<...>>>` of a launch in progress.
    static CALL_CONFIG: RefCell<Vec<(dim3, dim3, usize, usize)>> = const { RefCell::new(Vec::new()) };
}

/// A token `__hipRegisterFatBinary` returns: the registrations need a non-null handle.
static FAT_BINARY_TOKEN: u8 = 0;

hip_api! {
    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `module` must be null or writable; `image` null or a NUL-terminated code object.
    "hip_4.2" fn hipModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> hipError_t {
        guard(|| {
            if module.is_null() || image.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: the caller passes a code object; both formats this library reads are
            // text, ended by a NUL.
            let bytes = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes();
            let m = load(bytes)?;
            // SAFETY: checked non-null; the caller passes a writable pointer.
            unsafe { put(module, m) }
        })
    }

    /// `hipModuleLoad`: a code object from a file.
    ///
    /// # Safety
    /// `module` must be null or writable; `path` null or a C string.
    "hip_4.2" fn hipModuleLoad(module: *mut *mut c_void, path: *const c_char) -> hipError_t {
        guard(|| {
            if module.is_null() || path.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated string.
            let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).map_err(|_| hipErrorNotFound)?;
            let m = load(&bytes)?;
            // SAFETY: as above.
            unsafe { put(module, m) }
        })
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_4.2" fn hipModuleUnload(module: *mut c_void) -> hipError_t {
        guard(|| {
            if !lock(&MODULES).as_mut().is_some_and(|s| s.remove(&(module as usize))) {
                return Err(hipErrorInvalidHandle);
            }
            // SAFETY: removed from the live set: the last use of the box made in `load`.
            let m = unsafe { Box::from_raw(module.cast::<Module>()) };
            if let Some(live) = lock(&FUNCTIONS).as_mut() {
                for f in m.functions.values() {
                    live.remove(f);
                }
            }
            Ok(())
        })
    }

    /// `hipModuleGetFunction`.
    ///
    /// # Safety
    /// `f` must be null or writable; `name` null or a C string.
    "hip_4.2" fn hipModuleGetFunction(f: *mut *mut c_void, module: *mut c_void, name: *const c_char) -> hipError_t {
        guard(|| {
            if f.is_null() || name.is_null() {
                return Err(hipErrorInvalidValue);
            }
            if !lock(&MODULES).as_ref().is_some_and(|s| s.contains(&(module as usize))) {
                return Err(hipErrorInvalidHandle);
            }
            // SAFETY: a live `Module` box (checked above); modules are only freed by
            // hipModuleUnload, which a caller does not race with its own lookups.
            let m = unsafe { &*module.cast::<Module>() };
            // SAFETY: non-null, and the caller passes a NUL-terminated string.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            let h = *m.functions.get(name.as_ref()).ok_or(hipErrorNotFound)?;
            // SAFETY: as above.
            unsafe { put(f, h as *mut c_void) }
        })
    }

    /// `hipModuleGetGlobal`: the simulated code objects have no globals.
    ///
    /// # Safety
    /// No pointer is written.
    "hip_4.2" fn hipModuleGetGlobal(_dptr: *mut *mut c_void, _bytes: *mut usize, module: *mut c_void, _name: *const c_char) -> hipError_t {
        guard(|| {
            if !lock(&MODULES).as_ref().is_some_and(|s| s.contains(&(module as usize))) {
                return Err(hipErrorInvalidHandle);
            }
            Err(hipErrorNotFound)
        })
    }

    /// `hipFuncGetAttribute`: 1024 threads per block; nothing else is used.
    ///
    /// # Safety
    /// `value` must be null or writable.
    "hip_4.2" fn hipFuncGetAttribute(value: *mut c_int, attribute: c_int, f: *mut c_void) -> hipError_t {
        guard(|| {
            function(f)?;
            // HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK is 0; registers, local and shared
            // memory are 0 for a kernel that does not exist on silicon.
            let v = if attribute == 0 { 1024 } else { 0 };
            // SAFETY: the caller's contract.
            unsafe { put(value, v) }
        })
    }

    /// `hipLaunchCooperativeKernelMultiDevice`: each entry's kernel on its stream, in
    /// order; the first that fails stops the rest.
    ///
    /// # Safety
    /// `list` must be null or valid for `n` entries.
    "hip_4.2" fn hipLaunchCooperativeKernelMultiDevice(list: *mut hipLaunchParams, n: c_int, _flags: c_uint) -> hipError_t {
        guard(|| {
            if list.is_null() || n <= 0 {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: the caller passes `n` readable entries.
            let entries = unsafe { std::slice::from_raw_parts(list, n as usize) };
            for p in entries {
                launch(registered(p.func)?, p.gridDim.count(), p.blockDim.count(), p.stream)?;
            }
            Ok(())
        })
    }

}

/// The launch exports, grouped by the parameters they share, each group's parameter list and
/// body written once: a launch by module function in blocks (`module`), by module function
/// in work items with events around it (`work_items`, also under ROCm 5's C++ names), and by
/// a program's host stub (`stub`). Each export adds only its own trailing parameters, which
/// the simulator does not read, except a `stub`'s `events`, the two events it records.
macro_rules! launch_exports {
    ($(
        $(#[$attr:meta])*
        $group:ident fn $name:ident ($($tail:tt)*);
    )*) => {
        $(launch_exports!(@one $group [$(#[$attr])*] $name ($($tail)*));)*
    };
    (@one module [$($attr:tt)*] $name:ident ($($tail:ident: $tty:ty),*)) => {
        hip_api! {
            $($attr)*
            "hip_4.2" fn $name(
                f: *mut c_void,
                gx: c_uint, gy: c_uint, gz: c_uint,
                bx: c_uint, by: c_uint, bz: c_uint,
                _shared: c_uint,
                s: *mut c_void,
                _params: *mut *mut c_void,
                $($tail: $tty),*
            ) -> hipError_t {
                guard(|| {
                    let k = function(f)?;
                    let grid = dim3 { x: gx, y: gy, z: gz };
                    let block = dim3 { x: bx, y: by, z: bz };
                    launch(k.cost, grid.count(), block.count(), s)
                })
            }
        }
    };
    (@one work_items [$($attr:tt)*] $name:ident ($($tail:ident: $tty:ty),*)) => {
        hip_api! {
            $($attr)*
            "hip_4.2" fn $name(
                f: *mut c_void,
                gx: u32, gy: u32, gz: u32,
                lx: u32, ly: u32, lz: u32,
                _shared: usize,
                s: *mut c_void,
                _params: *mut *mut c_void,
                _extra: *mut *mut c_void,
                start: *mut c_void,
                stop: *mut c_void,
                $($tail: $tty),*
            ) -> hipError_t {
                guard(|| {
                    let k = function(f)?;
                    let local = dim3 { x: lx, y: ly, z: lz };
                    if local.count() == 0 {
                        return Err(hipErrorInvalidValue);
                    }
                    let blocks = [(gx, lx), (gy, ly), (gz, lz)]
                        .iter()
                        .map(|&(g, l)| u64::from(g).div_ceil(u64::from(l.max(1))))
                        .product::<u64>();
                    record(start, s)?;
                    launch(k.cost, blocks, local.count(), s)?;
                    record(stop, s)
                })
            }
        }
    };
    // Null events record nothing: the launches without events pass none.
    (@events) => {
        [std::ptr::null_mut::<c_void>(); 2]
    };
    (@events $start:ident, $stop:ident) => {
        [$start, $stop]
    };
    (@one stub [$($attr:tt)*] $name:ident (_shared: $sty:ty $(, events $start:ident, $stop:ident $(, $tail:ident: $tty:ty)*)?)) => {
        hip_api! {
            $($attr)*
            "hip_4.2" fn $name(
                host_fn: *const c_void,
                grid: dim3,
                block: dim3,
                _args: *mut *mut c_void,
                _shared: $sty,
                s: *mut c_void,
                $($start: *mut c_void, $stop: *mut c_void, $($tail: $tty),*)?
            ) -> hipError_t {
                guard(|| {
                    let cost = registered(host_fn)?;
                    let events = launch_exports!(@events $($start, $stop)?);
                    record(events[0], s)?;
                    launch(cost, grid.count(), block.count(), s)?;
                    record(events[1], s)
                })
            }
        }
    };
}

launch_exports! {
    /// `hipModuleLaunchKernel`.
    ///
    /// # Safety
    /// Any handle values are accepted; the parameters are not read.
    module fn hipModuleLaunchKernel(_extra: *mut *mut c_void);

    /// `hipModuleLaunchCooperativeKernel` (a later ROCm's call): as
    /// `hipModuleLaunchKernel`, the grid co-resident by construction on the one engine.
    ///
    /// # Safety
    /// Any handle values are accepted; the parameters are not read.
    module fn hipModuleLaunchCooperativeKernel();

    /// `hipExtModuleLaunchKernel`: sizes in work items (threads), not blocks; the events
    /// are recorded around the launch.
    ///
    /// # Safety
    /// Any handle values are accepted; the parameters are not read.
    work_items fn hipExtModuleLaunchKernel(_flags: u32);

    /// `hipExtModuleLaunchKernel` under the C++ name ROCm 5 exports it by (the header
    /// declares it without `extern "C"`).
    ///
    /// # Safety
    /// As `hipExtModuleLaunchKernel`.
    work_items fn _Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j(_flags: u32);

    /// `hipHccModuleLaunchKernel`: `hipExtModuleLaunchKernel` without flags (work-item
    /// sizes, events around the launch).
    ///
    /// # Safety
    /// As `hipExtModuleLaunchKernel`.
    work_items fn hipHccModuleLaunchKernel();

    /// `hipHccModuleLaunchKernel` under the C++ name ROCm 5 exports it by.
    ///
    /// # Safety
    /// As `hipExtModuleLaunchKernel`.
    work_items fn _Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_();

    /// `hipLaunchKernel`: a kernel compiled into the program, by its host stub.
    ///
    /// # Safety
    /// Any stub address is accepted; the arguments are not read.
    stub fn hipLaunchKernel(_shared: usize);

    /// `hipLaunchCooperativeKernel`: as `hipLaunchKernel` (the engine runs one grid at a
    /// time anyway, so a cooperative grid is co-resident by construction).
    ///
    /// # Safety
    /// As `hipLaunchKernel`.
    stub fn hipLaunchCooperativeKernel(_shared: c_uint);

    /// `hipExtLaunchKernel`: `hipLaunchKernel` with events recorded around it.
    ///
    /// # Safety
    /// As `hipLaunchKernel`.
    stub fn hipExtLaunchKernel(_shared: usize, events start, stop, _flags: c_int);
}

hip_api! {
    /// `__hipRegisterFatBinary`: the program's device code; its kernels follow one by one.
    ///
    /// # Safety
    /// The image is not read.
    "hip_4.2" fn __hipRegisterFatBinary(_data: *const c_void) -> *mut *mut c_void {
        (&raw const FAT_BINARY_TOKEN).cast_mut().cast()
    }

    /// `__hipRegisterFunction`: remembers the kernel's name by its host stub.
    ///
    /// # Safety
    /// `name` must be null or a C string.
    "hip_4.2" fn __hipRegisterFunction(
        _modules: *mut *mut c_void,
        host_fn: *const c_void,
        _device_fn: *mut c_char,
        name: *const c_char,
        _thread_limit: c_uint,
        _tid: *mut c_void,
        _bid: *mut c_void,
        _block: *mut dim3,
        _grid: *mut dim3,
        _wsize: *mut c_int,
    ) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if name.is_null() {
                return;
            }
            // SAFETY: non-null, and the program passes its kernel's NUL-terminated name.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
            lock(&REGISTERED).get_or_insert_with(HashMap::new).insert(host_fn as usize, name);
        }));
    }

    /// `__hipUnregisterFatBinary`: the program is going away; nothing is held for it.
    ///
    /// # Safety
    /// The handle is not read.
    "hip_4.2" fn __hipUnregisterFatBinary(_modules: *mut *mut c_void) {}

    /// `__hipPushCallConfiguration`: the `<<<grid, block, shared, stream>>>` of a launch.
    ///
    /// # Safety
    /// No pointers are read.
    "hip_4.2" fn __hipPushCallConfiguration(grid: dim3, block: dim3, shared: usize, s: *mut c_void) -> hipError_t {
        CALL_CONFIG.with(|c| c.borrow_mut().push((grid, block, shared, s as usize)));
        hipSuccess
    }

    /// `__hipPopCallConfiguration`.
    ///
    /// # Safety
    /// The out pointers must be null or writable.
    "hip_4.2" fn __hipPopCallConfiguration(grid: *mut dim3, block: *mut dim3, shared: *mut usize, s: *mut *mut c_void) -> hipError_t {
        guard(|| {
            let (g, b, sh, st) = CALL_CONFIG
                .with(|c| c.borrow_mut().pop())
                .ok_or(hipErrorInvalidValue)?;
            // SAFETY: the caller's contract.
            unsafe {
                put(grid, g)?;
                put(block, b)?;
                put(shared, sh)?;
                put(s, st as *mut c_void)
            }
        })
    }
}

/// Records an event on a stream if one is given (the `hipExt*` launches' events).
fn record(e: *mut c_void, s: *mut c_void) -> HipResult<()> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: both handles are checked by the call itself.
    match unsafe { stream::hipEventRecord(e, s) } {
        hipSuccess => Ok(()),
        err => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_code_formats_parse() {
        let k = parse_code(format!("{CODE_MAGIC}\nkernel add\nkernel f<float, 2>\n").as_bytes())
            .expect("hiprtc's format");
        assert_eq!(k.len(), 2);
        assert_eq!(k[1].0, "f<float, 2>");
        assert!(matches!(k[0].1, Cost::Modelled(_)));
        let k = parse_code(b"kernel step 1ms\n").expect("the simulated module format");
        assert_eq!(k, vec![("step".to_string(), Cost::Fixed(1_000_000))]);
        assert_eq!(parse_code(b"\x7fELF"), Err(hipErrorInvalidImage));
        assert_eq!(parse_code(b"not a module"), Err(hipErrorInvalidImage));
    }
}
