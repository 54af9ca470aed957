//! A demo workload: a real CUDA driver-API client that loads `libcuda.so.1`
//! with `dlopen` and resolves functions with `dlsym` on that handle (as
//! cudarc or ctypes do), holds device memory and keeps its GPU busy with
//! kernels of a known duration. It runs as its own process under the shim
//! (`tessera __workload ...`), and reports events as JSON lines on stdout.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use libloading::Library;
use tessera_contract::format_uuid;
use tessera_ffi::cuda::*;

/// What one workload does.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// UUID of the GPU to run on.
    #[arg(long)]
    pub uuid: String,
    /// Device memory to hold while running.
    #[arg(long)]
    pub memory: u64,
    /// Duration of one kernel, in microseconds.
    #[arg(long, default_value_t = 2000)]
    pub kernel_us: u64,
    /// Kernels queued between two synchronisations.
    #[arg(long, default_value_t = 4)]
    pub batch: u32,
    /// Every this many seconds, try to allocate past the memory limit.
    #[arg(long)]
    pub oversubscribe_every: Option<f64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub seconds: f64,
}

/// Why a workload stopped early.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot load libcuda.so.1: {0}")]
    Load(#[from] libloading::Error),
    #[error("{call} failed: {name}")]
    Cuda { call: &'static str, name: String },
    #[error("no GPU with UUID {0}")]
    NoDevice(String),
}

macro_rules! driver {
    ($($field:ident : $pfn:ident = $sym:literal),* $(,)?) => {
        /// The driver entry points a workload uses, resolved on the handle.
        struct Driver {
            _lib: Library,
            $($field: <$pfn as OptionFn>::F,)*
        }
        impl Driver {
            fn load() -> Result<Self, WorkloadError> {
                // SAFETY: loading the CUDA driver runs its initialisers,
                // which is what every CUDA program does.
                let lib = unsafe { Library::new("libcuda.so.1") }?;
                $(
                    // SAFETY: the symbol is the driver function whose
                    // prototype the PFN typedef (from cudaTypedefs.h) gives.
                    let $field = unsafe { *lib.get::<<$pfn as OptionFn>::F>($sym)? };
                )*
                Ok(Driver { _lib: lib, $($field,)* })
            }
        }
    };
}

/// The function-pointer type inside bindgen's `Option<fn>` typedefs.
trait OptionFn {
    type F: Copy;
}
impl<F: Copy> OptionFn for Option<F> {
    type F = F;
}

driver! {
    init: PFN_cuInit_v2000 = b"cuInit\0",
    get_error_name: PFN_cuGetErrorName_v6000 = b"cuGetErrorName\0",
    device_get_count: PFN_cuDeviceGetCount_v2000 = b"cuDeviceGetCount\0",
    device_get: PFN_cuDeviceGet_v2000 = b"cuDeviceGet\0",
    device_get_uuid: PFN_cuDeviceGetUuid_v11040 = b"cuDeviceGetUuid_v2\0",
    primary_ctx_retain: PFN_cuDevicePrimaryCtxRetain_v7000 = b"cuDevicePrimaryCtxRetain\0",
    ctx_set_current: PFN_cuCtxSetCurrent_v4000 = b"cuCtxSetCurrent\0",
    ctx_synchronize: PFN_cuCtxSynchronize_v2000 = b"cuCtxSynchronize\0",
    module_load_data: PFN_cuModuleLoadData_v2000 = b"cuModuleLoadData\0",
    module_get_function: PFN_cuModuleGetFunction_v2000 = b"cuModuleGetFunction\0",
    mem_alloc: PFN_cuMemAlloc_v3020 = b"cuMemAlloc_v2\0",
    mem_free: PFN_cuMemFree_v3020 = b"cuMemFree_v2\0",
    launch_kernel: PFN_cuLaunchKernel_v4000 = b"cuLaunchKernel\0",
}

impl Driver {
    fn check(&self, call: &'static str, r: CUresult) -> Result<(), WorkloadError> {
        if r == CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        Err(WorkloadError::Cuda {
            call,
            name: self.error_name(r),
        })
    }

    fn error_name(&self, r: CUresult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string.
        let ok = unsafe { (self.get_error_name)(r, &mut p) } == CUresult::CUDA_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUresult({})", r.0)
        }
    }
}

fn emit(event: serde_json::Value) {
    // One line per event; the demo reads them from our stdout.
    println!("{event}");
}

const CHUNK: u64 = 256 << 20;

