//! The byte layout of the control and state files: `#[repr(C)]`, fixed size,
//! atomics only, checked at compile time and by the layout tests.
//!
//! Everything a process reads or writes after the file is created is an
//! atomic, so a process killed at any instruction leaves every word either
//! before or after its update, never torn. The few plain fields (magic, ABI,
//! identity strings) are written once, before the file is published by a
//! rename, and never again.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// Most GPUs one allocation can span.
pub const MAX_DEVICES: usize = 16;
/// Most processes that can be joined to one allocation at once.
pub const MAX_SLOTS: usize = 1024;
/// Bytes reserved for a GPU UUID string (`GPU-xxxxxxxx-...`, NUL padded).
pub const UUID_LEN: usize = 64;
/// Bytes reserved for an allocation id (NUL padded).
pub const ID_LEN: usize = 64;

/// `b"TESSCTL\0"` read as little-endian.
pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"TESSCTL\0");
/// `b"TESSSTA\0"` read as little-endian.
pub const STATE_MAGIC: u64 = u64::from_le_bytes(*b"TESSSTA\0");
/// Bumped on every incompatible change of either file.
pub const ABI_VERSION: u32 = 1;

/// Compute policy values stored in [`DeviceControl::policy`].
pub use tessera_contract::policy::{POLICY_BURST, POLICY_GUARANTEED};

/// Bits of the grant word ([`DeviceControl::grant`]), the futex the gate waits on.
pub mod grant {
    /// The allocation holds the GPU: its processes may submit work.
    pub const GRANTED: u32 = 1;
    /// No arbitration on this device (whole GPU, or compute not enforced):
    /// submit freely.
    pub const OPEN: u32 = 2;
    /// The epoch counts grant transitions; it lives above the flag bits.
    pub const EPOCH_SHIFT: u32 = 2;
    /// Epoch of a grant word.
    pub const fn epoch(word: u32) -> u32 {
        word >> EPOCH_SHIFT
    }
    /// Whether a process may submit under this grant word.
    pub const fn may_submit(word: u32) -> bool {
        word & (GRANTED | OPEN) != 0
    }
}

/// Start of the control file: what identifies it and node-wide arbiter state.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ControlHeader {
    pub magic: u64,
    pub abi_version: u32,
    /// `size_of::<ControlFile>()` as written; a reader refuses any other size.
    pub size: u32,
    /// CRC-32 of the identity part: `n_devices`, `alloc_id` and every UUID.
    pub identity_crc: u32,
    pub n_devices: u32,
    pub alloc_id: [u8; ID_LEN],
    /// Device memory charged for every CUDA context a process creates, an
    /// estimate of what the driver keeps for itself.
    pub context_overhead_bytes: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of the arbiter's latest tick; 0 = never.
    pub arbiter_heartbeat_ns: AtomicU64,
    /// How long a gate waits on a silent arbiter before running free.
    pub gate_timeout_ns: AtomicU64,
    /// Futex word: 1 while the manager holds the allocation paused
    /// (`tessera pause`), 0 otherwise. The shim blocks launches and memory
    /// requests on it; woken on resume. Taken from what was reserved space
    /// (zero in older files: not paused), so the layout and ABI stay.
    pub paused: AtomicU32,
    pub paused_pad: u32,
    /// CLOCK_MONOTONIC ns when the current pause began (0: not paused).
    pub paused_since_ns: AtomicU64,
    /// Nanoseconds of pauses that have ended.
    pub paused_total_ns: AtomicU64,
    /// The allocation's priority for burst time (higher first; 0 by
    /// default), read by the arbiter. Also from what was reserved space.
    pub priority: AtomicI32,
    pub priority_pad: u32,
}

