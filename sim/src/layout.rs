//! The node state file's layout: `#[repr(C)]`, fixed size, atomics only, so that every
//! process of the node maps the same bytes and updates them without locks.
//!
//! A file is valid when `magic`, `abi` and `size` match; the creator writes `magic` last.
//! Everything starts zeroed (a fresh `ftruncate`d file), which is a valid empty state.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `b"TSRASIM\0"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRASIM\0");
/// Bumped on every incompatible change of this file.
pub const ABI_VERSION: u32 = 5;
/// Devices a node can have.
pub const MAX_DEVICES: usize = 16;
/// Processes that can use the node's CUDA at the same time.
pub const MAX_PROCS: usize = 512;
/// Bytes of a device name, NUL included.
pub const NAME_LEN: usize = 64;
/// Bytes of an AMD device's architecture name (`gfx90a:sramecc+:xnack-`), NUL included.
pub const ARCH_LEN: usize = 32;
/// XID events kept per device for NVML event sets.
pub const XID_RING: usize = 64;
/// Device memory objects shared between processes (IPC handles, exported VMM handles)
/// that can exist at once.
pub const MAX_SHARED: usize = 1024;
/// Words of a [`SharedObj`]'s holder bitmap (one bit per process slot).
pub const HOLDER_WORDS: usize = MAX_PROCS / 64;

/// Buckets of the per-device busy history: 10 ms each, 20.48 s in all.
pub const DEVICE_RING: usize = 2048;
pub const DEVICE_BUCKET_NS: u64 = 10_000_000;
/// Buckets of the per-process busy history: 100 ms each, 6.4 s in all.
pub const PROC_RING: usize = 64;
pub const PROC_BUCKET_NS: u64 = 100_000_000;
/// Idle stretches kept per device ([`IdleLog`]): at 1 ms kernels synchronised every launch
/// (about 1,000 a second per program) a reader polling every 100 ms keeps up with room
/// to spare.
pub const IDLE_RING: usize = 4096;

/// The whole file.
#[repr(C)]
pub struct NodeState {
    pub header: Header,
    pub devices: [DeviceState; MAX_DEVICES],
    pub procs: [ProcSlot; MAX_PROCS],
    pub shared: [SharedObj; MAX_SHARED],
}

/// Size of the node state file in bytes.
pub const STATE_SIZE: usize = size_of::<NodeState>();
const _: () = assert!(
    STATE_SIZE == 4_693_496 + MAX_PROCS * 8 + MAX_SHARED * 104 + MAX_DEVICES * (8 + IDLE_RING * 24),
    "NodeState layout changed: bump ABI_VERSION"
);

#[repr(C)]
pub struct Header {
    /// `MAGIC` once the file is initialised; written last with `Release`.
    pub magic: AtomicU64,
    pub abi: AtomicU32,
    pub device_count: AtomicU32,
    pub size: AtomicU64,
    pub seed: AtomicU64,
    /// Bumped (and futex-woken) on every XID event of any device; NVML event sets wait on it.
    pub event_seq: AtomicU32,
    /// One past the highest process slot ever claimed, so scans stop early.
    pub procs_high: AtomicU32,
    /// CLOCK_MONOTONIC ns when the node was created (energy counters start there).
    pub created_ns: AtomicU64,
    /// Last id given to a [`SharedObj`] (ids start at 1; 0 marks a free entry).
    pub shared_seq: AtomicU64,
    /// Device memory each CUDA context holds for itself (`TESSERA_SIM_CONTEXT_MEMORY`).
    pub context_memory: AtomicU64,
    /// How long the driver takes to tear down what one process held on one device once
    /// the process has exited (`TESSERA_SIM_CONTEXT_TEARDOWN`, ns); 0: at once.
    pub context_teardown_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns at which the last teardown queued so far completes: the driver
    /// tears exited processes down one at a time, node-wide.
    pub teardown_until_ns: AtomicU64,
    pub _reserved: [u64; 5],
}

