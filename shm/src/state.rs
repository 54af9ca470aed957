//! The state file: what an allocation's processes hold, updated lock-free.
//!
//! # Reservations
//!
//! Each device has one packed word, [`DeviceState::reserved`]: the bytes all
//! processes hold, plus at most one *pending* operation (slot, sequence).
//! Each slot has, per device, its own usage (bytes, sequence) and an intent
//! (signed change, sequence). An operation by slot `s` on device `d`:
//!
//! 1. finishes any pending operation first (helping, below);
//! 2. checks the limit against the reserved bytes;
//! 3. writes its intent `(delta, seq+1)` into its slot;
//! 4. compare-and-swaps the reserved word from what it read to
//!    `(bytes + delta, pending = (s, seq+1))` — this is the admission;
//! 5. helps its own operation to completion.
//!
//! *Helping* an operation `(s, k)`: if slot `s`'s usage still carries
//! sequence `k-1`, compare-and-swap it to `(usage + delta, k)`; then
//! compare-and-swap the reserved word's pending mark away. Every step is an
//! idempotent CAS, so any number of helpers may race, and a process killed
//! anywhere leaves either nothing (before step 4) or an operation the next
//! process finishes for it. No lock exists, so none is ever left held.
//!
//! # Slots and reclaim
//!
//! A process joins by CAS-ing a free slot to `Alive(pid)`. A dead process's
//! slot is reclaimed by whoever first CAS-es it to `Reclaiming`: the
//! claimant then runs ordinary operations that bring the slot's usage to
//! zero, and frees it. A claimant that dies mid-way is itself detected
//! dead, and its claim is taken over.
//!
//! Who may reclaim what: the driver goes on holding a dead process's memory
//! until it has torn the process down, after the process is gone from
//! `/proc` (NVML keeps listing it meanwhile), so a slot that still holds
//! memory is reclaimed only by a caller that has seen the driver let go of
//! it: the manager ([`State::reclaim_dead`] with its NVML-aware liveness).
//! A process of the allocation reclaims only the slots of dead processes
//! that hold nothing ([`State::reclaim_dead_empty`]), and waits for the
//! manager for the rest ([`State::dead_holding`]).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::ShmError;
use crate::control::{check_exact_size, check_header, write_atomically_with};
use crate::layout::*;
use crate::map::Mapping;
use crate::process::{Liveness, ProcIdentity};
use crate::protocol::{self, Refused, Word, Words};

/// A process's membership: its slot and the slot generation it joined at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub slot: usize,
    pub generation: u32,
}

/// A process that holds (or held) part of the allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub slot: usize,
    pub identity: ProcIdentity,
    pub host_pid: u32,
    /// Bytes held per device, in the control file's device order.
    pub usage: Vec<u64>,
}

/// What reclaiming one dead process returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub slot: usize,
    pub identity: ProcIdentity,
    /// Bytes returned per device.
    pub freed: Vec<u64>,
}

/// An open state file.
#[derive(Debug)]
pub struct State {
    map: Mapping<StateFile>,
    path: PathBuf,
}

/// Creates (or replaces) an empty state file for allocation `alloc_id`.
/// Mode 0666: the container's processes, whatever their uid, must write it;
/// only that container mounts it.
pub fn create_state_file(path: &Path, alloc_id: &str) -> Result<(), ShmError> {
    if alloc_id.is_empty() || alloc_id.len() >= ID_LEN {
        return Err(ShmError::BadSpec(format!("bad allocation id {alloc_id:?}")));
    }
    // Only the header is written; the rest (the slots, over half a
    // megabyte) is a hole that reads as zeros, so a create writes one page
    // instead of the whole file, and pages are spent only on slots used.
    let mut header = vec![0u8; std::mem::size_of::<StateHeader>()];
    header[..8].copy_from_slice(&STATE_MAGIC.to_le_bytes());
    let abi = std::mem::offset_of!(StateHeader, abi_version);
    header[abi..abi + 4].copy_from_slice(&ABI_VERSION.to_le_bytes());
    let size = std::mem::offset_of!(StateHeader, size);
    header[size..size + 4]
        .copy_from_slice(&(std::mem::size_of::<StateFile>() as u32).to_le_bytes());
    let id = std::mem::offset_of!(StateHeader, alloc_id);
    header[id..id + alloc_id.len()].copy_from_slice(alloc_id.as_bytes());
    write_atomically_with(path, 0o666, |f| {
        f.set_len(std::mem::size_of::<StateFile>() as u64)?;
        f.write_all(&header)
    })?;
    // The umask may have narrowed the mode; processes of any uid must write.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| ShmError::io(path, e))
}

