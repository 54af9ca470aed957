//! The control file: an allocation's limits, written by the manager and
//! mounted read-only into the container.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tessera_contract::units::FULL_COMPUTE_PPM;

use crate::layout::*;
use crate::map::Mapping;
use crate::pause::PauseWords;
use crate::{ShmError, crc32};

/// Device memory a bare [`ControlSpec::new`] charges per CUDA context:
/// none, so that a spec built by hand (tests, tools) counts only what is
/// allocated. It is not the node's default: the manager writes every
/// control file with what a context holds (measured at its start, else its
/// own `DEFAULT_CONTEXT_OVERHEAD`, 518 MiB), since no charge would let a
/// process that makes many contexts pass its limit through the driver's own
/// use.
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 0;
/// Default wait for a silent arbiter before a gate runs free.
pub const DEFAULT_GATE_TIMEOUT_NS: u64 = 2_000_000_000;

/// Compute policy of one device of an allocation (defined with its names
/// in the shared contract).
pub use tessera_contract::Policy;

/// One GPU of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub uuid: String,
    pub memory_limit_bytes: u64,
    /// Parts per million of the GPU's time; 1_000_000 = the whole GPU.
    pub compute_share_ppm: u32,
    pub policy: Policy,
}

/// Everything the control file says about an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSpec {
    pub alloc_id: String,
    pub devices: Vec<DeviceSpec>,
    /// What every context is charged where no measured figure is given.
    pub context_overhead_bytes: u64,
    /// What a context holds on each device (by index, as `devices`), as the
    /// manager measured it; `None` (or a shorter list) where not measured.
    pub context_bytes: Vec<Option<u64>>,
    pub gate_timeout_ns: u64,
}

impl ControlSpec {
    /// A spec with default overhead and gate timeout.
    pub fn new(alloc_id: impl Into<String>, devices: Vec<DeviceSpec>) -> Self {
        ControlSpec {
            alloc_id: alloc_id.into(),
            devices,
            context_overhead_bytes: DEFAULT_CONTEXT_OVERHEAD,
            context_bytes: Vec::new(),
            gate_timeout_ns: DEFAULT_GATE_TIMEOUT_NS,
        }
    }

    /// Checks what a reader would otherwise refuse.
    pub fn validate(&self) -> Result<(), ShmError> {
        let bad = |reason: String| Err(ShmError::BadSpec(reason));
        if self.alloc_id.is_empty() || self.alloc_id.len() >= ID_LEN {
            return bad(format!(
                "allocation id must be 1..{} bytes, got {:?}",
                ID_LEN - 1,
                self.alloc_id
            ));
        }
        if self.devices.is_empty() || self.devices.len() > MAX_DEVICES {
            return bad(format!(
                "an allocation spans 1..={MAX_DEVICES} devices, got {}",
                self.devices.len()
            ));
        }
        for (i, d) in self.devices.iter().enumerate() {
            if d.uuid.is_empty() || d.uuid.len() >= UUID_LEN || !d.uuid.is_ascii() {
                return bad(format!("device {i}: bad UUID {:?}", d.uuid));
            }
            if self.devices[..i].iter().any(|o| o.uuid == d.uuid) {
                return bad(format!("device {i}: UUID {} listed twice", d.uuid));
            }
            if d.memory_limit_bytes > MAX_BYTES {
                return bad(format!(
                    "device {i}: memory limit {} exceeds {MAX_BYTES}",
                    d.memory_limit_bytes
                ));
            }
            if let Some(Some(b)) = self.context_bytes.get(i)
                && *b >= CONTEXT_MEASURED
            {
                return bad(format!("device {i}: context size {b} is not a size"));
            }
            if d.compute_share_ppm == 0 || d.compute_share_ppm > FULL_COMPUTE_PPM {
                return bad(format!(
                    "device {i}: compute share {} ppm is not in 1..=1000000",
                    d.compute_share_ppm
                ));
            }
        }
        Ok(())
    }
}

fn put_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    dst[..s.len()].copy_from_slice(s.as_bytes());
}

fn get_str(src: &[u8]) -> Option<&str> {
    let end = src.iter().position(|&b| b == 0)?;
    let s = std::str::from_utf8(&src[..end]).ok()?;
    // Nothing but NULs may follow the string: anything else is corruption.
    src[end..].iter().all(|&b| b == 0).then_some(s)
}

