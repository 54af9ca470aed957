//! The extender's view of the cluster, kept by watching the API server
//! (kube-rs `watcher` into `reflector` stores): nodes, pods not finished,
//! and, with DRA on, the driver's ResourceSlices and every ResourceClaim.
//! Beside each store an index the decisions read (the assignments per node,
//! the slices per node, the allocated devices per pool), updated by the same
//! task that applies the kind's events, so a decision reads memory and never
//! waits on the API server.
//!
//! **How fresh the view is.** Per kind the cache keeps two resourceVersions
//! (read as the decimal numbers every API server writes; one that is not is
//! ignored):
//!
//! - `applied`: every event of the kind up to it is in the store and its
//!   index: the greatest version of an object its watch delivered, and, when
//!   a (re)list completes, at least what `seen` was when that list started
//!   (the list is a quorum read, so it reflects every write made before) and
//!   the greatest version of an object listed (kube-rs does not hand on the
//!   list's own version, so a deletion nobody reported is not counted: the
//!   view holds it, `applied` does not say so, which can only make a bind
//!   wait for the next event, never decide early);
//! - `seen`: the greatest version of the kind the extender knows exists: from
//!   its watch, from its own writes (the pod a bind patched), and from the
//!   objects the scheduler sends it (the pod and nodes of a filter call, the
//!   pod a bind reads).
//!
//! A view is *caught up* on a kind when the kind's first list is applied and
//! `applied ≥ seen`. Filter and prioritize read the view as it is. A bind
//! decides only on a view caught up, for every kind it reads, with what was
//! seen when the bind began ([`Cache::caught_up`]); it waits for that, up to
//! a limit, and is refused if the view does not get there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodStatus};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tessera_contract::labels::{ANNOTATION_GPU_ASSIGNMENT, NODE_GPU_REPORT};
use tessera_node::scheduling::Assignment;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dra::{self, Allocated, DraNode};
use crate::view;

/// The kinds the extender watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Nodes,
    Pods,
    ResourceSlices,
    ResourceClaims,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Nodes,
        Kind::Pods,
        Kind::ResourceSlices,
        Kind::ResourceClaims,
    ];
    /// What decisions for slice pods read.
    pub const SLICE_PODS: [Kind; 2] = [Kind::Nodes, Kind::Pods];

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Nodes => "nodes",
            Kind::Pods => "pods",
            Kind::ResourceSlices => "resourceslices",
            Kind::ResourceClaims => "resourceclaims",
        })
    }
}

/// How far the view of one kind has got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The kind's first list is applied.
    pub synced: bool,
    /// Every event up to this resourceVersion is applied.
    pub applied: u64,
    /// The greatest resourceVersion of the kind the extender has seen.
    pub seen: u64,
    /// Lists applied: 1 after start-up, one more each time a watch could
    /// not be resumed (410 Expired) and the kind was listed again.
    pub lists: u64,
}

impl Progress {
    fn reaches(&self, target: u64) -> bool {
        self.synced && self.applied >= target
    }
}

/// The view could not be used: not listed yet, or behind what was seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("the extender has not listed {0} yet (starting, or the API server does not answer)")]
    NotSynced(Kind),
    #[error(
        "the extender's view of {kind} is behind: events applied up to resourceVersion {applied}, \
         {target} seen; not caught up within {waited:?}"
    )]
    Behind {
        kind: Kind,
        applied: u64,
        target: u64,
        waited: Duration,
    },
    #[error("DRA is off (--dra-driver \"\"): the extender does not watch {0}")]
    Off(Kind),
}

/// A resourceVersion as a number (None: absent, or not a number).
pub fn version(rv: Option<&str>) -> Option<u64> {
    rv.and_then(|v| v.parse().ok())
}

fn version_of<K: Resource>(o: &K) -> Option<u64> {
    version(o.meta().resource_version.as_deref())
}

type Tracks = Arc<[watch::Sender<Progress>; 4]>;

