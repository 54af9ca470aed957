//! The node state file: opening (and creating) it, and every operation on the shared
//! state: process slots, memory admission, the execution engine's timeline, XID events.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use crate::clock::now_ns;
use crate::config::{ConfigError, ENV_STATE, NodeConfig, Vendor, invalid, parse_size};
use crate::layout::*;
use crate::process::{is_alive, own_start_time};
/// The UUID spelling NVML, nvidia-smi and the control file share (the contract's),
/// re-exported for the tests that name a simulated device by UUID.
pub use tessera_contract::format_uuid;
use tessera_shm::sys::{futex_wait, futex_wake_all};

/// Why the node state cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("simulated node state {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error(
        "simulated node state {path}: {reason} (delete it, or set TESSERA_SIM_STATE to another file)"
    )]
    BadFile { path: PathBuf, reason: String },
    #[error("simulated node configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("all {MAX_PROCS} process slots of the simulated node are in use")]
    NoSlot,
    #[error("no simulated device {0}")]
    NoDevice(u32),
}

/// Device memory a CUDA context holds for itself (module images, stacks, the driver's
/// own allocations), set per node by this variable when the node is created from the
/// environment.
pub const ENV_CONTEXT_MEMORY: &str = "TESSERA_SIM_CONTEXT_MEMORY";

/// The default context memory of a node created from the environment: 518 MiB, what a
/// primary context held on the first real GPU Tessera ran on (an H200, driver 580, CUDA
/// 13.0, 2026-12-04: `cuMemGetInfo` inside a 4 GiB allocation showed 518 MiB used
/// before any allocation; NVML listed the process at 523 MiB). The simulator holds
/// 518 MiB in both views.
pub const DEFAULT_CONTEXT_MEMORY: u64 = 518 << 20;

/// How long the driver takes, per device, to tear down what an exited process held
/// (its contexts and memory), set per node by this variable when the node is created
/// from the environment: a duration (`20ms`), `0` for at once.
pub const ENV_CONTEXT_TEARDOWN: &str = "TESSERA_SIM_CONTEXT_TEARDOWN";

/// The default teardown of a node created from the environment: 20 ms per device a
/// process held something on. Assumed, not measured: on the H200 run, 29 of 32
/// processes that had all exited together were still listed by NVML with their memory
/// in one pass of the manager (docs/simulator.md, "Exited processes"), which shows the
/// driver frees an exited process's memory one process at a time and not at once, but
/// not how long each takes.
pub const DEFAULT_CONTEXT_TEARDOWN_NS: u64 = 20_000_000;

/// The context memory a node created from this environment gets.
pub fn context_memory_from_env() -> Result<u64, NodeError> {
    match std::env::var(ENV_CONTEXT_MEMORY) {
        Err(_) => Ok(DEFAULT_CONTEXT_MEMORY),
        Ok(v) => parse_size(&v).map_err(|e| NodeError::Config(invalid(ENV_CONTEXT_MEMORY, &v, e))),
    }
}

/// The teardown (ns per device) a node created from this environment gets.
pub fn context_teardown_from_env() -> Result<u64, NodeError> {
    match std::env::var(ENV_CONTEXT_TEARDOWN) {
        Err(_) => Ok(DEFAULT_CONTEXT_TEARDOWN_NS),
        Ok(v) if v.trim() == "0" => Ok(0),
        Ok(v) => tessera_contract::units::parse_duration(&v)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .map_err(|e| NodeError::Config(invalid(ENV_CONTEXT_TEARDOWN, &v, e))),
    }
}

/// What a node is created with beyond its devices: the driver's own figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DriverFigures {
    context_memory: u64,
    context_teardown_ns: u64,
}

/// A mapped node state file. Cheap to share between threads: everything in it is atomic.
#[derive(Debug)]
pub struct Node {
    state: NonNull<NodeState>,
    path: PathBuf,
}

// SAFETY: the mapping is only accessed through atomics and lives as long as the Node.
unsafe impl Send for Node {}
// SAFETY: as above; all shared access goes through atomic operations.
unsafe impl Sync for Node {}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: `state` is the start of a mapping of STATE_SIZE bytes made in `open`, and
        // no reference into it outlives `self`.
        unsafe { libc::munmap(self.state.as_ptr().cast(), STATE_SIZE) };
    }
}

/// The default state file: `$XDG_RUNTIME_DIR/tessera-sim/node`, else
/// `/tmp/tessera-sim-<uid>/node`.
pub fn default_state_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("tessera-sim/node"),
        _ => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/tessera-sim-{uid}/node"))
        }
    }
}

/// The state file this process uses: `TESSERA_SIM_STATE`, else the default.
pub fn state_path_from_env() -> PathBuf {
    match std::env::var_os(ENV_STATE) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => default_state_path(),
    }
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> NodeError + 'a {
    move |source| NodeError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

impl Node {
    /// Opens the node of this process's environment (`TESSERA_SIM_STATE` and the
    /// `TESSERA_SIM_*` configuration, used only if the file is created now).
    pub fn open_from_env() -> Result<Node, NodeError> {
        let path = state_path_from_env();
        // The configuration is only read to create the file; an existing file wins, so a
        // bad variable does not stop a process from joining an existing node.
        Self::open_with(&path, || {
            let config = NodeConfig::from_env().map_err(NodeError::from)?;
            let figures = DriverFigures {
                context_memory: context_memory_from_env()?,
                context_teardown_ns: context_teardown_from_env()?,
            };
            Ok((config, figures))
        })
    }

    /// Opens `path`, creating and initialising it from `config` if it does not exist yet.
    /// A node created here has no context memory until [`Node::set_context_memory`] and
    /// frees an exited process's memory at once until [`Node::set_context_teardown`] (the
    /// Rust API's nodes are the tests', which count bytes exactly).
    pub fn open(path: &Path, config: &NodeConfig) -> Result<Node, NodeError> {
        Self::open_with(path, || Ok((config.clone(), DriverFigures::default())))
    }

    /// Device memory each CUDA context created from now on holds for itself.
    pub fn context_memory(&self) -> u64 {
        self.state().header.context_memory.load(Ordering::Acquire)
    }

    /// Sets the memory each CUDA context created from now on holds (contexts that exist
    /// keep what they were charged).
    pub fn set_context_memory(&self, bytes: u64) {
        self.state()
            .header
            .context_memory
            .store(bytes, Ordering::Release);
    }

    /// How long (ns) the driver takes, per device, to tear down what an exited process
    /// held there; 0: its memory is free the moment it is gone.
    pub fn context_teardown(&self) -> u64 {
        self.state()
            .header
            .context_teardown_ns
            .load(Ordering::Acquire)
    }

    /// Sets the teardown per device of processes that exit from now on.
    pub fn set_context_teardown(&self, ns: u64) {
        self.state()
            .header
            .context_teardown_ns
            .store(ns, Ordering::Release);
    }

