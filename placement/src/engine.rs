//! The engine: the cluster, its nodes grouped by the state of their GPUs,
//! and the decision over an index of the nodes per request.
//!
//! Nodes whose GPUs are in the same state (kind, free compute, free memory,
//! free slices, utilization: the multiset, not the order) share one
//! *bucket*. Every policy ranks a candidate by its GPU state and the CPU it
//! leaves, so a node's rank for a request is a function of (bucket, free
//! CPU, request) and is remembered under that key (a bucket's GPU state
//! never changes; a node that changes moves to another bucket).
//!
//! A decision is the best (rank, node index) over the nodes with the CPU and
//! host memory to hold the request. Rather than rank every node on every
//! decision, the engine keeps, per kind of request (CPU, GPU need, models),
//! the nodes ordered by their rank for it, and a log of the nodes that
//! changed: a decision first re-ranks the nodes changed since that kind of
//! request last came (usually a handful, whatever the cluster's size), then
//! takes the first node of the order with the host memory left. Its cost
//! grows with the changes between two requests of a kind, not with the
//! number of nodes.

use std::collections::{BTreeSet, HashMap};

use crate::cluster::{Choice, GpuNeed, MILLI, MemoryNeed, Node, Request, free_share};
use crate::frag::{CompiledType, FragGpu, NodeSums, TaskMix, node_fragmentation};
use crate::policy::{Candidate, Policy, rank};

/// How good a candidate is under the engine's policy: lower is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rank(pub [f64; 4]);

impl Rank {
    /// The order of two ranks (lexicographic, total).
    pub fn total_cmp(&self, other: &Rank) -> std::cmp::Ordering {
        cmp_rank(&self.0, &other.0)
    }
}

/// Why a placement was not made. Nothing is changed when one is returned.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlaceError {
    #[error("no node can hold the request")]
    NoFit,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("invalid node {node:?}: {reason}")]
    InvalidNode { node: String, reason: String },
    #[error("node index {0} is not in the cluster")]
    UnknownNode(usize),
    #[error("the choice does not fit node {node:?}: {reason}")]
    DoesNotFit { node: String, reason: String },
    #[error("more than {} GPU models and classes", u16::MAX)]
    TooManyKinds,
}

/// A GPU's state as the index keys it. Utilization in thousandths,
/// `u16::MAX` when unmeasured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct GState {
    kind: u16,
    compute_free: u16,
    memory: u64,
    memory_free: u64,
    slices: u32,
    slices_free: u32,
    util: u16,
}

const UNMEASURED: u16 = u16::MAX;

impl GState {
    fn free(&self) -> u32 {
        free_share(u32::from(self.compute_free), self.memory_free, self.memory)
    }

    fn unused(&self) -> bool {
        u32::from(self.compute_free) >= MILLI
            && self.memory_free >= self.memory
            && self.slices_free >= self.slices
    }

    fn utilization(&self) -> f32 {
        if self.util == UNMEASURED {
            0.0
        } else {
            f32::from(self.util) / 1000.0
        }
    }

    /// Whether a share fits, and the state after it.
    fn after_share(&self, compute: u32, memory: MemoryNeed, slices: u32) -> Option<GState> {
        let need = memory.on(self.memory);
        if u32::from(self.compute_free) < compute
            || self.memory_free < need
            || (self.slices > 0 && self.slices_free < slices)
        {
            return None;
        }
        Some(GState {
            compute_free: self.compute_free - compute as u16,
            memory_free: self.memory_free - need,
            slices_free: self.slices_free.saturating_sub(slices),
            ..*self
        })
    }

    fn taken(&self) -> GState {
        GState {
            compute_free: 0,
            memory_free: 0,
            slices_free: 0,
            ..*self
        }
    }
}

struct NodeState {
    name: String,
    cpu: u64,
    cpu_free: u64,
    memory: u64,
    memory_free: u64,
    gpus: Vec<GState>,
    bucket: u32,
}

struct Bucket {
    /// The GPU states, sorted.
    key: Vec<GState>,
    /// Nodes in this state.
    members: u32,
}

/// A rank as an ordered key: each component mapped to a `u64` in the order
/// of `f64::total_cmp`, so that (key, node) orders as (rank, node index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RankKey([u64; 4]);

impl RankKey {
    fn of(r: &[f64; 4]) -> RankKey {
        RankKey(r.map(|x| {
            let b = x.to_bits();
            if b >> 63 == 1 { !b } else { b | (1 << 63) }
        }))
    }
}

/// The nodes ordered by their rank for one kind of request.
struct RankIndex {
    /// The change (a position in the engine's log) it has seen up to.
    seen: u64,
    /// (rank, node) of each node with the CPU for the request and a way to
    /// place it.
    order: BTreeSet<(RankKey, u32)>,
    /// Each node's key in `order`, if it is there.
    key_of: Vec<Option<RankKey>>,
    /// When it was last used (the engine's decision count), to drop the
    /// least recently used beyond [`INDEX_LIMIT`].
    used: u64,
}

/// How a candidate uses the GPUs of a bucket's state: indexes into its key.
#[derive(Debug, Clone)]
enum Pick {
    None,
    Share(usize),
    Whole(Vec<usize>),
}

/// A request as the memo knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReqKey {
    cpu: u64,
    gpu: GpuNeed,
    models: Vec<String>,
}

/// Remembered ranks: (bucket, free CPU of the ranked node, request).
type Memo = HashMap<(u32, u64, u32), Option<([f64; 4], Pick)>, BuildFast>;

/// A fast hash for the engine's own integer keys (none comes from a
/// tenant, so no defence against chosen collisions is needed): the default
/// SipHash was a good part of a decision's time.
#[derive(Debug, Clone, Copy, Default)]
struct BuildFast;

impl std::hash::BuildHasher for BuildFast {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(0)
    }
}