/// The assignments the extender wrote, of pods not finished, by node.
#[derive(Debug, Default)]
struct PodIndex {
    /// Pod `namespace/name` → (node, its assignment).
    held: HashMap<String, (String, Assignment)>,
    /// Node → pod `namespace/name` → assignment.
    by_node: HashMap<String, BTreeMap<String, Assignment>>,
    /// Containers' slice counts over every held assignment: count per size.
    sizes: BTreeMap<u32, usize>,
}

impl PodIndex {
    fn remove(&mut self, key: &str) {
        let Some((node, a)) = self.held.remove(key) else {
            return;
        };
        if let Some(m) = self.by_node.get_mut(&node) {
            m.remove(key);
            if m.is_empty() {
                self.by_node.remove(&node);
            }
        }
        for c in &a.containers {
            if let Some(n) = self.sizes.get_mut(&c.slices()) {
                *n -= 1;
                if *n == 0 {
                    self.sizes.remove(&c.slices());
                }
            }
        }
    }

    fn apply(&mut self, pod: &Pod) {
        let key = view::pod_key(pod);
        self.remove(&key);
        if let Some((node, a)) = view::live_assignment(pod) {
            for c in &a.containers {
                *self.sizes.entry(c.slices()).or_default() += 1;
            }
            self.by_node
                .entry(node.clone())
                .or_default()
                .insert(key.clone(), a.clone());
            self.held.insert(key, (node, a));
        }
    }
}

/// The driver's ResourceSlices by the node they name.
#[derive(Debug, Default)]
struct SliceIndex {
    by_node: HashMap<String, BTreeMap<String, Arc<ResourceSlice>>>,
    /// Slice name → its node.
    node_of: HashMap<String, String>,
}

