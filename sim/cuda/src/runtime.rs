//! The process-wide driver state created by `cuInit`: the mapped node, this process's slot
//! in it, per-device state (primary context, memory pools), and each thread's context stack.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tessera_ffi::cuda::CUresult;
use tessera_sim::{DriverCosts, Node, NodeError};

use crate::CuResult;
use crate::context::Context;
use crate::memory::Pool;

/// The driver state of this process, once `cuInit` has run (successfully or not).
static RT: OnceLock<Result<Runtime, CUresult>> = OnceLock::new();
/// Set in a child after `fork()`: the parent's driver state is not the child's to use.
static FORKED: AtomicBool = AtomicBool::new(false);

#[derive(Debug)]
pub struct Runtime {
    pub node: Node,
    pub slot: usize,
    pub pid: u32,
    /// The devices this process sees (`CUDA_VISIBLE_DEVICES`), by `CUdevice` ordinal.
    pub devices: Vec<DeviceLocal>,
    /// What launches and synchronisations cost (`TESSERA_SIM_LAUNCH_COST`, ...), read
    /// once here so no call reads the environment.
    pub costs: DriverCosts,
}

/// This process's view of one device.
#[derive(Debug)]
pub struct DeviceLocal {
    /// The device's index in the node (physical); everything recorded in the node state
    /// and every `usize` device in this crate uses it, while a `CUdevice` is an ordinal
    /// into [`Runtime::devices`].
    pub index: usize,
    pub primary: Mutex<Primary>,
    /// `cuDeviceGetDefaultMemPool`.
    pub default_pool: Arc<Pool>,
    /// `cuDeviceGetMemPool` (the pool `cuMemAllocAsync` uses), as a handle.
    pub current_pool: AtomicUsize,
    /// Live contexts on the device; NVML lists the process while it is non-zero.
    pub contexts: AtomicU32,
}

/// The device's primary context and its retain count.
#[derive(Debug, Default)]
pub struct Primary {
    pub ctx: Option<Arc<Context>>,
    pub refs: u32,
    pub flags: u32,
}

impl Runtime {
    fn start() -> Result<Runtime, CUresult> {
        let costs = DriverCosts::from_env().map_err(|e| {
            eprintln!("tessera-sim libcuda: {e}");
            CUresult::CUDA_ERROR_INVALID_VALUE
        })?;
        let node = Node::open_from_env().map_err(|e| {
            // The one place this library writes to stderr: without it a broken setup would
            // show up only as an error code.
            eprintln!("tessera-sim libcuda: {e}");
            match e {
                NodeError::NoSlot => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                _ => CUresult::CUDA_ERROR_OPERATING_SYSTEM,
            }
        })?;
        let slot = node.attach().map_err(|e| {
            eprintln!("tessera-sim libcuda: {e}");
            CUresult::CUDA_ERROR_OUT_OF_MEMORY
        })?;
        // CUDA sees only NVIDIA's devices: on a mixed node its index n (and what
        // CUDA_VISIBLE_DEVICES names) is the n-th NVIDIA device, as each vendor's driver
        // numbers its own GPUs.
        let nvidia = node.devices_of(tessera_sim::Vendor::Nvidia);
        let uuids: Vec<String> = nvidia
            .iter()
            .map(|&i| node.device_info(i).map(|d| d.uuid).unwrap_or_default())
            .collect();
        let spec = std::env::var_os(crate::visible::VAR);
        let spec = spec.as_ref().map(|s| s.to_string_lossy());
        let devices = crate::visible::visible_devices(spec.as_deref(), &uuids)
            .into_iter()
            .map(|k| nvidia[k] as usize)
            .map(|index| {
                let default_pool = Pool::new_default(index);
                let handle = crate::memory::POOLS.insert(default_pool.clone());
                DeviceLocal {
                    index,
                    primary: Mutex::new(Primary::default()),
                    default_pool,
                    current_pool: AtomicUsize::new(handle),
                    contexts: AtomicU32::new(0),
                }
            })
            .collect();
        // SAFETY: registering a fork handler with no prepare/parent hooks; `child_after_fork`
        // only stores to an atomic, which is async-signal-safe.
        unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
        Ok(Runtime {
            node,
            slot,
            pid: std::process::id(),
            devices,
            costs,
        })
    }

    pub fn device(&self, ordinal: i32) -> CuResult<&DeviceLocal> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    /// This process's state of physical device `index`, if the process sees it.
    pub fn local(&self, index: usize) -> Option<&DeviceLocal> {
        self.devices.iter().find(|d| d.index == index)
    }

