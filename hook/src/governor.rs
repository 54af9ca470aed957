//! Whether and how this process is governed: the configuration (read once),
//! the allocation's files (opened once; any fault fails closed with one
//! line on stderr), the membership (joined at `cuInit`, re-joined in a
//! forked child), admission against the limits, and what happens at exit.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use parking_lot::Mutex;
use tessera_ffi::cuda::{CUcontext, CUdevice, CUresult, CUstream, CUuuid};
use tessera_shm::layout::MAX_DEVICES;
use tessera_shm::{Control, LocalLiveness, Member, ProcIdentity, Refused, ShmError, State};

use crate::config::{AllocFiles, Config};
use crate::devices::{DeviceMap, format_uuid, same_uuid};
use crate::ledger::{GraphMem, Ledger, PoolBooks, Shared, Vmm, growth};
use crate::log::{self, Level};
use crate::table::{call_real, real};

const CUDA_SUCCESS: CUresult = CUresult::CUDA_SUCCESS;

const UNKNOWN: u8 = 0;
const PASS: u8 = 1;
const GOVERNED_OK: u8 = 2;
const REFUSED: u8 = 3;

static CONFIG: OnceLock<Config> = OnceLock::new();
static FILES: OnceLock<Result<Files, String>> = OnceLock::new();
static GOVERNED: OnceLock<Governed> = OnceLock::new();
/// A summary of the above for the launch path: one load decides.
static STATUS: AtomicU8 = AtomicU8::new(UNKNOWN);
static ESTABLISH: Mutex<()> = Mutex::new(());
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The error every governed CUDA entry point returns when the process
/// fails closed: the driver was never initialised through the shim, and
/// this is what an uninitialised driver answers.
pub const CUDA_REFUSED: CUresult = CUresult::CUDA_ERROR_NOT_INITIALIZED;

/// The process's configuration, read from the environment on first use.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let c = Config::current();
        if c.log_level != Level::Off {
            log::init(c.log_level, &c.log_file, c.allocation_paths());
        }
        if let Some(complaint) = &c.log_complaint {
            crate::log!(Level::Info, "{complaint}");
        }
        if c.alloc.is_none() {
            STATUS.store(PASS, Ordering::Release);
        } else {
            install_process_hooks();
        }
        c
    })
}

/// The allocation's two files, open.
#[derive(Debug)]
pub struct Files {
    pub control: Control,
    pub state: State,
    pub live: LocalLiveness,
}

impl Files {
    /// Opens and checks both files; the error is the line to print.
    pub fn open(a: &AllocFiles) -> Result<Files, ShmError> {
        crate::config::check_regular(a)?;
        let control = Control::open(&a.control)?;
        let state = State::open(&a.state, control.alloc_id())?;
        Ok(Files {
            control,
            state,
            live: LocalLiveness::quick(),
        })
    }

    /// The control-file index of the device with this UUID.
    pub fn find_uuid(&self, uuid: &str) -> Option<usize> {
        (0..self.control.n_devices()).find(|&i| same_uuid(self.control.uuid(i), uuid))
    }

    /// What a device looks like from inside the allocation: the memory
    /// total (the limit, or the physical size if smaller) and what the
    /// allocation's processes have reserved. A device outside the
    /// allocation has a total of 0.
    pub fn view(&self, index: Option<usize>, physical_total: u64) -> (u64, u64) {
        match index {
            Some(i) => (
                self.control.memory_limit(i).min(physical_total),
                self.state.reserved(i),
            ),
            None => (0, 0),
        }
    }
}

/// Prints the one fail-closed line (once per process) and logs it.
fn report(reason: &str) {
    if !REPORTED.swap(true, Ordering::AcqRel) {
        log::stderr_line(&format!("tessera: GPU access refused: {reason}"));
    }
    crate::log!(Level::Error, "GPU access refused: {reason}");
}

/// The allocation's files: `None` for an ungoverned process, `Err` when
/// they are missing or bad (the process fails closed).
pub fn files() -> Option<Result<&'static Files, ()>> {
    let alloc = config().alloc.as_ref()?;
    let files = match FILES.get() {
        Some(f) => f,
        None => {
            // Initialised under ESTABLISH, which fork_prepare holds: a child
            // never inherits a half-finished initialisation it would wait
            // on forever.
            let _once = ESTABLISH.lock();
            FILES.get_or_init(|| Files::open(alloc).map_err(|e| e.to_string()))
        }
    };
    match files {
        Ok(f) => Some(Ok(f)),
        Err(reason) => {
            STATUS.store(REFUSED, Ordering::Release);
            report(reason);
            Some(Err(()))
        }
    }
}

