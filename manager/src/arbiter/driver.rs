//! One GPU's arbiter thread: runs the [`Scheduler`] over the shared-memory
//! files of the allocations on that GPU. It publishes grants, watches demand
//! (processes blocked at a gate), activity (launch counters) and drains
//! (slots' drained epochs), beats the heartbeat gates rely on, and keeps the
//! statistics.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_shm::layout::{GRANT_START_PENDING, Owner, grant};
use tessera_shm::sys::{Priority, Sys};
use tessera_shm::{Liveness, LocalLiveness, Policy, ProcIdentity};

use super::sched::{Action, ClientId, Event, Scheduler, View};
use super::{AllocationFiles, ArbiterConfig, ArbiterError};

/// Hand-over samples kept per allocation and per GPU.
const SAMPLES: usize = 4096;
/// How often the heartbeat is written.
const BEAT_NS: u64 = 1_000_000;
/// How often shares and policies are re-read from the control files.
const PARAMS_NS: u64 = 5_000_000;
/// A "has work" verdict backed by live slots is trusted this long while
/// the waiter counter does not change.
const DEMAND_TRUST_NS: u64 = 100_000_000;
/// A "no work" verdict despite a non-zero counter (a count no live slot's
/// bit backs) is trusted only this long: a process sets its bit just after
/// counting itself, and a verdict taken in between must not stand.
const PHANTOM_TRUST_NS: u64 = 2_000_000;
/// How often slots that have not drained are checked for dead processes.
const LIVENESS_NS: u64 = 20_000_000;

/// Requests to a GPU thread.
pub(super) enum Cmd {
    Add {
        files: Arc<dyn AllocationFiles>,
        dev: usize,
        reply: SyncSender<Result<(), ArbiterError>>,
    },
    Remove {
        alloc_id: String,
        reply: SyncSender<bool>,
    },
    Shutdown,
}

/// What the GPU thread publishes for [`super::Arbiter::stats`].
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub members: HashMap<ClientId, MemberStats>,
    pub handovers: VecDeque<u64>,
    /// The same hand-overs, when each began and ended, and to whom.
    pub handover_spans: VecDeque<super::HandoverSpan>,
    /// The client holding the GPU and since when (a charge in progress).
    pub holding: Option<(ClientId, u64)>,
    /// Times the GPU thread woke to decide (its own counter, read without
    /// the lock).
    pub wakeups: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Clone)]
pub(super) struct MemberStats {
    pub alloc_id: String,
    /// The same, shared by its hand-overs' records (cheap to copy out).
    pub alloc_key: Arc<str>,
    pub dev: usize,
    pub target_ppm: u32,
    pub policy: Policy,
    pub added_at: u64,
    pub held_ns: u64,
    /// The longest single hold (grant to drained), drains included.
    pub longest_hold_ns: u64,
    pub grants: u64,
    pub drain_timeouts: u64,
    /// Recent held intervals, for the achieved share over the window.
    pub charges: VecDeque<(u64, u64)>,
    pub handovers: VecDeque<u64>,
    pub files: Arc<dyn AllocationFiles>,
}

struct Member {
    id: ClientId,
    files: Arc<dyn AllocationFiles>,
    dev: usize,
    /// The epoch of the latest revocation, whose work must drain.
    revoked_epoch: u32,
    /// Work submitted before this arbiter took over (processes running
    /// free) must drain before the allocation is scheduled: until then
    /// `settle_by` is set.
    settle_by: Option<u64>,
    /// Cached demand verdict: (waiter counter, verdict, when).
    demand: Option<(u32, bool, u64)>,
    /// Slots found dead while draining (slot, owner word): ignored.
    dead: Vec<(usize, u64)>,
    /// When this arbiter revoked the grant (or took the allocation over):
    /// a reported drain time is never taken as earlier than this.
    revoked_seen: u64,
    last_liveness: u64,
}

impl Member {
    fn alloc_id(&self) -> &str {
        self.files.control().alloc_id()
    }