/// One GPU of an allocation, as the manager configured it.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct DeviceControl {
    /// NUL-padded GPU UUID (`GPU-...`), the key by which a process maps its
    /// own CUDA device order onto this entry.
    pub uuid: [u8; UUID_LEN],
    pub memory_limit_bytes: AtomicU64,
    /// Parts per million of the GPU's time.
    pub compute_share_ppm: AtomicU32,
    /// [`POLICY_GUARANTEED`] or [`POLICY_BURST`].
    pub policy: AtomicU32,
    /// Futex word, see [`grant`].
    pub grant: AtomicU32,
    /// Futex word the processes' drainers sleep on: bumped after every
    /// transition that takes the grant away (revoked, or opened), so that
    /// granting does not wake them.
    pub revocations: AtomicU32,
    /// What a CUDA context holds on this GPU, as the manager measured it
    /// (its own context, by the driver's per-process count), with
    /// [`CONTEXT_MEASURED`] set; 0 when not measured, and then the header's
    /// `context_overhead_bytes` is charged. Taken from what was reserved
    /// space (zero in older files: not measured), so the layout, its size and
    /// `ABI_VERSION` stay: an older shim charges the header's figure, as
    /// before.
    pub context_bytes: AtomicU64,
    /// CLOCK_MONOTONIC ns at which the current grant's quantum ends (the
    /// earliest a busy holder can be revoked), written by the arbiter before
    /// it publishes a grant and again when it renews one; 0: unknown. A hint
    /// for the shim's pacer (it queues no kernel to start past it), never
    /// trusted for anything else. Taken from what was reserved space (zero
    /// in older files), so the layout and ABI stay.
    pub grant_until_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns at which the current grant's time started (its
    /// charge's start), written by the arbiter; [`GRANT_START_PENDING`]
    /// while a pre-armed grant waits behind the revoked holder's drain (its
    /// first kernel is queued behind work of another process, so when it
    /// starts is not known yet); 0: unknown (an older arbiter). A hint for
    /// the shim's pacer, never trusted for anything else. Taken from what
    /// was reserved space (zero in older files), so the layout and ABI stay.
    pub grant_start_ns: AtomicU64,
    pub reserved: [u64; 2],
}

/// [`DeviceControl::grant_start_ns`] while a pre-armed grant's time has not
/// started (the revoked holder's work still drains ahead of it).
pub const GRANT_START_PENDING: u64 = u64::MAX;

/// Set in [`DeviceControl::context_bytes`] when the figure below it was
/// measured (a measured 0 is a figure too).
pub const CONTEXT_MEASURED: u64 = 1 << 63;

/// The whole control file.
#[repr(C)]
#[derive(Debug)]
pub struct ControlFile {
    pub header: ControlHeader,
    pub devices: [DeviceControl; MAX_DEVICES],
}

/// Start of the state file.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct StateHeader {
    pub magic: u64,
    pub abi_version: u32,
    pub size: u32,
    /// Must equal the control file's id, so a mix-up of files is caught.
    pub alloc_id: [u8; ID_LEN],
    /// Where the next joiner starts probing for a free slot.
    pub join_cursor: AtomicU32,
    /// One past the highest slot a process has set up its compute gate in:
    /// the arbiter's scans of launch and drain records stop there.
    pub gate_slots: AtomicU32,
    pub reserved: [u64; 5],
}

/// Per-device totals of the allocation.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct DeviceState {
    /// Packed [`Reserved`]: bytes reserved by all processes plus the one
    /// operation in flight, see `state.rs`.
    pub reserved: AtomicU64,
    /// Allocations refused for lack of quota.
    pub oom_refused: AtomicU64,
    /// Processes blocked at this device's gate right now (demand).
    pub waiters: AtomicU32,
    pub _pad: u32,
    /// Total nanoseconds processes spent blocked at the gate.
    pub wait_ns: AtomicU64,
    /// Doorbell the arbiter waits on (futex) while the holder drains:
    /// bumped by a process after it stores a `drained_epoch`. Only a hint;
    /// the arbiter checks the slots themselves.
    pub drain_signal: AtomicU32,
    /// The latest of the allocation's paced launches on this device that
    /// one of its processes saw done, as the low 32 bits of its count in
    /// `launches` (a launch done means every one queued before it is done:
    /// one engine, in order). With `launches` it bounds how much work is
    /// queued. Written and read by the allocation's processes only (issue
    /// 36); taken from padding (zero in older files).
    pub launches_done: AtomicU32,
    /// CLOCK_MONOTONIC ns of the latest drain a process reported (the
    /// largest written). The arbiter charges a grant up to this time,
    /// clamped to what it observed itself, so its own wake-up latency is
    /// not charged.
    pub drained_at_ns: AtomicU64,
    /// Paced launches the allocation's processes have decided on for this
    /// device, each numbered by the count as it took it
    /// (`Gate::take_launch`, a compare-and-swap, so that a decision and its
    /// number are one step). With `launches_done` it says how many of the
    /// allocation's launches may still be queued, so that the allocation,
    /// not each process on its own, keeps no more than the running kernel
    /// past a quantum's end: the device runs every process's work in one
    /// queue, and a revocation drains all of it (issue 36). Between two
    /// launches of one process the numbers also say how many of the
    /// others' ran in between, so its kernels' length is learned right.
    /// Written and read by the allocation's processes only, a hint among
    /// them: the arbiter never reads it. Taken from reserved space (zero in
    /// older files), so the layout and `ABI_VERSION` are unchanged.
    pub launches: AtomicU64,
    /// CLOCK_MONOTONIC ns at which `launches_done` last moved on: about
    /// when the launch after it started, where the process that saw it
    /// was waiting for it. Same writers and readers as `launches`; taken
    /// from reserved space (zero in older files).
    pub done_at_ns: AtomicU64,
}