/// One simulated GPU. The first block is written once at creation; the rest changes.
#[repr(C)]
pub struct DeviceState {
    pub memory_total: AtomicU64,
    pub sms: AtomicU32,
    pub cc_major: AtomicU32,
    pub cc_minor: AtomicU32,
    pub pci_domain: AtomicU32,
    pub pci_bus: AtomicU32,
    pub pci_device: AtomicU32,
    pub uuid: [AtomicU64; 2],
    pub name: [AtomicU64; NAME_LEN / 8],
    /// CLOCK_MONOTONIC ns at which the last work queued on the engine completes.
    pub busy_until: AtomicU64,
    /// Sum of the durations of all work ever queued (ns).
    pub busy_total_ns: AtomicU64,
    pub launches: AtomicU64,
    /// Non-zero while the device is marked lost (fallen off the bus).
    pub lost: AtomicU32,
    /// Whose GPU this is ([`crate::config::Vendor`] as u32: 0 NVIDIA, 1 AMD), written once
    /// at creation. Zero, NVIDIA, is what every device of an older file was.
    pub vendor: AtomicU32,
    /// Number of XID events ever injected; the newest is `xids[(xid_seq - 1) % XID_RING]`.
    pub xid_seq: AtomicU64,
    pub xids: [XidRecord; XID_RING],
    pub busy: BusyRing<DEVICE_RING, DEVICE_BUCKET_NS>,
    /// An AMD device's architecture name (HIP's `gcnArchName`), NUL-padded; zero for
    /// NVIDIA devices. Written once at creation.
    pub arch: [AtomicU64; ARCH_LEN / 8],
    pub _reserved: [u64; 4],
    /// The engine's idle stretches, for measuring what a hand-over costs.
    pub idle: IdleLog,
}

#[repr(C)]
pub struct XidRecord {
    /// The event's 1-based sequence number, stored last; a reader that finds another
    /// number in the record knows it was overwritten or is not written yet.
    pub seq: AtomicU64,
    pub xid: AtomicU64,
    pub time_ns: AtomicU64,
}

/// Owner word of a process slot: the pid in the low 32 bits, the state above.
pub const SLOT_FREE: u64 = 0;
pub const SLOT_CLAIMING: u64 = 1 << 32;
pub const SLOT_LIVE: u64 = 2 << 32;
pub const SLOT_REAPING: u64 = 3 << 32;
/// The process has exited and the driver is still tearing down what it held
/// ([`ProcSlot::exit_done_ns`] says until when): NVML still lists it with its memory.
pub const SLOT_EXITING: u64 = 4 << 32;
pub const SLOT_STATE_MASK: u64 = 0xffff_ffff << 32;

/// One process using the node's CUDA: what it holds and what it ran, per device.
#[repr(C)]
pub struct ProcSlot {
    /// `SLOT_*` state | pid (the claimer's, or for `SLOT_REAPING` the reaper's).
    pub owner: AtomicU64,
    /// Start time of the process (clock ticks since boot, `/proc/<pid>/stat` field 22),
    /// so a recycled pid is not mistaken for the slot's owner.
    pub start_time: AtomicU64,
    /// Bit d set while the process has a context on device d.
    pub contexts: AtomicU32,
    pub _pad: AtomicU32,
    pub memory: [AtomicU64; MAX_DEVICES],
    pub busy_ns: [AtomicU64; MAX_DEVICES],
    pub launches: [AtomicU64; MAX_DEVICES],
    pub busy: [BusyRing<PROC_RING, PROC_BUCKET_NS>; MAX_DEVICES],
    /// For a [`SLOT_EXITING`] slot: CLOCK_MONOTONIC ns at which the driver is done tearing
    /// the process down and its memory is free.
    pub exit_done_ns: AtomicU64,
}

impl ProcSlot {
    /// Clears everything the slot accounts; the owner word is left to the caller.
    pub fn clear_usage(&self) {
        self.contexts.store(0, Ordering::SeqCst);
        self.start_time.store(0, Ordering::SeqCst);
        self.exit_done_ns.store(0, Ordering::SeqCst);
        for d in 0..MAX_DEVICES {
            self.memory[d].store(0, Ordering::SeqCst);
            self.busy_ns[d].store(0, Ordering::SeqCst);
            self.launches[d].store(0, Ordering::SeqCst);
            self.busy[d].clear();
        }
    }
}

/// Device memory that more than one process may hold: an allocation exported with an IPC
/// handle or a VMM handle exported as a file descriptor. The memory is charged once, to
/// one holder (`charged_slot`); when that holder lets go (frees, closes, exits or is
/// killed) while others still hold it, the charge moves to another live holder, so the
/// device counts the memory exactly as long as some process can reach it.
///
/// `lock` serialises changes of one entry: the pid of the process changing it, 0 when
/// free; a lock whose holder died is taken over.
#[repr(C)]
pub struct SharedObj {
    pub lock: AtomicU64,
    /// Non-zero while the entry is in use.
    pub id: AtomicU64,
    /// What importers look the object up by: the inode of its backing memfd.
    pub key: AtomicU64,
    pub bytes: AtomicU64,
    pub device: AtomicU32,
    /// Slot + 1 of the process the bytes are charged to.
    pub charged_slot: AtomicU32,
    /// Bit s: process slot s holds the object.
    pub holders: [AtomicU64; HOLDER_WORDS],
}