    fn publish(&self, flags: u32) -> Option<u32> {
        match self.files.control().publish_grant(self.dev, flags) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::error!(alloc = self.alloc_id(), dev = self.dev, "grant: {e}");
                None
            }
        }
    }

    /// Live processes blocked at the gate, through the cache.
    fn waiting(&mut self, now: u64) -> bool {
        // A paused allocation (`tessera pause`) is never granted: its
        // processes are held before the gate, so what waits there is stale.
        if self.settle_by.is_some() || self.files.control().paused() {
            return false;
        }
        let state = self.files.state();
        let counter = state
            .device(self.dev)
            .waiters
            .load(std::sync::atomic::Ordering::Acquire);
        if counter == 0 {
            self.demand = None;
            return false;
        }
        let trust = |verdict: bool| {
            if verdict {
                DEMAND_TRUST_NS
            } else {
                PHANTOM_TRUST_NS
            }
        };
        if let Some((c, verdict, at)) = self.demand
            && c == counter
            && now.saturating_sub(at) < trust(verdict)
        {
            return verdict;
        }
        let verdict = state.gate_waiters(self.dev) > 0;
        self.demand = Some((counter, verdict, now));
        verdict
    }

    /// When every live process that submitted under the revoked epoch had
    /// drained, if they have: the processes' report, clamped to between
    /// the revocation and now. Processes found dead are left out.
    ///
    /// Not clamped to the arbiter's last look without a report: a report
    /// not there yet is no sight of work running, only of a drainer that
    /// has not woken. Clamped so, a process whose drainer woke late on a
    /// busy host was charged its own wake-up, at every look the arbiter
    /// took meanwhile (beside four busy processes, a guaranteed 75 % of
    /// 50 µs kernels alone was charged 0.35 ms past its work's end per
    /// grant on average, 2.5 points of its share), and a pre-armed next
    /// holder, whose time starts at the report, paid for the same stretch
    /// again. A process reporting early could always do so promptly, so
    /// the clamp kept nothing from a liar (docs/compute-slices.md, "What
    /// processes report").
    fn drained_at(&mut self, now: u64) -> Option<u64> {
        if !self.drained(now) {
            return None;
        }
        let reported = self.files.state().drained_at_ns(self.dev);
        Some(reported.clamp(self.revoked_seen.min(now), now))
    }

    /// Whether every live process that submitted under the revoked epoch
    /// has drained. Processes found dead are left out.
    fn drained(&mut self, now: u64) -> bool {
        let pending = self.files.state().undrained(self.dev, self.revoked_epoch);
        let mut pending: Vec<_> = pending
            .into_iter()
            .filter(|u| !self.dead.contains(&(u.slot, u.owner)))
            .collect();
        if pending.is_empty() {
            return true;
        }
        if now.saturating_sub(self.last_liveness) >= LIVENESS_NS {
            self.last_liveness = now;
            let state = self.files.state();
            pending.retain(|u| {
                if is_dead(state, u.slot, u.owner) {
                    self.dead.push((u.slot, u.owner));
                    false
                } else {
                    true
                }
            });
            // Keep the list from growing without bound: only the slots of
            // this drain matter.
            if self.dead.len() > 1024 {
                self.dead.clear();
            }
        }
        pending.is_empty()
    }
}

/// Whether the process in `slot` (still owned as `owner`) is dead, as far
/// as the manager can tell: by its host pid when the manager recorded one,
/// else from this pid namespace.
fn is_dead(state: &tessera_shm::State, slot: usize, owner: u64) -> bool {
    use std::sync::atomic::Ordering::Acquire;
    let s = state.slot(slot);
    if s.owner.load(Acquire) != owner || !matches!(Owner::unpack(owner), Owner::Alive { .. }) {
        return true; // left or reclaimed since
    }
    let host_pid = s.host_pid.load(Acquire);
    if host_pid != 0 {
        let Ok(pid) = i32::try_from(host_pid) else {
            return false;
        };
        return nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
    }
    let id = ProcIdentity {
        pid: s.pid.load(Acquire),
        pidns: s.pidns.load(Acquire),
        start_time: s.start_time.load(Acquire),
    };
    LocalLiveness::thorough().check(&id) == Some(false)
}