/// One process's use of one device.
#[repr(C)]
#[derive(Debug)]
pub struct SlotDevice {
    /// Packed [`Usage`]: bytes this process holds, and its operation sequence.
    pub usage: AtomicU64,
    /// Packed [`Intent`]: the operation this slot is about to apply.
    pub intent: AtomicU64,
    /// Grant epoch under which this process last submitted work.
    pub launch_epoch: AtomicU32,
    /// Latest grant epoch whose work this process has drained.
    pub drained_epoch: AtomicU32,
    /// Work submissions so far (written by the owner only).
    pub launches: AtomicU64,
}

/// One process of the allocation.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Slot {
    /// Packed [`Owner`]: free, alive (pid) or being reclaimed.
    pub owner: AtomicU64,
    /// `starttime` from `/proc/<pid>/stat` (clock ticks since boot); 0 while
    /// unknown. Written after `pidns`, so a non-zero value means both are set.
    pub start_time: AtomicU64,
    /// Inode of the process's pid namespace.
    pub pidns: AtomicU64,
    /// The process's pid in the host namespace, filled in by the manager.
    pub host_pid: AtomicU32,
    /// The process's pid in its own namespace (also in `owner` while alive;
    /// kept here so a slot being reclaimed still names its process).
    pub pid: AtomicU32,
    /// Bit `d` set: some thread of this process is blocked at device `d`'s
    /// gate. Each set bit is counted once in [`DeviceState::waiters`].
    pub gate_waiting: AtomicU32,
    /// Bit `d` set: some thread of this process waits in a synchronisation
    /// (`cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`)
    /// on device `d`: its work is in flight and it will launch again when
    /// the wait ends, so a holder in it is busy, not idle. Taken from what
    /// was padding: the layout, its size and `ABI_VERSION` are unchanged,
    /// and older processes read as never synchronising.
    pub syncing: AtomicU32,
    /// Bit `d` set: this process's synchronisation on device `d` returned
    /// with nothing of its left in flight, and by what it learned of itself
    /// its host part before the next launch is long (longer than the
    /// arbiter's contested idle release): it is idle now, and a holder
    /// whose launching processes all are gives the GPU back at once when
    /// another allocation waits, instead of idling it through the release.
    /// Cleared at the process's next launch. A hint: set falsely it only
    /// gives the process's own grant away (its drain still charged to it).
    /// Taken from what was reserved space (zero in older files): the
    /// layout, its size and `ABI_VERSION` are unchanged.
    pub yielding: AtomicU32,
    pub _pad_yield: u32,
    /// Packed [`FirstLaunch`]: when this process last made the first
    /// submission of a grant epoch, and on which device (the last device
    /// only: a process on several keeps one record). The arbiter starts a
    /// holder's time there while no one else waits, never after it saw the
    /// holder active itself (see `docs/compute-slices.md`, "A late start").
    /// A hint: set falsely, it can shave at most what the arbiter had not
    /// seen of one grant. Taken from what was reserved space (zero in older
    /// files, read as no record): the layout, its size and `ABI_VERSION`
    /// are unchanged.
    pub first_launch: AtomicU64,
    /// Packed like [`FirstLaunch`]: where the work this process last queued
    /// on a device is predicted to end (CLOCK_MONOTONIC), as its pacer
    /// learned the kernels' length, and on which device (the last one
    /// only); written for kernels shorter than the pacer's budget. The arbiter counts a holder busy until then (at most
    /// `MAX_QUEUED_AHEAD_NS` ahead of its look), as if it had just
    /// launched: a thread kept from a CPU with work queued is not idle,
    /// and revoking it for idleness drained that whole queue into the
    /// hand-over. A hint: set falsely, it keeps only this allocation's own
    /// grant until its quantum ends, charged. Taken from what was reserved
    /// space (zero in older files, read as nothing queued): the layout, its
    /// size and `ABI_VERSION` are unchanged.
    pub queued_until: AtomicU64,
    pub devices: [SlotDevice; MAX_DEVICES],
}