/// What a launch wrapper does before submitting.
pub enum Launch {
    /// Ungoverned, or governed but not yet initialised: the driver decides.
    Pass,
    /// Governed and joined: the gate decides.
    Gate(&'static Governed),
    /// Governed with bad files: refused.
    Refuse,
}

/// The launch path's decision: one atomic load once the process is joined.
#[inline(always)]
pub fn for_launch() -> Launch {
    if let Some(g) = GOVERNED.get() {
        return Launch::Gate(g);
    }
    if STATUS.load(Ordering::Acquire) == PASS {
        return Launch::Pass;
    }
    launch_slow()
}

#[cold]
fn launch_slow() -> Launch {
    match files() {
        None | Some(Ok(_)) => match GOVERNED.get() {
            Some(g) => Launch::Gate(g),
            None => Launch::Pass,
        },
        Some(Err(())) => Launch::Refuse,
    }
}

/// For governed CUDA entry points other than `cuInit`: `Ok(None)` when the
/// process is ungoverned, the joined governor when governed, or the error
/// to return (fail closed, or the driver's own answer when it is not
/// initialised yet).
pub fn cuda_entry(hooks: &'static Hooks) -> Result<Option<&'static Governed>, CUresult> {
    if let Some(g) = GOVERNED.get() {
        // No membership: a forked child (or a process whose join failed)
        // that has not been through `cuInit` itself, which is also what the
        // driver requires of it. Only `cuInit` joins.
        return match g.member() {
            Some(_) => Ok(Some(g)),
            None => Err(CUDA_REFUSED),
        };
    }
    match files() {
        None => Ok(None),
        Some(Err(())) => Err(CUDA_REFUSED),
        Some(Ok(f)) => establish(f, hooks).map(Some),
    }
}

/// `cuInit` of a governed process: check the files before the driver sees
/// anything, initialise the driver, then map the devices and join.
pub fn cuda_init(flags: std::ffi::c_uint, hooks: &'static Hooks) -> CUresult {
    let start = (std::time::Instant::now(), thread_cpu_ns());
    let joined_before = GOVERNED.get().and_then(Governed::member).is_some();
    let f = match files() {
        None => return call_real!(cuInit(flags)),
        Some(Err(())) => return CUDA_REFUSED,
        Some(Ok(f)) => f,
    };
    let driver = (std::time::Instant::now(), thread_cpu_ns());
    let r = call_real!(cuInit(flags));
    if r != CUresult::CUDA_SUCCESS {
        return r;
    }
    let driver = (driver.0.elapsed(), thread_cpu_ns().saturating_sub(driver.1));
    match establish(f, hooks) {
        Ok(g) => {
            if !joined_before && let Some(m) = g.member() {
                // What joining cost this process, the driver's own cuInit
                // excluded (the bench reads this line).
                let wall = start.0.elapsed().saturating_sub(driver.0);
                let cpu = thread_cpu_ns()
                    .saturating_sub(start.1)
                    .saturating_sub(driver.1);
                crate::log!(
                    Level::Info,
                    "join: allocation {} slot {} wall_ns={} cpu_ns={}",
                    f.control.alloc_id(),
                    m.slot,
                    wall.as_nanos(),
                    cpu
                );
            }
            CUresult::CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; the clock id is valid on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn check(r: CUresult) -> Result<(), CUresult> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

/// The visible devices and their UUIDs, from the real driver.
fn discover(files: &Files) -> Result<DeviceMap, CUresult> {
    let mut n = 0;
    check(call_real!(cuDeviceGetCount(&mut n)))?;
    let mut list = Vec::with_capacity(n.max(0) as usize);
    for ordinal in 0..n {
        let mut dev: CUdevice = 0;
        check(call_real!(cuDeviceGet(&mut dev, ordinal)))?;
        let mut uuid = CUuuid::default();
        // _v2 gives a MIG instance its own UUID; v1 the parent GPU's.
        let r = match real::cuDeviceGetUuid_v2() {
            // SAFETY: a valid out-pointer and a device the driver gave.
            Some(f) => unsafe { f(&mut uuid, dev) },
            None => call_real!(cuDeviceGetUuid(&mut uuid, dev)),
        };
        check(r)?;
        let bytes: [u8; 16] = uuid.bytes.map(|b| b as u8);
        list.push((dev, format_uuid(&bytes)));
    }
    Ok(DeviceMap::new(list, |u| files.find_uuid(u)))
}

/// Maps the devices, creates the governor (handing it `hooks`) and joins,
/// once.
fn establish(files: &'static Files, hooks: &'static Hooks) -> Result<&'static Governed, CUresult> {
    let _once = ESTABLISH.lock();
    if let Some(g) = GOVERNED.get() {
        return g.ensure_member();
    }
    let devices = discover(files)?;
    for v in devices.visible() {
        crate::log!(
            Level::Debug,
            "device {} {} -> allocation index {:?}",
            v.device,
            v.uuid,
            v.index
        );
    }
    let g = GOVERNED.get_or_init(|| Governed::new(files, devices, *hooks));
    STATUS.store(GOVERNED_OK, Ordering::Release);
    g.ensure_member()
}

/// The state of one process's use of its allocation.
#[derive(Debug)]
pub struct Governed {
    pub files: &'static Files,
    pub devices: DeviceMap,
    /// Packed membership: 0 = not joined (yet, or again after fork).
    member: AtomicU64,
    join_lock: Mutex<()>,
    /// Serialises this process's operations on its slot, per device: the
    /// state file's protocol allows one operation per slot and device at
    /// a time (its intent word is single).
    op_locks: [Mutex<()>; MAX_DEVICES],
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
    hooks: Hooks,
}

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

/// The refusals of one admission, however many tries it took: the
/// device's `oom_refused` counter goes up by exactly one for an admission
/// finally refused, and not at all for one that got its memory.
#[derive(Debug, Default)]
struct Tries {
    over_limit: u64,
    refused_other: bool,
}

impl Tries {
    fn done(self, g: &Governed, dev: usize, ok: bool) -> Result<(), CUresult> {
        let counted = self.over_limit;
        let keep = u64::from(!ok && counted > 0);
        if counted > keep
            && let Some(d) = g.files.state.raw().devices.get(dev)
        {
            d.oom_refused.fetch_sub(counted - keep, Ordering::Relaxed);
        }
        if ok {
            Ok(())
        } else if self.refused_other && counted == 0 && g.member().is_none() {
            Err(CUDA_REFUSED)
        } else {
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

fn pack(m: Member) -> u64 {
    1 << 63 | u64::from(m.generation) << 32 | m.slot as u64
}

fn unpack(w: u64) -> Option<Member> {
    (w >> 63 == 1).then_some(Member {
        slot: (w & 0xffff_ffff) as usize,
        generation: ((w >> 32) & 0x7fff_ffff) as u32,
    })
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
        }
    }

    /// The driver the pool and graph-memory accounting asks.
    pub fn pool_driver(&self) -> Option<&'static dyn PoolDriver> {
        self.hooks.pools
    }

    pub fn member(&self) -> Option<Member> {
        unpack(self.member.load(Ordering::Acquire))
    }

    /// Joins if not joined (first use, or in a forked child).
    pub fn ensure_member(&self) -> Result<&Self, CUresult> {
        if self.member().is_some() {
            return Ok(self);
        }
        let _g = self.join_lock.lock();
        if self.member().is_some() {
            return Ok(self);
        }
        match self
            .files
            .state
            .join(&ProcIdentity::current(), &self.files.live)
        {
            Ok(m) => {
                self.member.store(pack(m), Ordering::Release);
                crate::log!(
                    Level::Debug,
                    "joined allocation {} in slot {}",
                    self.files.control.alloc_id(),
                    m.slot
                );
                (self.hooks.on_join)(self);
                Ok(self)
            }
            Err(e) => {
                report(&e.to_string());
                Err(CUDA_REFUSED)
            }
        }
    }

    /// Reserves `bytes` on device `index` before the driver allocates.
    /// Over the limit, the quota of dead processes is reclaimed, and this
    /// process's own pools and graph memory are trimmed of what they keep
    /// unused (a program that frees and allocates again must not see an
    /// out-of-memory a smaller GPU would not give it), and the reservation
    /// tried again. A device outside the allocation has a limit of 0.
    pub fn reserve(&self, index: Option<usize>, bytes: u64) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(dev) = index else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        let mut tries = Tries::default();
        if self.try_quota(dev, bytes, &mut tries).is_ok() {
            return tries.done(self, dev, true);
        }
        let room = match self.pool_driver() {
            Some(drv) => self.make_room(drv, &mut self.books.lock(), dev),
            None => false,
        };
        let ok = room && self.try_quota(dev, bytes, &mut tries).is_ok();
        tries.done(self, dev, ok)
    }

    /// One reservation on `dev`, and once more after reclaiming the quota
    /// of dead processes. Counts the refusals in `tries`.
    fn try_quota(&self, dev: usize, bytes: u64, tries: &mut Tries) -> Result<(), Refused> {
        self.wait_while_paused();
        let Some(m) = self.member() else {
            tries.refused_other = true;
            return Err(Refused::NoDevice(dev));
        };
        let state = &self.files.state;
        let _op = self.op_locks[dev].lock();
        match state.reserve(m, dev, bytes, self.files.control.memory_limit(dev)) {
            Ok(()) => Ok(()),
            Err(e @ Refused::OverLimit { .. }) => {
                tries.over_limit += 1;
                let back = state.reclaim_dead(&self.files.live, Some(m));
                if back.is_empty() {
                    crate::log!(Level::Info, "device {dev}: refused: {e}");
                    return Err(e);
                }
                for r in &back {
                    crate::log!(
                        Level::Info,
                        "reclaimed slot {} of dead pid {}: {:?}",
                        r.slot,
                        r.identity.pid,
                        r.freed
                    );
                }
                let r = state.reserve(m, dev, bytes, self.files.control.memory_limit(dev));
                if let Err(e) = r {
                    if matches!(e, Refused::OverLimit { .. }) {
                        tries.over_limit += 1;
                    }
                    crate::log!(Level::Info, "device {dev}: refused: {e}");
                }
                r
            }
            Err(e) => {
                tries.refused_other = true;
                crate::log!(Level::Info, "device {dev}: refused: {e}");
                Err(e)
            }
        }
    }

    /// Charges `bytes` the device already holds for this process (memory a
    /// pool or a graph launch took beyond what was reserved for it, which
    /// cannot be undone), whatever the limit: the books say what the device
    /// holds. Logged: it means a route took more than it was admitted for.
    fn force(&self, dev: usize, bytes: u64) {
        let Some(m) = self.member() else { return };
        let _op = self.op_locks[dev].lock();
        match self.files.state.reserve(m, dev, bytes, u64::MAX) {
            Ok(()) => crate::log!(
                Level::Warn,
                "device {dev}: the driver took {bytes} bytes more than admitted; charged"
            ),
            Err(e) => crate::log!(Level::Error, "device {dev}: charge failed: {e}"),
        }
    }

    /// Moves a pool's or graph memory's charge to `target` bytes (what the
    /// driver says it holds): a surplus is returned, a shortfall charged
    /// whatever the limit.
    fn settle_charge(&self, dev: Option<usize>, charged: &mut u64, target: u64) {
        if *charged > target {
            self.release(dev, *charged - target);
            *charged = target;
        } else if target > *charged {
            if let Some(d) = dev {
                self.force(d, target - *charged);
            }
            *charged = target;
        }
    }

    /// Brings pool `id`'s charge to what the driver says it has reserved.
    /// Returns `(reserved, used)`, or `None` when the driver cannot say.
    fn reconcile_pool(
        &self,
        drv: &dyn PoolDriver,
        books: &mut PoolBooks,
        id: u64,
    ) -> Option<(u64, u64)> {
        let p = books.pools.get_mut(&id)?;
        if p.destroyed {
            return None;
        }
        let (reserved, used) = drv.pool_usage(p.handle)?;
        let (dev, mut charged) = (p.dev, p.charged);
        self.settle_charge(dev, &mut charged, reserved);
        p.charged = charged;
        Some((reserved, used))
    }

    /// Brings the graph-memory charge of `device` to what the driver says
    /// it has reserved.
    fn reconcile_graph(&self, drv: &dyn PoolDriver, books: &mut PoolBooks, device: CUdevice) {
        let Some((reserved, _)) = drv.graph_usage(device) else {
            return;
        };
        let dev = self.index_of(device);
        let g = books
            .graph
            .entry(device)
            .or_insert(GraphMem { dev, charged: 0 });
        let mut charged = g.charged;
        self.settle_charge(dev, &mut charged, reserved);
        g.charged = charged;
    }

    /// Every pool's charge brought to what the driver holds (after a
    /// synchronisation, where pools give back what exceeds their release
    /// threshold, or before the memory view is shown).
    pub fn reconcile_pools(&self) {
        let Some(drv) = self.pool_driver() else {
            return;
        };
        let mut books = self.books.lock();
        self.pool_slack.store(false, Ordering::Release);
        let ids: Vec<u64> = books.pools.keys().copied().collect();
        for id in ids {
            self.reconcile_pool(drv, &mut books, id);
        }
    }

    /// Trims this process's pools and graph memory on `dev` of what they
    /// keep unused, and returns the quota. Whether anything came back.
    fn make_room(&self, drv: &dyn PoolDriver, books: &mut PoolBooks, dev: usize) -> bool {
        // Exported memory kept for an importer may be closed by now.
        let back = self.sharing.load(Ordering::Acquire) && (self.hooks.settle_shared)(self);
        let before = books.charged_on(dev);
        for id in books.pools_on(dev) {
            if let Some(p) = books.pools.get(&id) {
                drv.pool_trim(p.handle);
            }
            self.reconcile_pool(drv, books, id);
        }
        let graphs: Vec<CUdevice> = books
            .graph
            .iter()
            .filter(|(_, g)| g.dev == Some(dev))
            .map(|(&d, _)| d)
            .collect();
        for device in graphs {
            drv.graph_trim(device);
            self.reconcile_graph(drv, books, device);
        }
        let after = books.charged_on(dev);
        if after < before {
            crate::log!(
                Level::Info,
                "device {dev}: trimmed own pools and graph memory: {} bytes back",
                before - after
            );
        }
        back || after < before
    }

    /// Admission of an allocation of `bytes` from pool `pool` on `device`:
    /// the pool is charged what it must grow by (what its unused reserve
    /// lacks), then, after the driver's call, exactly what it holds. If
    /// it grew by more than admitted and the rest does not fit, `undo(ptr)`
    /// frees the allocation again and the caller gets out-of-memory.
    /// `ptr` reads the allocation's address after a successful call.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_alloc(
        &self,
        drv: &dyn PoolDriver,
        pool: usize,
        device: CUdevice,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        ptr: impl FnOnce() -> u64,
        undo: impl FnOnce(u64),
    ) -> CUresult {
        let index = self.index_of(device);
        let mut books = self.books.lock();
        let id = books.pool(pool, index, device);
        let mut tries = Tries::default();
        let mut grow = 0;
        let mut admitted = false;
        for attempt in 0..2 {
            let charged = books.pools.get(&id).map_or(0, |p| p.charged);
            let (reserved, used) = self
                .reconcile_pool(drv, &mut books, id)
                .unwrap_or((charged, charged));
            grow = growth(reserved, used, bytes);
            if grow == 0 {
                admitted = true;
                break;
            }
            let Some(dev) = index else { break };
            if self.try_quota(dev, grow, &mut tries).is_ok() {
                admitted = true;
                break;
            }
            if attempt == 0 && !self.make_room(drv, &mut books, dev) {
                break;
            }
        }
        if let Some(dev) = index
            && let Err(e) = tries.done(self, dev, admitted)
        {
            return e;
        }
        if !admitted {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
        let r = call();
        let Some(p) = books.pools.get_mut(&id) else {
            return r;
        };
        if r != CUDA_SUCCESS {
            self.release(index, grow);
            return r;
        }
        p.charged += grow;
        let (handle, dev, charged) = (p.handle, p.dev, p.charged);
        let addr = ptr();
        let held = drv
            .pool_usage(handle)
            .map_or(charged, |(reserved, _)| reserved);
        if held > charged {
            // Grew by more than its reserve lacked (fragmentation, the
            // driver's granularity): admit the rest, or undo.
            let fits = dev.is_some_and(|d| {
                let mut t = Tries::default();
                let ok = self.try_quota(d, held - charged, &mut t).is_ok();
                let _ = t.done(self, d, ok);
                ok
            });
            if !fits {
                undo(addr);
                drv.pool_trim(handle);
                self.reconcile_pool(drv, &mut books, id);
                return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            }
        } else if held < charged {
            self.release(dev, charged - held);
        }
        if let Some(p) = books.pools.get_mut(&id) {
            p.charged = held;
        }
        books.live.insert(addr, (id, bytes));
        r
    }

    /// A free of `ptr` if it came from a pool: `None` when it did not (the
    /// caller frees it its own way). The pool keeps the memory, charged,
    /// until the driver says it gave it back; a destroyed pool's memory
    /// returns with the free.
    pub fn pool_free(&self, ptr: u64, call: impl FnOnce() -> CUresult) -> Option<CUresult> {
        let mut books = self.books.lock();
        let (id, bytes) = books.live.remove(&ptr)?;
        let r = call();
        if r != CUDA_SUCCESS {
            books.live.insert(ptr, (id, bytes));
            return Some(r);
        }
        let destroyed = books.pools.get(&id).is_none_or(|p| p.destroyed);
        if destroyed {
            self.settle_destroyed(&mut books, id);
        } else {
            self.pool_slack.store(true, Ordering::Release);
        }
        Some(r)
    }

    /// `cuMemPoolDestroy`: the driver releases the pool's unused reserve at
    /// once; memory of live allocations stays until they are freed.
    pub fn pool_destroy(&self, pool: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let mut books = self.books.lock();
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        if let Some(id) = books.destroyed(pool) {
            self.settle_destroyed(&mut books, id);
        }
        r
    }

    /// A destroyed pool (its reserve released by the driver) stays charged
    /// for its live allocations only, and is forgotten once none is left.
    fn settle_destroyed(&self, books: &mut PoolBooks, id: u64) {
        let left = books.live_bytes(id);
        if let Some(p) = books.pools.get_mut(&id) {
            let (dev, mut charged) = (p.dev, p.charged);
            self.settle_charge(dev, &mut charged, left);
            p.charged = charged;
        }
        if left == 0 {
            books.pools.remove(&id);
        }
    }

    /// A pool operation that may release memory (`cuMemPoolTrimTo`, a
    /// lowered release threshold): the call, then the pool reconciled.
    pub fn pool_changed(&self, pool: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS
            && let Some(drv) = self.pool_driver()
        {
            let mut books = self.books.lock();
            if let Some(&id) = books.by_handle.get(&pool) {
                self.reconcile_pool(drv, &mut books, id);
            }
        }
        r
    }

    /// Whether the process has used graph memory (graph launches are then
    /// accounted).
    pub fn graph_memory_used(&self) -> bool {
        self.graph_memory.load(Ordering::Acquire)
    }

    /// A graph gained an allocation node of `bytes` on `device`.
    pub fn graph_alloc_node(&self, graph: usize, device: CUdevice, bytes: u64) {
        self.graph_memory.store(true, Ordering::Release);
        let mut books = self.books.lock();
        let list = books.graphs.entry(graph).or_default();
        crate::ledger::add_bytes(list, device, bytes);
    }

    /// `graph` copied into `to` (a clone, or an instantiation: `exec`).
    pub fn graph_copied(&self, graph: usize, to: usize, exec: bool) {
        if !self.graph_memory.load(Ordering::Acquire) {
            return;
        }
        let mut books = self.books.lock();
        let Some(bytes) = books.graphs.get(&graph).cloned() else {
            return;
        };
        if exec {
            books.execs.insert(to, crate::ledger::ExecRec { bytes });
        } else {
            books.graphs.insert(to, bytes);
        }
    }

    /// A graph or an executable graph destroyed.
    pub fn graph_gone(&self, handle: usize, exec: bool) {
        if !self.graph_memory.load(Ordering::Acquire) {
            return;
        }
        let mut books = self.books.lock();
        if exec {
            books.execs.remove(&handle);
        } else {
            books.graphs.remove(&handle);
        }
    }

    /// Launch or upload of `exec`: the memory its allocation nodes map is
    /// admitted first: what the device's graph memory would have to grow by
    /// (its live allocations plus this graph's, less what it has reserved;
    /// nothing when a freed reserve covers it, as for a graph launched
    /// again after its allocation was freed). Graphs share the reserve, so
    /// an earlier launch or upload of this graph proves nothing. After the
    /// call, the charge follows what the driver has reserved.
    pub fn graph_launch(&self, exec: usize, call: impl FnOnce() -> CUresult) -> CUresult {
        if !self.graph_memory.load(Ordering::Acquire) {
            return call();
        }
        let Some(drv) = self.pool_driver() else {
            return call();
        };
        let mut books = self.books.lock();
        let Some(e) = books.execs.get(&exec).cloned() else {
            drop(books);
            return call();
        };
        // Admitted so far: (device, index, bytes).
        let mut admitted: Vec<(CUdevice, Option<usize>, u64)> = Vec::new();
        let undo = |books: &mut PoolBooks, admitted: &[(CUdevice, Option<usize>, u64)]| {
            for &(device, index, grow) in admitted {
                if let Some(g) = books.graph.get_mut(&device) {
                    g.charged -= grow;
                }
                self.release(index, grow);
            }
        };
        {
            for &(device, bytes) in &e.bytes {
                let index = self.index_of(device);
                // What the device's graph memory must grow by, asked again
                // after a trim (which leaves less to reuse).
                let need = |books: &mut PoolBooks| {
                    self.reconcile_graph(drv, books, device);
                    let (reserved, used) = drv.graph_usage(device).unwrap_or((0, 0));
                    growth(reserved, used, bytes)
                };
                let mut grow = need(&mut books);
                let ok = match index {
                    _ if grow == 0 => true,
                    None => false,
                    Some(dev) => {
                        let mut t = Tries::default();
                        let mut ok = self.try_quota(dev, grow, &mut t).is_ok();
                        if !ok && self.make_room(drv, &mut books, dev) {
                            grow = need(&mut books);
                            ok = self.try_quota(dev, grow, &mut t).is_ok();
                        }
                        let _ = t.done(self, dev, ok);
                        ok
                    }
                };
                if !ok {
                    undo(&mut books, &admitted);
                    return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
                }
                let g = books.graph.entry(device).or_insert(GraphMem {
                    dev: index,
                    charged: 0,
                });
                g.charged += grow;
                admitted.push((device, index, grow));
            }
        }
        let r = call();
        if r != CUDA_SUCCESS {
            undo(&mut books, &admitted);
            return r;
        }
        for &(device, _) in &e.bytes {
            self.reconcile_graph(drv, &mut books, device);
        }
        r
    }

    /// `cuDeviceGraphMemTrim` by the program: mappings are gone, charges
    /// follow the driver.
    pub fn graph_trimmed(&self, device: CUdevice) {
        let Some(drv) = self.pool_driver() else {
            return;
        };
        let mut books = self.books.lock();
        self.reconcile_graph(drv, &mut books, device);
    }

    /// Blocks the calling thread while the allocation is paused (`tessera
    /// pause`): memory requests wait here, as launches do at the gate,
    /// rather than fail.
    #[inline]
    pub fn wait_while_paused(&self) {
        let control = &self.files.control;
        if control.paused() {
            control.wait_while_paused();
        }
    }

    /// Returns `bytes` on device `index` reserved earlier by this process.
    pub fn release(&self, index: Option<usize>, bytes: u64) {
        let (Some(dev), Some(m)) = (index, self.member()) else {
            return;
        };
        if bytes == 0 {
            return;
        }
        let _op = self.op_locks[dev].lock();
        if let Err(e) = self.files.state.release(m, dev, bytes) {
            crate::log!(Level::Error, "device {dev}: release failed: {e}");
        }
    }

    /// Settles a reservation made with an estimate to the real size: gives
    /// back the surplus, or reserves the shortfall (which may be refused).
    pub fn settle(&self, index: Option<usize>, reserved: u64, real: u64) -> Result<(), CUresult> {
        if real > reserved {
            self.reserve(index, real - reserved)
        } else {
            self.release(index, reserved - real);
            Ok(())
        }
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
            if call_real!(cuStreamGetDevice(stream, &mut dev)) == CUDA_SUCCESS {
                return Ok(dev);
            }
            let mut ctx: CUcontext = std::ptr::null_mut();
            if call_real!(cuStreamGetCtx(stream, &mut ctx)) == CUDA_SUCCESS && !ctx.is_null() {
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

/// The governor, once joined (for the gate and tests).
pub fn governed() -> Option<&'static Governed> {
    GOVERNED.get()
}

static HOOKS: OnceLock<()> = OnceLock::new();

fn install_process_hooks() {
    HOOKS.get_or_init(|| {
        // SAFETY: registers functions of this library, which is never
        // unloaded (a preloaded object stays for the process's life).
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        }
    });
}

/// At exit a process that holds nothing leaves its slot. One that still
/// holds memory keeps it: the driver frees that memory only as the process
/// dies, after exit handlers, and returning the quota earlier would let
/// another process allocate it first. Its quota is reclaimed once it is
/// gone (by the next process that joins, an allocation over the limit, or
/// the manager).
extern "C" fn at_exit() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(g) = GOVERNED.get() else { return };
        let Some(m) = g.member() else { return };
        // Another thread mid-operation: leave the slot for reclaim.
        let Some(_j) = g.join_lock.try_lock() else {
            return;
        };
        let held: Vec<_> = g.op_locks.iter().map_while(|l| l.try_lock()).collect();
        if held.len() != MAX_DEVICES {
            return;
        }
        if g.holds_nothing(m) {
            g.files.state.leave(m);
            g.member.store(0, Ordering::Release);
        }
    }));
}