fn identity_crc(n_devices: u32, alloc_id: &[u8; ID_LEN], uuids: &[[u8; UUID_LEN]]) -> u32 {
    let mut buf = Vec::with_capacity(4 + ID_LEN + uuids.len() * UUID_LEN);
    buf.extend_from_slice(&n_devices.to_le_bytes());
    buf.extend_from_slice(alloc_id);
    for u in uuids {
        buf.extend_from_slice(u);
    }
    crc32(&buf)
}

/// Builds the bytes of a control file for `spec` (grants closed, no arbiter).
fn control_bytes(spec: &ControlSpec) -> Vec<u8> {
    let mut bytes = vec![0u8; std::mem::size_of::<ControlFile>()];
    let mut alloc_id = [0u8; ID_LEN];
    put_str(&mut alloc_id, &spec.alloc_id);
    let mut uuids = Vec::new();
    for d in &spec.devices {
        let mut u = [0u8; UUID_LEN];
        put_str(&mut u, &d.uuid);
        uuids.push(u);
    }
    let n = spec.devices.len() as u32;
    let crc = identity_crc(n, &alloc_id, &uuids);

    let off = |f: usize| f;
    let w64 = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let w32 = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    w64(
        &mut bytes,
        off(std::mem::offset_of!(ControlHeader, magic)),
        CONTROL_MAGIC,
    );
    w32(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, abi_version),
        ABI_VERSION,
    );
    w32(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, size),
        std::mem::size_of::<ControlFile>() as u32,
    );
    w32(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, identity_crc),
        crc,
    );
    w32(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, n_devices),
        n,
    );
    let id_at = std::mem::offset_of!(ControlHeader, alloc_id);
    bytes[id_at..id_at + ID_LEN].copy_from_slice(&alloc_id);
    w64(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, context_overhead_bytes),
        spec.context_overhead_bytes,
    );
    w64(
        &mut bytes,
        std::mem::offset_of!(ControlHeader, gate_timeout_ns),
        spec.gate_timeout_ns,
    );
    let dev0 = std::mem::offset_of!(ControlFile, devices);
    for (i, d) in spec.devices.iter().enumerate() {
        let base = dev0 + i * std::mem::size_of::<DeviceControl>();
        bytes[base..base + UUID_LEN].copy_from_slice(&uuids[i]);
        w64(
            &mut bytes,
            base + std::mem::offset_of!(DeviceControl, memory_limit_bytes),
            d.memory_limit_bytes,
        );
        w32(
            &mut bytes,
            base + std::mem::offset_of!(DeviceControl, compute_share_ppm),
            d.compute_share_ppm,
        );
        if let Some(Some(b)) = spec.context_bytes.get(i) {
            w64(
                &mut bytes,
                base + std::mem::offset_of!(DeviceControl, context_bytes),
                CONTEXT_MEASURED | b,
            );
        }
        w32(
            &mut bytes,
            base + std::mem::offset_of!(DeviceControl, policy),
            d.policy.to_raw(),
        );
        // A whole GPU needs no arbitration; anything less waits for the
        // arbiter's first grant (or the gate timeout when there is none).
        let grant = if d.compute_share_ppm >= FULL_COMPUTE_PPM {
            grant::OPEN
        } else {
            0
        };
        w32(
            &mut bytes,
            base + std::mem::offset_of!(DeviceControl, grant),
            grant,
        );
    }
    bytes
}

/// Writes `bytes` to `path` so that readers see either the old file or the
/// whole new one ([`tessera_contract::file`]). Not fsynced: an allocation's
/// control and state files are rebuilt from its durable record should a
/// power loss take them (the manager's store repairs them at start-up).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ShmError> {
    write_atomically_with(path, mode, |f| f.write_all(bytes))
}

/// [`write_atomically`] with the temp file's content written by `fill`.
pub(crate) fn write_atomically_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), ShmError> {
    use tessera_contract::file::{Durability, replace};
    replace(path, mode, Durability::ProcessCrash, fill).map_err(|e| ShmError::io(path, e))
}

/// Creates (or replaces) a control file for `spec`.
pub fn create_control_file(path: &Path, spec: &ControlSpec) -> Result<(), ShmError> {
    spec.validate()?;
    write_atomically(path, &control_bytes(spec), 0o644)
}

