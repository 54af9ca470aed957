//! Whether and how this process is governed: the configuration (read
//! once), the allocation's files (opened once; any fault fails closed with
//! one line on stderr), the launch path's one-load decision, `cuInit` and
//! the other entry points, which map the devices and set the governor up
//! once with the hooks its callers hand it, and the fork and exit handlers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use tessera_ffi::cuda::{CUdevice, CUresult, CUuuid};

use super::files::Files;
use super::governed::{Governed, Hooks, check};
use super::join::{CUDA_REFUSED, report};
use crate::config::Config;
use crate::devices::{CUDA_VISIBLE_DEVICES, DeviceMap, format_uuid, pinned_visible};
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
    pin_visible(f);
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

/// Points `CUDA_VISIBLE_DEVICES` at the allocation's GPUs before the
/// driver reads it (at its `cuInit`), so that the driver itself enumerates
/// only them, numbered from 0, on every route (`cuDeviceGetCount`,
/// `cuDeviceGet`, by PCI bus id or UUID, contexts): the allocation's GPUs
/// come from the control file, which the tenant cannot write, and the
/// environment, which is the tenant's, may only narrow them (see
/// [`pinned_visible`]).
fn pin_visible(files: &Files) {
    let alloc: Vec<&str> = (0..files.control.n_devices())
        .map(|i| files.control.uuid(i))
        .collect();
    let spec = std::env::var_os(CUDA_VISIBLE_DEVICES);
    let spec = spec.as_ref().map(|s| s.to_string_lossy());
    let want = pinned_visible(spec.as_deref(), &alloc);
    if spec.as_deref() == Some(want.as_str()) {
        return;
    }
    crate::log!(
        Level::Info,
        "{CUDA_VISIBLE_DEVICES}={spec:?} set to {want:?}: the allocation's GPUs"
    );
    // SAFETY: setenv is unsound only against another thread reading or
    // writing the environment at the same instant. This runs inside the
    // process's cuInit, before the driver reads the variable, where a
    // program is still setting up; glibc never frees an environment string,
    // so a concurrent getenv sees the old value or the new one.
    unsafe { std::env::set_var(CUDA_VISIBLE_DEVICES, &want) };
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

/// See [`Governed::at_exit`].
extern "C" fn at_exit() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(g) = GOVERNED.get() {
            g.at_exit();
        }
    }));
}

// Across fork() the process's own lock (ESTABLISH) is held too, so a child
// never inherits a half-finished set-up that it would wait on forever.

extern "C" fn fork_prepare() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        std::mem::forget(ESTABLISH.lock());
        if let Some(g) = GOVERNED.get() {
            g.lock_all();
        }
    }));
}

extern "C" fn fork_parent() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: fork_prepare ran in this process just before and took
        // ESTABLISH, and every lock of the governor if there is one.
        unsafe {
            if let Some(g) = GOVERNED.get() {
                g.unlock_all();
            }
            ESTABLISH.force_unlock(Default::default());
        }
    }));
}

extern "C" fn fork_child() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: fork_prepare took ESTABLISH and every lock of the governor
        // in the parent; this thread is its continuation in the child, and
        // the child has no other thread.
        unsafe {
            if let Some(g) = GOVERNED.get() {
                g.forget_parent();
            }
            ESTABLISH.force_unlock(Default::default());
        }
    }));
}