// Every lock of the governor is held across fork(), so the child never
// inherits one that a thread of the parent, absent in the child, held.
// The order is the one the wrappers nest them in: contexts, pools, pool
// books, shared memory, VMM, the per-device operation locks, the ledger's
// shards.

extern "C" fn fork_prepare() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        std::mem::forget(ESTABLISH.lock());
        let Some(g) = GOVERNED.get() else { return };
        std::mem::forget(g.join_lock.lock());
        std::mem::forget(g.contexts.lock());
        std::mem::forget(g.pools.lock());
        std::mem::forget(g.books.lock());
        std::mem::forget(g.shared.lock());
        std::mem::forget(g.vmm.lock());
        for l in &g.op_locks {
            std::mem::forget(l.lock());
        }
        for s in g.ledger.shards() {
            std::mem::forget(s.lock());
        }
    }));
}

/// Releases what `fork_prepare` took.
///
/// # Safety
///
/// Only after `fork_prepare` locked every lock, in the same process.
unsafe fn unlock_all(g: &Governed) {
    // SAFETY: (all below) fork_prepare locked each of these and forgot its
    // guard; this is the one matching unlock, with the stateless marker a
    // parking_lot acquisition carries.
    unsafe {
        for s in g.ledger.shards() {
            s.force_unlock(Default::default());
        }
        for l in &g.op_locks {
            l.force_unlock(Default::default());
        }
        g.vmm.force_unlock(Default::default());
        g.shared.force_unlock(Default::default());
        g.books.force_unlock(Default::default());
        g.pools.force_unlock(Default::default());
        g.contexts.force_unlock(Default::default());
        g.join_lock.force_unlock(Default::default());
    }
}