impl State {
    /// Opens a state file read-write and checks it belongs to `alloc_id`.
    pub fn open(path: &Path, alloc_id: &str) -> Result<Self, ShmError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| ShmError::io(path, e))?;
        check_exact_size::<StateFile>(&file, path)?;
        let map = Mapping::<StateFile>::new(&file, path, true)?;
        let h = &map.header;
        check_header::<StateFile>(path, STATE_MAGIC, h.magic, h.abi_version, h.size)?;
        let mut want = [0u8; ID_LEN];
        want[..alloc_id.len().min(ID_LEN - 1)]
            .copy_from_slice(&alloc_id.as_bytes()[..alloc_id.len().min(ID_LEN - 1)]);
        if h.alloc_id != want {
            return Err(ShmError::corrupt(
                path,
                format!("belongs to another allocation, not {alloc_id:?}"),
            ));
        }
        Ok(State {
            map,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw mapped file, for the gate and the arbiter.
    pub fn raw(&self) -> &StateFile {
        &self.map
    }

    pub fn device(&self, dev: usize) -> &DeviceState {
        &self.map.devices[dev]
    }

    pub fn slot(&self, slot: usize) -> &Slot {
        &self.map.slots[slot]
    }

    /// Bytes reserved on a device by all processes (a pending operation's
    /// change included: it is already admitted).
    pub fn reserved(&self, dev: usize) -> u64 {
        Reserved::unpack(self.map.devices[dev].reserved.load(Ordering::Acquire)).bytes
    }

    /// Bytes held by one slot on one device.
    pub fn slot_usage(&self, slot: usize, dev: usize) -> u64 {
        Usage::unpack(
            self.map.slots[slot].devices[dev]
                .usage
                .load(Ordering::Acquire),
        )
        .bytes
    }

    /// Allocations refused on a device for lack of quota.
    pub fn oom_refused(&self, dev: usize) -> u64 {
        self.map.devices[dev].oom_refused.load(Ordering::Relaxed)
    }

    fn identity(&self, slot: usize) -> ProcIdentity {
        let s = &self.map.slots[slot];
        // start_time is written last with Release: reading it first with
        // Acquire makes a non-zero value imply pidns is set too.
        let start_time = s.start_time.load(Ordering::Acquire);
        ProcIdentity {
            pid: s.pid.load(Ordering::Acquire),
            pidns: s.pidns.load(Ordering::Acquire),
            start_time,
        }
    }

    /// Joins the calling process: claims a free slot. Nothing is reclaimed
    /// here: what a dead process's slot holds the driver may still hold too
    /// (see the module docs), and dead slots that hold nothing cost only a
    /// slot, which the manager's reaper frees. `live` is kept for callers
    /// of the previous form.
    pub fn join(&self, me: &ProcIdentity, _live: &dyn Liveness) -> Result<Member, ShmError> {
        let h = &self.map.header;
        let start = h.join_cursor.fetch_add(1, Ordering::Relaxed) as usize;
        for k in 0..MAX_SLOTS {
            let i = (start + k) % MAX_SLOTS;
            if let Some(generation) = protocol::join_slot(&*self.map, i, me.pid) {
                let s = &self.map.slots[i];
                s.pid.store(me.pid, Ordering::Release);
                s.pidns.store(me.pidns, Ordering::Release);
                s.start_time.store(me.start_time, Ordering::Release);
                return Ok(Member {
                    slot: i,
                    generation,
                });
            }
        }
        Err(ShmError::Full(self.path.clone()))
    }

    /// Reserves `bytes` on `dev` for `m`, refusing anything over `limit`.
    ///
    /// One operation per member and device at a time: a slot's intent word
    /// has room for one, so threads of one process that allocate
    /// concurrently must serialise their calls (the hook holds a lock per
    /// device around them; it is not on the launch path).
    pub fn reserve(&self, m: Member, dev: usize, bytes: u64, limit: u64) -> Result<(), Refused> {
        let delta = i64::try_from(bytes).map_err(|_| Refused::TooLarge(bytes))?;
        let r = self.apply(m.slot, dev, delta, Some(limit));
        if matches!(r, Err(Refused::OverLimit { .. })) {
            self.map.devices[dev]
                .oom_refused
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Returns `bytes` on `dev` that `m` reserved earlier.
    pub fn release(&self, m: Member, dev: usize, bytes: u64) -> Result<(), Refused> {
        let delta = i64::try_from(bytes).map_err(|_| Refused::TooLarge(bytes))?;
        self.apply(m.slot, dev, -delta, None)
    }

    /// One operation, as described in the module docs.
    fn apply(
        &self,
        slot: usize,
        dev: usize,
        delta: i64,
        limit: Option<u64>,
    ) -> Result<(), Refused> {
        protocol::apply(&*self.map, slot, dev, delta, limit)
    }

    /// Leaves the allocation: returns everything `m` holds and frees its slot.
    pub fn leave(&self, m: Member) {
        let owner = &self.map.slots[m.slot].owner;
        let word = owner.load(Ordering::Acquire);
        if !matches!(Owner::unpack(word), Owner::Alive { generation, .. } if generation == m.generation)
        {
            return; // already reclaimed by someone who thought us dead
        }
        let claim = Owner::Reclaiming {
            generation: m.generation,
            by: m.slot as u32,
            by_gen: gen_low(m.generation),
        };
        self.take_over(m.slot, word, claim);
    }

    /// Reclaims every slot whose process `live` says is dead, and every
    /// abandoned reclaim. `by` is the caller's own membership (a hook), or
    /// `None` for the manager. Returns what was reclaimed.
    ///
    /// `live` must answer dead only for a process whose memory the driver
    /// no longer holds (the manager's answer: gone from `/proc` and no
    /// longer listed by NVML), or the quota returned here could be
    /// allocated again while the driver still holds it. A process of the
    /// allocation, which cannot ask the driver about another process, uses
    /// [`State::reclaim_dead_empty`].
    pub fn reclaim_dead(&self, live: &dyn Liveness, by: Option<Member>) -> Vec<Reclaimed> {
        self.reclaim(live, by, false)
    }

    /// Reclaims the slots of dead processes that hold nothing, and every
    /// abandoned reclaim: what a process of the allocation may reclaim on
    /// `/proc`'s word alone (a slot that holds nothing returns no quota).
    pub fn reclaim_dead_empty(&self, live: &dyn Liveness, by: Member) -> Vec<Reclaimed> {
        self.reclaim(live, Some(by), true)
    }

    /// Bytes on `dev` held by slots whose process `live` says is dead: the
    /// quota the manager has yet to release, once the driver has let go of
    /// those processes. A caller refused over the limit may wait for it.
    pub fn dead_holding(&self, live: &dyn Liveness, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        (0..MAX_SLOTS)
            .filter(|&i| {
                matches!(
                    Owner::unpack(self.map.slots[i].owner.load(Ordering::Acquire)),
                    Owner::Alive { .. }
                ) && self.slot_usage(i, dev) != 0
                    && live.check(&self.identity(i)) == Some(false)
            })
            .map(|i| self.slot_usage(i, dev))
            .sum()
    }

    /// Whether a slot holds memory on any device (a pending operation of
    /// its own counts: it may be about to).
    fn holds_anything(&self, slot: usize) -> bool {
        (0..MAX_DEVICES).any(|d| {
            self.slot_usage(slot, d) != 0
                || Reserved::unpack(self.map.devices[d].reserved.load(Ordering::Acquire))
                    .pending
                    .is_some_and(|(s, _)| s == slot)
        })
    }

    /// Reclaims dead slots and abandoned claims; with `empty_only`, only
    /// the dead slots that hold nothing.
    fn reclaim(&self, live: &dyn Liveness, by: Option<Member>, empty_only: bool) -> Vec<Reclaimed> {
        let (by_slot, by_gen) = match by {
            Some(m) => (m.slot as u32, gen_low(m.generation)),
            None => (MANAGER_RECLAIMER, 0),
        };
        let mut out = Vec::new();
        for i in 0..MAX_SLOTS {
            let owner = &self.map.slots[i].owner;
            let word = owner.load(Ordering::Acquire);
            let (generation, identity) = match Owner::unpack(word) {
                Owner::Free { .. } => continue,
                Owner::Alive { generation, .. } => {
                    if empty_only && self.holds_anything(i) {
                        continue;
                    }
                    let id = self.identity(i);
                    if live.check(&id) != Some(false) {
                        continue;
                    }
                    (generation, id)
                }
                Owner::Reclaiming {
                    generation,
                    by,
                    by_gen,
                } => {
                    if !self.reclaimer_gone(i, by, by_gen, live, by_slot) {
                        continue;
                    }
                    (generation, self.identity(i))
                }
            };
            let claim = Owner::Reclaiming {
                generation,
                by: by_slot,
                by_gen,
            };
            if let Some(freed) = self.take_over(i, word, claim) {
                out.push(Reclaimed {
                    slot: i,
                    identity,
                    freed,
                });
            }
        }
        out
    }

    /// Whether a reclaim claimed by `by` was abandoned by a dead claimant.
    fn reclaimer_gone(
        &self,
        slot: usize,
        by: u32,
        by_gen: u32,
        live: &dyn Liveness,
        me: u32,
    ) -> bool {
        if by as usize == slot {
            // A process leaving empties its own slot: the claim is abandoned
            // only if that process died.
            return live.check(&self.identity(slot)) == Some(false);
        }
        if by == MANAGER_RECLAIMER {
            // One manager per node: a manager seeing a manager's claim is
            // its own restarted successor; a hook never takes it over.
            return me == MANAGER_RECLAIMER;
        }
        let Some(slot) = self.map.slots.get(by as usize) else {
            return true;
        };
        match Owner::unpack(slot.owner.load(Ordering::Acquire)) {
            Owner::Alive { generation, .. } if gen_low(generation) == by_gen => {
                live.check(&self.identity(by as usize)) == Some(false)
            }
            // The claimant's own slot moved on: it left or was reclaimed, so
            // it is no longer working on this one.
            _ => true,
        }
    }

    /// Takes a slot over from owner word `seen` (see
    /// [`protocol::take_over`]): its usage brought to zero, its gate and
    /// identity cleared, and freed. `None` when another took it first.
    fn take_over(&self, slot: usize, seen: u64, claim: Owner) -> Option<Vec<u64>> {
        protocol::take_over(&*self.map, slot, seen, claim, || {
            for sd in &self.map.slots[slot].devices {
                sd.launch_epoch.store(0, Ordering::Relaxed);
                sd.drained_epoch.store(0, Ordering::Relaxed);
                sd.launches.store(0, Ordering::Relaxed);
            }
            // A dead process blocked at a gate must not look like demand.
            crate::gate::forget_waiting(&self.map, slot);
            let s = &self.map.slots[slot];
            s.start_time.store(0, Ordering::Release);
            s.pidns.store(0, Ordering::Release);
            s.host_pid.store(0, Ordering::Release);
            s.pid.store(0, Ordering::Release);
            // The usage sequence numbers stay: they keep counting across
            // occupants, so a helper delayed from a previous occupant's
            // operation cannot mistake a new one for it.
        })
    }

    /// Every joined process and what it holds on the first `n_devices`.
    pub fn processes(&self, n_devices: usize) -> Vec<ProcessInfo> {
        let n = n_devices.min(MAX_DEVICES);
        (0..MAX_SLOTS)
            .filter_map(|i| {
                let s = &self.map.slots[i];
                let Owner::Alive { .. } = Owner::unpack(s.owner.load(Ordering::Acquire)) else {
                    return None;
                };
                Some(ProcessInfo {
                    slot: i,
                    identity: self.identity(i),
                    host_pid: s.host_pid.load(Ordering::Relaxed),
                    usage: (0..n).map(|d| self.slot_usage(i, d)).collect(),
                })
            })
            .collect()
    }

    /// Records a slot's host pid (the manager resolves it from `/proc`).
    pub fn set_host_pid(&self, slot: usize, host_pid: u32) {
        self.map.slots[slot]
            .host_pid
            .store(host_pid, Ordering::Relaxed);
    }

    /// Checks the file's invariants: every device's total equals the sum of
    /// its slots' usage and nothing is pending. Holds only when no process is
    /// mid-operation, so it is for tests and the manager's audits.
    pub fn audit(&self) -> Result<(), String> {
        for dev in 0..MAX_DEVICES {
            let r = Reserved::unpack(self.map.devices[dev].reserved.load(Ordering::Acquire));
            if r.pending.is_some() {
                return Err(format!("device {dev}: operation pending"));
            }
            let sum: u64 = (0..MAX_SLOTS).map(|s| self.slot_usage(s, dev)).sum();
            if sum != r.bytes {
                return Err(format!(
                    "device {dev}: reserved {} but slots hold {sum}",
                    r.bytes
                ));
            }
        }
        Ok(())
    }
}

/// The state file's atomics as the protocol's words.
impl Words for StateFile {
    fn devices(&self) -> usize {
        MAX_DEVICES
    }

    fn slots(&self) -> usize {
        MAX_SLOTS
    }

    #[inline]
    fn load(&self, w: Word, order: Ordering) -> u64 {
        self.word(w).load(order)
    }

    #[inline]
    fn store(&self, w: Word, value: u64, order: Ordering) {
        self.word(w).store(value, order)
    }

    #[inline]
    fn compare_exchange(&self, w: Word, current: u64, new: u64) -> Result<u64, u64> {
        self.word(w)
            .compare_exchange(current, new, protocol::CAS_SUCCESS, protocol::CAS_FAILURE)
    }
}

impl StateFile {
    #[inline]
    fn word(&self, w: Word) -> &std::sync::atomic::AtomicU64 {
        match w {
            Word::Reserved { dev } => &self.devices[dev].reserved,
            Word::Usage { slot, dev } => &self.slots[slot].devices[dev].usage,
            Word::Intent { slot, dev } => &self.slots[slot].devices[dev].intent,
            Word::Owner { slot } => &self.slots[slot].owner,
        }
    }
}
