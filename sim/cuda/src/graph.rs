//! CUDA graphs: create, add kernel, empty and memory nodes, instantiate, launch, destroy.
//! A graph launch queues its kernels, one after another, on the stream's device engine.
//!
//! Graph memory follows the driver's semantics: an allocation node's address is fixed
//! when the node is created (no memory yet); physical memory is reserved for the device's
//! graph memory when an executable graph is uploaded or launched, and stays reserved
//! after the allocations are freed (by a free node, `cuMemFreeAsync` or `cuMemFree`) so
//! later launches reuse it, until `cuDeviceGraphMemTrim` returns what no live graph
//! allocation uses. The reserve is charged to the device; the graph memory attributes
//! report it (`USED` = live graph allocations, `RESERVED` = charged).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_ffi::cuda::*;

use crate::launch::{Shape, shape_of};
use crate::memory::{Alloc, Kind, PAGE, allocs, arena, commit, round_up};
use crate::module::{ANY_DEVICE, Function, function};
use crate::registry::Registry;
use crate::runtime::{Runtime, rt};
use crate::stream::{Target, resolve};
use crate::{CuResult, get, guard, put};

#[derive(Debug, Default)]
pub struct Graph {
    /// Node handles in insertion order (a valid topological order: dependencies must exist
    /// before a node that names them).
    pub nodes: Mutex<Vec<usize>>,
    /// Live executable graphs instantiated from it (at most one if it has memory nodes).
    pub execs: AtomicU32,
}

#[derive(Debug)]
pub struct GraphNode {
    pub graph: usize,
    pub kernel: Option<(Arc<Function>, u64)>,
    pub mem: Option<MemOp>,
    /// Device work captured from a stream (a kernel launch, a graph launch): its
    /// duration.
    pub work: Option<u64>,
}

/// What a memory node does.
#[derive(Debug, Clone)]
pub enum MemOp {
    Alloc(Arc<GraphAlloc>),
    /// Frees the graph allocation at this address.
    Free(u64),
}

#[derive(Debug)]
pub struct GraphExec {
    /// Kernels (or captured work, without a function) with their durations, in launch
    /// order.
    pub kernels: Vec<(Option<Arc<Function>>, u64)>,
    /// Memory nodes in node order.
    pub mem: Vec<MemOp>,
    /// The graph it was instantiated from.
    pub graph: usize,
}

/// The allocation of one graph allocation node: a fixed address range, mapped while the
/// allocation is live (from the launch that allocates it to its free).
#[derive(Debug)]
pub struct GraphAlloc {
    /// Physical device index.
    pub device: usize,
    pub bytes: u64,
    pub va_len: u64,
    pub dptr: u64,
    pub live: AtomicBool,
}

impl GraphAlloc {
    /// The allocation was freed (its mapping is gone): it no longer uses graph memory.
    pub fn freed(&self, _rt: &Runtime) {
        if self.live.swap(false, Ordering::AcqRel) {
            let mut g = graph_mem();
            let m = g.entry(self.device).or_default();
            m.used = m.used.saturating_sub(self.bytes);
        }
    }
}

/// One device's graph memory in this process.
#[derive(Debug, Default, Clone, Copy)]
pub struct GraphMem {
    /// Bytes of live graph allocations.
    pub used: u64,
    /// Bytes charged to the device for graph allocations.
    pub reserved: u64,
    pub used_high: u64,
    pub reserved_high: u64,
}

static GRAPH_MEM: Mutex<BTreeMap<usize, GraphMem>> = Mutex::new(BTreeMap::new());
/// Every graph allocation ever made by a node, by address.
static GRAPH_ALLOCS: Mutex<BTreeMap<u64, Arc<GraphAlloc>>> = Mutex::new(BTreeMap::new());

fn graph_mem() -> MutexGuard<'static, BTreeMap<usize, GraphMem>> {
    GRAPH_MEM.lock().unwrap_or_else(|e| e.into_inner())
}

fn graph_allocs() -> MutexGuard<'static, BTreeMap<u64, Arc<GraphAlloc>>> {
    GRAPH_ALLOCS.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's graph memory on physical `device` (ground truth for tests).