/// The whole state file.
#[repr(C)]
#[derive(Debug)]
pub struct StateFile {
    pub header: StateHeader,
    pub devices: [DeviceState; MAX_DEVICES],
    pub slots: [Slot; MAX_SLOTS],
}

// The files are an ABI between separately built binaries (the hook in a
// container, the manager on the host): any size change must bump ABI_VERSION.
const _: () = assert!(std::mem::size_of::<ControlHeader>() == 192);
const _: () = assert!(std::mem::size_of::<DeviceControl>() == 128);
const _: () = assert!(std::mem::size_of::<ControlFile>() == 192 + 16 * 128);
const _: () = assert!(std::mem::size_of::<StateHeader>() == 128);
const _: () = assert!(std::mem::size_of::<DeviceState>() == 64);
const _: () = assert!(std::mem::size_of::<SlotDevice>() == 32);
const _: () = assert!(std::mem::size_of::<Slot>() == 576);
const _: () = assert!(std::mem::size_of::<StateFile>() == 128 + 16 * 64 + 1024 * 576);

/// Unpacked [`Slot::first_launch`]: the device in the top 4 bits, the
/// `CLOCK_MONOTONIC` ns in the other 60 (36 years of uptime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstLaunch {
    pub dev: usize,
    pub at_ns: u64,
}

const FIRST_LAUNCH_NS_BITS: u32 = 60;
const FIRST_LAUNCH_NS_MASK: u64 = (1 << FIRST_LAUNCH_NS_BITS) - 1;
const _: () = assert!(MAX_DEVICES <= 1 << (64 - FIRST_LAUNCH_NS_BITS));

impl FirstLaunch {
    pub fn pack(self) -> u64 {
        ((self.dev as u64) << FIRST_LAUNCH_NS_BITS) | (self.at_ns & FIRST_LAUNCH_NS_MASK)
    }
    /// `None` for 0, the word of a slot that never recorded one.
    pub fn unpack(word: u64) -> Option<Self> {
        (word != 0).then_some(FirstLaunch {
            dev: (word >> FIRST_LAUNCH_NS_BITS) as usize,
            at_ns: word & FIRST_LAUNCH_NS_MASK,
        })
    }
}

/// Width of a byte count in the packed words: 2^42 bytes = 4 TiB per device.
pub const BYTES_BITS: u32 = 42;
/// Largest byte count a packed word can hold.
pub const MAX_BYTES: u64 = (1 << BYTES_BITS) - 1;
/// Width of a slot's operation sequence number.
pub const SEQ_BITS: u32 = 21;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// The reserved word keeps only the low bits of the pending sequence.
const PSEQ_BITS: u32 = 11;
const PSEQ_MASK: u64 = (1 << PSEQ_BITS) - 1;
const PSLOT_BITS: u32 = 64 - BYTES_BITS - PSEQ_BITS; // 11: slot index + 1, 0 = none
const _: () = assert!(BYTES_BITS + 1 + SEQ_BITS <= 64); // Intent fits
const _: () = assert!((1 << PSLOT_BITS) > MAX_SLOTS);

/// Unpacked [`DeviceState::reserved`]: the allocation's reserved bytes, and
/// the one operation (slot, sequence) whose slot-side half may still be
/// outstanding. While `pending` is set, every process helps finish it
/// before starting its own, so a process killed between the two halves
/// leaves nothing anyone waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub bytes: u64,
    pub pending: Option<(usize, u64)>,
}

impl Reserved {
    pub fn pack(self) -> u64 {
        let (pslot, pseq) = match self.pending {
            Some((slot, seq)) => (slot as u64 + 1, seq & PSEQ_MASK),
            None => (0, 0),
        };
        self.bytes | (pseq << BYTES_BITS) | (pslot << (BYTES_BITS + PSEQ_BITS))
    }
    pub fn unpack(word: u64) -> Self {
        let bytes = word & MAX_BYTES;
        let pseq = (word >> BYTES_BITS) & PSEQ_MASK;
        let pslot = word >> (BYTES_BITS + PSEQ_BITS);
        let pending = if pslot == 0 {
            None
        } else {
            Some((pslot as usize - 1, pseq))
        };
        Reserved { bytes, pending }
    }
    /// Whether a full sequence number matches a pending one, which may be
    /// truncated (unpacked from the word) or not (built by the caller).
    pub fn pending_matches(pending_seq: u64, full_seq: u64) -> bool {
        pending_seq & PSEQ_MASK == full_seq & PSEQ_MASK
    }
}