impl SliceIndex {
    fn remove(&mut self, name: &str) {
        if let Some(node) = self.node_of.remove(name)
            && let Some(m) = self.by_node.get_mut(&node)
        {
            m.remove(name);
            if m.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    fn apply(&mut self, s: Arc<ResourceSlice>) {
        let name = s.name_any();
        self.remove(&name);
        if let Some(node) = s.spec.node_name.clone() {
            self.by_node
                .entry(node.clone())
                .or_default()
                .insert(name.clone(), s);
            self.node_of.insert(name, node);
        }
    }
}

/// The driver's devices allocated to claims, by pool.
#[derive(Debug, Default)]
struct ClaimIndex {
    /// Claim `namespace/name` → its allocated devices.
    held: HashMap<String, Vec<Allocated>>,
    by_pool: HashMap<String, BTreeSet<String>>,
}

impl ClaimIndex {
    fn remove(&mut self, key: &str) {
        for a in self.held.remove(key).unwrap_or_default() {
            if let Some(s) = self.by_pool.get_mut(&a.pool) {
                s.remove(key);
                if s.is_empty() {
                    self.by_pool.remove(&a.pool);
                }
            }
        }
    }

    fn apply(&mut self, c: &ResourceClaim, driver: &str) {
        let key = dra::claim_key(c);
        self.remove(&key);
        let held = dra::allocated(c, driver);
        if held.is_empty() {
            return;
        }
        for a in &held {
            self.by_pool
                .entry(a.pool.clone())
                .or_default()
                .insert(key.clone());
        }
        self.held.insert(key, held);
    }
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // An index is updated by plain inserts and removes: a panic half-way
    // leaves nothing worse than the event it was applying.
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Only what decisions read of a node: its name, version and GPU report.
fn slim_node(n: &mut Node) {
    let m = &mut n.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k == NODE_GPU_REPORT);
    }
    n.spec = None;
    n.status = None;
}

/// Only what decisions read of a pod: identity, assignment, node, the
/// containers' resources, its claims and phase.
fn slim_pod(p: &mut Pod) {
    let m = &mut p.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k == ANNOTATION_GPU_ASSIGNMENT);
    }
    if let Some(spec) = p.spec.take() {
        p.spec = Some(PodSpec {
            node_name: spec.node_name,
            resource_claims: spec.resource_claims,
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    name: c.name,
                    resources: c.resources,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    }
    if let Some(status) = p.status.take() {
        p.status = Some(PodStatus {
            phase: status.phase,
            resource_claim_statuses: status.resource_claim_statuses,
            ..Default::default()
        });
    }
}

fn slim_meta<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// Runs one kind's watch for the life of the cache: each event into the
/// store (`writer`, through the reflector), then into `index` (given the
/// store: on a completed list it rebuilds from it), then into the kind's
/// progress.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    tracks: Tracks,
    writer: reflector::store::Writer<K>,
    slim: fn(&mut K),
    mut index: impl FnMut(&watcher::Event<K>, &Store<K>) + Send,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let store = writer.as_reader();
    let events = watcher(api, config)
        .map(move |e| e.map(|e| e.modify(slim)))
        .default_backoff();
    let mut events = std::pin::pin!(reflector::reflector(writer, events));
    let track = &tracks[kind.index()];
    // During a (re)list: what was seen when it started, the greatest
    // version listed.
    let mut listing: Option<(u64, u64)> = None;
    while let Some(e) = events.next().await {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                tracing::warn!(%kind, error = %err, "watch failed; retrying");
                continue;
            }
        };
        index(&e, &store);
        match &e {
            watcher::Event::Init => listing = Some((track.borrow().seen, 0)),
            watcher::Event::InitApply(o) => {
                if let Some(l) = listing.as_mut() {
                    l.1 = l.1.max(version_of(o).unwrap_or(0));
                }
            }
            watcher::Event::InitDone => {
                let (seen, listed) = listing.take().unwrap_or_default();
                track.send_modify(|p| {
                    p.synced = true;
                    p.lists += 1;
                    p.applied = p.applied.max(seen).max(listed);
                    p.seen = p.seen.max(p.applied);
                });
                tracing::info!(%kind, objects = store.len(), "listed");
            }
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                if let Some(v) = version_of(o) {
                    track.send_modify(|p| {
                        p.applied = p.applied.max(v);
                        p.seen = p.seen.max(v);
                    });
                }
            }
        }
    }
}

/// The watched view. Dropping it stops the watches.
pub struct Cache {
    nodes: Store<Node>,
    pods: Arc<RwLock<PodIndex>>,
    dra: Option<Dra>,
    tracks: Tracks,
    tasks: Vec<JoinHandle<()>>,
}