pub fn graph_mem_of(device: usize) -> GraphMem {
    graph_mem().get(&device).copied().unwrap_or_default()
}

pub static GRAPHS: Registry<Graph> = Registry::new();
pub static NODES: Registry<GraphNode> = Registry::new();
pub static EXECS: Registry<GraphExec> = Registry::new();

/// `cuGraphCreate`.
///
/// # Safety
/// `phGraph` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint) -> CUresult {
    guard(|| {
        rt()?;
        if flags != 0 || phGraph.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let h = GRAPHS.insert(Arc::new(Graph::default()));
        // SAFETY: checked non-null above.
        unsafe { phGraph.write(h as CUgraph) };
        Ok(())
    })
}

/// `cuGraphDestroy`: its nodes go with it; instantiated executables stay valid.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(hGraph: CUgraph) -> CUresult {
    guard(|| {
        rt()?;
        GRAPHS
            .remove(hGraph as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        NODES.remove_where(|n| n.graph == hGraph as usize);
        Ok(())
    })
}

fn add_node(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    kernel: Option<(Arc<Function>, u64)>,
) -> CuResult<()> {
    add_any_node(ph, graph, deps, ndeps, kernel, None, None)
}

fn add_any_node(
    ph: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    kernel: Option<(Arc<Function>, u64)>,
    mem: Option<MemOp>,
    work: Option<u64>,
) -> CuResult<()> {
    rt()?;
    let g = GRAPHS
        .get(graph as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if ph.is_null() || (ndeps > 0 && deps.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut nodes = g.nodes.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..ndeps {
        // SAFETY: the caller passes `ndeps` node handles.
        let d = unsafe { deps.add(i).read() } as usize;
        if !nodes.contains(&d) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    }
    let h = NODES.insert(Arc::new(GraphNode {
        graph: graph as usize,
        kernel,
        mem,
        work,
    }));
    nodes.push(h);
    // SAFETY: checked non-null above.
    unsafe { ph.write(h as CUgraphNode) };
    Ok(())
}

fn kernel_of(func: CUfunction, shape: Shape) -> CuResult<(Arc<Function>, u64)> {
    let f = function(func)?;
    let blocks = shape.blocks()?;
    let d = f.cost.duration(blocks);
    Ok((f, d))
}

/// `cuGraphAddKernelNode` (CUDA 10 parameter struct).
///
/// # Safety
/// Pointers must be null or valid; `dependencies` holds `numDependencies` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
    nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller passes null (rejected) or valid parameters.
        let p = unsafe { get(nodeParams) }?;
        let shape = shape_of!(p);
        let k = kernel_of(p.func, shape)?;
        add_node(phGraphNode, hGraph, dependencies, numDependencies, Some(k))
    })
}

/// `cuGraphAddKernelNode_v2` (CUDA 12 parameter struct; `kern` may stand for `func`).
///
/// # Safety
/// Pointers must be null or valid; `dependencies` holds `numDependencies` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
    nodeParams: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller passes null (rejected) or valid parameters.
        let p = unsafe { get(nodeParams) }?;
        let shape = shape_of!(p);
        let func = if p.func.is_null() {
            p.kern as CUfunction
        } else {
            p.func
        };
        let k = kernel_of(func, shape)?;
        add_node(phGraphNode, hGraph, dependencies, numDependencies, Some(k))
    })
}

/// `cuGraphAddEmptyNode`.
///
/// # Safety
/// Pointers must be null or valid; `dependencies` holds `numDependencies` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
) -> CUresult {
    guard(|| add_node(phGraphNode, hGraph, dependencies, numDependencies, None))
}

