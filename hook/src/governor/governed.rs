//! The core's one object, [`Governed`]: the state of one process's use of
//! its allocation, what the layers above hand it when it is set up
//! ([`Hooks`], [`PoolDriver`]), and which allocation device a context or a
//! stream is on. The jobs done on it live beside it: joining (`join.rs`),
//! quota (`quota.rs`), pool and graph accounting (`pools.rs`), admission
//! (`admission.rs`), fork and exit (`fork.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};

use parking_lot::Mutex;
use tessera_ffi::cuda::{CUcontext, CUdevice, CUresult, CUstream};
use tessera_shm::Member;
use tessera_shm::layout::MAX_DEVICES;

use super::files::Files;
use crate::devices::DeviceMap;
use crate::ledger::{Ledger, PoolBooks, Shared, Vmm};
use crate::table::call_real;

/// The state of one process's use of its allocation.
#[derive(Debug)]
pub struct Governed {
    pub files: &'static Files,
    pub devices: DeviceMap,
    /// Packed membership: 0 = not joined (yet, or again after fork).
    pub(super) member: AtomicU64,
    pub(super) join_lock: Mutex<()>,
    /// Serialises this process's operations on its slot, per device: the
    /// state file's protocol allows one operation per slot and device at
    /// a time (its intent word is single).
    pub(super) op_locks: [Mutex<()>; MAX_DEVICES],
    pub ledger: Ledger,
    pub contexts: Mutex<Contexts>,
    /// Memory pools and the device they allocate on (`None`: host memory).
    pub pools: Mutex<HashMap<usize, Option<CUdevice>>>,
    /// VMM physical allocations and their mappings.
    pub vmm: Mutex<Vmm>,
    /// Stream-ordered pools and graph memory: what the driver keeps for
    /// this process beyond its live allocations, charged until released.
    pub books: Mutex<PoolBooks>,
    /// A pool allocation was freed since the pools were last reconciled:
    /// the driver may give the memory back at the next synchronisation.
    pub pool_slack: AtomicBool,
    /// The process has used graph memory (an allocation node, a captured
    /// stream-ordered allocation): graph launches are accounted.
    pub graph_memory: AtomicBool,
    /// Memory shared with other processes of the allocation.
    pub shared: Mutex<Shared>,
    /// Anything was exported or imported (frees then look at `shared`).
    pub sharing: AtomicBool,
    /// What the layers above handed the core.
    pub(super) hooks: Hooks,
    /// How long an admission over the limit waits for the manager to
    /// release dead processes' quota ([`DEAD_QUOTA_WAIT`]; a
    /// test that plays the manager sets a bound no scheduler can miss).
    pub(super) dead_quota_wait: std::time::Duration,
}

/// How long an admission refused over the limit waits for the manager to
/// release what dead processes hold on the device: long enough for a
/// driver's teardown of a few processes and a pass of the manager's reaper
/// (100 ms by default), short enough that a program probing its limit is
/// answered promptly. Past it the answer is out-of-memory, as on a full GPU
/// whose driver is still freeing an exited process's memory. Defined beside
/// the field it is the default of, so that the state does not import the
/// admission (`quota.rs`) that reads it.
pub(crate) const DEAD_QUOTA_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What the layers above the core hand it when it is set up: the core
/// calls these and never names the modules they live in (the compute gate,
/// the IPC bookkeeping, the real driver's pool queries). Nothing here is on
/// the launch path.
#[derive(Debug, Clone, Copy)]
pub struct Hooks {
    /// Once the process has joined its allocation (at `cuInit`, and again
    /// in a forked child), before its first submission: the compute gate
    /// is set up here.
    pub on_join: fn(&Governed),
    /// Returns the quota of exported memory kept for importers that have
    /// closed it since; whether any came back. Asked when an admission is
    /// over the limit.
    pub settle_shared: fn(&Governed) -> bool,
    /// The driver's pool and graph-memory queries (`None`: no pool or graph
    /// accounting, as in tests that do not need it).
    pub pools: Option<&'static dyn PoolDriver>,
}

impl Hooks {
    /// Hooks that do nothing: no gate, no shared memory, no pools.
    pub const NONE: Hooks = Hooks {
        on_join: |_| {},
        settle_shared: |_| false,
        pools: None,
    };
}