/// The scheduler's view of the world, over the members' files.
struct FileView<'a> {
    members: &'a mut [Member],
    now: u64,
}

impl FileView<'_> {
    fn member(&mut self, id: ClientId) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }
}

impl View for FileView<'_> {
    fn waiting(&mut self, id: ClientId) -> bool {
        let now = self.now;
        self.member(id).is_some_and(|m| m.waiting(now))
    }
    fn launches(&mut self, id: ClientId) -> u64 {
        self.member(id)
            .map_or(0, |m| m.files.state().launches(m.dev))
    }
    fn syncing(&mut self, id: ClientId) -> bool {
        self.member(id)
            .is_some_and(|m| m.files.state().syncing(m.dev))
    }
    fn yielding(&mut self, id: ClientId) -> bool {
        self.member(id)
            .is_some_and(|m| m.files.state().yielding(m.dev))
    }
    fn drained(&mut self, id: ClientId) -> Option<u64> {
        let now = self.now;
        match self.member(id) {
            Some(m) => m.drained_at(now),
            None => Some(now),
        }
    }
    fn reported_end(&mut self, id: ClientId) -> Option<u64> {
        // The processes' own word, unclamped: the scheduler cuts it to the
        // reporter's charge and uses it only for the next holder's start.
        self.member(id)
            .map(|m| m.files.state().drained_at_ns(m.dev))
            .filter(|&t| t != 0)
    }
    fn first_launch(&mut self, id: ClientId, since: u64) -> Option<u64> {
        // The processes' own record, a hint: the scheduler clamps it.
        self.member(id)
            .and_then(|m| m.files.state().first_launch_since(m.dev, since))
    }
    fn queued_until(&mut self, id: ClientId) -> Option<u64> {
        // The processes' own word, a hint: the scheduler bounds it.
        self.member(id)
            .and_then(|m| m.files.state().queued_until(m.dev))
    }
}

/// The GPU thread.
pub(super) struct Driver {
    cfg: ArbiterConfig,
    /// The clock and the futex (the real ones, or a test's fake clock).
    sys: Arc<dyn Sys>,
    sched: Scheduler,
    members: Vec<Member>,
    next_id: ClientId,
    shared: Arc<Mutex<Shared>>,
    last_beat: u64,
    last_params: u64,
    /// When the GPU last had a holder or demand (for the slower idle poll).
    last_busy: u64,
    /// [`Shared::wakeups`].
    wakeups: Arc<std::sync::atomic::AtomicU64>,
}

impl Driver {
    pub fn new(cfg: ArbiterConfig, shared: Arc<Mutex<Shared>>, sys: Arc<dyn Sys>) -> Self {
        let wakeups = Arc::clone(&lock(&shared).wakeups);
        Driver {
            wakeups,
            sched: Scheduler::new(cfg.sched()),
            cfg,
            sys,
            members: Vec::new(),
            next_id: 1,
            shared,
            last_beat: 0,
            last_params: 0,
            last_busy: 0,
        }
    }