/// `cuGraphGetNodes`: with `nodes` NULL, the count only.
///
/// # Safety
/// `numNodes` must be valid; `nodes` null or holding `*numNodes` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    hGraph: CUgraph,
    nodes: *mut CUgraphNode,
    numNodes: *mut usize,
) -> CUresult {
    guard(|| {
        rt()?;
        let g = GRAPHS
            .get(hGraph as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if numNodes.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let list = g.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !nodes.is_null() {
            // SAFETY: non-null; the caller says how many entries `nodes` holds.
            let room = unsafe { numNodes.read() };
            for (i, n) in list.iter().take(room).enumerate() {
                // SAFETY: i < room entries of the caller's array.
                unsafe { nodes.add(i).write(*n as CUgraphNode) };
            }
        }
        // SAFETY: checked non-null above.
        unsafe { numNodes.write(list.len()) };
        Ok(())
    })
}

fn instantiate(ph: *mut CUgraphExec, graph: CUgraph) -> CuResult<()> {
    rt()?;
    let g = GRAPHS
        .get(graph as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if ph.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let nodes: Vec<Arc<GraphNode>> = g
        .nodes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|n| NODES.get(*n))
        .collect();
    let kernels = nodes
        .iter()
        .filter_map(|n| match (&n.kernel, n.work) {
            (Some((f, d)), _) => Some((Some(f.clone()), *d)),
            (None, Some(d)) => Some((None, d)),
            (None, None) => None,
        })
        .collect();
    let mem: Vec<MemOp> = nodes.iter().filter_map(|n| n.mem.clone()).collect();
    // As the driver: a graph with memory nodes has at most one executable at a time.
    if !mem.is_empty() && g.execs.load(Ordering::Acquire) > 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    g.execs.fetch_add(1, Ordering::AcqRel);
    let h = EXECS.insert(Arc::new(GraphExec {
        kernels,
        mem,
        graph: graph as usize,
    }));
    // SAFETY: checked non-null above.
    unsafe { ph.write(h as CUgraphExec) };
    Ok(())
}

/// `cuGraphInstantiateWithFlags`.
///
/// # Safety
/// `phGraphExec` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    flags: u64,
) -> CUresult {
    guard(|| {
        if flags & !0xf != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        instantiate(phGraphExec, hGraph)
    })
}

tessera_sim::exports! {
    /// `cuGraphInstantiate`, `cuGraphInstantiate_v2` (the CUDA 10/11 signature with an error
    /// node and log buffer; `_v2` is the same).
    ///
    /// # Safety
    /// `phGraphExec` must be null or writable; the optional outputs null or writable.
    fn [cuGraphInstantiate, cuGraphInstantiate_v2](
        phGraphExec: *mut CUgraphExec,
        hGraph: CUgraph,
        phErrorNode: *mut CUgraphNode,
        logBuffer: *mut c_char,
        bufferSize: usize,
    ) -> CUresult {
        guard(|| {
            if !phErrorNode.is_null() {
                // SAFETY: non-null out pointer from the caller.
                unsafe { phErrorNode.write(std::ptr::null_mut()) };
            }
            if !logBuffer.is_null() && bufferSize > 0 {
                // SAFETY: the buffer holds at least one byte.
                unsafe { logBuffer.write(0) };
            }
            instantiate(phGraphExec, hGraph)
        })
    }
}