/// Busy time per time bucket, a ring indexed by `t / BUCKET_NS`. Each word packs the
/// bucket's epoch (`t / BUCKET_NS`, low 32 bits) in its high half and the busy ns in it in
/// its low half, so a writer that finds an old epoch restarts the bucket with one CAS and
/// a reader ignores buckets of other laps.
#[repr(C)]
pub struct BusyRing<const N: usize, const BUCKET_NS: u64> {
    pub buckets: [AtomicU64; N],
}

impl<const N: usize, const BUCKET_NS: u64> BusyRing<N, BUCKET_NS> {
    /// Ring span in ns.
    pub const SPAN_NS: u64 = N as u64 * BUCKET_NS;

    /// Records busy time over `[start, end)`. Only the part up to three quarters of the
    /// ring ahead of `now` is recorded, so writes never overrun the history readers need.
    pub fn add(&self, now: u64, start: u64, end: u64) {
        let horizon = now.saturating_add(Self::SPAN_NS / 4 * 3);
        let end = end.min(horizon);
        let mut t = start;
        while t < end {
            let epoch = t / BUCKET_NS;
            let bucket_end = (epoch + 1) * BUCKET_NS;
            let chunk = bucket_end.min(end) - t;
            self.add_to(epoch, chunk);
            t = bucket_end;
        }
    }

    fn add_to(&self, epoch: u64, ns: u64) {
        let slot = &self.buckets[(epoch % N as u64) as usize];
        let tag = epoch & 0xffff_ffff;
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let next = if cur >> 32 == tag {
                (tag << 32) | ((cur & 0xffff_ffff) + ns).min(BUCKET_NS)
            } else {
                (tag << 32) | ns.min(BUCKET_NS)
            };
            match slot.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Busy ns recorded in the buckets that lie wholly inside `[from, to)`.
    pub fn busy_between(&self, from: u64, to: u64) -> u64 {
        let first = from.div_ceil(BUCKET_NS);
        let last = to / BUCKET_NS; // exclusive
        let first = first.max(last.saturating_sub(N as u64 - 1));
        (first..last)
            .map(|epoch| {
                let word = self.buckets[(epoch % N as u64) as usize].load(Ordering::Acquire);
                if word >> 32 == epoch & 0xffff_ffff {
                    word & 0xffff_ffff
                } else {
                    0
                }
            })
            .sum()
    }

    /// Fraction of `window_ns` (rounded to whole buckets) ending at the last complete
    /// bucket before `now` that was busy, 0.0..=1.0.
    pub fn utilization(&self, now: u64, window_ns: u64) -> f64 {
        let to = now / BUCKET_NS * BUCKET_NS;
        let buckets = (window_ns / BUCKET_NS).clamp(1, N as u64 / 4);
        let from = to.saturating_sub(buckets * BUCKET_NS);
        let span = to - from;
        if span == 0 {
            return 0.0;
        }
        (self.busy_between(from, to) as f64 / span as f64).min(1.0)
    }

    pub fn clear(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
    }
}

/// The stretches a device's engine stood idle with work still to come: each is written when
/// the work that ends it is queued, so a reader sees a stretch once it is over. Only the
/// stretches longer than the device's kernel-to-kernel gap are written (a streaming
/// program's back-to-back kernels would fill the ring with the fixed gap); a written stretch
/// runs from the previous work's end, so its fixed gap is in it.
///
/// Entry `seq % IDLE_RING` holds stretch `seq` (0-based); its `seq` word is stored last,
/// with `seq + 1`, and a reader that finds another number there knows the entry was
/// overwritten or is not written yet.
#[repr(C)]
pub struct IdleLog {
    /// Stretches ever written: the next one's `seq`.
    pub next: AtomicU64,
    pub entries: [IdleEntry; IDLE_RING],
}

#[repr(C)]
pub struct IdleEntry {
    pub seq: AtomicU64,
    pub from: AtomicU64,
    pub to: AtomicU64,
}

/// What [`IdleLog::read_since`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdleRead {
    /// `(from, to)` on CLOCK_MONOTONIC, in the order written.
    pub stretches: Vec<(u64, u64)>,
    /// Where the next read starts.
    pub next: u64,
    /// Stretches overwritten before this read saw them.
    pub lost: u64,
}

