//! The simulated driver loads what real programs load — NVRTC's cubin and PTX of our own
//! kernels, fat binaries (bare and inside the runtime's wrapper struct), CUDA 12 libraries
//! — finds kernels and globals by name, runs launches for the documented duration model,
//! and answers malformed images with an error code and one log line, never a crash, even
//! when the image ends right before unmapped memory.
//!
//! This binary holds one test on purpose: the driver runs in this process (its Rust
//! library), and the test sets `TESSERA_SIM_STATE` and `TESSERA_SIM_KERNEL_TIME` in its own
//! environment before `cuInit`, which is only sound with no other test running.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Read;
use std::os::fd::FromRawFd;

use tessera_e2e::SimNode;
use tessera_ffi::cuda::{CUfunction_attribute as A, CUresult};
use tessera_sim_cuda::context::{
    cuCtxCreate_v2, cuCtxDestroy_v2, cuCtxSetCurrent, cuCtxSynchronize,
};
use tessera_sim_cuda::copy::{cuMemcpyDtoH_v2, cuMemcpyHtoD_v2};
use tessera_sim_cuda::device::cuInit;
use tessera_sim_cuda::launch::cuLaunchKernel;
use tessera_sim_cuda::memop::*;
use tessera_sim_cuda::module::*;
use tessera_sim_cuda::occupancy::*;

const CUBIN: &[u8] = include_bytes!("../../sim/src/image/fixtures/kernels.sm_90.cubin");
const PTX: &[u8] = include_bytes!("../../sim/src/image/fixtures/kernels.ptx");
const OK: CUresult = CUresult::CUDA_SUCCESS;

/// `base + threads × per thread` of `TESSERA_SIM_KERNEL_TIME=1ms+1ns/thread`.
fn modelled(threads: u64) -> u64 {
    1_000_000 + threads
}