    /// The `CUdevice` ordinal of physical device `index` (`-1` if the process does not
    /// see it, which no context or allocation of this process can be on).
    pub fn ordinal(&self, index: usize) -> i32 {
        self.devices
            .iter()
            .position(|d| d.index == index)
            .map_or(-1, |o| o as i32)
    }

    /// Fails with `CUDA_ERROR_DEVICE_UNAVAILABLE` while the device is marked lost.
    #[inline]
    pub fn check_device(&self, device: usize) -> CuResult<()> {
        if self.node.is_lost(device) {
            Err(CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE)
        } else {
            Ok(())
        }
    }

    /// Charges `bytes` of device memory to this process, or fails as a full GPU does.
    pub fn charge(&self, device: usize, bytes: u64) -> CuResult<()> {
        self.check_device(device)?;
        if self.node.reserve_memory(self.slot, device, bytes) {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    pub fn uncharge(&self, device: usize, bytes: u64) {
        self.node.release_memory(self.slot, device, bytes);
    }

    /// Records that a context on `device` was created (`+1`) or destroyed (`-1`).
    pub fn context_count(&self, device: usize, delta: i32) {
        if let Some(d) = self.local(device) {
            let now = if delta > 0 {
                d.contexts.fetch_add(1, Ordering::AcqRel) + 1
            } else {
                d.contexts.fetch_sub(1, Ordering::AcqRel).saturating_sub(1)
            };
            self.node.set_context(self.slot, device, now > 0);
        }
    }
}

extern "C" fn child_after_fork() {
    FORKED.store(true, Ordering::SeqCst);
}

/// `cuInit`: creates the driver state once; later calls return the first outcome.
pub fn init() -> CuResult<&'static Runtime> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    }
    match RT.get_or_init(Runtime::start) {
        Ok(rt) => Ok(rt),
        Err(e) => Err(*e),
    }
}

/// The driver state, or `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (and in a forked
/// child, as the real driver).
#[inline]
pub fn rt() -> CuResult<&'static Runtime> {
    match RT.get() {
        Some(Ok(rt)) if !FORKED.load(Ordering::Relaxed) => Ok(rt),
        _ => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// Hands the process slot back when the library is unloaded or the process exits. What it
/// still holds is the driver's to tear down: at once, or after the node's teardown time
/// (`TESSERA_SIM_CONTEXT_TEARDOWN`), during which NVML still lists the process, as the
/// real driver does (a killed one's teardown begins when the next process looks).
extern "C" fn on_unload() {
    if FORKED.load(Ordering::Relaxed) {
        return;
    }
    if let Some(Ok(rt)) = RT.get()
        && rt.pid == std::process::id()
    {
        rt.node.detach(rt.slot);
    }
}

#[used]
#[unsafe(link_section = ".fini_array")]
static ON_UNLOAD: extern "C" fn() = on_unload;

thread_local! {
    /// This thread's context stack; the last entry is current.
    static STACK: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context.
#[inline]
pub fn current() -> CuResult<Arc<Context>> {
    let ctx = STACK
        .try_with(|s| s.borrow().last().cloned())
        .ok()
        .flatten()
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    ctx.check()?;
    Ok(ctx)
}

/// The current context without checking it (`cuCtxGetCurrent` returns destroyed ones too).
pub fn current_raw() -> Option<Arc<Context>> {
    STACK
        .try_with(|s| s.borrow().last().cloned())
        .ok()
        .flatten()
}

/// `cuCtxSetCurrent`: replaces the top of the stack (pushes onto an empty one); `None`
/// pops it.
pub fn set_current(ctx: Option<Arc<Context>>) -> CuResult<()> {
    STACK
        .try_with(|s| {
            let mut s = s.borrow_mut();
            match ctx {
                Some(c) => {
                    if let Some(top) = s.last_mut() {
                        *top = c;
                    } else {
                        s.push(c);
                    }
                }
                None => {
                    s.pop();
                }
            }
        })
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

pub fn push_current(ctx: Arc<Context>) -> CuResult<()> {
    STACK
        .try_with(|s| s.borrow_mut().push(ctx))
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

pub fn pop_current() -> CuResult<Arc<Context>> {
    STACK
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// Removes a destroyed context from this thread's stack.
pub fn forget_current(ctx: &Arc<Context>) {
    let _ = STACK.try_with(|s| s.borrow_mut().retain(|c| !Arc::ptr_eq(c, ctx)));
}