    /// Runs until told to shut down (or the arbiter is dropped).
    pub fn run(mut self, rx: Receiver<Cmd>) {
        // Grants of a capped allocation are due at exact times, and the
        // default 50 µs slack shows in its share.
        self.sys.set_timer_slack(1_000);
        // And each decision is due at a time: woken after a busy thread's
        // whole slice, it comes late on a loaded node.
        self.sys.wake_promptly();
        // The slice alone still left about one wake-up in a hundred 1–8 ms
        // late beside four busy processes: a weight keeps it eligible.
        if self.sys.raise_priority(self.cfg.nice) == Priority::Refused {
            tracing::info!(
                nice = self.cfg.nice,
                "the arbiter's thread keeps its priority (raising it needs CAP_SYS_NICE): \
                 under CPU load, hand-overs wait longer for it"
            );
        }
        // Whose doorbell ended the last sleep before its time.
        let mut rung: Option<ClientId> = None;
        loop {
            self.wakeups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let now = self.sys.monotonic_ns();
            self.housekeeping(now);
            // The holder's doorbell, read before deciding: a process that
            // yields after this read (its host part began) wakes the sleep
            // below at once, one before it is seen by the decision.
            let holder_bell = self.bell_of(self.sched.holder());
            let phase = (self.sched.holder(), self.sched.draining());
            let until = self.decide(now);
            // A ring that changed nothing (a tenant ringing its own bell over
            // and over) does not cut the next sleep on that bell short: a
            // doorbell can wake this thread at most once per poll more than
            // the clock does, whatever is rung.
            let deaf_to = rung.filter(|_| phase == (self.sched.holder(), self.sched.draining()));
            // Sleep until the decision's deadline, the next poll, or a
            // command.
            let now = self.sys.monotonic_ns();
            let poll = if self.sched.holder().is_some()
                || now.saturating_sub(self.last_busy) < self.cfg.idle_after.as_nanos() as u64
            {
                self.cfg.poll
            } else {
                self.cfg.idle_poll
            };
            let wake = until.map_or(u64::MAX, |u| u.max(now));
            let sleep = wake.saturating_sub(now).min(poll.as_nanos() as u64);
            // While a grant is held or drains, sleep on its allocation's
            // doorbell: a drain's report rings it, and so does a process
            // that yields (a host gap begins), so the GPU changes hands
            // within a wake-up, not a poll. While no one holds it, on the
            // doorbell of the allocation expected back from a host gap
            // soonest: its processes ring it as they reach the gate. Commands
            // wait for the poll.
            // While the holder is away in a host gap (its processes yield),
            // on the doorbell of the one expected back soonest instead: the
            // holder keeps its grant while uncontested, and only that
            // return changes it.
            let draining = self.sched.draining();
            let holder = self.sched.holder();
            let holder_away = draining.is_none()
                && holder.is_some_and(|h| {
                    FileView {
                        members: &mut self.members,
                        now,
                    }
                    .yielding(h)
                });
            let back = self.sched.expected_back(now, holder_away);
            rung = None;
            if let Some(id) = draining
                .or(back.filter(|_| holder_away))
                .or(holder)
                .or(back)
                && deaf_to != Some(id)
                && let Some((files, dev)) = self
                    .members
                    .iter()
                    .find(|m| m.id == id)
                    .map(|m| (Arc::clone(&m.files), m.dev))
            {
                let bell = files.state().drain_signal(dev);
                let seen = match holder_bell {
                    // Read before deciding: a yield since wakes at once.
                    Some((h, v)) if h == id && draining.is_none() => v,
                    _ => bell.load(std::sync::atomic::Ordering::Acquire),
                };
                // Re-check after reading the bell: a drain reported in
                // between must not be slept through.
                let mut view = FileView {
                    members: &mut self.members,
                    now,
                };
                let due = if back == Some(id) {
                    // Back already (it reached the gate before the read):
                    // decide again at once.
                    !view.waiting(id)
                } else {
                    draining.is_none() || view.drained(id).is_none()
                };
                if due {
                    self.sys.futex_wait(bell, seen, sleep.max(1));
                    rung = (self.sys.monotonic_ns() < now.saturating_add(sleep)).then_some(id);
                }
                match rx.try_recv() {
                    Ok(cmd) => {
                        if self.command(cmd) {
                            return;
                        }
                    }
                    Err(std::sync::mpsc::TryRecvError::Empty) => {}
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
                continue;
            }
            match rx.recv_timeout(Duration::from_nanos(sleep)) {
                Ok(cmd) => {
                    if self.command(cmd) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.shutdown();
                    return;
                }
            }
        }
    }

    /// The doorbell value of `id`'s state file on its device, with `id`.
    fn bell_of(&self, id: Option<ClientId>) -> Option<(ClientId, u32)> {
        let id = id?;
        let m = self.members.iter().find(|m| m.id == id)?;
        Some((
            id,
            m.files
                .state()
                .drain_signal(m.dev)
                .load(std::sync::atomic::Ordering::Acquire),
        ))
    }

    /// Handles a command; true when the thread must stop.
    fn command(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Add { files, dev, reply } => {
                let r = self.add(files, dev);
                let _ = reply.send(r);
                false
            }
            Cmd::Remove { alloc_id, reply } => {
                let found = self.remove(&alloc_id);
                let _ = reply.send(found);
                false
            }
            Cmd::Shutdown => {
                self.shutdown();
                true
            }
        }
    }