/// An uncompressed fat binary container (layout in `tessera_sim::image::fatbin`).
fn container(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, arch, payload) in entries {
        let padded = payload.len().div_ceil(8) * 8;
        let mut h = [0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
        h[28..32].copy_from_slice(&arch.to_le_bytes());
        h[40..48].copy_from_slice(&0x11u64.to_le_bytes());
        h[56..64].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(payload);
        body.resize(body.len() + padded - payload.len(), 0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// `__fatBinC_Wrapper_t`.
#[repr(C)]
struct Wrapper {
    magic: u32,
    version: u32,
    data: *const u8,
    filename_or_fatbins: *const c_void,
}

/// Bytes placed so that the last one is followed by an unmapped page: reading one byte
/// past the end faults.
struct Guarded {
    base: *mut u8,
    len: usize,
    at: *mut u8,
}

impl Guarded {
    fn new(bytes: &[u8]) -> Guarded {
        let page = 4096;
        let data_pages = bytes.len().div_ceil(page).max(1);
        let len = (data_pages + 1) * page;
        // SAFETY: a fresh anonymous mapping; the last page is made inaccessible.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        // SAFETY: the guard page is inside the mapping just made.
        let rc =
            unsafe { libc::mprotect(base.add(data_pages * page).cast(), page, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        // SAFETY: `bytes` fits in the data pages, ending exactly at the guard page.
        let at = unsafe { base.add(data_pages * page - bytes.len()) };
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
        Guarded { base, len, at }
    }

    fn ptr(&self) -> *const c_void {
        self.at.cast()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Runs `f` with this process's stderr captured; returns its result and what it wrote.
fn capture_stderr<T>(f: impl FnOnce() -> T) -> (T, String) {
    let mut fds = [0; 2];
    // SAFETY: plain fd juggling on this process's own descriptors; the test is alone.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let saved = libc::dup(2);
        libc::dup2(fds[1], 2);
        libc::close(fds[1]);
        let out = f();
        libc::dup2(saved, 2);
        libc::close(saved);
        let mut text = String::new();
        std::fs::File::from_raw_fd(fds[0])
            .read_to_string(&mut text)
            .expect("read captured stderr");
        (out, text)
    }
}

fn load(image: *const c_void) -> (CUresult, tessera_ffi::cuda::CUmodule) {
    let mut m = std::ptr::null_mut();
    // SAFETY: `m` is writable; the image is the test's own memory.
    let rc = unsafe { cuModuleLoadData(&mut m, image) };
    (rc, m)
}

fn function(
    m: tessera_ffi::cuda::CUmodule,
    name: &str,
) -> (CUresult, tessera_ffi::cuda::CUfunction) {
    let name = std::ffi::CString::new(name).expect("name");
    let mut f = std::ptr::null_mut();
    // SAFETY: valid out pointer and C string.
    let rc = unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) };
    (rc, f)
}

fn attr(f: tessera_ffi::cuda::CUfunction, a: A) -> c_int {
    let mut v = -7;
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cuFuncGetAttribute(&mut v, a, f) }, OK);
    v
}

fn launch(f: tessera_ffi::cuda::CUfunction, grid: u32, block: u32) -> CUresult {
    // SAFETY: no kernel arguments are read by the simulator; the default stream.
    unsafe {
        cuLaunchKernel(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[test]
fn real_images_load_launch_and_fail_cleanly() {
    let node = SimNode::builder().devices(1).memory("4Gi").build();
    // SAFETY: the only test of this binary: no other thread reads the environment.
    unsafe {
        std::env::set_var("TESSERA_SIM_STATE", &node.state);
        std::env::set_var("TESSERA_SIM_KERNEL_TIME", "1ms+1ns/thread");
    }
    let pid = std::process::id();
    // SAFETY: plain driver calls with valid out pointers.
    unsafe {
        assert_eq!(cuInit(0), OK);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), OK);
    }
    let busy = || node.node().process(pid).map_or(0, |p| p.busy_ns[0]);
    let memory = || node.node().process(pid).map_or(0, |p| p.memory[0]);

    // ---- NVRTC's cubin: kernels, attributes, globals with their initial values ----
    let (rc, cubin) = load(CUBIN.as_ptr().cast());
    assert_eq!(rc, OK);
    let (rc, add) = function(cubin, "tessera_add");
    assert_eq!(rc, OK);
    assert_eq!(function(cubin, "tessera_add").1, add, "one handle per name");
    assert_eq!(function(cubin, "_Z16tessera_scale_byIfEvPT_i").0, OK);
    assert_eq!(
        function(cubin, "no_such_kernel").0,
        CUresult::CUDA_ERROR_NOT_FOUND
    );
    assert_eq!(attr(add, A::CU_FUNC_ATTRIBUTE_NUM_REGS), 12);
    assert_eq!(attr(add, A::CU_FUNC_ATTRIBUTE_BINARY_VERSION), 90);
    assert_eq!(attr(add, A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
    // (const float *a, const float *b, float *c, int n): the last parameter at 24, 4 bytes.
    let (mut off, mut sz) = (0usize, 0usize);
    // SAFETY: valid out pointers.
    assert_eq!(unsafe { cuFuncGetParamInfo(add, 3, &mut off, &mut sz) }, OK);
    assert_eq!((off, sz), (24, 4));
    // SAFETY: as above.
    let rc = unsafe { cuFuncGetParamInfo(add, 4, &mut off, &mut sz) };
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    let mut count = 0;
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cuModuleGetFunctionCount(&mut count, cubin) }, OK);
    assert_eq!(count, 4);

    let before = memory();
    let (mut dptr, mut size) = (0, 0usize);
    // SAFETY: valid out pointers and C string.
    let rc =
        unsafe { cuModuleGetGlobal_v2(&mut dptr, &mut size, cubin, c"tessera_scale".as_ptr()) };
    assert_eq!((rc, size), (OK, 4));
    assert!(memory() >= before + 4, "globals are charged to the device");
    let mut value = [0u8; 4];
    // SAFETY: 4 bytes of device memory at dptr, 4 host bytes.
    let rc = unsafe { cuMemcpyDtoH_v2(value.as_mut_ptr().cast(), dptr, 4) };
    assert_eq!(rc, OK);
    assert_eq!(
        f32::from_le_bytes(value),
        2.0,
        "the global holds its initial value"
    );
    let table = {
        let (mut p, mut n) = (0, 0usize);
        // SAFETY: as above.
        let rc = unsafe { cuModuleGetGlobal_v2(&mut p, &mut n, cubin, c"tessera_table".as_ptr()) };
        assert_eq!((rc, n), (OK, 256));
        p
    };
    let ones = [1u8; 256];
    let mut back = [0u8; 256];
    // SAFETY: 256 bytes each side.
    unsafe {
        assert_eq!(cuMemcpyHtoD_v2(table, ones.as_ptr().cast(), 256), OK);
        assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), table, 256), OK);
    }
    assert_eq!(back, ones, "a program can copy to and from a global");
    // SAFETY: valid out pointers and C string.
    let rc = unsafe { cuModuleGetGlobal_v2(&mut dptr, &mut size, cubin, c"nope".as_ptr()) };
    assert_eq!(rc, CUresult::CUDA_ERROR_NOT_FOUND);

    // Occupancy from the image's register count: 256-thread blocks, 12 registers each,
    // are limited by the SM's 2048 threads.
    let mut blocks = 0;
    // SAFETY: valid out pointer.
    let rc = unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut blocks, add, 256, 0) };
    assert_eq!((rc, blocks), (OK, 8));
    let (mut grid, mut block) = (0, 0);
    // SAFETY: valid out pointers, no callback.
    let rc = unsafe { cuOccupancyMaxPotentialBlockSize(&mut grid, &mut block, add, None, 0, 0) };
    assert_eq!(rc, OK);
    assert!(block > 0 && block <= 1024 && grid > 0, "{grid} × {block}");

    // ---- launches run for the model: 1 ms + 1 ns per thread ----
    let b0 = busy();
    assert_eq!(launch(add, 4096, 256), OK);
    // SAFETY: plain call.
    assert_eq!(unsafe { cuCtxSynchronize() }, OK);
    assert_eq!(busy() - b0, modelled(4096 * 256));
    assert_eq!(launch(add, 1, 2048), CUresult::CUDA_ERROR_INVALID_VALUE);

    // Unloading frees the globals.
    // SAFETY: a live module.
    assert_eq!(unsafe { cuModuleUnload(cubin) }, OK);
    assert_eq!(memory(), before);
    assert_eq!(launch(add, 1, 1), CUresult::CUDA_ERROR_INVALID_HANDLE);

    // ---- PTX (NVRTC's, with its NUL), and a PTX file ----
    let (rc, ptx) = load(PTX.as_ptr().cast());
    assert_eq!(rc, OK);
    let (rc, fill) = function(ptx, "tessera_fill");
    assert_eq!(rc, OK);
    let b0 = busy();
    assert_eq!(launch(fill, 10, 100), OK);
    assert_eq!(busy() - b0, modelled(1000));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kernels.ptx");
    std::fs::write(&path, PTX).expect("write");
    let cpath = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("path");
    let mut from_file = std::ptr::null_mut();
    // SAFETY: valid out pointer and C string.
    assert_eq!(unsafe { cuModuleLoad(&mut from_file, cpath.as_ptr()) }, OK);
    assert_eq!(function(from_file, "tessera_add").0, OK);

    // ---- fat binaries: the container, and the runtime's wrapper around it ----
    let fatbin = container(&[(2, 80, CUBIN), (2, 90, CUBIN), (1, 90, PTX)]);
    let mut m = std::ptr::null_mut();
    // SAFETY: valid out pointer, a whole container.
    let rc = unsafe { cuModuleLoadFatBinary(&mut m, fatbin.as_ptr().cast()) };
    assert_eq!(rc, OK);
    assert_eq!(function(m, "tessera_fill").0, OK);
    let wrapper = Wrapper {
        magic: 0x466243b1,
        version: 1,
        data: fatbin.as_ptr(),
        filename_or_fatbins: std::ptr::null(),
    };
    let (rc, wrapped) = load((&raw const wrapper).cast());
    assert_eq!(rc, OK);
    assert_eq!(function(wrapped, "tessera_add").0, OK);
    assert_eq!(
        function(wrapped, "missing").0,
        CUresult::CUDA_ERROR_NOT_FOUND
    );

    // ---- a CUDA 12 library from the wrapper: kernels, its module, its globals ----
    let mut lib = std::ptr::null_mut();
    // SAFETY: valid out pointer, the wrapper above, no options.
    let rc = unsafe {
        cuLibraryLoadData(
            &mut lib,
            (&raw const wrapper).cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    assert_eq!(rc, OK);
    let mut kernel = std::ptr::null_mut();
    // SAFETY: valid out pointer and C string.
    let rc = unsafe { cuLibraryGetKernel(&mut kernel, lib, c"tessera_add".as_ptr()) };
    assert_eq!(rc, OK);
    // SAFETY: as above.
    let rc = unsafe { cuLibraryGetKernel(&mut kernel, lib, c"nope".as_ptr()) };
    assert_eq!(rc, CUresult::CUDA_ERROR_NOT_FOUND);
    // SAFETY: as above.
    let rc = unsafe { cuLibraryGetKernel(&mut kernel, lib, c"tessera_add".as_ptr()) };
    assert_eq!(rc, OK);
    let mut f = std::ptr::null_mut();
    // SAFETY: valid out pointer, a live kernel.
    assert_eq!(unsafe { cuKernelGetFunction(&mut f, kernel) }, OK);
    let mut regs = 0;
    // SAFETY: valid out pointer, a live kernel, device 0.
    let rc = unsafe { cuKernelGetAttribute(&mut regs, A::CU_FUNC_ATTRIBUTE_NUM_REGS, kernel, 0) };
    assert_eq!((rc, regs), (OK, 12));
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cuKernelGetName(&mut name, kernel) }, OK);
    // SAFETY: the driver returned a NUL-terminated name that lives with the kernel.
    assert_eq!(unsafe { CStr::from_ptr(name) }.to_str(), Ok("tessera_add"));
    let b0 = busy();
    assert_eq!(launch(f, 2, 64), OK);
    assert_eq!(busy() - b0, modelled(128));
    let mut lm = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cuLibraryGetModule(&mut lm, lib) }, OK);
    assert_eq!(function(lm, "tessera_fill").0, OK);
    let (mut g, mut n) = (0, 0usize);
    // SAFETY: valid out pointers and C string.
    let rc = unsafe { cuLibraryGetGlobal(&mut g, &mut n, lib, c"tessera_scale".as_ptr()) };
    assert_eq!((rc, n), (OK, 4));
    // SAFETY: 4 bytes each side.
    let rc = unsafe { cuMemcpyDtoH_v2(value.as_mut_ptr().cast(), g, 4) };
    assert_eq!(rc, OK);
    assert_eq!(f32::from_le_bytes(value), 2.0);

    // ---- the simulated format still works, with its explicit durations ----
    let (rc, sim) = load(c"kernel step 2ms".as_ptr().cast());
    assert_eq!(rc, OK);
    let (_, step) = function(sim, "step");
    let b0 = busy();
    assert_eq!(launch(step, 1000, 1024), OK);
    assert_eq!(busy() - b0, 2_000_000);

    // ---- cuStreamWriteValue32 (PyTorch resolves it): the value lands in device memory ----
    // SAFETY: 4 bytes of a live global; the default stream.
    unsafe {
        assert_eq!(
            cuStreamWriteValue32_v2(std::ptr::null_mut(), g, 0xfeed_beef, 0),
            OK
        );
        assert_eq!(cuMemcpyDtoH_v2(value.as_mut_ptr().cast(), g, 4), OK);
    }
    assert_eq!(u32::from_le_bytes(value), 0xfeed_beef);
    // SAFETY: an address no allocation covers.
    let rc = unsafe { cuStreamWriteValue32_v2(std::ptr::null_mut(), 8, 1, 0) };
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);

    // SAFETY: a live library.
    assert_eq!(unsafe { cuLibraryUnload(lib) }, OK);
    assert_eq!(launch(f, 1, 1), CUresult::CUDA_ERROR_INVALID_HANDLE);

    // ---- malformed images: an error code and one line, never a crash ----
    let mut garbage = vec![0x5au8; 300];
    garbage[299] = 0;
    let truncated_elf = &CUBIN[..CUBIN.len() - 100];
    let truncated_fatbin = &fatbin[..fatbin.len() / 2];
    let mut corrupt_fatbin = fatbin.clone();
    corrupt_fatbin[16 + 4..16 + 8].copy_from_slice(&8u32.to_le_bytes()); // entry header size 8
    let no_nul = b"kernel step 1ms".to_vec();
    let bad_ptx = b".version 8.0\n.visible .entry (\n\0".to_vec();
    let sm80_only = container(&[(2, 80, CUBIN)]);
    let cases: Vec<(&str, Vec<u8>, CUresult)> = vec![
        ("garbage text", garbage, CUresult::CUDA_ERROR_INVALID_IMAGE),
        (
            "truncated cubin",
            truncated_elf.to_vec(),
            CUresult::CUDA_ERROR_INVALID_IMAGE,
        ),
        (
            "truncated fat binary",
            truncated_fatbin.to_vec(),
            CUresult::CUDA_ERROR_INVALID_IMAGE,
        ),
        (
            "corrupt fat binary",
            corrupt_fatbin,
            CUresult::CUDA_ERROR_INVALID_IMAGE,
        ),
        (
            "text without NUL",
            no_nul,
            CUresult::CUDA_ERROR_INVALID_IMAGE,
        ),
        ("bad PTX", bad_ptx, CUresult::CUDA_ERROR_INVALID_PTX),
        (
            "sm_80 only",
            sm80_only,
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
        ),
    ];
    for (what, bytes, want) in cases {
        // The image ends right before an unmapped page: reading past it would fault.
        let g = Guarded::new(&bytes);
        let ((rc, _), err) = capture_stderr(|| load(g.ptr()));
        assert_eq!(rc, want, "{what}");
        assert_eq!(err.lines().count(), 1, "{what}: one log line, got {err:?}");
        assert!(err.starts_with("tessera-sim libcuda: "), "{what}: {err:?}");
    }
    // A wrapper whose data pointer leads nowhere, and a null image.
    let g = Guarded::new(&[0u8; 8]);
    let dangling = Wrapper {
        magic: 0x466243b1,
        version: 1,
        // One page past the guarded bytes: the guard page itself.
        data: g.at.wrapping_add(8),
        filename_or_fatbins: std::ptr::null(),
    };
    let ((rc, _), err) = capture_stderr(|| load((&raw const dangling).cast()));
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_IMAGE);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert_eq!(load(std::ptr::null()).0, CUresult::CUDA_ERROR_INVALID_VALUE);

    // ---- a destroyed context takes its modules' globals with it, once ----
    let before = memory();
    let mut other = std::ptr::null_mut();
    // SAFETY: valid out pointer; the new context becomes current.
    assert_eq!(unsafe { cuCtxCreate_v2(&mut other, 0, 0) }, OK);
    let (rc, m) = load(CUBIN.as_ptr().cast());
    assert_eq!(rc, OK);
    // SAFETY: valid out pointers and C string.
    let rc = unsafe { cuModuleGetGlobal_v2(&mut dptr, &mut size, m, c"tessera_table".as_ptr()) };
    assert_eq!(rc, OK);
    assert!(memory() > before);
    // SAFETY: a live context; then none is current.
    unsafe {
        assert_eq!(cuCtxDestroy_v2(other), OK);
        assert_eq!(cuCtxSetCurrent(std::ptr::null_mut()), OK);
    }
    assert_eq!(memory(), before);
    assert_eq!(
        function(m, "tessera_add").0,
        CUresult::CUDA_ERROR_INVALID_HANDLE
    );
}