/// Multiply-rotate over the key's words (the scheme of rustc's FxHasher).
#[derive(Debug, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// How much FGD's fragmentation counts in the defrag measure against the
/// leftover measure (measured on the openb traces: 3 to 30 all beat FGD
/// alone by over a point on the default trace; 10 was best).
const DEFRAG_FGD_WEIGHT: f64 = 10.0;

/// How much taking a GPU's share that constrained task types are expected
/// to claim costs in defrag's measure, per thousandth taken and per unit of
/// the kind's reserve (1: the constrained types alone fill the kind). Ten:
/// taking half a GPU of a kind the constrained types fill costs about what
/// FGD's measure (weighted ten) gives to leaving half a GPU no task can
/// use. Chosen among 1 to 3,000 on gpuspec10, gpuspec20 and two variants
/// with more pods asking for models (docs/placement.md): 10 to 30 hold on
/// all four; it changes nothing on a trace without model constraints.
const DEFRAG_RESERVE_WEIGHT: f64 = 10.0;

/// Memo entries before it is emptied (a bound on memory, not a tuning).
const MEMO_LIMIT: usize = 1 << 20;

/// Kinds of request with an index of their own; beyond it the least
/// recently used is dropped (rebuilt if it comes again). A bound on memory.
const INDEX_LIMIT: usize = 256;