fn instantiate_with_params(
    ph: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CuResult<()> {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let r = instantiate(ph, graph);
    // SAFETY: non-null; the caller passes a writable parameter struct.
    unsafe {
        (*params).hErrNode_out = std::ptr::null_mut();
        (*params).result_out = if r.is_ok() {
            CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS
        } else {
            CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR
        };
    }
    r
}

tessera_sim::exports! {
    /// `cuGraphInstantiateWithParams`, `cuGraphInstantiateWithParams_ptsz`.
    ///
    /// # Safety
    /// Pointers must be null or valid and writable.
    fn [cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz](
        phGraphExec: *mut CUgraphExec,
        hGraph: CUgraph,
        instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) -> CUresult {
        guard(|| instantiate_with_params(phGraphExec, hGraph, instantiateParams))
    }
}

/// The executable graph a handle names; `CUDA_ERROR_INVALID_VALUE` for an unknown one, as
/// the driver reports it for launches and uploads.
fn exec_of(h: CUgraphExec) -> CuResult<Arc<GraphExec>> {
    EXECS
        .get(h as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

fn graph_launch(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let e = exec_of(exec)?;
    let t = resolve(stream, per_thread)?;
    let device = t.ctx().device;
    if e.kernels.iter().any(|(f, _)| {
        f.as_ref()
            .is_some_and(|f| f.device != ANY_DEVICE && f.device != device)
    }) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    run_memory_nodes(rt, &e, &t)?;
    // One launch's host cost for the whole graph: what graphs are for.
    rt.costs.pay_launch();
    for (_, d) in &e.kernels {
        t.submit(rt, *d)?;
    }
    Ok(())
}

fn upload(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let e = exec_of(exec)?;
    resolve(stream, per_thread)?;
    // Uploading reserves the graph's memory, as its first launch would.
    let mut need: BTreeMap<usize, u64> = BTreeMap::new();
    for op in &e.mem {
        if let MemOp::Alloc(a) = op {
            *need.entry(a.device).or_default() += a.bytes;
        }
    }
    for (device, bytes) in need {
        reserve_graph_memory(rt, device, bytes)?;
    }
    Ok(())
}

crate::ptsz_exports! {
    /// `cuGraphLaunch`: queues the graph's kernels in order.
    ///
    /// # Safety
    /// Handles are checked; no pointers are dereferenced.
    fn cuGraphLaunch / cuGraphLaunch_ptsz [per_thread](
        hGraphExec: CUgraphExec,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| graph_launch(hGraphExec, hStream, per_thread))
    }

    /// `cuGraphUpload`: reserves the graph's memory, as its first launch would.
    ///
    /// # Safety
    /// Handles are checked; no pointers are dereferenced.
    fn cuGraphUpload / cuGraphUpload_ptsz [per_thread](
        hGraphExec: CUgraphExec,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| upload(hGraphExec, hStream, per_thread))
    }
}

/// Makes sure the device's graph memory has room for `extra` more bytes of live graph
/// allocations, charging the device for what the reserve has to grow by.
fn reserve_graph_memory(rt: &Runtime, device: usize, extra: u64) -> CuResult<()> {
    let mut g = graph_mem();
    let m = g.entry(device).or_default();
    // The reserve grows in whole device pages, as every device allocation does.
    let want = crate::memory::device_pages(m.used.saturating_add(extra))?;
    if want > m.reserved {
        rt.charge(device, want - m.reserved)?;
        m.reserved = want;
        m.reserved_high = m.reserved_high.max(m.reserved);
    }
    Ok(())
}

/// Runs a launch's memory nodes: maps its allocations and unmaps what it frees, after
/// reserving (and charging) the peak the graph needs at once.
fn run_memory_nodes(rt: &Runtime, e: &GraphExec, t: &Target) -> CuResult<()> {
    if e.mem.is_empty() {
        return Ok(());
    }
    // Validate and find each device's peak first, so a refused launch changes nothing.
    let mut running: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    let mut allocated: Vec<u64> = Vec::new();
    let known = graph_allocs();
    for op in &e.mem {
        match op {
            MemOp::Alloc(a) => {
                // Launching again before the last launch's allocation was freed.
                if a.live.load(Ordering::Acquire) || allocated.contains(&a.dptr) {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                allocated.push(a.dptr);
                let r = running.entry(a.device).or_default();
                r.0 += a.bytes;
                r.1 = r.1.max(r.0);
            }
            MemOp::Free(p) => {
                let a = known.get(p).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
                if !(a.live.load(Ordering::Acquire) || allocated.contains(p)) {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                allocated.retain(|x| x != p);
                let r = running.entry(a.device).or_default();
                r.0 = r.0.saturating_sub(a.bytes);
            }
        }
    }
    drop(known);
    for (&device, &(_, peak)) in &running {
        rt.check_device(device)?;
        reserve_graph_memory(rt, device, peak)?;
    }
    let ctx = t.ctx();
    for op in &e.mem {
        match op {
            MemOp::Alloc(a) => {
                commit(a.dptr, a.va_len)?;
                a.live.store(true, Ordering::Release);
                {
                    let mut g = graph_mem();
                    let m = g.entry(a.device).or_default();
                    m.used += a.bytes;
                    m.used_high = m.used_high.max(m.used);
                }
                allocs().insert(
                    a.dptr,
                    Alloc {
                        base: a.dptr,
                        size: a.bytes,
                        va_len: a.va_len,
                        device: a.device,
                        ctx_id: ctx.id,
                        kind: Kind::Graph(a.clone()),
                        charged: 0,
                        accessible: true,
                        shared: 0,
                    },
                );
            }
            MemOp::Free(p) => {
                crate::memory::free_device(rt, *p)?;
            }
        }
    }
    Ok(())
}

/// A new graph allocation of `bytes` on physical `device`: its address range, with no
/// memory behind it until a launch maps it.
pub fn new_graph_alloc(device: usize, bytes: u64) -> CuResult<Arc<GraphAlloc>> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let va_len = round_up(bytes, PAGE).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    let dptr = arena()?.reserve(va_len, crate::vmm::GRANULARITY)?;
    let a = Arc::new(GraphAlloc {
        device,
        bytes,
        va_len,
        dptr,
        live: AtomicBool::new(false),
    });
    graph_allocs().insert(dptr, a.clone());
    Ok(a)
}

/// Adds an allocation node for `bytes` on physical `device` after `deps`; returns the
/// node and its address.
pub fn add_alloc_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    device: usize,
    bytes: u64,
) -> CuResult<(CUgraphNode, u64)> {
    let a = new_graph_alloc(device, bytes)?;
    let dptr = a.dptr;
    Ok((add_mem_node(graph, deps, MemOp::Alloc(a))?, dptr))
}

/// Adds the node of one memory operation (an allocation or a free) after `deps`.
fn add_mem_node(graph: CUgraph, deps: &[CUgraphNode], op: MemOp) -> CuResult<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    add_any_node(
        &mut node,
        graph,
        deps.as_ptr(),
        deps.len(),
        None,
        Some(op),
        None,
    )?;
    Ok(node)
}