/// What the pool and graph-memory accounting asks the driver. Handles and
/// devices are the driver's (`CUmemoryPool` as an address, `CUdevice`).
pub trait PoolDriver: Sync + std::fmt::Debug {
    /// `(reserved, used)`: `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`; `None` if the driver cannot say.
    fn pool_usage(&self, pool: usize) -> Option<(u64, u64)>;
    /// `cuMemPoolTrimTo(pool, 0)`: release every byte not in use.
    fn pool_trim(&self, pool: usize);
    /// `(reserved, used)` of the device's graph memory
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`, `..._USED_MEM_CURRENT`).
    fn graph_usage(&self, device: CUdevice) -> Option<(u64, u64)>;
    /// `cuDeviceGraphMemTrim(device)`.
    fn graph_trim(&self, device: CUdevice);
    /// The unit pools and graph memory grow in: what an admission charges
    /// up to before the call (the driver's answer settles it after).
    fn page(&self) -> u64 {
        crate::sizes::DEVICE_PAGE
    }
}

/// Contexts and what each was charged.
#[derive(Debug, Default)]
pub struct Contexts {
    /// `cuCtxCreate*` contexts: handle → (device index, bytes charged).
    pub created: HashMap<usize, (Option<usize>, u64)>,
    /// Primary contexts by `CUdevice`.
    pub primary: HashMap<CUdevice, Primary>,
}

/// A primary context's retain count as seen through the shim.
#[derive(Debug, Default, Clone, Copy)]
pub struct Primary {
    pub refs: u32,
    pub ctx: usize,
    pub index: Option<usize>,
    pub charged: u64,
}

pub(super) fn check(r: CUresult) -> Result<(), CUresult> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

impl Governed {
    pub fn new(files: &'static Files, devices: DeviceMap, hooks: Hooks) -> Self {
        Governed {
            files,
            devices,
            member: AtomicU64::new(0),
            join_lock: Mutex::new(()),
            op_locks: std::array::from_fn(|_| Mutex::new(())),
            ledger: Ledger::new(),
            contexts: Mutex::new(Contexts::default()),
            pools: Mutex::new(HashMap::new()),
            vmm: Mutex::new(Vmm::default()),
            books: Mutex::new(PoolBooks::default()),
            pool_slack: AtomicBool::new(false),
            graph_memory: AtomicBool::new(false),
            shared: Mutex::new(Shared::default()),
            sharing: AtomicBool::new(false),
            hooks,
            dead_quota_wait: DEAD_QUOTA_WAIT,
        }
    }

    /// The driver the pool and graph-memory accounting asks.
    pub fn pool_driver(&self) -> Option<&'static dyn PoolDriver> {
        self.hooks.pools
    }

    /// The allocation's index of a `CUdevice`.
    pub fn index_of(&self, dev: CUdevice) -> Option<usize> {
        self.devices.index_of(dev)
    }

    /// The allocation's index of the current context's device, and that
    /// context. The driver's error when there is no current context.
    pub fn current(&self) -> Result<(Option<usize>, CUcontext), CUresult> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        check(call_real!(cuCtxGetCurrent(&mut ctx)))?;
        if ctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        if self.devices.single() {
            return Ok((self.devices.only(), ctx));
        }
        let mut dev: CUdevice = 0;
        check(call_real!(cuCtxGetDevice(&mut dev)))?;
        Ok((self.index_of(dev), ctx))
    }

    /// The allocation's index of the device work on `stream` runs on.
    pub fn device_of_stream(&self, stream: CUstream) -> Option<usize> {
        if self.devices.single() {
            return self.devices.only();
        }
        self.index_of(self.stream_device(stream).ok()?)
    }

    /// The device work on `stream` runs on, whatever the current context:
    /// a stream belongs to the context it was created in. The null, legacy
    /// and per-thread streams are the current context's.
    // The stream is an opaque handle the driver checks; the shim never
    // dereferences it.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn stream_device(&self, stream: CUstream) -> Result<CUdevice, CUresult> {
        if self.devices.single() {
            return Ok(self.devices.visible()[0].device);
        }
        let mut dev: CUdevice = 0;
        if (stream as usize) > 2 {
            // CUDA 12.8 answers directly; older drivers through the
            // stream's context, made current for one query.
            if call_real!(cuStreamGetDevice(stream, &mut dev)) == CUresult::CUDA_SUCCESS {
                return Ok(dev);
            }
            let mut ctx: CUcontext = std::ptr::null_mut();
            if call_real!(cuStreamGetCtx(stream, &mut ctx)) == CUresult::CUDA_SUCCESS
                && !ctx.is_null()
            {
                check(call_real!(cuCtxPushCurrent_v2(ctx)))?;
                let r = call_real!(cuCtxGetDevice(&mut dev));
                let mut popped: CUcontext = std::ptr::null_mut();
                let _ = call_real!(cuCtxPopCurrent_v2(&mut popped));
                check(r)?;
                return Ok(dev);
            }
        }
        check(call_real!(cuCtxGetDevice(&mut dev)))?;
        Ok(dev)
    }

    /// Bytes this process holds on every device, from its slot.
    pub fn holds_nothing(&self, m: Member) -> bool {
        (0..MAX_DEVICES).all(|d| self.files.state.slot_usage(m.slot, d) == 0)
    }
}