/// Runs a workload until its time is up.
pub fn run(args: &WorkloadArgs) -> Result<(), WorkloadError> {
    let d = Driver::load()?;
    // SAFETY: cuInit takes flags by value.
    d.check("cuInit", unsafe { (d.init)(0) })?;
    let mut n: c_int = 0;
    // SAFETY: (here and below) arguments are valid pointers to locals of the
    // types the PFN prototypes name; the driver writes only through them.
    d.check("cuDeviceGetCount", unsafe { (d.device_get_count)(&mut n) })?;
    let mut dev: CUdevice = -1;
    for i in 0..n {
        let mut h: CUdevice = 0;
        // SAFETY: as above.
        d.check("cuDeviceGet", unsafe { (d.device_get)(&mut h, i) })?;
        let mut u = CUuuid { bytes: [0; 16] };
        // SAFETY: as above.
        d.check("cuDeviceGetUuid_v2", unsafe {
            (d.device_get_uuid)(&mut u, h)
        })?;
        let bytes: [u8; 16] = u.bytes.map(|b| b as u8);
        if format_uuid(&bytes) == args.uuid {
            dev = h;
        }
    }
    if dev < 0 {
        return Err(WorkloadError::NoDevice(args.uuid.clone()));
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: as above.
    d.check("cuDevicePrimaryCtxRetain", unsafe {
        (d.primary_ctx_retain)(&mut ctx, dev)
    })?;
    // SAFETY: as above.
    d.check("cuCtxSetCurrent", unsafe { (d.ctx_set_current)(ctx) })?;

    // Hold the working set, in chunks as frameworks do.
    let mut held: Vec<CUdeviceptr> = Vec::new();
    let mut have = 0;
    while have < args.memory {
        let size = CHUNK.min(args.memory - have);
        let mut p: CUdeviceptr = 0;
        // SAFETY: as above.
        d.check("cuMemAlloc_v2", unsafe {
            (d.mem_alloc)(&mut p, size as usize)
        })?;
        held.push(p);
        have += size;
    }
    emit(serde_json::json!({"event": "allocated", "bytes": have}));

    let image = CString::new(format!("kernel work {}us\n", args.kernel_us)).unwrap_or_default();
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: as above; the image is a NUL-terminated simulated module.
    d.check("cuModuleLoadData", unsafe {
        (d.module_load_data)(&mut module, image.as_ptr() as *const c_void)
    })?;
    let mut func: CUfunction = std::ptr::null_mut();
    // SAFETY: as above.
    d.check("cuModuleGetFunction", unsafe {
        (d.module_get_function)(&mut func, module, c"work".as_ptr())
    })?;

    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let mut next_oversub = args
        .oversubscribe_every
        .map(|s| start + Duration::from_secs_f64(s / 2.0));
    let mut launches: u64 = 0;
    while Instant::now() < end {
        for _ in 0..args.batch {
            // SAFETY: as above; a kernel without parameters.
            let r = unsafe {
                (d.launch_kernel)(
                    func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0 as c_uint,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            d.check("cuLaunchKernel", r)?;
            launches += 1;
        }
        // SAFETY: as above.
        d.check("cuCtxSynchronize", unsafe { (d.ctx_synchronize)() })?;
        if let (Some(at), Some(every)) = (next_oversub, args.oversubscribe_every)
            && Instant::now() >= at
        {
            oversubscribe(&d)?;
            next_oversub = Some(at + Duration::from_secs_f64(every));
        }
    }
    for p in held {
        // SAFETY: p came from cuMemAlloc_v2 and is freed once.
        d.check("cuMemFree_v2", unsafe { (d.mem_free)(p) })?;
    }
    emit(serde_json::json!({"event": "done", "launches": launches}));
    Ok(())
}

/// Allocates chunk after chunk until the driver (the shim) says no, reports
/// how far it got, then gives the extra back.
fn oversubscribe(d: &Driver) -> Result<(), WorkloadError> {
    let mut extra = Vec::new();
    let refusal = loop {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer, as in `run`.
        let r = unsafe { (d.mem_alloc)(&mut p, CHUNK as usize) };
        if r != CUresult::CUDA_SUCCESS {
            break d.error_name(r);
        }
        extra.push(p);
        if extra.len() > 1 << 16 {
            break "never refused".to_owned();
        }
    };
    emit(serde_json::json!({
        "event": "oom",
        "extra_bytes": extra.len() as u64 * CHUNK,
        "error": refusal,
    }));
    for p in extra {
        // SAFETY: p came from cuMemAlloc_v2 and is freed once.
        d.check("cuMemFree_v2", unsafe { (d.mem_free)(p) })?;
    }
    Ok(())
}