/// The placement engine over one cluster.
pub struct Engine {
    policy: Policy,
    /// (model, class), lower case.
    kinds: Vec<(String, String)>,
    nodes: Vec<NodeState>,
    buckets: HashMap<u32, Bucket, BuildFast>,
    by_key: HashMap<Vec<GState>, u32>,
    next_bucket: u32,
    types: Vec<CompiledType>,
    /// Per GPU kind, the share of it the constrained task types are
    /// expected to claim (`reserve_of`).
    reserve: Vec<f64>,
    mix: TaskMix,
    requests: HashMap<ReqKey, u32>,
    memo: Memo,
    /// Per kind of request (its id in `requests`), the nodes by rank.
    indexes: HashMap<u32, RankIndex, BuildFast>,
    /// Nodes changed, in order; `log[0]` is change number `log_base`.
    log: Vec<u32>,
    log_base: u64,
    decisions: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.policy)
            .field("nodes", &self.nodes.len())
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl Engine {
    /// An engine over `nodes` (their current free state), placing by
    /// `policy`; `mix` is the task mix the fragmentation measure expects.
    pub fn new(nodes: Vec<Node>, policy: Policy, mix: &TaskMix) -> Result<Engine, PlaceError> {
        let mut e = Engine {
            policy,
            kinds: Vec::new(),
            nodes: Vec::with_capacity(nodes.len()),
            buckets: HashMap::default(),
            by_key: HashMap::new(),
            next_bucket: 0,
            types: Vec::new(),
            reserve: Vec::new(),
            mix: mix.clone(),
            requests: HashMap::new(),
            memo: HashMap::default(),
            indexes: HashMap::default(),
            log: Vec::new(),
            log_base: 0,
            decisions: 0,
        };
        for n in nodes {
            let bad = |reason: &str| PlaceError::InvalidNode {
                node: n.name.clone(),
                reason: reason.to_owned(),
            };
            if n.cpu_free > n.cpu_milli || n.memory_free_mib > n.memory_mib {
                return Err(bad("more CPU or memory free than it has"));
            }
            let mut gpus = Vec::with_capacity(n.gpus.len());
            for g in &n.gpus {
                if g.compute_free > MILLI
                    || g.memory_free_mib > g.memory_mib
                    || g.slices_free > g.slices
                {
                    return Err(bad("a GPU with more free than it has"));
                }
                if g.utilization.is_some_and(|u| !(0.0..=1.0).contains(&u)) {
                    return Err(bad("a GPU utilization outside 0..1"));
                }
                let kind = e.kind_of(&g.model, &g.class)?;
                gpus.push(GState {
                    kind,
                    compute_free: g.compute_free as u16,
                    memory: g.memory_mib,
                    memory_free: g.memory_free_mib,
                    slices: g.slices,
                    slices_free: g.slices_free,
                    util: util_key(g.utilization),
                });
            }
            let i = e.nodes.len() as u32;
            e.nodes.push(NodeState {
                name: n.name,
                cpu: n.cpu_milli,
                cpu_free: n.cpu_free,
                memory: n.memory_mib,
                memory_free: n.memory_free_mib,
                gpus,
                bucket: 0,
            });
            e.insert(i);
        }
        e.compile_types();
        e.reserve = e.reserve_of();
        Ok(e)
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How many buckets the index holds now.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    pub fn node_name(&self, node: usize) -> Option<&str> {
        self.nodes.get(node).map(|n| n.name.as_str())
    }

    /// Free CPU and host memory of a node.
    pub fn node_free(&self, node: usize) -> Option<(u64, u64)> {
        self.nodes.get(node).map(|n| (n.cpu_free, n.memory_free))
    }

    /// (free compute, free memory MiB, free slices) of each GPU of a node.
    pub fn gpu_free(&self, node: usize) -> Option<Vec<(u32, u64, u32)>> {
        self.nodes.get(node).map(|n| {
            n.gpus
                .iter()
                .map(|g| (u32::from(g.compute_free), g.memory_free, g.slices_free))
                .collect()
        })
    }

    /// The free GPU share of the whole cluster, thousandths of a GPU.
    pub fn free_gpu_milli(&self) -> u64 {
        self.nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .map(|g| u64::from(g.free()))
            .sum()
    }

    /// The cluster's expected fragmentation (thousandths of a GPU) over the
    /// task mix.
    pub fn fragmentation(&self) -> f64 {
        self.nodes
            .iter()
            .map(|n| node_fragmentation(&self.types, n.cpu_free, &frag_gpus(&n.gpus)))
            .sum()
    }

    /// Records a GPU's measured utilization (0..=1; None: unmeasured).
    pub fn set_utilization(
        &mut self,
        node: usize,
        gpu: usize,
        util: Option<f32>,
    ) -> Result<(), PlaceError> {
        let n = self.nodes.get(node).ok_or(PlaceError::UnknownNode(node))?;
        if gpu >= n.gpus.len() || util.is_some_and(|u| !(0.0..=1.0).contains(&u)) {
            return Err(PlaceError::DoesNotFit {
                node: n.name.clone(),
                reason: format!("no GPU {gpu} or utilization outside 0..1"),
            });
        }
        self.remove(node as u32);
        self.nodes[node].gpus[gpu].util = util_key(util);
        self.insert(node as u32);
        self.changed(node as u32);
        Ok(())
    }

    /// Decides where `req` goes, changing nothing: the best (rank, node
    /// index) among the nodes with the CPU and host memory for it.
    pub fn decide(&mut self, req: &Request) -> Result<Choice, PlaceError> {
        validate(req)?;
        let (rid, allowed) = self.request_id(req);
        if self.memo.len() > MEMO_LIMIT {
            self.memo.clear();
        }
        self.decisions += 1;
        let mut idx = match self.indexes.remove(&rid) {
            Some(idx) => idx,
            None => RankIndex {
                seen: 0,
                order: BTreeSet::new(),
                key_of: Vec::new(),
                used: 0,
            },
        };
        self.sync(&mut idx, rid, req, &allowed);
        idx.used = self.decisions;
        let best = idx
            .order
            .iter()
            .find(|(_, i)| self.nodes[*i as usize].memory_free >= req.memory_mib)
            .map(|&(_, i)| i);
        self.indexes.insert(rid, idx);
        if self.indexes.len() > INDEX_LIMIT
            && let Some(&old) = self
                .indexes
                .iter()
                .min_by_key(|(_, x)| x.used)
                .map(|(k, _)| k)
        {
            self.indexes.remove(&old);
        }
        let node = best.ok_or(PlaceError::NoFit)?;
        let n = &self.nodes[node as usize];
        let key = &self.buckets[&n.bucket].key;
        let (policy, types, reserve, cpu_free) =
            (self.policy, &self.types, &self.reserve, n.cpu_free);
        let pick = self
            .memo
            .entry((n.bucket, n.cpu_free, rid))
            .or_insert_with(|| {
                best_pick(policy, types, reserve, key, cpu_free, req, &allowed, None)
            })
            .as_ref()
            .map(|(_, p)| p.clone())
            .expect("a node in the index has a way to place the request");
        let pick = self.in_gpu_order(node, req, &allowed).unwrap_or(pick);
        Ok(self.choice(node, &pick))
    }

    /// For `fgd`, a share's GPU as FGD's published scheduler picks it: the
    /// first GPU by index among those of the best score (its
    /// `calculateGpuShareFragExtendScore` keeps the first GPU of the highest
    /// integer score), where the memo's pick is the fullest of them (buckets
    /// know GPUs by state, not by index). The node's rank is the same
    /// either way; only which of its GPUs differs. None for the other
    /// policies and requests.
    fn in_gpu_order(&self, node: u32, req: &Request, allowed: &[bool]) -> Option<Pick> {
        if self.policy != Policy::Fgd || !matches!(req.gpu, GpuNeed::Share { .. }) {
            return None;
        }
        let n = &self.nodes[node as usize];
        let key = &self.buckets[&n.bucket].key;
        // Each GPU in index order, as the first key position of its state
        // (GPUs in one state rank alike; `choice` maps a state back to the
        // lowest-indexed GPU in it, which is the first one seen here).
        let order: Vec<usize> = n
            .gpus
            .iter()
            .map(|g| {
                key.iter()
                    .position(|k| k == g)
                    .expect("a bucket's key is its nodes' GPU states")
            })
            .collect();
        best_pick(
            self.policy,
            &self.types,
            &self.reserve,
            key,
            n.cpu_free,
            req,
            allowed,
            Some(&order),
        )
        .map(|(_, p)| p)
    }

    /// Brings `idx` (the index of request `rid`, `req`) up to date: re-ranks
    /// the nodes changed since it last looked (each once), or every node if
    /// the log no longer reaches back that far.
    fn sync(&mut self, idx: &mut RankIndex, rid: u32, req: &Request, allowed: &[bool]) {
        let end = self.log_base + self.log.len() as u64;
        let fresh = idx.key_of.len() != self.nodes.len();
        let nodes: Vec<u32> = if fresh || idx.seen < self.log_base {
            if fresh {
                idx.order.clear();
                idx.key_of = vec![None; self.nodes.len()];
            }
            // Every node; one whose rank is the same costs a lookup.
            (0..self.nodes.len() as u32).collect()
        } else {
            let mut changed = self.log[(idx.seen - self.log_base) as usize..].to_vec();
            // A node changed twice is re-ranked once (its state now).
            changed.sort_unstable();
            changed.dedup();
            changed
        };
        for i in nodes {
            let new = self
                .node_rank(i, rid, req, allowed)
                .map(|r| RankKey::of(&r));
            let old = std::mem::replace(&mut idx.key_of[i as usize], new);
            if old == new {
                continue;
            }
            if let Some(k) = old {
                idx.order.remove(&(k, i));
            }
            if let Some(k) = new {
                idx.order.insert((k, i));
            }
        }
        idx.seen = end;
    }

    /// Node `i`'s rank for `req` (remembered per bucket, free CPU and
    /// request), or None if it has not the CPU or no way to place it.
    fn node_rank(&mut self, i: u32, rid: u32, req: &Request, allowed: &[bool]) -> Option<[f64; 4]> {
        let n = &self.nodes[i as usize];
        if n.cpu_free < req.cpu_milli {
            return None;
        }
        let key = &self.buckets[&n.bucket].key;
        let (policy, types, reserve, cpu_free) =
            (self.policy, &self.types, &self.reserve, n.cpu_free);
        self.memo
            .entry((n.bucket, cpu_free, rid))
            .or_insert_with(|| best_pick(policy, types, reserve, key, cpu_free, req, allowed, None))
            .as_ref()
            .map(|(r, _)| *r)
    }

    /// The node and GPUs of a pick on node `node`.
    fn choice(&self, node: u32, pick: &Pick) -> Choice {
        let b = &self.buckets[&self.nodes[node as usize].bucket];
        let states: Vec<GState> = match pick {
            Pick::None => Vec::new(),
            Pick::Share(i) => vec![b.key[*i]],
            Pick::Whole(is) => is.iter().map(|&i| b.key[i]).collect(),
        };
        // The key is sorted; map each picked state to a GPU of the node in
        // that state (lowest index first).
        let n = &self.nodes[node as usize];
        let mut used = vec![false; n.gpus.len()];
        let mut gpus = Vec::with_capacity(states.len());
        for s in states {
            let i = (0..n.gpus.len())
                .find(|&i| !used[i] && n.gpus[i] == s)
                .expect("a bucket's key is its nodes' GPU states");
            used[i] = true;
            gpus.push(i);
        }
        gpus.sort_unstable();
        Choice {
            node: node as usize,
            gpus,
        }
    }

    /// Records that node `i` changed, for the indexes to re-rank it; keeps
    /// the log within a few times the node count (an index further behind
    /// re-ranks every node: about what re-ranking that many changes costs).
    fn changed(&mut self, i: u32) {
        self.log.push(i);
        let limit = 4 * self.nodes.len() + 1024;
        if self.log.len() > limit {
            let drop = self.log.len() - 2 * self.nodes.len();
            self.log.drain(..drop);
            self.log_base += drop as u64;
        }
    }

    /// The nodes among `among` that can hold `req` and their ranks, best
    /// first (ties by index), changing nothing. `decide` picks the first
    /// node of this order over the whole cluster. The scheduler extender
    /// scores the scheduler's candidate nodes by this order.
    pub fn ranked(
        &mut self,
        req: &Request,
        among: &[usize],
    ) -> Result<Vec<(usize, Rank)>, PlaceError> {
        validate(req)?;
        let (rid, allowed) = self.request_id(req);
        if self.memo.len() > MEMO_LIMIT {
            self.memo.clear();
        }
        let mut ranked: Vec<([f64; 4], usize)> = Vec::with_capacity(among.len());
        for &i in among {
            let n = self.nodes.get(i).ok_or(PlaceError::UnknownNode(i))?;
            if n.cpu_free < req.cpu_milli || n.memory_free < req.memory_mib {
                continue;
            }
            let b = &self.buckets[&n.bucket];
            let entry = self
                .memo
                .entry((n.bucket, n.cpu_free, rid))
                .or_insert_with(|| {
                    best_pick(
                        self.policy,
                        &self.types,
                        &self.reserve,
                        &b.key,
                        n.cpu_free,
                        req,
                        &allowed,
                        None,
                    )
                });
            if let Some((r, _)) = entry {
                ranked.push((*r, i));
            }
        }
        ranked.sort_by(|a, b| cmp_rank(&a.0, &b.0).then(a.1.cmp(&b.1)));
        ranked.dedup_by_key(|r| r.1);
        Ok(ranked.into_iter().map(|(r, i)| (i, Rank(r))).collect())
    }

    /// Records `req` as placed at `choice`; refuses (changing nothing) a
    /// choice that does not fit.
    pub fn commit(&mut self, choice: &Choice, req: &Request) -> Result<(), PlaceError> {
        validate(req)?;
        let (_, allowed) = self.request_id(req);
        let n = self
            .nodes
            .get(choice.node)
            .ok_or(PlaceError::UnknownNode(choice.node))?;
        let bad = |reason: String| PlaceError::DoesNotFit {
            node: n.name.clone(),
            reason,
        };
        if n.cpu_free < req.cpu_milli || n.memory_free < req.memory_mib {
            return Err(bad("not enough CPU or host memory left".into()));
        }
        let mut seen = vec![false; n.gpus.len()];
        for &g in &choice.gpus {
            if g >= n.gpus.len() || std::mem::replace(&mut seen[g], true) {
                return Err(bad(format!("GPU {g} is not a distinct GPU of the node")));
            }
            if !allowed[usize::from(n.gpus[g].kind)] {
                return Err(bad(format!("GPU {g} is not of an allowed model")));
            }
        }
        let mut after = n.gpus.clone();
        match req.gpu {
            GpuNeed::None => {
                if !choice.gpus.is_empty() {
                    return Err(bad("a CPU-only request takes no GPU".into()));
                }
            }
            GpuNeed::Share {
                compute,
                memory,
                slices,
            } => {
                let [g] = choice.gpus[..] else {
                    return Err(bad("a share takes exactly one GPU".into()));
                };
                after[g] = n.gpus[g]
                    .after_share(compute, memory, slices)
                    .ok_or_else(|| bad(format!("GPU {g} has not that much free")))?;
            }
            GpuNeed::Whole(k) => {
                if choice.gpus.len() != k as usize {
                    return Err(bad(format!(
                        "{k} whole GPUs asked, {} chosen",
                        choice.gpus.len()
                    )));
                }
                for &g in &choice.gpus {
                    if !n.gpus[g].unused() {
                        return Err(bad(format!("GPU {g} is in use")));
                    }
                    after[g] = n.gpus[g].taken();
                }
            }
        }
        let i = choice.node as u32;
        self.remove(i);
        let n = &mut self.nodes[choice.node];
        n.cpu_free -= req.cpu_milli;
        n.memory_free -= req.memory_mib;
        n.gpus = after;
        self.insert(i);
        self.changed(i);
        Ok(())
    }

    /// Decides and commits.
    pub fn place(&mut self, req: &Request) -> Result<Choice, PlaceError> {
        let c = self.decide(req)?;
        self.commit(&c, req)?;
        Ok(c)
    }

    /// Gives back what `req` took at `choice` (a pod that left). Refuses,
    /// changing nothing, what would free more than the node has.
    pub fn release(&mut self, choice: &Choice, req: &Request) -> Result<(), PlaceError> {
        validate(req)?;
        let n = self
            .nodes
            .get(choice.node)
            .ok_or(PlaceError::UnknownNode(choice.node))?;
        let bad = |reason: &str| PlaceError::DoesNotFit {
            node: n.name.clone(),
            reason: reason.to_owned(),
        };
        if n.cpu_free + req.cpu_milli > n.cpu || n.memory_free + req.memory_mib > n.memory {
            return Err(bad("would free more CPU or memory than the node has"));
        }
        let mut after = n.gpus.clone();
        for &g in &choice.gpus {
            let Some(s) = after.get_mut(g) else {
                return Err(bad("no such GPU"));
            };
            let (c, m, sl) = match req.gpu {
                GpuNeed::None => return Err(bad("a CPU-only request took no GPU")),
                GpuNeed::Share {
                    compute,
                    memory,
                    slices,
                } => (compute, memory.on(s.memory), slices),
                GpuNeed::Whole(_) => (MILLI, s.memory, s.slices),
            };
            let compute_free = u32::from(s.compute_free) + c;
            if compute_free > MILLI || s.memory_free + m > s.memory || s.slices_free + sl > s.slices
            {
                return Err(bad("would free more of a GPU than it has"));
            }
            s.compute_free = compute_free as u16;
            s.memory_free += m;
            s.slices_free += sl;
        }
        let i = choice.node as u32;
        self.remove(i);
        let n = &mut self.nodes[choice.node];
        n.cpu_free += req.cpu_milli;
        n.memory_free += req.memory_mib;
        n.gpus = after;
        self.insert(i);
        self.changed(i);
        Ok(())
    }

    fn kind_of(&mut self, model: &str, class: &str) -> Result<u16, PlaceError> {
        let k = (model.to_lowercase(), class.to_lowercase());
        if let Some(i) = self.kinds.iter().position(|x| *x == k) {
            return Ok(i as u16);
        }
        if self.kinds.len() >= usize::from(u16::MAX) {
            return Err(PlaceError::TooManyKinds);
        }
        self.kinds.push(k);
        Ok((self.kinds.len() - 1) as u16)
    }

    fn allowed(&self, models: &[String]) -> Vec<bool> {
        self.kinds
            .iter()
            .map(|(m, c)| {
                models.is_empty()
                    || models.iter().any(|x| {
                        x.eq_ignore_ascii_case(m) || (!c.is_empty() && x.eq_ignore_ascii_case(c))
                    })
            })
            .collect()
    }

    fn compile_types(&mut self) {
        self.types = self
            .mix
            .types
            .iter()
            .map(|e| CompiledType {
                cpu_milli: e.task.cpu_milli,
                gpus: e.task.gpus,
                milli: e.task.milli,
                allowed: self.allowed(&e.task.models),
                weight: e.weight,
            })
            .collect();
    }

    /// Per GPU kind k, how much of it the task types that may use only
    /// some kinds are expected to claim, relative to the demand per GPU of
    /// the whole mix: each constrained type's demand spread over the GPUs
    /// it may use, per GPU of k, over the mix's demand per GPU of the
    /// cluster. 0 for every kind when no type is constrained; 1 when the
    /// constrained types alone are expected to fill kind k.
    fn reserve_of(&self) -> Vec<f64> {
        let mut supply = vec![0u64; self.kinds.len()];
        for n in &self.nodes {
            for g in &n.gpus {
                supply[usize::from(g.kind)] += 1;
            }
        }
        let total: u64 = supply.iter().sum();
        let demand = |t: &CompiledType| t.weight * f64::from(t.gpus) * f64::from(t.milli);
        let per_gpu: f64 = self.types.iter().map(demand).sum::<f64>() / total.max(1) as f64;
        let mut reserve = vec![0.0; self.kinds.len()];
        if per_gpu <= 0.0 {
            return reserve;
        }
        for t in &self.types {
            if t.gpus == 0 || t.allowed.iter().all(|&a| a) {
                continue;
            }
            let s: u64 = (0..supply.len())
                .filter(|&k| t.allowed[k])
                .map(|k| supply[k])
                .sum();
            if s == 0 {
                continue;
            }
            for (k, r) in reserve.iter_mut().enumerate() {
                if t.allowed[k] {
                    *r += demand(t) / s as f64 / per_gpu;
                }
            }
        }
        reserve
    }

    fn request_id(&mut self, req: &Request) -> (u32, Vec<bool>) {
        let allowed = self.allowed(&req.models);
        let mut models: Vec<String> = req.models.iter().map(|m| m.to_lowercase()).collect();
        models.sort();
        let key = ReqKey {
            cpu: req.cpu_milli,
            gpu: req.gpu,
            models,
        };
        let next = self.requests.len() as u32;
        let id = *self.requests.entry(key).or_insert(next);
        (id, allowed)
    }

    fn insert(&mut self, i: u32) {
        let n = &self.nodes[i as usize];
        let mut key = n.gpus.clone();
        key.sort_unstable();
        let bid = match self.by_key.get(&key) {
            Some(&b) => b,
            None => {
                let b = self.next_bucket;
                self.next_bucket += 1;
                let bucket = Bucket {
                    key: key.clone(),
                    members: 0,
                };
                self.by_key.insert(key, b);
                self.buckets.insert(b, bucket);
                b
            }
        };
        self.buckets
            .get_mut(&bid)
            .expect("by_key names live buckets")
            .members += 1;
        self.nodes[i as usize].bucket = bid;
    }

    fn remove(&mut self, i: u32) {
        let bid = self.nodes[i as usize].bucket;
        let b = self.buckets.get_mut(&bid).expect("a node is in its bucket");
        b.members -= 1;
        if b.members == 0 {
            let b = self.buckets.remove(&bid).expect("present");
            self.by_key.remove(&b.key);
        }
    }
}

fn util_key(u: Option<f32>) -> u16 {
    match u {
        Some(u) => (u.clamp(0.0, 1.0) * 1000.0).round() as u16,
        None => UNMEASURED,
    }
}

fn frag_gpu(g: &GState) -> FragGpu {
    FragGpu {
        kind: g.kind,
        free: g.free(),
    }
}

fn frag_gpus(gpus: &[GState]) -> Vec<FragGpu> {
    gpus.iter().map(frag_gpu).collect()
}

fn validate(req: &Request) -> Result<(), PlaceError> {
    match req.gpu {
        GpuNeed::Share {
            compute, memory, ..
        } => {
            if compute > MILLI {
                return Err(PlaceError::InvalidRequest(format!(
                    "a share of {compute} thousandths is more than one GPU: ask for whole GPUs"
                )));
            }
            if compute == 0 && matches!(memory, MemoryNeed::Mib(0) | MemoryNeed::PerMille(0)) {
                return Err(PlaceError::InvalidRequest("a share of nothing".into()));
            }
            if let MemoryNeed::PerMille(p) = memory
                && p > MILLI
            {
                return Err(PlaceError::InvalidRequest(format!(
                    "{p} thousandths of a GPU's memory is more than the GPU"
                )));
            }
        }
        GpuNeed::Whole(0) => return Err(PlaceError::InvalidRequest("zero whole GPUs".into())),
        GpuNeed::Whole(n) if n > u32::from(u16::MAX) => {
            return Err(PlaceError::InvalidRequest(format!("{n} GPUs")));
        }
        _ => {}
    }
    Ok(())
}

fn cmp_rank(a: &[f64; 4], b: &[f64; 4]) -> std::cmp::Ordering {
    for i in 0..4 {
        let o = a[i].total_cmp(&b[i]);
        if o.is_ne() {
            return o;
        }
    }
    std::cmp::Ordering::Equal
}

/// The best way to place `req` on a node whose GPUs are `key` and with
/// `cpu_free` CPU left (CPU and memory already known to fit), and its rank.
///
/// A share goes to the first best GPU of `share_order` (indexes into `key`)
/// when one is given, else to the first best of `key`'s order (the fullest
/// of GPUs that rank alike).
#[allow(clippy::too_many_arguments)]
fn best_pick(
    policy: Policy,
    types: &[CompiledType],
    reserve: &[f64],
    key: &[GState],
    cpu_free: u64,
    req: &Request,
    allowed: &[bool],
    share_order: Option<&[usize]>,
) -> Option<([f64; 4], Pick)> {
    let node_free: u64 = key.iter().map(|g| u64::from(g.free())).sum();
    let cpu_after = cpu_free - req.cpu_milli;
    let leftover = policy.defrag_parts().is_some_and(|p| p.leftover);
    // Defrag: FGD's measure, weighted so that it leads, plus the leftover
    // measure, which tells apart what FGD scores alike (how many more
    // copies of each task still fit, CPU included).
    let measure = |cpu: u64, sums: &NodeSums| {
        match policy.defrag_parts() {
            Some(_) if leftover => {
                sums.leftover(types, cpu) + DEFRAG_FGD_WEIGHT * sums.fragmentation(types, cpu)
            }
            // Defrag without the leftover keeps FGD's weight, so that its
            // steps mean what they mean with it.
            Some(_) => DEFRAG_FGD_WEIGHT * sums.fragmentation(types, cpu),
            None => sums.fragmentation(types, cpu),
        }
    };
    let sums = policy
        .uses_fragmentation()
        .then(|| NodeSums::new(types, &frag_gpus(key)));
    let frag_before = sums.as_ref().map_or(0.0, |s| measure(cpu_free, s));
    let threshold = match policy {
        Policy::SharedThreshold(t) => t as f32,
        _ => 0.0,
    };
    let busy = |g: &GState| 1.0 - g.utilization() < threshold;
    let candidate = |after: &[GState], changed: &[usize]| -> Candidate {
        let free_after: u64 = after.iter().map(|g| u64::from(g.free())).sum();
        // The node's sums with the changed GPUs in their new state.
        let frag_delta = sums.as_ref().map_or(0.0, |s| {
            let mut s = s.clone();
            for &i in changed {
                s.remove(types, frag_gpu(&key[i]));
                s.add(types, frag_gpu(&after[i]));
            }
            // What the request takes of GPUs whose kind the constrained
            // task types are expected to claim (see `reserve_of`).
            let scarce: f64 = if policy.defrag_parts().is_some_and(|p| p.reserve) {
                changed
                    .iter()
                    .map(|&i| {
                        let k = usize::from(key[i].kind);
                        f64::from(key[i].free().saturating_sub(after[i].free()))
                            * reserve.get(k).copied().unwrap_or(0.0)
                    })
                    .sum()
            } else {
                0.0
            };
            measure(cpu_after, &s) - frag_before + DEFRAG_RESERVE_WEIGHT * scarce
        });
        Candidate {
            node_free_after: free_after,
            gpu_free_after: match (req.gpu, changed) {
                (GpuNeed::Share { .. }, [i]) => after[*i].free(),
                _ => 0,
            },
            cpu_free_after: cpu_after,
            frag_delta,
            utilization: changed
                .iter()
                .map(|&i| key[i].utilization())
                .fold(0.0, f32::max),
            busy: changed.iter().any(|&i| busy(&key[i])),
        }
    };
    match req.gpu {
        GpuNeed::None => {
            let c = Candidate {
                node_free_after: node_free,
                cpu_free_after: cpu_after,
                frag_delta: sums
                    .as_ref()
                    .map_or(0.0, |s| measure(cpu_after, s) - frag_before),
                ..Candidate::default()
            };
            Some((rank(policy, &c), Pick::None))
        }
        GpuNeed::Share {
            compute,
            memory,
            slices,
        } => {
            let mut best: Option<([f64; 4], Pick)> = None;
            let mut after = key.to_vec();
            let key_order: Vec<usize>;
            let order = match share_order {
                Some(o) => o,
                None => {
                    // Equal states rank alike: each state once.
                    key_order = (0..key.len())
                        .filter(|&i| i == 0 || key[i] != key[i - 1])
                        .collect();
                    &key_order
                }
            };
            for &i in order {
                if !allowed[usize::from(key[i].kind)] {
                    continue;
                }
                let Some(s) = key[i].after_share(compute, memory, slices) else {
                    continue;
                };
                after[i] = s;
                let r = rank(policy, &candidate(&after, &[i]));
                after[i] = key[i];
                if best.as_ref().is_none_or(|(b, _)| cmp_rank(&r, b).is_lt()) {
                    best = Some((r, Pick::Share(i)));
                }
            }
            best
        }
        GpuNeed::Whole(n) => {
            let mut free: Vec<usize> = (0..key.len())
                .filter(|&i| key[i].unused() && allowed[usize::from(key[i].kind)])
                .collect();
            if free.len() < n as usize {
                return None;
            }
            if matches!(policy, Policy::Spread | Policy::SharedThreshold(_)) {
                free.sort_by(|&a, &b| key[a].utilization().total_cmp(&key[b].utilization()));
            }
            free.truncate(n as usize);
            let mut after = key.to_vec();
            for &i in &free {
                after[i] = key[i].taken();
            }
            let r = rank(policy, &candidate(&after, &free));
            Some((r, Pick::Whole(free)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Gpu;

    /// xorshift64*: the test's own seeded generator.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
        }
    }

    /// The decision without index or memo: rank every node with the CPU
    /// and memory for `req`, keep the best (rank, node index).
    fn decide_by_scan(e: &Engine, req: &Request) -> Result<Choice, PlaceError> {
        validate(req)?;
        let allowed = e.allowed(&req.models);
        let mut best: Option<([f64; 4], u32, Pick)> = None;
        for (i, n) in e.nodes.iter().enumerate() {
            if n.cpu_free < req.cpu_milli || n.memory_free < req.memory_mib {
                continue;
            }
            let mut key = n.gpus.clone();
            key.sort_unstable();
            let Some((r, pick)) = best_pick(
                e.policy, &e.types, &e.reserve, &key, n.cpu_free, req, &allowed, None,
            ) else {
                continue;
            };
            if best
                .as_ref()
                .is_none_or(|(b, _, _)| cmp_rank(&r, b).is_lt())
            {
                best = Some((r, i as u32, pick));
            }
        }
        let (_, node, pick) = best.ok_or(PlaceError::NoFit)?;
        let pick = e.in_gpu_order(node, req, &allowed).unwrap_or(pick);
        Ok(e.choice(node, &pick))
    }

    fn random_node(r: &mut Rng, i: usize) -> Node {
        let models = ["T4", "A100"];
        let model = models[r.below(2) as usize];
        let gpus = (0..1 + r.below(8))
            .map(|_| {
                let mut g = Gpu::new(model, 16_000);
                // Few distinct states, so that buckets hold several nodes.
                g.compute_free = [0, 190, 500, 530, 1000][r.below(5) as usize];
                g.memory_free_mib = 16 * u64::from(g.compute_free);
                g
            })
            .collect();
        let mut n = Node::new(format!("n{i}"), 32_000, 64_000, gpus);
        n.cpu_free = 1000 * r.below(33);
        n.memory_free_mib = 4000 * r.below(17);
        n
    }

    fn random_request(r: &mut Rng) -> Request {
        // A small set of kinds that recur (the index is reused and must
        // follow the changes) and some that are new every time.
        let cpu = if r.below(4) == 0 {
            r.below(8000)
        } else {
            1000 * r.below(4)
        };
        let mut req = match r.below(4) {
            0 => Request::trace(cpu, 0, 0, 0),
            1 => Request::trace(cpu, 0, 1 + r.below(3) as u32, 1000),
            _ => Request::trace(cpu, 0, 1, [190, 470, 500, 810][r.below(4) as usize]),
        };
        req.memory_mib = 4000 * r.below(6);
        if r.below(5) == 0 {
            req.models = vec!["a100".into()];
        }
        req
    }

    #[test]
    fn the_index_decides_as_a_scan_of_every_node() {
        let mut r = Rng(0x5EED_1234);
        for round in 0..40 {
            let nodes: Vec<Node> = (0..1 + r.below(30) as usize)
                .map(|i| random_node(&mut r, i))
                .collect();
            let reqs: Vec<Request> = (0..40).map(|_| random_request(&mut r)).collect();
            let mix = TaskMix::from_requests(&reqs, 0.95);
            let policy = Policy::ALL[round % Policy::ALL.len()];
            let mut e = Engine::new(nodes, policy, &mix).unwrap();
            let mut placed: Vec<(Choice, Request)> = Vec::new();
            for step in 0..300 {
                let req = random_request(&mut r);
                let want = decide_by_scan(&e, &req);
                assert_eq!(e.decide(&req), want, "{policy}, round {round}, step {step}");
                // Mostly place; sometimes give back or change a utilization,
                // so that nodes move between buckets both ways.
                match r.below(10) {
                    0 if !placed.is_empty() => {
                        let (c, q) = placed.swap_remove(r.below(placed.len() as u64) as usize);
                        e.release(&c, &q).unwrap();
                    }
                    1 => {
                        let n = r.below(e.len() as u64) as usize;
                        let g = r.below(e.nodes[n].gpus.len() as u64) as usize;
                        e.set_utilization(n, g, Some(r.below(11) as f32 / 10.0))
                            .unwrap();
                    }
                    _ => {
                        if let Ok(c) = want {
                            e.commit(&c, &req).unwrap();
                            placed.push((c, req));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_index_left_far_behind_by_the_log_is_rebuilt() {
        for policy in [Policy::Defrag, Policy::Spread] {
            let nodes: Vec<Node> = (0..6)
                .map(|i| {
                    let gpus = (0..8).map(|_| Gpu::new("T4", 16_000)).collect();
                    let mut n = Node::new(format!("n{i}"), 64_000, 64_000, gpus);
                    n.cpu_free = 1000 * (60 - i);
                    n
                })
                .collect();
            let mut e = Engine::new(nodes, policy, &TaskMix::default()).unwrap();
            let seldom = Request::trace(0, 0, 1, 190);
            let often = Request::trace(0, 0, 1, 10);
            assert_eq!(e.decide(&seldom), decide_by_scan(&e, &seldom));
            let before = e.decide(&seldom);
            // Far more changes than the log keeps, then the seldom kind again.
            for _ in 0..3000 {
                let _ = e.place(&often);
            }
            assert!(e.log_base > 0, "the log was trimmed");
            let after = e.decide(&seldom);
            assert_eq!(after, decide_by_scan(&e, &seldom), "{policy}");
            assert_ne!(after, before, "{policy}: the cluster changed under it");
        }
    }

    fn share_of(model: &str, milli: u32) -> Request {
        let mut r = Request::trace(1000, 0, 1, milli);
        if !model.is_empty() {
            r.models = vec![model.into()];
        }
        r
    }

    /// One T4 and three G2 GPUs; half the tasks need a T4: they alone are
    /// expected to claim twice what the T4 has, and nothing of the G2s.
    #[test]
    fn the_reserve_of_a_kind_is_what_its_constrained_tasks_claim_of_it() {
        let nodes = vec![
            Node::new("t4", 64_000, 256_000, vec![Gpu::new("T4", 16_384)]),
            Node::new("g2", 64_000, 256_000, vec![Gpu::new("G2", 16_384); 3]),
        ];
        let reqs = [share_of("T4", 500), share_of("", 500)];
        let mix = Policy::Defrag.task_mix(&reqs, 1.0);
        let e = Engine::new(nodes.clone(), Policy::Defrag, &mix).unwrap();
        let t4 = e.kinds.iter().position(|k| k.0 == "t4").unwrap();
        let g2 = e.kinds.iter().position(|k| k.0 == "g2").unwrap();
        assert!((e.reserve[t4] - 2.0).abs() < 1e-9, "{:?}", e.reserve);
        assert_eq!(e.reserve[g2], 0.0);
        // Without constrained tasks no kind is reserved: defrag is then
        // what it was without the reserve.
        let free = [share_of("", 500), share_of("", 250)];
        let e = Engine::new(nodes, Policy::Defrag, &Policy::Defrag.task_mix(&free, 1.0)).unwrap();
        assert!(e.reserve.iter().all(|&r| r == 0.0), "{:?}", e.reserve);
    }

    /// A task that may use a T4 or a G2 goes to a G2 when the one T4 is
    /// what the T4-only tasks need. FGD's measure sees no difference (as
    /// many G2-only as T4-only tasks: taking either GPU's share changes
    /// the unusable share alike), so without the reserve the first node's
    /// T4 is taken.
    #[test]
    fn defrag_leaves_the_kind_constrained_tasks_need() {
        let nodes = vec![
            Node::new("t4", 64_000, 256_000, vec![Gpu::new("T4", 16_384)]),
            Node::new("g2", 64_000, 256_000, vec![Gpu::new("G2", 16_384); 3]),
        ];
        let mut either = share_of("", 500);
        either.models = vec!["T4".into(), "G2".into()];
        let reqs = [share_of("T4", 500), share_of("G2", 500), either.clone()];
        let go = |p: Policy| {
            let mut e = Engine::new(nodes.clone(), p, &p.task_mix(&reqs, 1.0)).unwrap();
            e.decide(&either).unwrap().node
        };
        assert_eq!(go(Policy::Defrag), 1);
        let without: Policy = "defrag-without:reserve".parse().unwrap();
        assert_eq!(go(without), 0);
    }

    /// FGD's published scheduler gives a share the first GPU by index among
    /// those of the best (integer) score; this engine's buckets know a
    /// node's GPUs by state, so `fgd` re-picks in index order. Here a 100
    /// share grows the fragmentation of neither GPU (the mix is that share
    /// alone): both score alike, and the lower index wins, whichever GPU is
    /// fuller. Defrag keeps its own rule, the fullest GPU that takes it.
    #[test]
    fn fgd_gives_a_share_the_first_gpu_by_index_among_the_best() {
        let part = |free: u32| Gpu {
            compute_free: free,
            memory_free_mib: 16 * u64::from(free),
            ..Gpu::new("T4", 16_000)
        };
        let req = Request::trace(1000, 0, 1, 100);
        let mix = TaskMix::from_requests(std::slice::from_ref(&req), 1.0);
        for (gpus, fgd, defrag) in [
            (vec![part(1000), part(600)], 0, 1),
            (vec![part(600), part(1000)], 0, 0),
            (vec![part(1000), part(1000), part(600)], 0, 2),
        ] {
            let node = Node::new("n", 64_000, 64_000, gpus.clone());
            let mut e = Engine::new(vec![node.clone()], Policy::Fgd, &mix).unwrap();
            let want = Choice {
                node: 0,
                gpus: vec![fgd],
            };
            assert_eq!(e.decide(&req).unwrap(), want, "fgd {gpus:?}");
            assert_eq!(decide_by_scan(&e, &req).unwrap(), want, "scan {gpus:?}");
            let mut e = Engine::new(vec![node], Policy::Defrag, &mix).unwrap();
            assert_eq!(
                e.decide(&req).unwrap().gpus,
                vec![defrag],
                "defrag {gpus:?}"
            );
        }
    }
}