extern "C" fn fork_parent() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: fork_prepare ran in this process just before and took
        // ESTABLISH, and every lock of the governor if there is one.
        unsafe {
            if let Some(g) = GOVERNED.get() {
                unlock_all(g);
            }
            ESTABLISH.force_unlock(Default::default());
        }
    }));
}

/// The child is a new process: it holds no allocation of its parent (CUDA
/// state is not inherited), so it forgets them, and joins again, in a slot
/// of its own, if it calls `cuInit` (the driver requires that too).
extern "C" fn fork_child() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(g) = GOVERNED.get() else {
            // SAFETY: fork_prepare took ESTABLISH in the parent; this thread
            // is its continuation in the child.
            unsafe { ESTABLISH.force_unlock(Default::default()) };
            return;
        };
        g.member.store(0, Ordering::Release);
        // SAFETY: this thread holds every lock (taken in fork_prepare and
        // inherited); the child has no other thread to race with.
        unsafe {
            for s in g.ledger.shards() {
                (*s.data_ptr()).clear();
            }
            *g.contexts.data_ptr() = Contexts::default();
            (*g.pools.data_ptr()).clear();
            (*g.vmm.data_ptr()).clear();
            (*g.books.data_ptr()).clear();
            *g.shared.data_ptr() = Shared::default();
            unlock_all(g);
            ESTABLISH.force_unlock(Default::default());
        }
    }));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};

    pub(crate) fn leaked_files(limits: &[u64]) -> &'static Files {
        let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
        let spec = ControlSpec::new(
            "test-alloc",
            limits
                .iter()
                .enumerate()
                .map(|(i, &l)| DeviceSpec {
                    uuid: format!("GPU-0000000{i}-0000-0000-0000-000000000000"),
                    memory_limit_bytes: l,
                    compute_share_ppm: 1_000_000,
                    policy: Policy::Burst,
                })
                .collect(),
        );
        let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
        Box::leak(Box::new(
            Files::open(&AllocFiles {
                control: c,
                state: s,
            })
            .unwrap(),
        ))
    }

    fn governed(limits: &[u64], hooks: Hooks) -> Governed {
        let files = leaked_files(limits);
        let devices = DeviceMap::new(
            (0..limits.len())
                .map(|i| (i as i32, files.control.uuid(i).to_owned()))
                .collect(),
            |u| files.find_uuid(u),
        );
        let g = Governed::new(files, devices, hooks);
        g.ensure_member().unwrap();
        g
    }

    #[test]
    fn reservations_stop_exactly_at_the_limit_and_release_returns_quota() {
        let g = governed(&[1000, 10], Hooks::NONE);
        assert_eq!(g.reserve(Some(0), 600), Ok(()));
        assert_eq!(g.reserve(Some(0), 400), Ok(()));
        assert_eq!(
            g.reserve(Some(0), 1),
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(g.files.state.reserved(0), 1000);
        g.release(Some(0), 400);
        assert_eq!(g.files.state.reserved(0), 600);
        assert_eq!(
            g.reserve(Some(1), 11),
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(g.files.state.oom_refused(1), 1);
        // A device outside the allocation has no quota, but zero bytes
        // cost nothing anywhere.
        assert_eq!(g.reserve(None, 1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(g.reserve(None, 0), Ok(()));
        g.files.state.audit().unwrap();
    }

    #[test]
    fn settling_an_estimate_moves_to_the_real_size() {
        let g = governed(&[1000], Hooks::NONE);
        g.reserve(Some(0), 512).unwrap();
        g.settle(Some(0), 512, 300).unwrap();
        assert_eq!(g.files.state.reserved(0), 300);
        g.settle(Some(0), 300, 900).unwrap();
        assert_eq!(g.files.state.reserved(0), 900);
        assert_eq!(
            g.settle(Some(0), 900, 1001),
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(g.files.state.reserved(0), 900);
    }

    #[test]
    fn over_the_limit_the_quota_of_dead_processes_is_reclaimed() {
        let g = governed(&[1000], Hooks::NONE);
        let state = &g.files.state;
        // A process that died holding 800 bytes: a real, exited child.
        let dead = tessera_shm::testing::exited_process();
        let m = state
            .join(&dead, &tessera_shm::testing::AssumeAlive)
            .unwrap();
        state.reserve(m, 0, 800, 1000).unwrap();
        assert_eq!(state.reserved(0), 800);
        // 300 more fit only once the dead process's 800 come back.
        assert_eq!(g.reserve(Some(0), 300), Ok(()));
        assert_eq!(state.reserved(0), 300);
        state.audit().unwrap();
    }

    #[test]
    fn members_pack() {
        for m in [
            Member {
                slot: 0,
                generation: 0,
            },
            Member {
                slot: 1023,
                generation: (1 << 30) - 1,
            },
        ] {
            assert_eq!(unpack(pack(m)), Some(m));
        }
        assert_eq!(unpack(0), None);
    }

    #[test]
    fn the_view_is_the_limit_capped_by_the_device() {
        let g = governed(&[1000], Hooks::NONE);
        g.reserve(Some(0), 250).unwrap();
        assert_eq!(g.files.view(Some(0), 1 << 40), (1000, 250));
        assert_eq!(g.files.view(Some(0), 500), (500, 250));
        assert_eq!(g.files.view(None, 1 << 40), (0, 0));
    }

    /// A driver's pools as the CUDA documentation describes them: a pool
    /// takes from the device what its unused reserve lacks (rounded up to
    /// `grain`), keeps freed memory, gives back what exceeds its release
    /// threshold at a synchronisation, and all unused memory when trimmed.
    #[derive(Debug, Default)]
    struct FakePools {
        // pool → (reserved, used, threshold)
        pools: Mutex<HashMap<usize, (u64, u64, u64)>>,
        graph: Mutex<(u64, u64)>,
        grain: u64,
    }

    impl FakePools {
        fn new(grain: u64) -> &'static FakePools {
            Box::leak(Box::new(FakePools {
                grain,
                ..FakePools::default()
            }))
        }
        fn alloc(&self, pool: usize, bytes: u64) {
            let mut p = self.pools.lock();
            let e = p.entry(pool).or_default();
            let lack = growth(e.0, e.1, bytes);
            if lack > 0 {
                e.0 += lack.div_ceil(self.grain.max(1)) * self.grain.max(1);
            }
            e.1 += bytes;
        }
        fn free(&self, pool: usize, bytes: u64) {
            self.pools.lock().get_mut(&pool).unwrap().1 -= bytes;
        }
        fn threshold(&self, pool: usize, t: u64) {
            self.pools.lock().entry(pool).or_default().2 = t;
        }
        fn sync(&self) {
            for e in self.pools.lock().values_mut() {
                e.0 = e.0.min(e.1.max(e.2));
            }
        }
        /// Ground truth: what the device holds for pools and graphs.
        fn held(&self) -> u64 {
            self.pools.lock().values().map(|e| e.0).sum::<u64>() + self.graph.lock().0
        }
    }

    impl PoolDriver for FakePools {
        fn pool_usage(&self, pool: usize) -> Option<(u64, u64)> {
            self.pools
                .lock()
                .get(&pool)
                .map(|e| (e.0, e.1))
                .or(Some((0, 0)))
        }
        fn pool_trim(&self, pool: usize) {
            if let Some(e) = self.pools.lock().get_mut(&pool) {
                e.0 = e.1;
            }
        }
        fn graph_usage(&self, _device: CUdevice) -> Option<(u64, u64)> {
            Some(*self.graph.lock())
        }
        fn graph_trim(&self, _device: CUdevice) {
            let mut g = self.graph.lock();
            g.0 = g.1;
        }
    }

    /// A process governed with a 1000-byte limit on one device whose pools
    /// are `FakePools` of `grain`.
    fn with_pools(grain: u64) -> (Governed, &'static FakePools) {
        let d = FakePools::new(grain);
        let hooks = Hooks {
            pools: Some(d),
            ..Hooks::NONE
        };
        (governed(&[1000], hooks), d)
    }

    fn pool_alloc(g: &Governed, d: &FakePools, pool: usize, bytes: u64) -> CUresult {
        g.pool_alloc(
            d,
            pool,
            0,
            bytes,
            || {
                d.alloc(pool, bytes);
                CUresult::CUDA_SUCCESS
            },
            || (pool as u64) << 32 | d.pools.lock()[&pool].1,
            |_| d.free(pool, bytes),
        )
    }

    #[test]
    fn pool_memory_counts_until_the_pool_gives_it_back() {
        let (g, d) = with_pools(1);
        d.threshold(1, u64::MAX);
        assert_eq!(pool_alloc(&g, d, 1, 768), CUresult::CUDA_SUCCESS);
        let ptr = 1 << 32 | 768;
        assert_eq!(g.files.state.reserved(0), 768);
        let r = g.pool_free(ptr, || {
            d.free(1, 768);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(r, Some(CUresult::CUDA_SUCCESS));
        d.sync();
        g.reconcile_pools();
        // The pool keeps it (its threshold is maximal): still charged.
        assert_eq!(g.files.state.reserved(0), 768);
        assert_eq!(d.held(), 768);
        // Allocating again from the pool reuses the reserve: no growth.
        assert_eq!(pool_alloc(&g, d, 1, 768), CUresult::CUDA_SUCCESS);
        assert_eq!(g.files.state.reserved(0), 768);
        g.pool_free(1 << 32 | 768, || {
            d.free(1, 768);
            CUresult::CUDA_SUCCESS
        });
        // Plain memory past what is left: the pool is trimmed first, and
        // the program gets its memory (no spurious out-of-memory).
        assert_eq!(g.reserve(Some(0), 768), Ok(()));
        assert_eq!(d.held(), 0);
        assert_eq!(g.files.state.reserved(0), 768);
        assert_eq!(g.files.state.oom_refused(0), 0, "no refusal was final");
        // And past the limit for real: refused, counted once.
        assert_eq!(
            g.reserve(Some(0), 300),
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(g.files.state.oom_refused(0), 1);
        g.files.state.audit().unwrap();
    }

    #[test]
    fn many_pools_that_keep_everything_stay_under_the_limit() {
        let (g, d) = with_pools(1);
        for pool in 1..=10usize {
            d.threshold(pool, u64::MAX);
            assert_eq!(pool_alloc(&g, d, pool, 400), CUresult::CUDA_SUCCESS);
            let held = d.pools.lock()[&pool].1;
            g.pool_free((pool as u64) << 32 | held, || {
                d.free(pool, 400);
                CUresult::CUDA_SUCCESS
            });
            d.sync();
            assert!(d.held() <= 1000, "pool {pool}: device holds {}", d.held());
            assert_eq!(g.files.state.reserved(0), d.held());
        }
        // Live allocations cannot be trimmed: past the limit is refused.
        assert_eq!(pool_alloc(&g, d, 1, 700), CUresult::CUDA_SUCCESS);
        assert_eq!(
            pool_alloc(&g, d, 2, 400),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY
        );
        assert!(d.held() <= 1000);
        g.files.state.audit().unwrap();
    }

    #[test]
    fn a_pool_that_grows_by_more_than_admitted_is_undone_if_the_rest_does_not_fit() {
        let (g, d) = with_pools(256);
        // 100 bytes take a 256-byte grain: charged 256.
        assert_eq!(pool_alloc(&g, d, 1, 100), CUresult::CUDA_SUCCESS);
        assert_eq!(g.files.state.reserved(0), 256);
        assert_eq!(g.reserve(Some(0), 700), Ok(()));
        // 44 left; 100 more fit in the pool's reserve: no growth.
        assert_eq!(pool_alloc(&g, d, 1, 100), CUresult::CUDA_SUCCESS);
        assert_eq!(g.files.state.reserved(0), 956);
        // 40 admitted (44 left), but the grain makes it 256: undone.
        assert_eq!(pool_alloc(&g, d, 1, 96), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(d.pools.lock()[&1].1, 200, "the allocation was freed");
        assert!(d.held() + 700 <= 1000);
        assert_eq!(g.files.state.reserved(0), d.held() + 700);
        g.files.state.audit().unwrap();
    }

    #[test]
    fn a_destroyed_pool_keeps_its_live_allocations_charged_until_freed() {
        let (g, d) = with_pools(1);
        d.threshold(5, u64::MAX);
        pool_alloc(&g, d, 5, 300);
        pool_alloc(&g, d, 5, 200);
        g.pool_free(5 << 32 | 300, || {
            d.free(5, 300);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(g.files.state.reserved(0), 500);
        g.pool_destroy(5, || {
            // The driver frees the reserve; the handle is no longer the
            // pool's (it lives on under another name until its last free).
            d.pool_trim(5);
            let e = d.pools.lock().remove(&5).unwrap();
            d.pools.lock().insert(1005, e);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(g.files.state.reserved(0), 200, "the reserve went back");
        // The handle comes back for a new pool while 200 still live.
        pool_alloc(&g, d, 5, 100);
        assert_eq!(g.files.state.reserved(0), 300);
        let freed = g.pool_free(5 << 32 | 500, || {
            d.pools.lock().remove(&1005);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(freed, Some(CUresult::CUDA_SUCCESS));
        assert_eq!(g.files.state.reserved(0), 100);
        assert_eq!(g.pool_free(0xdead, || CUresult::CUDA_SUCCESS), None);
        g.files.state.audit().unwrap();
    }

    #[test]
    fn graph_memory_is_charged_at_launch_and_returned_when_trimmed() {
        let (g, d) = with_pools(1);
        let launch = |g: &Governed| {
            g.graph_launch(0xe, || {
                let mut m = d.graph.lock();
                m.1 = 600;
                m.0 = m.0.max(600);
                CUresult::CUDA_SUCCESS
            })
        };
        g.graph_alloc_node(0x9, 0, 600);
        g.graph_copied(0x9, 0xe, true);
        assert_eq!(launch(&g), CUresult::CUDA_SUCCESS);
        assert_eq!(g.files.state.reserved(0), 600);
        // Its allocation freed, the reserve stays: launched again, it
        // takes nothing more, even with too little left for a first one.
        d.graph.lock().1 = 0;
        assert_eq!(g.reserve(Some(0), 400), Ok(()));
        assert_eq!(launch(&g), CUresult::CUDA_SUCCESS);
        assert_eq!(g.files.state.reserved(0), 1000);
        // The graph's allocation freed, the program allocates: the graph
        // memory is trimmed to make room.
        d.graph.lock().1 = 0;
        g.release(Some(0), 400);
        assert_eq!(g.reserve(Some(0), 900), Ok(()));
        assert_eq!(d.held(), 0);
        assert_eq!(g.files.state.reserved(0), 900);
        // Relaunch needs its 600 again: refused, nothing launched.
        assert_eq!(launch(&g), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(g.files.state.reserved(0), 900);
        g.files.state.audit().unwrap();
    }

    #[test]
    fn a_launch_refused_until_a_trim_is_admitted_for_what_it_needs_after_it() {
        let (g, d) = with_pools(1);
        // Graph memory holds 600, 300 of them live; plain memory 300.
        g.graph_alloc_node(0x9, 0, 600);
        g.graph_copied(0x9, 0xe, true);
        let launch = |g: &Governed, exec: usize, bytes: u64| {
            g.graph_launch(exec, || {
                let mut m = d.graph.lock();
                m.0 = m.0.max(m.1 + bytes);
                m.1 += bytes;
                CUresult::CUDA_SUCCESS
            })
        };
        assert_eq!(launch(&g, 0xe, 600), CUresult::CUDA_SUCCESS);
        d.graph.lock().1 = 300;
        assert_eq!(g.reserve(Some(0), 300), Ok(()));
        // A 500-byte graph: 200 past the spare before a trim, 500 after
        // it; neither fits.
        g.graph_alloc_node(0xa, 0, 500);
        g.graph_copied(0xa, 0xf, true);
        assert_eq!(launch(&g, 0xf, 500), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(d.held() + 300 <= 1000, "device holds {}", d.held() + 300);
        assert_eq!(g.files.state.reserved(0), d.held() + 300);
        g.files.state.audit().unwrap();
    }
}