    fn add(&mut self, files: Arc<dyn AllocationFiles>, dev: usize) -> Result<(), ArbiterError> {
        let alloc_id = files.control().alloc_id().to_owned();
        if self
            .members
            .iter()
            .any(|m| m.alloc_id() == alloc_id && m.dev == dev)
        {
            return Err(ArbiterError::AlreadyAdded { alloc_id, dev });
        }
        let now = self.sys.monotonic_ns();
        let id = self.next_id;
        self.next_id += 1;
        let control = files.control();
        let share = control.compute_share_ppm(dev);
        let policy = control.policy(dev);
        control.beat(now)?;
        // Take over: whatever runs now (processes running free, or a grant
        // a previous arbiter left) stops and drains before anyone is
        // granted.
        let revoked = control.publish_grant(dev, 0)?;
        let member = Member {
            id,
            files: Arc::clone(&files),
            dev,
            revoked_epoch: grant::epoch(revoked),
            settle_by: Some(now.saturating_add(self.cfg.drain_timeout.as_nanos() as u64)),
            demand: None,
            dead: Vec::new(),
            last_liveness: 0,
            revoked_seen: now,
        };
        self.sched.add(id, share, policy);
        self.sched.set_priority(id, control.priority());
        self.members.push(member);
        lock(&self.shared).members.insert(
            id,
            MemberStats {
                alloc_id: alloc_id.clone(),
                alloc_key: Arc::from(alloc_id.as_str()),
                dev,
                target_ppm: share,
                policy,
                added_at: now,
                held_ns: 0,
                longest_hold_ns: 0,
                grants: 0,
                drain_timeouts: 0,
                charges: VecDeque::new(),
                handovers: VecDeque::new(),
                files,
            },
        );
        tracing::info!(alloc = %alloc_id, dev, share_ppm = share, ?policy, "arbitrating");
        Ok(())
    }

    fn remove(&mut self, alloc_id: &str) -> bool {
        let ids: Vec<ClientId> = self
            .members
            .iter()
            .filter(|m| m.alloc_id() == alloc_id)
            .map(|m| m.id)
            .collect();
        for &id in &ids {
            self.sched.remove(id);
            if let Some(pos) = self.members.iter().position(|m| m.id == id) {
                let m = self.members.remove(pos);
                // No longer arbitrated: its processes run freely.
                m.publish(grant::OPEN);
            }
            let mut shared = lock(&self.shared);
            shared.members.remove(&id);
            if shared.holding.is_some_and(|(h, _)| h == id) {
                shared.holding = None;
            }
        }
        !ids.is_empty()
    }

    /// Opens every gate: with no arbiter, its allocations run freely (a
    /// later arbiter takes them over again).
    fn shutdown(&mut self) {
        for m in self.members.drain(..) {
            m.publish(grant::OPEN);
        }
        let mut shared = lock(&self.shared);
        shared.members.clear();
        shared.holding = None;
    }

