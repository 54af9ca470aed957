//! CUDA graphs: create, add kernel and empty nodes, instantiate, launch, destroy. A graph
//! launch queues its kernels, one after another, on the stream's device engine.

use std::ffi::{c_char, c_uint};
use std::sync::{Arc, Mutex};

use tessera_ffi::cuda::*;

use crate::launch::Shape;
use crate::module::{ANY_DEVICE, Function, function};
use crate::registry::Registry;
use crate::runtime::rt;
use crate::stream::resolve;
use crate::{CuResult, get, guard};

#[derive(Debug, Default)]
pub struct Graph {
    /// Node handles in insertion order (a valid topological order: dependencies must exist
    /// before a node that names them).
    pub nodes: Mutex<Vec<usize>>,
}

#[derive(Debug)]
pub struct GraphNode {
    pub graph: usize,
    pub kernel: Option<(Arc<Function>, u64)>,
}

#[derive(Debug)]
pub struct GraphExec {
    /// Kernels with their durations, in launch order.
    pub kernels: Vec<(Arc<Function>, u64)>,
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
        let shape = Shape {
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared: p.sharedMemBytes,
        };
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
        let shape = Shape {
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared: p.sharedMemBytes,
        };
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
    let kernels = g
        .nodes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|n| NODES.get(*n)?.kernel.clone())
        .collect();
    let h = EXECS.insert(Arc::new(GraphExec { kernels }));
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

/// `cuGraphInstantiate` (the CUDA 10/11 signature with an error node and log buffer).
///
/// # Safety
/// `phGraphExec` must be null or writable; the optional outputs null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
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

/// `cuGraphInstantiate_v2` (same signature as `cuGraphInstantiate`).
///
/// # Safety
/// As `cuGraphInstantiate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    phErrorNode: *mut CUgraphNode,
    logBuffer: *mut c_char,
    bufferSize: usize,
) -> CUresult {
    // SAFETY: forwarded with the caller's pointers, same contract.
    unsafe { cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize) }
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

/// `cuGraphInstantiateWithParams`.
///
/// # Safety
/// Pointers must be null or valid and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    guard(|| instantiate_with_params(phGraphExec, hGraph, instantiateParams))
}

/// `cuGraphInstantiateWithParams_ptsz`.
///
/// # Safety
/// Pointers must be null or valid and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    guard(|| instantiate_with_params(phGraphExec, hGraph, instantiateParams))
}

fn graph_launch(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let e = EXECS
        .get(exec as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let t = resolve(stream, per_thread)?;
    let device = t.ctx().device;
    if e.kernels
        .iter()
        .any(|(f, _)| f.device != ANY_DEVICE && f.device != device)
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for (_, d) in &e.kernels {
        t.submit(rt, *d)?;
    }
    Ok(())
}

/// `cuGraphLaunch`: queues the graph's kernels in order.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    guard(|| graph_launch(hGraphExec, hStream, false))
}

/// `cuGraphLaunch_ptsz`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    guard(|| graph_launch(hGraphExec, hStream, true))
}

fn upload(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CuResult<()> {
    rt()?;
    EXECS
        .get(exec as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    resolve(stream, per_thread).map(|_| ())
}

/// `cuGraphUpload`: nothing to upload; validates its arguments.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    guard(|| upload(hGraphExec, hStream, false))
}

/// `cuGraphUpload_ptsz`.
///
/// # Safety
/// Handles are checked; no pointers are dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload_ptsz(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    guard(|| upload(hGraphExec, hStream, true))
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    guard(|| {
        rt()?;
        EXECS
            .remove(hGraphExec as usize)
            .map(|_| ())
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })
}
