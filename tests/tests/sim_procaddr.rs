//! `cuGetProcAddress_v2` with CUDA 12 semantics, as a program sees it through the loaded
//! library: the version argument picks the symbol's ABI, the per-thread flag picks the
//! `_ptsz`/`_ptds` variant, and failures say why in `symbolStatus`.

use tessera_e2e::{Mode, SimNode};

/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`, `..._VERSION_NOT_SUFFICIENT`.
const SYMBOL_NOT_FOUND: u64 = 1;
const VERSION_NOT_SUFFICIENT: u64 = 2;

#[test]
fn versions_and_flags_pick_the_exported_symbol() {
    let node = SimNode::new();
    for mode in [Mode::Dlopen, Mode::ProcAddr, Mode::Link] {
        // No cuInit first: the CUDA 12 runtime looks functions up before initialising.
        let out = node.run(
            mode,
            &[
                "procaddr cuMemAlloc 12000",
                "procaddr cuMemAlloc 3010",
                "procaddr cuLaunchKernel 12000 pt",
                "procaddr cuLaunchKernel 12000",
                "procaddr cuLaunchKernel 6050 pt",
                "procaddr cuMemcpyHtoD 12000 pt",
                "procaddr cuStreamSynchronize 12000 pt",
                "procaddr cuGraphInstantiate 11000",
                "procaddr cuGraphInstantiate 12000",
                "procaddr cuCtxCreate 12090",
                "procaddr cuGetProcAddress 12000",
                "procaddr cuInit 12000",
            ],
        );
        out.expect_ok();
        let got: Vec<&str> = out.fields("procaddr", "resolved");
        assert_eq!(
            got,
            [
                "cuMemAlloc_v2",
                "cuMemAlloc",
                "cuLaunchKernel_ptsz",
                "cuLaunchKernel",
                "cuLaunchKernel",
                "cuMemcpyHtoD_v2_ptds",
                "cuStreamSynchronize_ptsz",
                "cuGraphInstantiate_v2",
                "cuGraphInstantiateWithFlags",
                "cuCtxCreate_v3",
                "cuGetProcAddress_v2",
                "cuInit",
            ],
            "{mode:?}"
        );
        assert!(out.all("procaddr").iter().all(|l| l.u64("status") == 0));
    }
}

#[test]
fn failures_report_the_reason() {
    let node = SimNode::new();
    let out = node.run(
        Mode::ProcAddr,
        &[
            "procaddr cuNoSuchFunction 12000",
            "procaddr cuMemAlloc_v2 12000",
            "procaddr cuMemAllocAsync 11010",
            "procaddr cuInit 12000 4",
        ],
    );
    assert!(out.status.success());
    let l = out.all("procaddr");
    assert_eq!(l[0].error.as_deref(), Some("CUDA_ERROR_NOT_FOUND"));
    assert_eq!(l[0].u64("status"), SYMBOL_NOT_FOUND);
    assert_eq!(
        l[1].error.as_deref(),
        Some("CUDA_ERROR_NOT_FOUND"),
        "versioned names are not symbols"
    );
    assert_eq!(l[1].u64("status"), SYMBOL_NOT_FOUND);
    assert_eq!(l[2].error.as_deref(), Some("CUDA_ERROR_NOT_FOUND"));
    assert_eq!(l[2].u64("status"), VERSION_NOT_SUFFICIENT);
    assert_eq!(
        l[3].error.as_deref(),
        Some("CUDA_ERROR_INVALID_VALUE"),
        "unknown flags"
    );
}