/// Adds a free node for the graph allocation at `dptr` after `deps`.
pub fn add_free_node(graph: CUgraph, deps: &[CUgraphNode], dptr: u64) -> CuResult<CUgraphNode> {
    if !graph_allocs().contains_key(&dptr) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    add_mem_node(graph, deps, MemOp::Free(dptr))
}

/// Adds a node of captured device work lasting `duration_ns` after `deps`.
pub fn add_work_node(
    graph: usize,
    deps: &[CUgraphNode],
    duration_ns: u64,
) -> CuResult<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    add_any_node(
        &mut node,
        graph as CUgraph,
        deps.as_ptr(),
        deps.len(),
        None,
        None,
        Some(duration_ns),
    )?;
    Ok(node)
}

/// Is `dptr` the address of a graph allocation (for `cuMemFreeAsync` in capture)?
pub fn is_graph_alloc(dptr: u64) -> bool {
    graph_allocs().contains_key(&dptr)
}

fn deps_slice<'a>(deps: *const CUgraphNode, n: usize) -> CuResult<&'a [CUgraphNode]> {
    if n == 0 {
        return Ok(&[]);
    }
    if deps.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller of the export passes `n` node handles at `deps`.
    Ok(unsafe { std::slice::from_raw_parts(deps, n) })
}

/// `cuGraphAddMemAllocNode`: the address is chosen now and written to `dptr` of the
/// parameters; memory is reserved at upload or launch.
///
/// # Safety
/// Pointers must be null or valid; `dependencies` holds `numDependencies` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
    nodeParams: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if nodeParams.is_null() || phGraphNode.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller passes valid, writable parameters.
        let p = unsafe { &mut *nodeParams };
        if p.poolProps.allocType != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
            || p.poolProps.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let device = rt
            .device(p.poolProps.location.id)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?
            .index;
        let deps = deps_slice(dependencies, numDependencies)?;
        let (node, dptr) = add_alloc_node(hGraph, deps, device, p.bytesize as u64)?;
        p.dptr = dptr;
        // SAFETY: checked non-null above.
        unsafe { phGraphNode.write(node) };
        Ok(())
    })
}