/// Unpacked [`SlotDevice::usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub seq: u64,
}

impl Usage {
    pub fn pack(self) -> u64 {
        self.bytes | ((self.seq & SEQ_MASK) << BYTES_BITS)
    }
    pub fn unpack(word: u64) -> Self {
        Usage {
            bytes: word & MAX_BYTES,
            seq: word >> BYTES_BITS,
        }
    }
}

/// Next sequence number after `seq`, wrapping in [`SEQ_BITS`].
pub fn next_seq(seq: u64) -> u64 {
    (seq + 1) & SEQ_MASK
}

/// Unpacked [`SlotDevice::intent`]: the signed change a slot's next
/// operation applies, tagged with the sequence number it will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent {
    pub delta: i64,
    pub seq: u64,
}

impl Intent {
    pub fn pack(self) -> u64 {
        let neg = u64::from(self.delta < 0);
        let mag = self.delta.unsigned_abs() & MAX_BYTES;
        mag | (neg << BYTES_BITS) | ((self.seq & SEQ_MASK) << (BYTES_BITS + 1))
    }
    pub fn unpack(word: u64) -> Self {
        let mag = (word & MAX_BYTES) as i64;
        let neg = (word >> BYTES_BITS) & 1 == 1;
        Intent {
            delta: if neg { -mag } else { mag },
            seq: word >> (BYTES_BITS + 1),
        }
    }
}

/// Unpacked [`Slot::owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Free; `generation` counts how often the slot has been used.
    Free { generation: u32 },
    /// Joined by the process with this pid (in its own pid namespace).
    Alive { generation: u32, pid: u32 },
    /// Being reclaimed by the process in slot `by`, whose owner generation
    /// (low bits) was `by_gen` when it claimed this one, or by the manager
    /// (`by == MANAGER_RECLAIMER`).
    Reclaiming {
        generation: u32,
        by: u32,
        by_gen: u32,
    },
}

/// `Owner::Reclaiming::by` when the manager, which has no slot, reclaims.
pub const MANAGER_RECLAIMER: u32 = (1 << 11) - 1;
const GEN_MASK: u64 = (1 << 30) - 1;

impl Owner {
    pub fn pack(self) -> u64 {
        match self {
            Owner::Free { generation } => u64::from(generation) & GEN_MASK,
            Owner::Alive { generation, pid } => {
                1 << 62 | (u64::from(generation) & GEN_MASK) << 32 | u64::from(pid)
            }
            Owner::Reclaiming {
                generation,
                by,
                by_gen,
            } => {
                2 << 62
                    | (u64::from(generation) & GEN_MASK) << 32
                    | (u64::from(by) & 0x7ff) << 21
                    | (u64::from(by_gen) & 0x1f_ffff)
            }
        }
    }
    pub fn unpack(word: u64) -> Self {
        let generation = ((word >> 32) & GEN_MASK) as u32;
        match word >> 62 {
            1 => Owner::Alive {
                generation,
                pid: word as u32,
            },
            2 => Owner::Reclaiming {
                generation,
                by: ((word >> 21) & 0x7ff) as u32,
                by_gen: (word & 0x1f_ffff) as u32,
            },
            // A free word keeps its generation in the low bits.
            _ => Owner::Free {
                generation: (word & GEN_MASK) as u32,
            },
        }
    }
    pub fn generation(self) -> u32 {
        match self {
            Owner::Free { generation }
            | Owner::Alive { generation, .. }
            | Owner::Reclaiming { generation, .. } => generation,
        }
    }
}

/// Low bits of a generation as recorded in [`Owner::Reclaiming::by_gen`].
pub fn gen_low(generation: u32) -> u32 {
    generation & 0x1f_ffff
}

/// Next generation, wrapping in 30 bits.
pub fn next_gen(generation: u32) -> u32 {
    ((u64::from(generation) + 1) & GEN_MASK) as u32
}