/// An open control file. Opened read-only by the hook; read-write by the
/// manager and the arbiter, which change limits and grants in place.
#[derive(Debug)]
pub struct Control {
    map: Mapping<ControlFile>,
    path: PathBuf,
    /// Makes a pause's two words (`paused_since_ns`, `paused_total_ns`) one
    /// value to this process: `pause`, `resume` and `paused_ns` hold it. Only
    /// the manager (one per node, under its state directory's lock) writes or
    /// sums them, through one `Control` per allocation; without it a sum read
    /// while a resume moves the running pause into the total counts that pause
    /// twice, or not at all, and the exported counter would step back
    /// (`shm/tests/loom_gate.rs`).
    pause_lock: std::sync::Mutex<()>,
}

impl Control {
    /// Opens and validates a control file for reading.
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        Self::open_inner(path, false)
    }

    /// Opens and validates a control file for reading and writing.
    pub fn open_rw(path: &Path) -> Result<Self, ShmError> {
        Self::open_inner(path, true)
    }

    fn open_inner(path: &Path, writable: bool) -> Result<Self, ShmError> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| ShmError::io(path, e))?;
        check_exact_size::<ControlFile>(&file, path)?;
        let map = Mapping::<ControlFile>::new(&file, path, writable)?;
        let c = Control {
            map,
            path: path.to_owned(),
            pause_lock: std::sync::Mutex::new(()),
        };
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), ShmError> {
        let h = &self.map.header;
        let path = &self.path;
        check_header::<ControlFile>(path, CONTROL_MAGIC, h.magic, h.abi_version, h.size)?;
        let n = h.n_devices as usize;
        if n == 0 || n > MAX_DEVICES {
            return Err(ShmError::corrupt(path, format!("{n} devices")));
        }
        let uuids: Vec<[u8; UUID_LEN]> = self.map.devices[..n].iter().map(|d| d.uuid).collect();
        if identity_crc(h.n_devices, &h.alloc_id, &uuids) != h.identity_crc {
            return Err(ShmError::corrupt(path, "identity checksum mismatch".into()));
        }
        if get_str(&h.alloc_id).is_none_or(str::is_empty) {
            return Err(ShmError::corrupt(path, "allocation id unreadable".into()));
        }
        for (i, d) in self.map.devices[..n].iter().enumerate() {
            if get_str(&d.uuid).is_none_or(str::is_empty) {
                return Err(ShmError::corrupt(
                    path,
                    format!("device {i} UUID unreadable"),
                ));
            }
            if Policy::from_raw(d.policy.load(Ordering::Relaxed)).is_none() {
                return Err(ShmError::corrupt(
                    path,
                    format!("device {i} policy unknown"),
                ));
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw mapped file, for the gate and arbiter which work on its atomics.
    pub fn raw(&self) -> &ControlFile {
        &self.map
    }

    pub fn alloc_id(&self) -> &str {
        get_str(&self.map.header.alloc_id).unwrap_or_default()
    }

    pub fn n_devices(&self) -> usize {
        self.map.header.n_devices as usize
    }

    pub fn device(&self, i: usize) -> &DeviceControl {
        &self.map.devices[i]
    }

    pub fn uuid(&self, i: usize) -> &str {
        get_str(&self.map.devices[i].uuid).unwrap_or_default()
    }

    /// Index of the device with this UUID.
    pub fn find_uuid(&self, uuid: &str) -> Option<usize> {
        (0..self.n_devices()).find(|&i| self.uuid(i) == uuid)
    }

    pub fn memory_limit(&self, i: usize) -> u64 {
        self.map.devices[i]
            .memory_limit_bytes
            .load(Ordering::Acquire)
    }

    pub fn compute_share_ppm(&self, i: usize) -> u32 {
        self.map.devices[i]
            .compute_share_ppm
            .load(Ordering::Acquire)
    }

    pub fn policy(&self, i: usize) -> Policy {
        // Validated at open and only ever stored through set_policy.
        Policy::from_raw(self.map.devices[i].policy.load(Ordering::Acquire))
            .unwrap_or(Policy::Guaranteed)
    }

    /// What every context is charged where no measured figure is given
    /// (the manager's `contextOverhead`).
    pub fn context_overhead(&self) -> u64 {
        self.map
            .header
            .context_overhead_bytes
            .load(Ordering::Acquire)
    }

    /// What a context holds on device `i`, as the manager measured it;
    /// `None` when it did not.
    pub fn context_bytes(&self, i: usize) -> Option<u64> {
        let w = self.map.devices[i].context_bytes.load(Ordering::Acquire);
        (w & CONTEXT_MEASURED != 0).then_some(w & !CONTEXT_MEASURED)
    }

    /// What a new context on device `i` is charged before the driver sees
    /// the call: the measured figure, else the allocation's
    /// [`Control::context_overhead`].
    pub fn context_charge(&self, i: usize) -> u64 {
        self.context_bytes(i)
            .unwrap_or_else(|| self.context_overhead())
    }

    /// Records (or, with `None`, forgets) what a context holds on device
    /// `i`, in place: processes charge it from their next context on.
    pub fn set_context_bytes(&self, i: usize, bytes: Option<u64>) -> Result<(), ShmError> {
        self.require_writable()?;
        let w = match bytes {
            Some(b) if b >= CONTEXT_MEASURED => {
                return Err(ShmError::BadSpec(format!(
                    "device {i}: context size {b} is not a size"
                )));
            }
            Some(b) => CONTEXT_MEASURED | b,
            None => 0,
        };
        self.map.devices[i]
            .context_bytes
            .store(w, Ordering::Release);
        Ok(())
    }

    /// The allocation's priority for burst time (higher first).
    pub fn priority(&self) -> i32 {
        self.map.header.priority.load(Ordering::Acquire)
    }

    /// Changes the priority in place (the arbiter picks it up).
    pub fn set_priority(&self, priority: i32) -> Result<(), ShmError> {
        self.require_writable()?;
        self.map.header.priority.store(priority, Ordering::Release);
        Ok(())
    }

    /// Whether the manager holds the allocation paused.
    #[inline]
    pub fn paused(&self) -> bool {
        self.map.header.paused.load(Ordering::Acquire) != 0
    }

    /// Blocks the calling thread while the allocation is paused (a futex
    /// wait on the pause word; rechecked every second, so a lost wake-up
    /// costs at most that). Returns at once when it is not paused.
    pub fn wait_while_paused(&self) {
        self.wait_while_paused_on(&crate::sys::Linux)
    }

    /// [`Control::wait_while_paused`] through the system calls `sys` (a
    /// test's, to see the thread asleep on the word).
    pub fn wait_while_paused_on(&self, sys: &dyn crate::sys::Sys) {
        let word = &self.map.header.paused;
        loop {
            let v = word.load(Ordering::Acquire);
            if v == 0 {
                return;
            }
            sys.futex_wait(word, v, 1_000_000_000);
        }
    }

    /// Pauses the allocation at `now_ns` (CLOCK_MONOTONIC); false if it
    /// already was.
    pub fn pause(&self, now_ns: u64) -> Result<bool, ShmError> {
        self.require_writable()?;
        let _one = self.pause_accounting();
        Ok(self.pause_words().pause(now_ns))
    }

    /// Resumes the allocation at `now_ns` and wakes every thread blocked
    /// on the pause; false if it was not paused.
    pub fn resume(&self, now_ns: u64) -> Result<bool, ShmError> {
        self.require_writable()?;
        let _one = self.pause_accounting();
        if !self.pause_words().resume(now_ns) {
            return Ok(false);
        }
        crate::sys::futex_wake_all(&self.map.header.paused);
        Ok(true)
    }

    /// The header's pause words.
    fn pause_words(&self) -> PauseWords<'_, AtomicU32, AtomicU64> {
        let h = &self.map.header;
        PauseWords {
            paused: &h.paused,
            since_ns: &h.paused_since_ns,
            total_ns: &h.paused_total_ns,
        }
    }

    /// The pause words' lock (see [`Control`]); a panic while it was held
    /// left the words as consistent as the atomics make them, so a poisoned
    /// lock is taken as it is.
    fn pause_accounting(&self) -> std::sync::MutexGuard<'_, ()> {
        self.pause_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Nanoseconds the allocation has spent paused up to `now_ns`,
    /// the current pause included.
    pub fn paused_ns(&self, now_ns: u64) -> u64 {
        let _one = self.pause_accounting();
        self.pause_words().paused_ns(now_ns)
    }

    /// A snapshot of what the file says, as a spec.
    pub fn spec(&self) -> ControlSpec {
        ControlSpec {
            alloc_id: self.alloc_id().to_owned(),
            devices: (0..self.n_devices())
                .map(|i| DeviceSpec {
                    uuid: self.uuid(i).to_owned(),
                    memory_limit_bytes: self.memory_limit(i),
                    compute_share_ppm: self.compute_share_ppm(i),
                    policy: self.policy(i),
                })
                .collect(),
            context_overhead_bytes: self.context_overhead(),
            context_bytes: {
                // Trailing unmeasured devices left out, as a spec that
                // measured none says it (an empty list).
                let mut v: Vec<Option<u64>> = (0..self.n_devices())
                    .map(|i| self.context_bytes(i))
                    .collect();
                while v.last() == Some(&None) {
                    v.pop();
                }
                v
            },
            gate_timeout_ns: self.map.header.gate_timeout_ns.load(Ordering::Acquire),
        }
    }

    pub(crate) fn require_writable(&self) -> Result<(), ShmError> {
        if self.map.writable() {
            Ok(())
        } else {
            Err(ShmError::ReadOnly(self.path.clone()))
        }
    }

    /// Changes a device's memory limit in place. Lowering it below what is
    /// reserved refuses new allocations until usage falls; nothing is revoked.
    pub fn set_memory_limit(&self, i: usize, bytes: u64) -> Result<(), ShmError> {
        self.require_writable()?;
        if bytes > MAX_BYTES {
            return Err(ShmError::BadSpec(format!("memory limit {bytes} too large")));
        }
        self.map.devices[i]
            .memory_limit_bytes
            .store(bytes, Ordering::Release);
        Ok(())
    }

    /// Changes a device's compute share in place (the arbiter picks it up).
    pub fn set_compute_share(&self, i: usize, ppm: u32) -> Result<(), ShmError> {
        self.require_writable()?;
        if ppm == 0 || ppm > FULL_COMPUTE_PPM {
            return Err(ShmError::BadSpec(format!("compute share {ppm} ppm")));
        }
        self.map.devices[i]
            .compute_share_ppm
            .store(ppm, Ordering::Release);
        Ok(())
    }

    /// Changes a device's compute policy in place.
    pub fn set_policy(&self, i: usize, policy: Policy) -> Result<(), ShmError> {
        self.require_writable()?;
        self.map.devices[i]
            .policy
            .store(policy.to_raw(), Ordering::Release);
        Ok(())
    }
}

/// Checks the three fields every Tessera file opens with: its magic, the
/// ABI version, and the size of `T` as the writer knew it.
pub(crate) fn check_header<T>(
    path: &Path,
    magic: u64,
    found_magic: u64,
    abi_version: u32,
    size: u32,
) -> Result<(), ShmError> {
    if found_magic != magic {
        return Err(ShmError::BadMagic {
            path: path.to_owned(),
            found: found_magic,
        });
    }
    if abi_version != ABI_VERSION {
        return Err(ShmError::AbiMismatch {
            path: path.to_owned(),
            found: abi_version,
            expected: ABI_VERSION,
        });
    }
    if size as usize != std::mem::size_of::<T>() {
        return Err(ShmError::corrupt(path, format!("header says {size} bytes")));
    }
    Ok(())
}

/// Refuses a file whose length is not exactly `size_of::<T>()`: a short one
/// is truncated, a long one is not ours.
pub(crate) fn check_exact_size<T>(file: &File, path: &Path) -> Result<(), ShmError> {
    let need = std::mem::size_of::<T>() as u64;
    let len = file.metadata().map_err(|e| ShmError::io(path, e))?.len();
    if len != need {
        // Another release's file may have another size: say so rather than "corrupt".
        let mut head = [0u8; 12];
        if std::os::unix::fs::FileExt::read_exact_at(file, &mut head, 0).is_ok() {
            let magic = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
            let found = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
            if (magic == CONTROL_MAGIC || magic == STATE_MAGIC) && found != ABI_VERSION {
                return Err(ShmError::AbiMismatch {
                    path: path.to_owned(),
                    found,
                    expected: ABI_VERSION,
                });
            }
        }
    }
    if len < need {
        return Err(ShmError::Truncated {
            path: path.to_owned(),
            len,
            need,
        });
    }
    if len > need {
        return Err(ShmError::corrupt(
            path,
            format!("{len} bytes, expected {need}"),
        ));
    }
    Ok(())
}