impl IdleLog {
    /// Records that the engine stood idle over `[from, to)`.
    pub fn push(&self, from: u64, to: u64) {
        let seq = self.next.fetch_add(1, Ordering::AcqRel);
        let e = &self.entries[(seq % IDLE_RING as u64) as usize];
        // Marks the entry as being written, so a reader never pairs the old `from` with the
        // new `to` (the fence keeps the stores below from being seen before this one).
        e.seq.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        e.from.store(from, Ordering::Relaxed);
        e.to.store(to, Ordering::Relaxed);
        e.seq.store(seq + 1, Ordering::Release);
    }

    /// The stretches written from `since` on (a previous read's `next`, 0 at first). An
    /// entry still being written is left for the next read.
    pub fn read_since(&self, since: u64) -> IdleRead {
        let end = self.next.load(Ordering::Acquire);
        let first = since.max(end.saturating_sub(IDLE_RING as u64));
        let mut out = IdleRead {
            stretches: Vec::with_capacity((end - first) as usize),
            next: first,
            lost: first - since.min(first),
        };
        for seq in first..end {
            let e = &self.entries[(seq % IDLE_RING as u64) as usize];
            let tag = e.seq.load(Ordering::Acquire);
            let (from, to) = (e.from.load(Ordering::Relaxed), e.to.load(Ordering::Relaxed));
            // Reads the tag again: a writer that came in between changed it.
            std::sync::atomic::fence(Ordering::Acquire);
            let again = e.seq.load(Ordering::Relaxed);
            if tag == seq + 1 && again == tag {
                out.stretches.push((from, to));
            } else if tag == 0 || tag <= seq {
                // Not written yet (its writer is between `fetch_add` and the last store):
                // stop here and read it next time.
                break;
            } else {
                // Overwritten by a later lap.
                out.lost += 1;
            }
            out.next = seq + 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_log_reads_each_stretch_once_and_counts_what_a_lap_overwrote() {
        // SAFETY: every field is an atomic, for which all-zero bytes are a valid value.
        let log: Box<IdleLog> = unsafe { Box::new_zeroed().assume_init() };
        log.push(10, 20);
        log.push(30, 45);
        let first = log.read_since(0);
        assert_eq!(first.stretches, vec![(10, 20), (30, 45)]);
        assert_eq!((first.next, first.lost), (2, 0));
        let n = IDLE_RING as u64 + 5;
        for i in 0..n {
            log.push(100 + i, 101 + i);
        }
        let second = log.read_since(first.next);
        assert_eq!(
            second.lost, 5,
            "five stretches were overwritten before this read"
        );
        assert_eq!(second.stretches.len(), IDLE_RING);
        assert_eq!(second.stretches[0], (105, 106));
        assert_eq!(second.next, first.next + n);
        // An entry whose writer has taken its number but not stored it yet ends the read
        // there, and the next read picks it up.
        log.next.fetch_add(1, Ordering::AcqRel);
        let third = log.read_since(second.next);
        assert!(third.stretches.is_empty());
        assert_eq!((third.next, third.lost), (second.next, 0));
    }

    fn ring() -> Box<BusyRing<16, 10>> {
        Box::new(BusyRing {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    #[test]
    fn records_and_reads_busy_time_per_bucket() {
        let r = ring();
        r.add(0, 5, 25); // 5 in [0,10), 10 in [10,20), 5 in [20,30)
        assert_eq!(r.busy_between(0, 30), 20);
        assert_eq!(r.busy_between(10, 20), 10);
        // Partial buckets at the edges are not counted.
        assert_eq!(r.busy_between(5, 30), 15);
    }

    #[test]
    fn old_laps_are_ignored_and_overwritten() {
        let r = ring();
        r.add(0, 0, 10);
        // 16 buckets later the same slot holds a new epoch.
        r.add(160, 160, 165);
        assert_eq!(r.busy_between(160, 170), 5);
        assert_eq!(r.busy_between(0, 10), 0, "lap 0 is gone");
    }

    #[test]
    fn writes_far_ahead_are_clipped() {
        let r = ring();
        // Horizon is 3/4 of 160 = 120 ns ahead of now.
        r.add(0, 0, 1_000);
        assert_eq!(r.busy_between(0, 120), 120);
        assert_eq!(r.busy_between(120, 160), 0);
    }

    #[test]
    fn utilization_over_a_window() {
        let r = ring();
        r.add(0, 0, 20);
        r.add(0, 30, 40);
        // Window of 4 buckets ending at 40: [0,40) has 30 busy.
        let u = r.utilization(45, 40);
        assert!((u - 0.75).abs() < 1e-9, "{u}");
    }
}
