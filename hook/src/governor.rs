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
use crate::ledger::{Ledger, Vmm};
use crate::log::{self, Level};
use crate::table::{call_real, real};

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
            log::init(c.log_level, &c.log_file);
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
pub fn cuda_entry() -> Result<Option<&'static Governed>, CUresult> {
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
        Some(Ok(f)) => establish(f).map(Some),
    }
}

/// `cuInit` of a governed process: check the files before the driver sees
/// anything, initialise the driver, then map the devices and join.
pub fn cuda_init(flags: std::ffi::c_uint) -> CUresult {
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
    match establish(f) {
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

/// Maps the devices, creates the governor and joins, once.
fn establish(files: &'static Files) -> Result<&'static Governed, CUresult> {
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
    let g = GOVERNED.get_or_init(|| Governed::new(files, devices));
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
    pub fn new(files: &'static Files, devices: DeviceMap) -> Self {
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
        }
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
                crate::gate::on_join(self);
                Ok(self)
            }
            Err(e) => {
                report(&e.to_string());
                Err(CUDA_REFUSED)
            }
        }
    }

    /// Reserves `bytes` on device `index` before the driver allocates.
    /// Over the limit, the quota of dead processes is reclaimed and the
    /// reservation tried once more. A device outside the allocation has a
    /// limit of 0.
    pub fn reserve(&self, index: Option<usize>, bytes: u64) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(dev) = index else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        let m = self.member().ok_or(CUDA_REFUSED)?;
        let state = &self.files.state;
        let limit = self.files.control.memory_limit(dev);
        let _op = self.op_locks[dev].lock();
        match state.reserve(m, dev, bytes, limit) {
            Ok(()) => Ok(()),
            Err(e @ Refused::OverLimit { .. }) => {
                let back = state.reclaim_dead(&self.files.live, Some(m));
                if back.is_empty() {
                    crate::log!(Level::Info, "device {dev}: refused: {e}");
                    return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
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
                match state.reserve(m, dev, bytes, self.files.control.memory_limit(dev)) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        // One refused allocation counts once, not per try.
                        state
                            .device(dev)
                            .oom_refused
                            .fetch_sub(1, Ordering::Relaxed);
                        crate::log!(Level::Info, "device {dev}: refused: {e}");
                        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
                    }
                }
            }
            Err(e) => {
                crate::log!(Level::Info, "device {dev}: refused: {e}");
                Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            }
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

    /// The allocation's index of the device work on `stream` runs on. With
    /// one visible device no driver call is needed; otherwise it is the
    /// current context's device (a stream of another context is attributed
    /// to the current one).
    pub fn device_of_stream(&self, _stream: CUstream) -> Option<usize> {
        if self.devices.single() {
            return self.devices.only();
        }
        let mut dev: CUdevice = 0;
        if call_real!(cuCtxGetDevice(&mut dev)) != CUresult::CUDA_SUCCESS {
            return None;
        }
        self.index_of(dev)
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
// The order is the one the wrappers nest them in: contexts, pools, VMM,
// the per-device operation locks, the ledger's shards.

extern "C" fn fork_prepare() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        std::mem::forget(ESTABLISH.lock());
        let Some(g) = GOVERNED.get() else { return };
        std::mem::forget(g.join_lock.lock());
        std::mem::forget(g.contexts.lock());
        std::mem::forget(g.pools.lock());
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

    fn governed(limits: &[u64]) -> Governed {
        let files = leaked_files(limits);
        let devices = DeviceMap::new(
            (0..limits.len())
                .map(|i| (i as i32, files.control.uuid(i).to_owned()))
                .collect(),
            |u| files.find_uuid(u),
        );
        let g = Governed::new(files, devices);
        g.ensure_member().unwrap();
        g
    }

    #[test]
    fn reservations_stop_exactly_at_the_limit_and_release_returns_quota() {
        let g = governed(&[1000, 10]);
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
        let g = governed(&[1000]);
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
        let g = governed(&[1000]);
        let state = &g.files.state;
        // A process that died holding 800 bytes: a real, exited child.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = ProcIdentity {
            pid: child.id(),
            pidns: tessera_shm::process::pidns_of("self").unwrap(),
            start_time: 1,
        };
        child.wait().unwrap();
        struct Alive;
        impl tessera_shm::Liveness for Alive {
            fn check(&self, _: &ProcIdentity) -> Option<bool> {
                Some(true)
            }
        }
        let m = state.join(&dead, &Alive).unwrap();
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
        let g = governed(&[1000]);
        g.reserve(Some(0), 250).unwrap();
        assert_eq!(g.files.view(Some(0), 1 << 40), (1000, 250));
        assert_eq!(g.files.view(Some(0), 500), (500, 250));
        assert_eq!(g.files.view(None, 1 << 40), (0, 0));
    }
}