/// `cuGraphAddMemFreeNode`: `dptr` must be a graph allocation.
///
/// # Safety
/// Pointers must be null or valid; `dependencies` holds `numDependencies` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        if phGraphNode.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let deps = deps_slice(dependencies, numDependencies)?;
        let node = add_free_node(hGraph, deps, dptr)?;
        // SAFETY: checked non-null above.
        unsafe { phGraphNode.write(node) };
        Ok(())
    })
}

/// `cuGraphMemAllocNodeGetParams`.
///
/// # Safety
/// `params_out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    hNode: CUgraphNode,
    params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let n = NODES
            .get(hNode as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let Some(MemOp::Alloc(a)) = &n.mem else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if params_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: all-zero is a valid CUDA_MEM_ALLOC_NODE_PARAMS (null pointers, zeros).
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        p.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = rt.ordinal(a.device);
        p.bytesize = a.bytes as usize;
        p.dptr = a.dptr;
        // SAFETY: checked non-null above.
        unsafe { params_out.write(p) };
        Ok(())
    })
}

/// `cuGraphMemFreeNodeGetParams`.
///
/// # Safety
/// `dptr_out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    hNode: CUgraphNode,
    dptr_out: *mut CUdeviceptr,
) -> CUresult {
    guard(|| {
        rt()?;
        let n = NODES
            .get(hNode as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let Some(MemOp::Free(p)) = &n.mem else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(dptr_out, *p) }
    })
}

/// `cuDeviceGraphMemTrim`: returns reserved graph memory that no live graph allocation
/// uses.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(device)?.index;
        let mut g = graph_mem();
        let m = g.entry(d).or_default();
        // Whole device pages go back; a page a live allocation touches stays.
        let keep =
            crate::memory::round_up(m.used, crate::memory::DEVICE_PAGE).unwrap_or(m.reserved);
        if m.reserved > keep {
            rt.uncharge(d, m.reserved - keep);
            m.reserved = keep;
        }
        Ok(())
    })
}

/// `cuDeviceGetGraphMemAttribute`: used/reserved, current and high (cuuint64_t).
///
/// # Safety
/// `value` must be null or valid for writing a cuuint64_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let m = graph_mem_of(rt()?.device(device)?.index);
        use CUgraphMem_attribute as A;
        let v = match attr {
            A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => m.used,
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => m.used_high,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => m.reserved,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => m.reserved_high,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the caller passes a writable cuuint64_t or null (rejected).
        unsafe { put(value.cast::<u64>(), v) }
    })
}

/// `cuDeviceSetGraphMemAttribute`: only the high watermarks, and only reset (to 0).
///
/// # Safety
/// `value` must be null or point to a cuuint64_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = rt()?.device(device)?.index;
        // SAFETY: the caller passes null (rejected) or a valid cuuint64_t.
        let v = *unsafe { get(value.cast::<u64>()) }?;
        if v != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        use CUgraphMem_attribute as A;
        let mut g = graph_mem();
        let m = g.entry(d).or_default();
        match attr {
            A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => m.used_high = m.used,
            A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => m.reserved_high = m.reserved,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    guard(|| {
        rt()?;
        let e = EXECS
            .remove(hGraphExec as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if let Some(g) = GRAPHS.get(e.graph) {
            g.execs.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    })
}

// ---- node queries cuBLASLt resolves by name (not implemented yet) ----
//
// cuBLASLt (behind torch.matmul) resolves these with dlsym when it creates a handle and
// refuses to start without them. Until this family implements them they exist and answer
// `CUDA_ERROR_NOT_SUPPORTED` (no cuGetProcAddress entries: the graph family owns those).

/// `cuGraphNodeGetType`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(
    _hNode: CUgraphNode,
    _type_: *mut CUgraphNodeType,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuGraphKernelNodeGetParams`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    _hNode: CUgraphNode,
    _nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `cuGraphExecKernelNodeSetParams`: not supported yet (see above).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    _hGraphExec: CUgraphExec,
    _hNode: CUgraphNode,
    _nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