    fn open_with(
        path: &Path,
        config: impl FnOnce() -> Result<(NodeConfig, DriverFigures), NodeError>,
    ) -> Result<Node, NodeError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io(path, "creating its directory"))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io(path, "open"))?;
        let fd = file.as_raw_fd();
        // Creation and validation happen under an exclusive flock, so no opener sees a
        // half-initialised file; the lock is dropped with `file` at the end of this call.
        // SAFETY: `fd` is an open descriptor owned by `file`.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(io(path, "flock")(std::io::Error::last_os_error()));
        }
        let len = file.metadata().map_err(io(path, "stat"))?.len();
        if len == 0 {
            file.set_len(STATE_SIZE as u64)
                .map_err(io(path, "ftruncate"))?;
        } else if len != STATE_SIZE as u64 {
            return Err(NodeError::BadFile {
                path: path.to_path_buf(),
                reason: format!(
                    "size is {len} bytes, this build expects {STATE_SIZE} (another ABI version?)"
                ),
            });
        }
        // SAFETY: mapping `STATE_SIZE` bytes of a file that is exactly that long, shared and
        // read-write; the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io(path, "mmap")(std::io::Error::last_os_error()));
        }
        let node = Node {
            // SAFETY: mmap succeeded, so `ptr` is non-null and page-aligned.
            state: unsafe { NonNull::new_unchecked(ptr.cast()) },
            path: path.to_path_buf(),
        };
        // The mapping keeps the open file description alive, and with it the flock, so the
        // lock is dropped explicitly whatever the outcome.
        let result = node.validate_or_initialise(config);
        // SAFETY: `fd` is still open (owned by `file`).
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        drop(file);
        result.map(|()| node)
    }

    fn validate_or_initialise(
        &self,
        config: impl FnOnce() -> Result<(NodeConfig, DriverFigures), NodeError>,
    ) -> Result<(), NodeError> {
        let node = self;
        let path = &self.path;
        let header = &node.state().header;
        match header.magic.load(Ordering::Acquire) {
            // Never initialised, or its creator died half-way: we hold the lock, so finish.
            0 => {
                let (config, figures) = config()?;
                node.set_context_memory(figures.context_memory);
                node.set_context_teardown(figures.context_teardown_ns);
                node.initialise(&config);
            }
            MAGIC => {
                let abi = header.abi.load(Ordering::Relaxed);
                if abi != ABI_VERSION {
                    return Err(NodeError::BadFile {
                        path: path.to_path_buf(),
                        reason: format!("ABI version {abi}, this build uses {ABI_VERSION}"),
                    });
                }
            }
            other => {
                return Err(NodeError::BadFile {
                    path: path.to_path_buf(),
                    reason: format!("not a node state file (magic {other:#x})"),
                });
            }
        }
        Ok(())
    }

    fn initialise(&self, config: &NodeConfig) {
        let s = self.state();
        s.header.abi.store(ABI_VERSION, Ordering::Relaxed);
        s.header
            .device_count
            .store(config.devices, Ordering::Relaxed);
        s.header.size.store(STATE_SIZE as u64, Ordering::Relaxed);
        s.header.seed.store(config.seed, Ordering::Relaxed);
        s.header.created_ns.store(now_ns(), Ordering::Relaxed);
        for (i, d) in s.devices.iter().enumerate().take(config.devices as usize) {
            let gpu = config.gpu(i);
            d.memory_total
                .store(config.memory_per_device, Ordering::Relaxed);
            d.sms.store(gpu.units, Ordering::Relaxed);
            d.cc_major.store(gpu.cc_major, Ordering::Relaxed);
            d.cc_minor.store(gpu.cc_minor, Ordering::Relaxed);
            d.vendor.store(gpu.vendor as u32, Ordering::Relaxed);
            d.pci_domain.store(0, Ordering::Relaxed);
            d.pci_bus.store(0x18 + 0x10 * i as u32, Ordering::Relaxed);
            d.pci_device.store(0, Ordering::Relaxed);
            let uuid = device_uuid(config.seed, i as u32);
            d.uuid[0].store(
                u64::from_le_bytes(uuid[..8].try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
            d.uuid[1].store(
                u64::from_le_bytes(uuid[8..].try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
            store_str(&d.name, &gpu.name);
            store_str(&d.arch, &gpu.arch);
        }
        s.header.magic.store(MAGIC, Ordering::Release);
    }

    /// The raw shared state, for the simulated libraries.
    pub fn state(&self) -> &NodeState {
        // SAFETY: the mapping is valid for the Node's lifetime and NodeState holds only
        // atomics (and padding), for which any bit pattern, including zero, is valid.
        unsafe { self.state.as_ref() }
    }

    /// CLOCK_MONOTONIC ns when the node was created.
    pub fn created_ns(&self) -> u64 {
        self.state().header.created_ns.load(Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device_count(&self) -> u32 {
        self.state()
            .header
            .device_count
            .load(Ordering::Relaxed)
            .min(MAX_DEVICES as u32)
    }

    /// The device's shared state, if `index` names one.
    pub fn device(&self, index: u32) -> Result<&DeviceState, NodeError> {
        if index < self.device_count() {
            Ok(&self.state().devices[index as usize])
        } else {
            Err(NodeError::NoDevice(index))
        }
    }

    /// Static facts about a device.
    pub fn device_info(&self, index: u32) -> Result<DeviceInfo, NodeError> {
        let d = self.device(index)?;
        let uuid = device_uuid_bytes(d);
        Ok(DeviceInfo {
            index,
            name: load_str(&d.name),
            vendor: self.vendor(index as usize).unwrap_or_default(),
            arch: load_str(&d.arch),
            uuid: format_uuid(&uuid),
            uuid_bytes: uuid,
            memory_total: d.memory_total.load(Ordering::Relaxed),
            sms: d.sms.load(Ordering::Relaxed),
            cc_major: d.cc_major.load(Ordering::Relaxed),
            cc_minor: d.cc_minor.load(Ordering::Relaxed),
            pci_domain: d.pci_domain.load(Ordering::Relaxed),
            pci_bus: d.pci_bus.load(Ordering::Relaxed),
            pci_device: d.pci_device.load(Ordering::Relaxed),
        })
    }

    /// Whose device `index` is; `None` past the node's devices.
    pub fn vendor(&self, index: usize) -> Option<Vendor> {
        if index >= self.device_count() as usize {
            return None;
        }
        // A word no build writes (a corrupt file) reads as NVIDIA: the vendor every device
        // had before the word existed.
        Some(
            Vendor::from_word(self.state().devices[index].vendor.load(Ordering::Relaxed))
                .unwrap_or_default(),
        )
    }

    /// The physical indices of `vendor`'s devices, in order: what that vendor's
    /// libraries number 0, 1, ... (each vendor's driver sees only its own GPUs).
    pub fn devices_of(&self, vendor: Vendor) -> Vec<u32> {
        (0..self.device_count())
            .filter(|&i| self.vendor(i as usize) == Some(vendor))
            .collect()
    }

    /// What the device is doing now.
    /// The engine's idle stretches on device `index` written since `since` (a previous
    /// read's `next`; 0 at first): see [`IdleLog`].
    pub fn idle_since(&self, index: u32, since: u64) -> Result<IdleRead, NodeError> {
        Ok(self.device(index)?.idle.read_since(since))
    }

    pub fn device_usage(&self, index: u32) -> Result<DeviceUsage, NodeError> {
        let d = self.device(index)?;
        let now = now_ns();
        Ok(DeviceUsage {
            memory_used: self.memory_used(index as usize),
            memory_total: d.memory_total.load(Ordering::Relaxed),
            busy_ns: d.busy_total_ns.load(Ordering::Acquire),
            busy_until_ns: d.busy_until.load(Ordering::Acquire),
            launches: d.launches.load(Ordering::Relaxed),
            lost: d.lost.load(Ordering::Acquire) != 0,
            utilization: d.busy.utilization(now, 1_000_000_000),
        })
    }

    fn slots(&self) -> &[ProcSlot] {
        let high = (self.state().header.procs_high.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        &self.state().procs[..high]
    }

    /// Claims (or finds again) this process's slot. Dead processes are reaped first.
    pub fn attach(&self) -> Result<usize, NodeError> {
        self.reap_dead();
        let pid = std::process::id();
        let start = own_start_time();
        for (i, slot) in self.slots().iter().enumerate() {
            if slot.owner.load(Ordering::Acquire) == SLOT_LIVE | u64::from(pid)
                && slot.start_time.load(Ordering::Acquire) == start
            {
                return Ok(i);
            }
        }
        let procs = &self.state().procs;
        for (i, slot) in procs.iter().enumerate() {
            if slot
                .owner
                .compare_exchange(
                    SLOT_FREE,
                    SLOT_CLAIMING | u64::from(pid),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                slot.clear_usage();
                slot.start_time.store(start, Ordering::Release);
                self.state()
                    .header
                    .procs_high
                    .fetch_max(i as u32 + 1, Ordering::AcqRel);
                slot.owner
                    .store(SLOT_LIVE | u64::from(pid), Ordering::Release);
                return Ok(i);
            }
        }
        Err(NodeError::NoSlot)
    }

    /// Gives this process's slot back (clean exit). What it still holds is the driver's to
    /// tear down: with a teardown time set ([`Node::set_context_teardown`]) the slot stays
    /// listed, with its memory, until the teardown is done; otherwise its memory returns
    /// to the devices at once.
    pub fn detach(&self, slot: usize) {
        let Some(s) = self.state().procs.get(slot) else {
            return;
        };
        let me = SLOT_LIVE | u64::from(std::process::id());
        if self.begin_teardown(s, me) {
            return;
        }
        if s.owner
            .compare_exchange(
                me,
                SLOT_REAPING | u64::from(std::process::id()),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            self.drop_shares(slot);
            s.clear_usage();
            s.owner.store(SLOT_FREE, Ordering::Release);
        }
    }

    /// The devices a slot holds something on (a context or memory).
    fn held_devices(&self, s: &ProcSlot) -> u32 {
        let contexts = s.contexts.load(Ordering::Acquire);
        (0..self.device_count() as usize)
            .filter(|&d| contexts & (1 << d) != 0 || s.memory[d].load(Ordering::SeqCst) > 0)
            .count() as u32
    }

    /// Moves a slot whose process has exited (owner word `owner`) to
    /// [`SLOT_EXITING`]: the driver tears exited processes down one at a time,
    /// node-wide, each taking the teardown time per device it held something on, and
    /// lists the process with its memory until its turn is done. Returns false (nothing
    /// changed) when there is nothing to tear down or no teardown time is set: the
    /// caller frees the slot at once.
    fn begin_teardown(&self, s: &ProcSlot, owner: u64) -> bool {
        let per_device = self.context_teardown();
        let devices = self.held_devices(s);
        if per_device == 0 || devices == 0 {
            return false;
        }
        let cost = per_device.saturating_mul(u64::from(devices));
        let queue = &self.state().header.teardown_until_ns;
        let now = now_ns();
        let mut cur = queue.load(Ordering::Acquire);
        let done = loop {
            let done = cur.max(now).saturating_add(cost);
            match queue.compare_exchange_weak(cur, done, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break done,
                Err(seen) => cur = seen,
            }
        };
        s.exit_done_ns.store(done, Ordering::Release);
        let pid = owner & 0xffff_ffff;
        if s.owner
            .compare_exchange(
                owner,
                SLOT_EXITING | pid,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            // Someone else (a reaper) took the slot meanwhile: theirs to settle. The
            // queue keeps the turn it gave us, as a driver busy a moment longer would.
            return true;
        }
        true
    }

    /// Frees the slots of processes that are gone (exited, killed, zombies): at once, or,
    /// with a teardown time set, once the driver has torn them down (until then NVML
    /// lists them with their memory, as the real driver does). Returns how many slots
    /// were freed.
    pub fn reap_dead(&self) -> usize {
        let me = u64::from(std::process::id());
        let now = now_ns();
        let mut reaped = 0;
        for (index, slot) in self.slots().iter().enumerate() {
            let owner = slot.owner.load(Ordering::Acquire);
            let pid = (owner & 0xffff_ffff) as u32;
            let dead = match owner & SLOT_STATE_MASK {
                SLOT_LIVE => {
                    if is_alive(pid, slot.start_time.load(Ordering::Acquire)) {
                        false
                    } else {
                        // Killed, or exited without the library's exit handler: the
                        // driver notices it now and queues its teardown.
                        !self.begin_teardown(slot, owner)
                    }
                }
                SLOT_EXITING => slot.exit_done_ns.load(Ordering::Acquire) <= now,
                // A claimer or reaper that died half-way: its pid is all we know.
                SLOT_CLAIMING | SLOT_REAPING => !is_alive(pid, 0),
                _ => false,
            };
            if dead
                && slot
                    .owner
                    .compare_exchange(
                        owner,
                        SLOT_REAPING | me,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                self.drop_shares(index);
                slot.clear_usage();
                slot.owner.store(SLOT_FREE, Ordering::Release);
                reaped += 1;
            }
        }
        reaped
    }

    /// Device memory in use: the sum of every process's holdings on the device.
    pub fn memory_used(&self, device: usize) -> u64 {
        self.slots()
            .iter()
            .map(|s| s.memory[device].load(Ordering::SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// Admits `bytes` of device memory for the process in `slot`, or returns false when the
    /// device is full (the caller reports CUDA_ERROR_OUT_OF_MEMORY).
    ///
    /// The reservation is added to the slot first and then checked against the sum of all
    /// slots, so a process killed at any instant holds exactly what its slot says and
    /// reaping the slot returns it. Two racing reservations can both see each other and
    /// both back off; they retry a few times before giving up.
    pub fn reserve_memory(&self, slot: usize, device: usize, bytes: u64) -> bool {
        let Some(s) = self.state().procs.get(slot) else {
            return false;
        };
        let Some(dev) = self.state().devices.get(device) else {
            return false;
        };
        let capacity = dev.memory_total.load(Ordering::Relaxed);
        let mut reaped = false;
        for attempt in 0..32u32 {
            s.memory[device].fetch_add(bytes, Ordering::SeqCst);
            if self.memory_used(device) <= capacity {
                return true;
            }
            s.memory[device].fetch_sub(bytes, Ordering::SeqCst);
            let others = self.memory_used(device);
            if others.saturating_add(bytes) > capacity {
                if !reaped {
                    reaped = true;
                    if self.reap_dead() > 0 {
                        continue;
                    }
                }
                return false;
            }
            // Another reservation was in flight; let it settle.
            if attempt < 4 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(u64::from(attempt)));
            }
        }
        false
    }

    /// Returns memory admitted by `reserve_memory`.
    pub fn release_memory(&self, slot: usize, device: usize, bytes: u64) {
        if let (Some(s), true) = (self.state().procs.get(slot), device < MAX_DEVICES) {
            let m = &s.memory[device];
            let mut cur = m.load(Ordering::SeqCst);
            loop {
                let next = cur.saturating_sub(bytes);
                match m.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return,
                    Err(seen) => cur = seen,
                }
            }
        }
    }

    // ---- memory shared between processes ----

    /// Locks one shared-object entry for the calling process; a lock held by a process
    /// that died is taken over.
    fn lock_shared(&self, index: usize) -> SharedGuard<'_> {
        let obj = &self.state().shared[index];
        let me = u64::from(std::process::id());
        let mut spins = 0u32;
        loop {
            match obj
                .lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return SharedGuard { obj },
                Err(holder) => {
                    spins += 1;
                    if spins.is_multiple_of(1024)
                        && !is_alive(holder as u32, 0)
                        && obj
                            .lock
                            .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return SharedGuard { obj };
                    }
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Registers memory of `bytes` on `device`, already charged to `slot`, as shared,
    /// keyed by `key` (the inode of its backing memfd). Returns its id, or `None` when the
    /// table is full.
    pub fn share_create(&self, slot: usize, device: usize, bytes: u64, key: u64) -> Option<u64> {
        if slot >= MAX_PROCS || device >= MAX_DEVICES {
            return None;
        }
        for i in 0..MAX_SHARED {
            if self.state().shared[i].id.load(Ordering::Acquire) != 0 {
                continue;
            }
            let g = self.lock_shared(i);
            if g.obj.id.load(Ordering::Acquire) != 0 {
                continue;
            }
            let id = self
                .state()
                .header
                .shared_seq
                .fetch_add(1, Ordering::AcqRel)
                + 1;
            for w in &g.obj.holders {
                w.store(0, Ordering::Relaxed);
            }
            g.obj.holders[slot / 64].store(1 << (slot % 64), Ordering::Relaxed);
            g.obj.key.store(key, Ordering::Relaxed);
            g.obj.bytes.store(bytes, Ordering::Relaxed);
            g.obj.device.store(device as u32, Ordering::Relaxed);
            g.obj.charged_slot.store(slot as u32 + 1, Ordering::Relaxed);
            g.obj.id.store(id, Ordering::Release);
            return Some(id);
        }
        None
    }

    /// The live shared object with `key`, if any.
    pub fn share_find(&self, key: u64) -> Option<SharedInfo> {
        self.state().shared.iter().find_map(|o| {
            let id = o.id.load(Ordering::Acquire);
            (id != 0 && o.key.load(Ordering::Acquire) == key).then(|| SharedInfo {
                id,
                key,
                device: o.device.load(Ordering::Relaxed) as usize,
                bytes: o.bytes.load(Ordering::Relaxed),
                charged_slot: o
                    .charged_slot
                    .load(Ordering::Relaxed)
                    .checked_sub(1)
                    .map(|s| s as usize),
                holders: (0..MAX_PROCS)
                    .filter(|&s| o.holders[s / 64].load(Ordering::Relaxed) & (1 << (s % 64)) != 0)
                    .collect(),
            })
        })
    }

    /// Every live shared object (ground truth for tests).
    pub fn shared_objects(&self) -> Vec<SharedInfo> {
        self.state()
            .shared
            .iter()
            .filter(|o| o.id.load(Ordering::Acquire) != 0)
            .filter_map(|o| self.share_find(o.key.load(Ordering::Acquire)))
            .collect()
    }

    fn shared_index(&self, id: u64) -> Option<usize> {
        self.state()
            .shared
            .iter()
            .position(|o| o.id.load(Ordering::Acquire) == id)
    }

    /// Adds `slot` as a holder of shared object `id` (an import): the memory is not
    /// charged again. Returns the object's device and size, or `None` if it is gone.
    pub fn share_join(&self, slot: usize, id: u64) -> Option<(usize, u64)> {
        if slot >= MAX_PROCS {
            return None;
        }
        let i = self.shared_index(id)?;
        let g = self.lock_shared(i);
        if g.obj.id.load(Ordering::Acquire) != id {
            return None;
        }
        g.obj.holders[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
        Some((
            g.obj.device.load(Ordering::Relaxed) as usize,
            g.obj.bytes.load(Ordering::Relaxed),
        ))
    }

    /// `slot` no longer holds shared object `id`. If the bytes were charged to it, the
    /// charge moves to another live holder, or, when none is left, leaves the device and
    /// the object is gone.
    pub fn share_leave(&self, slot: usize, id: u64) {
        if let Some(i) = self.shared_index(id) {
            let g = self.lock_shared(i);
            if g.obj.id.load(Ordering::Acquire) == id {
                self.leave_locked(g.obj, slot, true);
            }
        }
    }

    /// With the entry locked: removes `slot` from the holders and settles the charge.
    /// `uncharge` says whether the slot's own memory counter is to be lowered (not when
    /// the slot is being cleared anyway).
    fn leave_locked(&self, obj: &SharedObj, slot: usize, uncharge: bool) {
        obj.holders[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::AcqRel);
        if obj.charged_slot.load(Ordering::Relaxed) as usize != slot + 1 {
            return;
        }
        let device = obj.device.load(Ordering::Relaxed) as usize;
        let bytes = obj.bytes.load(Ordering::Relaxed);
        let heir = (0..MAX_PROCS).find(|&s| {
            obj.holders[s / 64].load(Ordering::Relaxed) & (1 << (s % 64)) != 0
                && self.state().procs[s].owner.load(Ordering::Acquire) & SLOT_STATE_MASK
                    == SLOT_LIVE
        });
        match heir {
            Some(h) => {
                // The heir is charged before the leaver is relieved, so the device never
                // counts the memory less than once.
                self.state().procs[h].memory[device].fetch_add(bytes, Ordering::SeqCst);
                obj.charged_slot.store(h as u32 + 1, Ordering::Relaxed);
            }
            None => {
                obj.charged_slot.store(0, Ordering::Relaxed);
                obj.id.store(0, Ordering::Release);
            }
        }
        if uncharge {
            self.release_memory(slot, device, bytes);
        }
    }

    /// A process slot is being cleared (exit, kill): it holds none of its shared objects
    /// any more.
    fn drop_shares(&self, slot: usize) {
        if slot >= MAX_PROCS {
            return;
        }
        let bit = 1u64 << (slot % 64);
        for i in 0..MAX_SHARED {
            let o = &self.state().shared[i];
            if o.id.load(Ordering::Acquire) == 0
                || o.holders[slot / 64].load(Ordering::Acquire) & bit == 0
            {
                continue;
            }
            let g = self.lock_shared(i);
            if g.obj.id.load(Ordering::Acquire) != 0 {
                self.leave_locked(g.obj, slot, false);
            }
        }
    }

    /// Marks whether the process in `slot` has a context on `device` (NVML lists it).
    pub fn set_context(&self, slot: usize, device: usize, present: bool) {
        if let Some(s) = self.state().procs.get(slot) {
            let bit = 1u32 << device;
            if present {
                s.contexts.fetch_or(bit, Ordering::AcqRel);
            } else {
                s.contexts.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    /// Queues work of `duration_ns` from the process in `slot` on the device's one engine:
    /// it starts when the engine is free (never before `now`), so work from any process or
    /// stream never overlaps. Returns (start, end) on CLOCK_MONOTONIC.
    #[inline]
    pub fn schedule(&self, slot: usize, device: usize, now: u64, duration_ns: u64) -> (u64, u64) {
        self.schedule_after_gap(slot, device, now, duration_ns, 0)
    }

    /// [`Node::schedule`] with the device's kernel-to-kernel gap: the work starts no
    /// earlier than `gap_ns` after the engine's previous work ends (the time a real GPU
    /// takes between one kernel's end and the next's start). The gap is idle time: it is
    /// in nobody's busy time.
    #[inline]
    pub fn schedule_after_gap(
        &self,
        slot: usize,
        device: usize,
        now: u64,
        duration_ns: u64,
        gap_ns: u64,
    ) -> (u64, u64) {
        let dev = &self.state().devices[device];
        let s = &self.state().procs[slot];
        s.launches[device].fetch_add(1, Ordering::Relaxed);
        if duration_ns == 0 {
            // Nothing to occupy the engine with: done once what is queued before it is.
            let end = dev.busy_until.load(Ordering::Acquire).max(now);
            return (end, end);
        }
        let mut cur = dev.busy_until.load(Ordering::Acquire);
        let (start, end) = loop {
            // An engine never used (0) has no previous kernel to leave a gap after.
            let after = if cur == 0 {
                0
            } else {
                cur.saturating_add(gap_ns)
            };
            let start = after.max(now);
            let end = start.saturating_add(duration_ns);
            match dev.busy_until.compare_exchange_weak(
                cur,
                end,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break (start, end),
                Err(seen) => cur = seen,
            }
        };
        // The engine stood idle from the previous work's end (`cur`) to this start for
        // longer than the fixed gap: nothing was queued (see `IdleLog`).
        if cur != 0 && start - cur > gap_ns {
            dev.idle.push(cur, start);
        }
        dev.launches.fetch_add(1, Ordering::Relaxed);
        dev.busy_total_ns.fetch_add(duration_ns, Ordering::AcqRel);
        s.busy_ns[device].fetch_add(duration_ns, Ordering::AcqRel);
        dev.busy.add(now, start, end);
        s.busy[device].add(now, start, end);
        (start, end)
    }

    /// Per-process usage, for every live (or not yet reaped) process, and for every
    /// exited one the driver is still tearing down (`exiting`).
    pub fn processes(&self) -> Vec<ProcessUsage> {
        let n = self.device_count() as usize;
        let now = now_ns();
        self.slots()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let owner = s.owner.load(Ordering::Acquire);
                let exiting = match owner & SLOT_STATE_MASK {
                    SLOT_LIVE => false,
                    SLOT_EXITING => true,
                    _ => return None,
                };
                Some(ProcessUsage {
                    slot: i,
                    pid: (owner & 0xffff_ffff) as u32,
                    exiting,
                    contexts: s.contexts.load(Ordering::Acquire),
                    memory: (0..n).map(|d| s.memory[d].load(Ordering::SeqCst)).collect(),
                    busy_ns: (0..n)
                        .map(|d| s.busy_ns[d].load(Ordering::Acquire))
                        .collect(),
                    launches: (0..n)
                        .map(|d| s.launches[d].load(Ordering::Relaxed))
                        .collect(),
                    utilization: (0..n)
                        .map(|d| s.busy[d].utilization(now, 1_000_000_000))
                        .collect(),
                })
            })
            .collect()
    }

    /// The usage of one process, if it holds a slot.
    pub fn process(&self, pid: u32) -> Option<ProcessUsage> {
        self.processes().into_iter().find(|p| p.pid == pid)
    }

    /// Records an XID error on a device and wakes NVML event waiters.
    pub fn inject_xid(&self, device: u32, xid: u64) -> Result<(), NodeError> {
        let d = self.device(device)?;
        let seq = d.xid_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let rec = &d.xids[((seq - 1) % XID_RING as u64) as usize];
        rec.seq.store(0, Ordering::Release);
        rec.xid.store(xid, Ordering::Relaxed);
        rec.time_ns.store(now_ns(), Ordering::Relaxed);
        rec.seq.store(seq, Ordering::Release);
        let word = &self.state().header.event_seq;
        word.fetch_add(1, Ordering::AcqRel);
        futex_wake_all(word);
        Ok(())
    }

    /// XID events of `device` after sequence number `seen` (0: from the start), oldest
    /// first, and the sequence number to pass next time. Events overwritten in the ring
    /// before they were read are skipped.
    pub fn xid_events_since(&self, device: u32, seen: u64) -> (Vec<XidEvent>, u64) {
        let Ok(d) = self.device(device) else {
            return (Vec::new(), seen);
        };
        let last = d.xid_seq.load(Ordering::Acquire);
        let first = seen.max(last.saturating_sub(XID_RING as u64)) + 1;
        let mut events = Vec::new();
        for seq in first..=last {
            let rec = &d.xids[((seq - 1) % XID_RING as u64) as usize];
            let xid = rec.xid.load(Ordering::Relaxed);
            let time_ns = rec.time_ns.load(Ordering::Relaxed);
            if rec.seq.load(Ordering::Acquire) == seq {
                events.push(XidEvent {
                    device,
                    seq,
                    xid,
                    time_ns,
                });
            }
        }
        (events, last.max(seen))
    }

    /// The node-wide event counter; pass it to `wait_event` after a scan found nothing.
    pub fn event_seq(&self) -> u32 {
        self.state().header.event_seq.load(Ordering::Acquire)
    }

    /// Sleeps until the node-wide event counter moves from `seen` or `timeout_ns` passes.
    pub fn wait_event(&self, seen: u32, timeout_ns: u64) {
        futex_wait(&self.state().header.event_seq, seen, timeout_ns);
    }

    /// Marks a device lost (fallen off the bus, XID 79) or recovered.
    pub fn set_lost(&self, device: u32, lost: bool) -> Result<(), NodeError> {
        let d = self.device(device)?;
        let was = d.lost.swap(u32::from(lost), Ordering::AcqRel);
        if lost && was == 0 {
            self.inject_xid(device, 79)?;
        }
        Ok(())
    }

    pub fn is_lost(&self, device: usize) -> bool {
        self.state()
            .devices
            .get(device)
            .is_some_and(|d| d.lost.load(Ordering::Acquire) != 0)
    }
}

/// Writes `text` NUL-padded into `words` (truncated to leave one NUL).
fn store_str(words: &[std::sync::atomic::AtomicU64], text: &str) {
    let mut bytes = vec![0u8; words.len() * 8];
    let n = text.len().min(bytes.len() - 1);
    bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
    for (w, chunk) in words.iter().zip(bytes.chunks(8)) {
        w.store(
            u64::from_le_bytes(chunk.try_into().unwrap_or_default()),
            Ordering::Relaxed,
        );
    }
}

/// The NUL-terminated text `store_str` wrote.
fn load_str(words: &[std::sync::atomic::AtomicU64]) -> String {
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    bytes.truncate(end);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Device `index`'s UUID bytes for a node seed (splitmix64 of seed and index).
pub fn device_uuid(seed: u64, index: u32) -> [u8; 16] {
    let mut x = seed ^ (u64::from(index) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&next().to_be_bytes());
    out[8..].copy_from_slice(&next().to_be_bytes());
    out
}

fn device_uuid_bytes(d: &DeviceState) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&d.uuid[0].load(Ordering::Relaxed).to_le_bytes());
    out[8..].copy_from_slice(&d.uuid[1].load(Ordering::Relaxed).to_le_bytes());
    out
}

/// Parses a PCI bus id `[domain:]bus:device.function` (hex, any case, any domain width,
/// as CUDA and NVML write them) into (domain, bus, device).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let (rest, function) = s.trim().rsplit_once('.')?;
    u32::from_str_radix(function, 16).ok()?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

/// Unlocks a shared-object entry when dropped.
struct SharedGuard<'a> {
    obj: &'a SharedObj,
}

impl Drop for SharedGuard<'_> {
    fn drop(&mut self) {
        self.obj.lock.store(0, Ordering::Release);
    }
}

/// A shared device memory object, as the node state records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedInfo {
    pub id: u64,
    pub key: u64,
    /// Physical device index.
    pub device: usize,
    pub bytes: u64,
    /// The process slot the bytes are charged to.
    pub charged_slot: Option<usize>,
    /// Process slots holding it.
    pub holders: Vec<usize>,
}

/// Static facts about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: u32,
    /// The model's name (`NVIDIA H200`, `AMD Instinct MI210`).
    pub name: String,
    pub vendor: Vendor,
    /// AMD's architecture name (`gfx90a:sramecc+:xnack-`); empty for NVIDIA.
    pub arch: String,
    /// `GPU-...` form.
    pub uuid: String,
    pub uuid_bytes: [u8; 16],
    pub memory_total: u64,
    /// SMs (NVIDIA) or compute units (AMD).
    pub sms: u32,
    /// NVIDIA's compute capability; for AMD, HIP's major.minor of the architecture.
    pub cc_major: u32,
    pub cc_minor: u32,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

impl DeviceInfo {
    /// `00000000:18:00.0` form.
    pub fn pci_bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }
}

/// A device's activity now.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceUsage {
    pub memory_used: u64,
    pub memory_total: u64,
    /// Total duration of all work ever queued on the engine.
    pub busy_ns: u64,
    /// When the engine runs out of queued work (CLOCK_MONOTONIC ns).
    pub busy_until_ns: u64,
    pub launches: u64,
    pub lost: bool,
    /// Busy fraction over the last second.
    pub utilization: f64,
}

/// One process's holdings and work, indexed by device.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUsage {
    pub slot: usize,
    pub pid: u32,
    /// The process has exited and the driver is still tearing down what it held
    /// ([`Node::set_context_teardown`]).
    pub exiting: bool,
    /// Bit d: the process has a context on device d.
    pub contexts: u32,
    pub memory: Vec<u64>,
    pub busy_ns: Vec<u64>,
    pub launches: Vec<u64>,
    /// Busy fraction of each device due to this process over the last second.
    pub utilization: Vec<f64>,
}

/// An XID error recorded on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEvent {
    pub device: u32,
    pub seq: u64,
    pub xid: u64,
    pub time_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuSpec;

    fn node(devices: u32, memory: u64) -> (tempfile::TempDir, Node) {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = NodeConfig {
            devices,
            memory_per_device: memory,
            seed: 7,
            ..NodeConfig::default()
        };
        let node = Node::open(&dir.path().join("node"), &config).expect("open");
        (dir, node)
    }

    #[test]
    fn creates_then_reopens_with_the_files_config() {
        let (dir, a) = node(3, 1 << 30);
        assert_eq!(a.device_count(), 3);
        let other = NodeConfig {
            devices: 1,
            ..NodeConfig::default()
        };
        let b = Node::open(&dir.path().join("node"), &other).expect("reopen");
        assert_eq!(b.device_count(), 3, "existing file wins over config");
        assert_eq!(
            a.device_info(2).expect("dev").uuid,
            b.device_info(2).expect("dev").uuid
        );
        assert!(matches!(b.device(3), Err(NodeError::NoDevice(3))));
    }

    #[test]
    fn a_mixed_node_records_each_devices_vendor_and_shares_one_ground_truth() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = NodeConfig {
            memory_per_device: 1 << 30,
            seed: 7,
            gpus: vec![
                GpuSpec::amd(None),
                GpuSpec::nvidia(),
                GpuSpec::amd(Some("AMD Instinct MI300X")),
            ],
            devices: 3,
            ..NodeConfig::default()
        };
        let n = Node::open(&dir.path().join("node"), &config).expect("open");
        assert_eq!(n.devices_of(Vendor::Amd), vec![0, 2]);
        assert_eq!(n.devices_of(Vendor::Nvidia), vec![1]);
        assert_eq!(n.vendor(3), None);
        let amd = n.device_info(2).expect("dev2");
        assert_eq!(amd.vendor, Vendor::Amd);
        assert_eq!(amd.name, "AMD Instinct MI300X");
        assert_eq!(amd.arch, "gfx942:sramecc+:xnack-");
        assert_eq!((amd.sms, amd.cc_major, amd.cc_minor), (304, 9, 4));
        let nv = n.device_info(1).expect("dev1");
        assert_eq!((nv.vendor, nv.arch.as_str()), (Vendor::Nvidia, ""));
        assert_eq!(nv.name, "Tessera Simulated GPU");
        // The reopened file keeps what it was created with.
        let again = Node::open(&dir.path().join("node"), &NodeConfig::default()).expect("reopen");
        assert_eq!(
            again.device_info(0).expect("dev0").name,
            "AMD Instinct MI210"
        );
        // One ground truth: memory on an AMD device is admitted against its capacity and
        // counted per process like any other.
        let slot = n.attach().expect("slot");
        assert!(n.reserve_memory(slot, 0, 1 << 30));
        assert!(!n.reserve_memory(slot, 0, 1), "the AMD device is full");
        assert!(n.reserve_memory(slot, 1, 1), "the NVIDIA device is not");
        assert_eq!(n.memory_used(0), 1 << 30);
        let me = n.process(std::process::id()).expect("listed");
        assert_eq!(me.memory[0], 1 << 30);
        n.detach(slot);
    }

    #[test]
    fn uuids_are_stable_distinct_and_well_formed() {
        let (_d, n) = node(2, 1 << 30);
        let a = n.device_info(0).expect("dev0").uuid;
        let b = n.device_info(1).expect("dev1").uuid;
        assert_ne!(a, b);
        assert_eq!(a, format_uuid(&device_uuid(7, 0)));
        assert_eq!(a.len(), 40);
        let parts: Vec<_> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [3, 8, 4, 4, 4, 12]);
        assert!(a.starts_with("GPU-"));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node");
        std::fs::write(&path, b"not a state file").expect("write");
        let err = Node::open(&path, &NodeConfig::default()).expect_err("wrong size");
        assert!(err.to_string().contains("size is 16 bytes"), "{err}");

        std::fs::write(&path, vec![0xabu8; STATE_SIZE]).expect("write");
        let err = Node::open(&path, &NodeConfig::default()).expect_err("bad magic");
        assert!(err.to_string().contains("not a node state file"), "{err}");
        // Nothing was overwritten.
        assert_eq!(std::fs::read(&path).expect("read")[0], 0xab);
    }

    #[test]
    fn memory_admission_enforces_capacity_and_counts_per_process() {
        let (_d, n) = node(1, 1000);
        let slot = n.attach().expect("attach");
        assert_eq!(n.attach().expect("again"), slot, "same process, same slot");
        assert!(n.reserve_memory(slot, 0, 600));
        assert!(!n.reserve_memory(slot, 0, 401), "1001 > 1000");
        assert!(n.reserve_memory(slot, 0, 400));
        assert_eq!(n.memory_used(0), 1000);
        n.release_memory(slot, 0, 600);
        assert_eq!(n.memory_used(0), 400);
        let me = n.process(std::process::id()).expect("listed");
        assert_eq!(me.memory[0], 400);
        n.detach(slot);
        assert_eq!(n.memory_used(0), 0);
        assert!(n.process(std::process::id()).is_none());
    }

    #[test]
    fn dead_processes_are_reaped() {
        let (_d, n) = node(1, 1000);
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        // Forge a slot owned by the dead child holding memory.
        let slot = &n.state().procs[5];
        slot.memory[0].store(300, Ordering::SeqCst);
        slot.owner
            .store(SLOT_LIVE | u64::from(pid), Ordering::SeqCst);
        n.state().header.procs_high.fetch_max(6, Ordering::SeqCst);
        assert_eq!(n.memory_used(0), 300);
        assert_eq!(n.reap_dead(), 1);
        assert_eq!(n.memory_used(0), 0);
        assert_eq!(n.reap_dead(), 0);
    }

    #[test]
    fn exited_processes_stay_listed_until_the_driver_has_torn_them_down() {
        let (_d, n) = node(2, 1 << 30);
        n.set_context_teardown(200_000_000);
        // Two dead processes holding memory, noticed together: the driver takes them
        // one after the other, 200 ms per device each held something on.
        let mut dead = Vec::new();
        for _ in 0..2 {
            let mut child = std::process::Command::new("true").spawn().expect("spawn");
            dead.push(child.id());
            child.wait().expect("wait");
        }
        for (i, pid) in dead.iter().enumerate() {
            let slot = &n.state().procs[5 + i];
            slot.memory[0].store(300, Ordering::SeqCst);
            slot.memory[1].store(100 * (i as u64), Ordering::SeqCst);
            slot.owner
                .store(SLOT_LIVE | u64::from(*pid), Ordering::SeqCst);
        }
        n.state().header.procs_high.fetch_max(7, Ordering::SeqCst);
        let t0 = now_ns();
        assert_eq!(n.reap_dead(), 0, "noticed, not yet torn down");
        let listed: Vec<_> = n.processes().into_iter().filter(|p| p.exiting).collect();
        assert_eq!(listed.len(), 2, "NVML still lists both");
        assert_eq!(
            n.memory_used(0),
            600,
            "and the device still holds their memory"
        );
        let done: Vec<u64> = (5..7)
            .map(|i| n.state().procs[i].exit_done_ns.load(Ordering::SeqCst))
            .collect();
        assert!(done[0] >= t0 + 200_000_000, "one device: one teardown");
        assert!(
            done[1] >= done[0] + 400_000_000,
            "two devices, after the first"
        );
        // Once its turn is done, the first is freed; the second only after.
        while now_ns() < done[0] {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(n.reap_dead(), 1);
        assert_eq!(n.memory_used(0), 300);
        while now_ns() < done[1] {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(n.reap_dead(), 1);
        assert_eq!((n.memory_used(0), n.memory_used(1)), (0, 0));
        assert!(n.processes().is_empty());
    }

    #[test]
    fn a_clean_exit_is_torn_down_too_and_nothing_held_is_freed_at_once() {
        let (_d, n) = node(1, 1000);
        n.set_context_teardown(60_000_000_000);
        let slot = n.attach().expect("attach");
        assert!(n.reserve_memory(slot, 0, 400));
        n.detach(slot);
        let me = n.processes();
        assert_eq!(me.len(), 1);
        assert!(me[0].exiting && me[0].memory[0] == 400, "{me:?}");
        assert_eq!(n.memory_used(0), 400, "the driver still holds it");
        // A process holding nothing leaves no trace.
        n.state().procs[slot]
            .owner
            .store(SLOT_FREE, Ordering::SeqCst);
        n.state().procs[slot].clear_usage();
        let slot = n.attach().expect("attach again");
        n.detach(slot);
        assert!(n.processes().is_empty());
    }

    #[test]
    fn the_engine_serialises_work() {
        let (_d, n) = node(1, 1000);
        let slot = n.attach().expect("attach");
        let now = now_ns();
        let (s1, e1) = n.schedule(slot, 0, now, 1_000_000);
        let (s2, e2) = n.schedule(slot, 0, now, 2_000_000);
        assert_eq!(s1, now);
        assert_eq!(e1, now + 1_000_000);
        assert_eq!(s2, e1, "second waits for the first");
        assert_eq!(e2, e1 + 2_000_000);
        let (s0, e0) = n.schedule(slot, 0, now, 0);
        assert_eq!(
            (s0, e0),
            (e2, e2),
            "zero-length work completes after the queue"
        );
        let u = n.device_usage(0).expect("usage");
        assert_eq!(u.busy_ns, 3_000_000);
        assert_eq!(u.launches, 2);
        let p = n.process(std::process::id()).expect("me");
        assert_eq!(p.busy_ns[0], 3_000_000);
        assert_eq!(p.launches[0], 3);
    }
    #[test]
    fn a_gap_separates_back_to_back_work_and_is_idle() {
        let (_d, n) = node(1, 1000);
        let slot = n.attach().expect("attach");
        let now = now_ns();
        let (s1, e1) = n.schedule_after_gap(slot, 0, now, 1_000_000, 1_000);
        let (s2, e2) = n.schedule_after_gap(slot, 0, now, 1_000_000, 1_000);
        assert_eq!(s1, now, "an idle engine starts at once");
        assert_eq!(s2, e1 + 1_000, "the next kernel waits out the gap");
        assert_eq!(e2, s2 + 1_000_000);
        // Work queued long after the engine went idle is not delayed by the gap.
        let later = e2 + 5_000_000;
        let (s3, _) = n.schedule_after_gap(slot, 0, later, 1_000_000, 1_000);
        assert_eq!(s3, later);
        assert_eq!(n.device_usage(0).expect("usage").busy_ns, 3_000_000);
        // Only the stretch the engine stood idle past the fixed gap is logged, from the
        // previous work's end to the next's start.
        let idle = n.idle_since(0, 0).expect("idle");
        assert_eq!(idle.stretches, vec![(e2, later)]);
        assert_eq!((idle.next, idle.lost), (1, 0));
        assert!(
            n.idle_since(0, idle.next)
                .expect("idle")
                .stretches
                .is_empty()
        );
    }

    /// Forges a live slot owned by `pid` (with start time 0: any process with that pid).
    fn forge_slot(n: &Node, index: usize, pid: u32) {
        let slot = &n.state().procs[index];
        slot.owner
            .store(SLOT_LIVE | u64::from(pid), Ordering::SeqCst);
        n.state()
            .header
            .procs_high
            .fetch_max(index as u32 + 1, Ordering::SeqCst);
    }

    #[test]
    fn shared_memory_is_charged_once_and_moves_to_the_last_holder() {
        let (_d, n) = node(1, 1000);
        let a = n.attach().expect("attach");
        let b = a + 1;
        forge_slot(&n, b, std::process::id());
        assert!(n.reserve_memory(a, 0, 300));
        let id = n.share_create(a, 0, 300, 77).expect("a free entry");
        assert_eq!(n.share_join(b, id), Some((0, 300)));
        assert_eq!(n.memory_used(0), 300, "an import is not charged again");
        let info = n.share_find(77).expect("listed");
        assert_eq!(
            (info.holders.clone(), info.charged_slot),
            (vec![a, b], Some(a))
        );
        // The exporter lets go: the importer now carries the charge.
        n.share_leave(a, id);
        assert_eq!(n.memory_used(0), 300);
        assert_eq!(n.state().procs[a].memory[0].load(Ordering::SeqCst), 0);
        assert_eq!(n.state().procs[b].memory[0].load(Ordering::SeqCst), 300);
        n.share_leave(b, id);
        assert_eq!(n.memory_used(0), 0);
        assert!(n.share_find(77).is_none());
        assert_eq!(n.share_join(b, id), None, "gone for good");
    }

    #[test]
    fn a_dead_holder_hands_its_shared_charge_on() {
        let (_d, n) = node(1, 1000);
        let me = n.attach().expect("attach");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let ds = me + 3;
        forge_slot(&n, ds, dead);
        n.state().procs[ds].memory[0].store(400, Ordering::SeqCst);
        let id = n.share_create(ds, 0, 400, 5).expect("entry");
        n.share_join(me, id).expect("join");
        assert_eq!(n.reap_dead(), 1);
        assert_eq!(n.memory_used(0), 400, "still reachable by the importer");
        assert_eq!(n.share_find(5).expect("alive").charged_slot, Some(me));
        n.detach(me);
        assert_eq!(n.memory_used(0), 0);
        assert!(n.shared_objects().is_empty());
    }

    #[test]
    fn bus_ids_parse_in_both_forms() {
        assert_eq!(parse_bus_id("0000:18:00.0"), Some((0, 0x18, 0)));
        assert_eq!(parse_bus_id("00000000:2A:00.0"), Some((0, 0x2a, 0)));
        assert_eq!(parse_bus_id("2a:01.0"), Some((0, 0x2a, 1)));
        assert_eq!(parse_bus_id("zz:00.0"), None);
        assert_eq!(parse_bus_id("0000:18:00"), None);
        assert_eq!(parse_bus_id(""), None);
    }

    #[test]
    fn xid_events_are_recorded_in_order() {
        let (_d, n) = node(2, 1000);
        let seq0 = n.event_seq();
        n.inject_xid(1, 43).expect("inject");
        n.set_lost(1, true).expect("lost");
        assert!(n.is_lost(1));
        assert_ne!(n.event_seq(), seq0);
        let (events, seen) = n.xid_events_since(1, 0);
        assert_eq!(
            events.iter().map(|e| e.xid).collect::<Vec<_>>(),
            vec![43, 79]
        );
        assert_eq!(seen, 2);
        assert!(n.xid_events_since(1, seen).0.is_empty());
        assert!(n.xid_events_since(0, 0).0.is_empty());
        assert!(n.inject_xid(2, 1).is_err());
        n.set_lost(1, false).expect("recover");
        assert!(!n.is_lost(1));
    }
}