    /// Heartbeat, parameter changes, settling of new members.
    fn housekeeping(&mut self, now: u64) {
        if now.saturating_sub(self.last_beat) >= BEAT_NS {
            self.last_beat = now;
            for m in &self.members {
                let _ = m.files.control().beat(now);
            }
        }
        if now.saturating_sub(self.last_params) >= PARAMS_NS {
            self.last_params = now;
            let mut shared = lock(&self.shared);
            for m in &self.members {
                let c = m.files.control();
                let (share, policy) = (c.compute_share_ppm(m.dev), c.policy(m.dev));
                self.sched.set_params(m.id, share, policy);
                self.sched.set_priority(m.id, c.priority());
                if let Some(s) = shared.members.get_mut(&m.id) {
                    s.target_ppm = share;
                    s.policy = policy;
                }
            }
        }
        for i in 0..self.members.len() {
            let Some(by) = self.members[i].settle_by else {
                continue;
            };
            let m = &mut self.members[i];
            if m.drained(now) || now >= by {
                if now >= by {
                    tracing::warn!(
                        alloc = m.alloc_id(),
                        dev = m.dev,
                        "work from before the arbiter took over did not drain in time"
                    );
                }
                m.settle_by = None;
            }
        }
    }

    /// Runs the scheduler until it waits; returns its deadline.
    fn decide(&mut self, now: u64) -> Option<u64> {
        let until = loop {
            let mut view = FileView {
                members: &mut self.members,
                now,
            };
            match self.sched.step(now, &mut view) {
                Action::Grant(id) => {
                    // Deciding took time (slot scans): charge from now, not
                    // from when the step began. The clock is read before the
                    // gate opens: the holder's work starts the moment the
                    // grant is published, and an arbiter preempted between
                    // the two must not leave that start uncharged (over a
                    // hundred grants a second, such gaps add up to whole
                    // holds of uncharged GPU time).
                    let at = self.sys.monotonic_ns();
                    if let Some(until) = self.sched.granted_at(at)
                        && let Some(m) = self.members.iter().find(|m| m.id == id)
                    {
                        // The quantum's end first: a process that sees the
                        // grant sees its end (the shim's pacer queues no
                        // kernel to start past it). It may be cut short of
                        // a quantum (a client owed more is due back).
                        let _ = m.files.control().set_grant_until(m.dev, until);
                        // Pre-armed behind a drain, its time starts where
                        // that work ends: the pacer must not predict its
                        // first kernel's end from now (a second 20 ms kernel
                        // would queue behind it and reach the next drain).
                        let start = match self.sched.grant_start() {
                            Some((h, None)) if h == id => GRANT_START_PENDING,
                            _ => at,
                        };
                        let _ = m.files.control().set_grant_start(m.dev, start);
                        m.publish(grant::GRANTED);
                    }
                }
                Action::Revoke(id, _) => {
                    if let Some(m) = self.members.iter_mut().find(|m| m.id == id)
                        && let Some(w) = m.publish(0)
                    {
                        m.revoked_epoch = grant::epoch(w);
                        m.dead.clear();
                        m.last_liveness = now;
                        m.revoked_seen = now;
                    }
                }
                Action::Wait { until } => break until,
            }
        };
        if self.sched.holder().is_some() {
            self.last_busy = now;
        }
        // A pre-armed grant whose drain ended: its time started then.
        if let Some((id, Some(start))) = self.sched.grant_start()
            && let Some(m) = self.members.iter().find(|m| m.id == id)
            && m.files.control().grant_start(m.dev) == GRANT_START_PENDING
        {
            let _ = m.files.control().set_grant_start(m.dev, start);
        }
        // A grant renewed without a hand-over has a new quantum end.
        if let Some((id, end)) = self.sched.quantum_end()
            && let Some(m) = self.members.iter().find(|m| m.id == id)
            && m.files.control().grant_until(m.dev) != end
        {
            let _ = m.files.control().set_grant_until(m.dev, end);
        }
        self.record(now);
        until
    }

