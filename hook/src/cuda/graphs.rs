//! Graph memory. A graph's allocation nodes (`cuGraphAddMemAllocNode`, or a
//! stream-ordered allocation captured into it) take memory from the
//! device's graph memory when the graph is launched or uploaded, keep it
//! mapped for later launches, and give it back to the device only when
//! trimmed (`cuDeviceGraphMemTrim`). So the shim learns each graph's
//! allocation bytes as nodes are added, hands them to its executable
//! graphs at instantiation, admits a launch for what the device's graph
//! memory must grow by, and charges the device's graph memory what the
//! driver says it has reserved (`Governed::graph_launch`).

use super::*;

pub unsafe fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    let g = governed_or!(call_real!(cuGraphAddMemAllocNode(
        node, graph, deps, ndeps, params
    )));
    let r = call_real!(cuGraphAddMemAllocNode(node, graph, deps, ndeps, params));
    if r == OK && !params.is_null() {
        // SAFETY: the driver accepted the parameters: readable.
        let p = unsafe { &*params };
        if p.poolProps.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
            g.graph_alloc_node(graph as usize, p.poolProps.location.id, p.bytesize as u64);
        }
    }
    r
}

pub unsafe fn cuGraphClone(clone: *mut CUgraph, graph: CUgraph) -> CUresult {
    let g = governed_or!(call_real!(cuGraphClone(clone, graph)));
    let r = call_real!(cuGraphClone(clone, graph));
    if r == OK {
        // SAFETY: the driver succeeded and wrote it.
        g.graph_copied(graph as usize, unsafe { out(clone) } as usize, false);
    }
    r
}

pub unsafe fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    let g = governed_or!(call_real!(cuGraphDestroy(graph)));
    let r = call_real!(cuGraphDestroy(graph));
    if r == OK {
        g.graph_gone(graph as usize, false);
    }
    r
}

/// An instantiation: the executable graph inherits the graph's allocation
/// bytes (nothing is mapped yet).
fn instantiated(g: &Governed, exec: *mut CUgraphExec, graph: CUgraph, r: CUresult) -> CUresult {
    if r == OK {
        // SAFETY: the driver succeeded and wrote it.
        g.graph_copied(graph as usize, unsafe { out(exec) } as usize, true);
    }
    r
}

/// `cuGraphInstantiate` and its `_v2`: one C signature and one body, each
/// calling its own real entry point.
macro_rules! instantiate {
    ($($name:ident),+) => {$(
        pub unsafe fn $name(
            exec: *mut CUgraphExec,
            graph: CUgraph,
            err: *mut CUgraphNode,
            log: *mut c_char,
            size: usize,
        ) -> CUresult {
            let g = governed_or!(call_real!($name(exec, graph, err, log, size)));
            let r = call_real!($name(exec, graph, err, log, size));
            instantiated(g, exec, graph, r)
        }
    )+};
}

instantiate!(cuGraphInstantiate, cuGraphInstantiate_v2);

pub unsafe fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    let g = governed_or!(call_real!(cuGraphInstantiateWithFlags(exec, graph, flags)));
    let r = call_real!(cuGraphInstantiateWithFlags(exec, graph, flags));
    instantiated(g, exec, graph, r)
}

/// With `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the driver maps the graph's
/// memory during the call: the instantiation is made without the flag and
/// the upload, admitted like a launch, follows on the same stream.
fn with_params(
    g: &Governed,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    call: impl Fn(*mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult,
    ptsz: bool,
) -> CUresult {
    let upload = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64;
    // SAFETY: the caller passes readable parameters (or null).
    let p = (!params.is_null()).then(|| unsafe { *params });
    let Some(mut p) = p.filter(|p| p.flags & upload != 0 && g.graph_memory_used()) else {
        let r = call(params);
        return instantiated(g, exec, graph, r);
    };
    p.flags &= !upload;
    let stream = p.hUploadStream;
    let r = call(&mut p);
    // SAFETY: the caller's parameters; the driver's outputs passed on.
    unsafe {
        (*params).hErrNode_out = p.hErrNode_out;
        (*params).result_out = p.result_out;
    }
    let r = instantiated(g, exec, graph, r);
    if r != OK {
        return r;
    }
    // SAFETY: the driver succeeded and wrote it.
    let e = unsafe { out(exec) };
    g.graph_launch(e as usize, || {
        if ptsz {
            call_real!(cuGraphUpload_ptsz(e, stream))
        } else {
            call_real!(cuGraphUpload(e, stream))
        }
    })
}

pub unsafe fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    let g = governed_or!(call_real!(cuGraphInstantiateWithParams(
        exec, graph, params
    )));
    with_params(
        g,
        exec,
        graph,
        params,
        |p| call_real!(cuGraphInstantiateWithParams(exec, graph, p)),
        false,
    )
}

pub unsafe fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    let g = governed_or!(call_real!(cuGraphInstantiateWithParams_ptsz(
        exec, graph, params
    )));
    with_params(
        g,
        exec,
        graph,
        params,
        |p| call_real!(cuGraphInstantiateWithParams_ptsz(exec, graph, p)),
        true,
    )
}

pub unsafe fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    let g = governed_or!(call_real!(cuGraphExecDestroy(exec)));
    let r = call_real!(cuGraphExecDestroy(exec));
    if r == OK {
        g.graph_gone(exec as usize, true);
    }
    r
}

pub unsafe fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuGraphUpload(exec, stream)));
    g.graph_launch(exec as usize, || call_real!(cuGraphUpload(exec, stream)))
}

pub unsafe fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let g = governed_or!(call_real!(cuGraphUpload_ptsz(exec, stream)));
    g.graph_launch(exec as usize, || {
        call_real!(cuGraphUpload_ptsz(exec, stream))
    })
}

pub unsafe fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceGraphMemTrim(dev)));
    let r = call_real!(cuDeviceGraphMemTrim(dev));
    if r == OK {
        g.graph_trimmed(dev);
    }
    r
}