struct Dra {
    driver: String,
    claims: Store<ResourceClaim>,
    slices: Arc<RwLock<SliceIndex>>,
    allocated: Arc<RwLock<ClaimIndex>>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Cache {
    /// Starts watching on the current tokio runtime: nodes and pods, and
    /// with `driver` (DRA on) its ResourceSlices and every ResourceClaim.
    pub fn start(client: kube::Client, driver: Option<String>) -> Cache {
        let tracks: Tracks = Arc::new(std::array::from_fn(|_| {
            watch::Sender::new(Progress::default())
        }));
        let mut tasks = Vec::new();

        let (nodes, writer) = reflector::store::<Node>();
        tasks.push(tokio::spawn(follow(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            Kind::Nodes,
            tracks.clone(),
            writer,
            slim_node,
            // The store is what decisions read.
            |_, _| {},
        )));

        let pods: Arc<RwLock<PodIndex>> = Arc::default();
        let idx = pods.clone();
        let (_, writer) = reflector::store::<Pod>();
        tasks.push(tokio::spawn(follow(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
            Kind::Pods,
            tracks.clone(),
            writer,
            slim_pod,
            move |e, store| match e {
                watcher::Event::Apply(p) => write(&idx).apply(p),
                watcher::Event::Delete(p) => write(&idx).remove(&view::pod_key(p)),
                watcher::Event::InitDone => {
                    let mut i = write(&idx);
                    *i = PodIndex::default();
                    for p in store.state() {
                        i.apply(&p);
                    }
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            },
        )));

        let dra = driver.map(|driver| {
            let slices: Arc<RwLock<SliceIndex>> = Arc::default();
            let idx = slices.clone();
            let (_, writer) = reflector::store::<ResourceSlice>();
            tasks.push(tokio::spawn(follow(
                Api::<ResourceSlice>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.driver={driver}")),
                Kind::ResourceSlices,
                tracks.clone(),
                writer,
                slim_meta,
                move |e, store| match e {
                    watcher::Event::Apply(s) => {
                        if let Some(s) = store.get(&ObjectRef::from(s)) {
                            write(&idx).apply(s);
                        }
                    }
                    watcher::Event::Delete(s) => write(&idx).remove(&s.name_any()),
                    watcher::Event::InitDone => {
                        let mut i = write(&idx);
                        *i = SliceIndex::default();
                        for s in store.state() {
                            i.apply(s);
                        }
                    }
                    watcher::Event::Init | watcher::Event::InitApply(_) => {}
                },
            )));

            let allocated: Arc<RwLock<ClaimIndex>> = Arc::default();
            let idx = allocated.clone();
            let d = driver.clone();
            let (claims, writer) = reflector::store::<ResourceClaim>();
            tasks.push(tokio::spawn(follow(
                Api::<ResourceClaim>::all(client.clone()),
                watcher::Config::default(),
                Kind::ResourceClaims,
                tracks.clone(),
                writer,
                slim_meta,
                move |e, store| match e {
                    watcher::Event::Apply(c) => write(&idx).apply(c, &d),
                    watcher::Event::Delete(c) => write(&idx).remove(&dra::claim_key(c)),
                    watcher::Event::InitDone => {
                        let mut i = write(&idx);
                        *i = ClaimIndex::default();
                        for c in store.state() {
                            i.apply(&c, &d);
                        }
                    }
                    watcher::Event::Init | watcher::Event::InitApply(_) => {}
                },
            )));
            Dra {
                driver,
                claims,
                slices,
                allocated,
            }
        });
        Cache {
            nodes,
            pods,
            dra,
            tracks,
            tasks,
        }
    }

    /// The DRA driver whose slices and claims are watched (None: DRA off).
    pub fn driver(&self) -> Option<&str> {
        self.dra.as_ref().map(|d| d.driver.as_str())
    }

    /// How far the view of `kind` has got.
    pub fn progress(&self, kind: Kind) -> Progress {
        *self.tracks[kind.index()].borrow()
    }

    /// How many waits for the view of `kind` are in progress (binds
    /// waiting for it to catch up).
    pub fn waiting(&self, kind: Kind) -> usize {
        self.tracks[kind.index()].receiver_count()
    }

    /// Records that resourceVersion `rv` of `kind` exists (from a write of
    /// the extender's or an object the scheduler sent).
    pub fn saw(&self, kind: Kind, rv: Option<&str>) {
        if let Some(v) = version(rv) {
            self.tracks[kind.index()].send_if_modified(|p| {
                let more = v > p.seen;
                p.seen = p.seen.max(v);
                more
            });
        }
    }

    /// Whether `kinds` have been listed (what filter and prioritize need).
    pub fn ready(&self, kinds: &[Kind]) -> Result<(), ViewError> {
        for &k in kinds {
            self.watched(k)?;
            if !self.progress(k).synced {
                return Err(ViewError::NotSynced(k));
            }
        }
        Ok(())
    }

    fn watched(&self, kind: Kind) -> Result<(), ViewError> {
        match kind {
            Kind::ResourceSlices | Kind::ResourceClaims if self.dra.is_none() => {
                Err(ViewError::Off(kind))
            }
            _ => Ok(()),
        }
    }

    /// Waits, up to `within`, until the view of `kind` has applied every
    /// event up to `target`.
    pub async fn reach(&self, kind: Kind, target: u64, within: Duration) -> Result<(), ViewError> {
        self.watched(kind)?;
        self.until(kind, within, |p| p.reaches(target))
            .await
            .map_err(|p| {
                if p.synced {
                    ViewError::Behind {
                        kind,
                        applied: p.applied,
                        target,
                        waited: within,
                    }
                } else {
                    ViewError::NotSynced(kind)
                }
            })
    }

    /// Waits, up to `within`, until the view of `kind` has applied its
    /// `n`th list.
    pub async fn lists(&self, kind: Kind, n: u64, within: Duration) -> Result<(), ViewError> {
        self.watched(kind)?;
        self.until(kind, within, |p| p.lists >= n)
            .await
            .map_err(|_| ViewError::NotSynced(kind))
    }

    /// Waits, up to `within`, for the progress of `kind` to satisfy `done`;
    /// the progress when it did not.
    async fn until(
        &self,
        kind: Kind,
        within: Duration,
        done: impl FnMut(&Progress) -> bool,
    ) -> Result<(), Progress> {
        let mut rx = self.tracks[kind.index()].subscribe();
        let ok = tokio::time::timeout(within, rx.wait_for(done))
            .await
            .map(|r| r.is_ok());
        match ok {
            Ok(true) => Ok(()),
            // Timed out, or the sender is gone (never: the cache holds it).
            _ => Err(*rx.borrow()),
        }
    }

    /// Waits, up to `within` in all, until the view of each of `kinds` has
    /// caught up with what was seen of it when this was called.
    pub async fn caught_up(&self, kinds: &[Kind], within: Duration) -> Result<(), ViewError> {
        let targets: Vec<(Kind, u64)> = kinds.iter().map(|&k| (k, self.progress(k).seen)).collect();
        let deadline = tokio::time::Instant::now() + within;
        for (k, target) in targets {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            self.reach(k, target, left).await.map_err(|e| match e {
                ViewError::Behind {
                    kind,
                    applied,
                    target,
                    ..
                } => ViewError::Behind {
                    kind,
                    applied,
                    target,
                    waited: within,
                },
                e => e,
            })?;
        }
        Ok(())
    }

    /// A node as the view has it.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The assignments held on `node`, but that of pod `except`.
    pub fn assigned_on(&self, node: &str, except: &str) -> Vec<(String, Assignment)> {
        read(&self.pods)
            .by_node
            .get(node)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.as_str() != except)
                    .map(|(k, a)| (k.clone(), a.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The slice counts of the containers of every held assignment: the
    /// task mix.
    pub fn live_slices(&self) -> Vec<u32> {
        read(&self.pods)
            .sizes
            .iter()
            .flat_map(|(&k, &n)| std::iter::repeat_n(k, n))
            .collect()
    }

    /// A resource claim as the view has it (None also with DRA off).
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        self.dra
            .as_ref()?
            .claims
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// Node `name`'s GPUs as its ResourceSlices publish them less what the
    /// allocated claims hold, or why it is unknown.
    pub fn dra_node(&self, name: &str) -> Result<DraNode, String> {
        let Some(d) = &self.dra else {
            return Err("DRA is off in the extender".into());
        };
        let slices = read(&d.slices);
        let none = BTreeMap::new();
        let mine: Vec<&ResourceSlice> = slices
            .by_node
            .get(name)
            .unwrap_or(&none)
            .values()
            .map(|s| s.as_ref())
            .collect();
        let claims = read(&d.allocated);
        let held: Vec<&Allocated> = mine
            .iter()
            .map(|s| s.spec.pool.name.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|pool| claims.by_pool.get(pool))
            .flatten()
            .filter_map(|k| claims.held.get(k))
            .flatten()
            .collect();
        dra::node_state(name, &mine, &held, &d.driver)
    }
}