    fn record(&mut self, now: u64) {
        let events = self.sched.take_events();
        let window = self.cfg.stats_window.as_nanos() as u64;
        let mut guard = lock(&self.shared);
        // One reborrow, so a member and the node-wide samples can be
        // borrowed apart (through the guard they cannot).
        let shared = &mut *guard;
        for e in events {
            match e {
                Event::Granted { id, at } => {
                    shared.holding = Some((id, at));
                    if let Some(s) = shared.members.get_mut(&id) {
                        s.grants += 1;
                    }
                }
                Event::Charged { id, start, end } => {
                    if shared.holding.is_some_and(|(h, _)| h == id) {
                        shared.holding = Some((id, end));
                    }
                    if let Some(s) = shared.members.get_mut(&id) {
                        s.held_ns += end.saturating_sub(start);
                        s.longest_hold_ns = s.longest_hold_ns.max(end.saturating_sub(start));
                        s.charges.push_back((start, end));
                        while s.charges.front().is_some_and(|&(_, e)| e + window < now) {
                            s.charges.pop_front();
                        }
                    }
                }
                Event::Handover {
                    to,
                    ns,
                    revoked_at,
                    waiting,
                } => {
                    push_sample(&mut shared.handovers, ns);
                    if let Some(s) = shared.members.get_mut(&to) {
                        let span = super::HandoverSpan {
                            to: Arc::clone(&s.alloc_key),
                            revoked_at,
                            over_at: revoked_at.saturating_add(ns),
                            waiting,
                        };
                        push_sample(&mut shared.handover_spans, span);
                        push_sample(&mut s.handovers, ns);
                    }
                }
                Event::DrainTimedOut { id } => {
                    if let Some(s) = shared.members.get_mut(&id) {
                        s.drain_timeouts += 1;
                        tracing::warn!(
                            alloc = %s.alloc_id,
                            dev = s.dev,
                            "a revoked grant's work did not drain in time; moving on"
                        );
                    }
                }
            }
        }
        if self.sched.holder().is_none() {
            shared.holding = None;
        }
    }
}

fn push_sample<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == SAMPLES {
        q.pop_front();
    }
    q.push_back(v);
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod stepped;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use tessera_shm::{ControlSpec, DeviceSpec, create_allocation_files};

    #[test]
    fn a_waiter_caught_between_counting_and_flagging_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ControlSpec::new(
            "demand",
            vec![DeviceSpec {
                uuid: "GPU-00000000-0000-0000-0000-0000000000d1".into(),
                memory_limit_bytes: 1 << 20,
                compute_share_ppm: 300_000,
                policy: Policy::Burst,
            }],
        );
        let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
        let files = Arc::new(super::super::OpenFiles::open(&c, &s).unwrap());
        let state = files.state();
        let me = ProcIdentity {
            pid: 4242,
            pidns: 0,
            start_time: 0,
        };
        let m = state.join(&me, &LocalLiveness::quick()).unwrap();
        state
            .raw()
            .header
            .gate_slots
            .store(m.slot as u32 + 1, Ordering::SeqCst);
        let mut member = Member {
            id: 1,
            files: files.clone(),
            dev: 0,
            revoked_epoch: 0,
            settle_by: None,
            demand: None,
            dead: Vec::new(),
            last_liveness: 0,
            revoked_seen: 0,
        };
        // Counted, not yet flagged: no demand yet.
        state.device(0).waiters.fetch_add(1, Ordering::SeqCst);
        let t = 1_000_000_000;
        assert!(!member.waiting(t));
        // Flagged; the counter did not change.
        state
            .slot(m.slot)
            .gate_waiting
            .fetch_or(1, Ordering::SeqCst);
        assert!(
            member.waiting(t + PHANTOM_TRUST_NS),
            "the earlier verdict stood"
        );
        // A settling member (its earlier work still draining) has none.
        member.settle_by = Some(t);
        assert!(!member.waiting(t + PHANTOM_TRUST_NS));
    }
}
