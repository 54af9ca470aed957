//! The built `libamdhip64.so.5` through its C ABI, on a mixed simulated node (one NVIDIA
//! and two AMD devices): the symbol versions CuPy-ROCm needs and ROCm 5.2.3 gives, what HIP shows of the
//! devices, every memory family's charge in the node's ground truth, hiprtc to a launch,
//! and `hipGetProcAddress`.
//!
//! The library keeps one runtime per process, set up at its first call from the
//! environment, so this file holds one test (one process) that sets the environment
//! before loading it.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::Path;

use tessera_sim::{GpuSpec, Node, NodeConfig};

type Err = c_int;
const OOM: Err = 2;
const MI: u64 = 1 << 20;

/// The built library, opened with `RTLD_NOW` (every reference resolved, as Python does).
struct Lib(*mut c_void);

impl Lib {
    fn open(path: &Path) -> Lib {
        let c = CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
        // SAFETY: a C string path; the library's constructors are Rust's (none that run
        // code of ours before main).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        Lib(h)
    }

    /// The address of `name` (default version).
    fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: a handle from dlopen and a C string.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "{name} is not exported");
        p
    }

    /// The address of `name` at exactly `version`, if defined.
    fn vsym(&self, name: &str, version: &str) -> *mut c_void {
        let (n, v) = (CString::new(name).unwrap(), CString::new(version).unwrap());
        // SAFETY: a handle from dlopen and two C strings.
        unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) }
    }
}

/// Calls an export by name with the given C signature.
macro_rules! call {
    ($lib:expr, $name:expr, fn($($t:ty),* $(,)?) -> $r:ty, $($a:expr),* $(,)?) => {{
        let p = $lib.sym($name);
        // SAFETY: the export has this C signature (hip_runtime_api.h / hiprtc.h), and
        // every pointer argument passed is valid for what the call does with it.
        let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
        // SAFETY: as above.
        unsafe { f($($a),*) }
    }};
}

/// Launches kernel `f` as 1024 blocks of 256 threads on the null stream through a module
/// launch export: `hipModuleLaunchKernel`'s first parameters (function, grid, block,
/// shared bytes, stream, kernel parameters), then the export's own, typed and given.
macro_rules! module_launch {
    ($lib:expr, $name:expr, $f:expr $(, $t:ty = $a:expr)* $(,)?) => {
        call!(
            $lib,
            $name,
            fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, $($t),*) -> Err,
            $f, 1024, 1, 1, 256, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), $($a),*
        )
    };
}

#[test]
fn a_mixed_node_through_the_hip_abi() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("node");
    // Created here (no context memory: the bytes below are exactly what each call holds).
    let config = NodeConfig {
        devices: 3,
        memory_per_device: 1 << 30,
        seed: 0x41d,
        gpus: vec![
            GpuSpec::nvidia(),
            GpuSpec::amd(None),
            GpuSpec::amd(Some("AMD Instinct MI300X")),
        ],
        ..NodeConfig::default()
    };
    let node = Node::open(&state, &config).expect("node");
    // SAFETY: this file's only test, before the library (the only reader) is loaded and
    // before any other thread of this process reads the environment.
    unsafe {
        std::env::set_var("TESSERA_SIM_STATE", &state);
        std::env::remove_var("HIP_VISIBLE_DEVICES");
    }
    let path = tessera_sim::libs::find_built_library("libtessera_sim_hip.so")
        .expect("the cdylib is built with the tests");
    let hip = Lib::open(&path);

    // Every libamdhip64.so.5 reference of CuPy-ROCm 13.3, at its version.
    let list = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("cupy-rocm-symbols.txt"),
    )
    .expect("symbol list");
    let mut checked = 0;
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, version) = line.split_once('@').expect("name@version");
        assert!(
            !hip.vsym(name, version).is_null(),
            "{name}@{version} missing"
        );
        checked += 1;
    }
    assert!(checked >= 75, "{checked} symbols listed");
    assert!(
        hip.vsym("hipMalloc", "hip_4.3").is_null(),
        "one version per symbol"
    );
    // Every function it shares with ROCm 5.2.3's own library carries that one's version
    // (hipMemCreate is hip_5.1 there), so a client built against 5.2 binds too.
    let real = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rocm-5.2.3-exports.txt"),
    )
    .expect("ROCm's export list");
    let mut shared = 0;
    for line in real
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, version) = line.split_once('@').expect("name@version");
        let c = CString::new(name).unwrap();
        // SAFETY: a handle from dlopen and a C string.
        if unsafe { libc::dlsym(hip.0, c.as_ptr()) }.is_null() {
            continue; // a function the simulator does not have
        }
        assert!(
            !hip.vsym(name, version).is_null(),
            "{name} is not at {version}"
        );
        shared += 1;
    }
    assert!(shared >= 100, "{shared} functions shared with ROCm 5.2.3");
    assert!(!hip.vsym("hipMemCreate", "hip_5.1").is_null());

    // HIP numbers only the AMD devices: ordinal 1 is physical device 2.
    let mut n: c_int = 0;
    assert_eq!(
        call!(hip, "hipGetDeviceCount", fn(*mut c_int) -> Err, &mut n),
        0
    );
    assert_eq!(n, 2);
    let mut prop = vec![0u8; 792];
    assert_eq!(
        call!(
            hip,
            "hipGetDeviceProperties",
            fn(*mut u8, c_int) -> Err,
            prop.as_mut_ptr(),
            1
        ),
        0
    );
    let cstr = |b: &[u8]| {
        CStr::from_bytes_until_nul(b)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(cstr(&prop[..256]), "AMD Instinct MI300X");
    assert_eq!(cstr(&prop[396..652]), "gfx942:sramecc+:xnack-");
    assert_eq!(
        u64::from_ne_bytes(prop[256..264].try_into().unwrap()),
        1 << 30
    );
    assert_eq!(i32::from_ne_bytes(prop[328..332].try_into().unwrap()), 9);
    assert_eq!(i32::from_ne_bytes(prop[332..336].try_into().unwrap()), 4);
    assert_eq!(i32::from_ne_bytes(prop[336..340].try_into().unwrap()), 304);
    let mut total = 0usize;
    assert_eq!(
        call!(
            hip,
            "hipDeviceTotalMem",
            fn(*mut usize, c_int) -> Err,
            &mut total,
            0
        ),
        0
    );
    assert_eq!(total, 1 << 30);
    assert_eq!(
        call!(hip, "hipSetDevice", fn(c_int) -> Err, 2),
        101,
        "no third AMD device"
    );

    // Memory on ordinal 0 (physical 1), counted in the ground truth.
    let pid = std::process::id();
    let held = || node.process(pid).map_or(0, |p| p.memory[1]);
    let mut p: *mut c_void = std::ptr::null_mut();
    let malloc = |p: *mut *mut c_void, n: usize| {
        call!(hip, "hipMalloc", fn(*mut *mut c_void, usize) -> Err, p, n)
    };
    assert_eq!(malloc(&mut p, 1), 0);
    assert_eq!(held(), 4096, "one byte holds a 4 KiB page");
    assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, p), 0);
    assert_eq!(held(), 0);
    // Zero bytes: success, a null pointer, nothing held (HIP's rule).
    p = 8 as *mut c_void;
    assert_eq!(malloc(&mut p, 0), 0);
    assert_eq!((p, held()), (std::ptr::null_mut(), 0));

    // Too large fails cleanly; a smaller one fits afterwards.
    let mut big: *mut c_void = std::ptr::null_mut();
    assert_eq!(malloc(&mut big, (1 << 30) + 1), OOM);
    assert_eq!(held(), 0, "a refused allocation holds nothing");
    assert_eq!(malloc(&mut big, 512 << 20), 0);
    let (mut free, mut tot) = (0usize, 0usize);
    assert_eq!(
        call!(
            hip,
            "hipMemGetInfo",
            fn(*mut usize, *mut usize) -> Err,
            &mut free,
            &mut tot
        ),
        0
    );
    assert_eq!((free, tot), (512 << 20, 1 << 30));
    // Device pointers are real memory: a copy round-trips.
    let src = [7u8; 64];
    let mut back = [0u8; 64];
    assert_eq!(
        call!(
            hip,
            "hipMemcpy",
            fn(*mut c_void, *const c_void, usize, c_int) -> Err,
            big,
            src.as_ptr().cast(),
            64,
            1
        ),
        0
    );
    assert_eq!(
        call!(
            hip,
            "hipMemcpy",
            fn(*mut c_void, *const c_void, usize, c_int) -> Err,
            back.as_mut_ptr().cast(),
            big,
            64,
            2
        ),
        0
    );
    assert_eq!(back, src);
    assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, big), 0);

    // The other families, each charged and given back.
    let mut a: *mut c_void = std::ptr::null_mut();
    for family in ["hipExtMallocWithFlags", "hipMallocManaged"] {
        assert_eq!(
            call!(
                hip,
                family,
                fn(*mut *mut c_void, usize, c_uint) -> Err,
                &mut a,
                MI as usize,
                1
            ),
            0,
            "{family}"
        );
        assert_eq!(held(), MI, "{family}");
        assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, a), 0);
    }
    let mut pitch = 0usize;
    assert_eq!(
        call!(
            hip,
            "hipMallocPitch",
            fn(*mut *mut c_void, *mut usize, usize, usize) -> Err,
            &mut a,
            &mut pitch,
            100,
            20
        ),
        0
    );
    assert_eq!(
        (pitch, held()),
        (256, 8192),
        "20 rows of 256 bytes, two pages"
    );
    assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, a), 0);
    #[repr(C)]
    struct Pitched(*mut c_void, usize, usize, usize);
    #[repr(C)]
    struct Extent(usize, usize, usize);
    let mut pp = Pitched(std::ptr::null_mut(), 0, 0, 0);
    assert_eq!(
        call!(
            hip,
            "hipMalloc3D",
            fn(*mut Pitched, Extent) -> Err,
            &mut pp,
            Extent(1000, 4, 256)
        ),
        0
    );
    assert_eq!((pp.1, held()), (1024, MI), "1024-byte rows x 4 x 256");
    assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, pp.0), 0);
    let float_desc: [c_int; 5] = [32, 0, 0, 0, 2];
    assert_eq!(
        call!(
            hip,
            "hipMallocArray",
            fn(*mut *mut c_void, *const c_int, usize, usize, c_uint) -> Err,
            &mut a,
            float_desc.as_ptr(),
            512,
            512,
            0
        ),
        0
    );
    assert_eq!(held(), MI, "512 x 512 floats");
    assert_eq!(
        call!(hip, "hipFree", fn(*mut c_void) -> Err, a),
        17,
        "hipErrorInvalidDevicePointer: an array is not hipFree's"
    );
    assert_eq!(call!(hip, "hipFreeArray", fn(*mut c_void) -> Err, a), 0);
    // The driver-style arrays: 256 x 256 float4 (HIP_AD_FORMAT_FLOAT = 0x20), then 3D.
    #[repr(C)]
    struct Desc2(usize, usize, c_int, c_uint);
    #[repr(C)]
    struct Desc3(usize, usize, usize, c_int, c_uint, c_uint);
    let d2 = Desc2(256, 256, 0x20, 4);
    let array_create = |a: *mut *mut c_void, d: *const Desc2| {
        call!(
            hip,
            "hipArrayCreate",
            fn(*mut *mut c_void, *const Desc2) -> Err,
            a,
            d
        )
    };
    assert_eq!(array_create(&mut a, &d2), 0);
    assert_eq!(held(), MI);
    assert_eq!(call!(hip, "hipArrayDestroy", fn(*mut c_void) -> Err, a), 0);
    let bad = Desc2(256, 256, 0x77, 4);
    assert_eq!(array_create(&mut a, &bad), 1);
    let d3 = Desc3(64, 64, 64, 0x01, 4, 0);
    assert_eq!(
        call!(
            hip,
            "hipArray3DCreate",
            fn(*mut *mut c_void, *const Desc3) -> Err,
            &mut a,
            &d3
        ),
        0
    );
    assert_eq!(held(), MI, "64^3 uchar4");
    assert_eq!(call!(hip, "hipArrayDestroy", fn(*mut c_void) -> Err, a), 0);
    assert_eq!(
        call!(
            hip,
            "hipMalloc3DArray",
            fn(*mut *mut c_void, *const c_int, Extent, c_uint) -> Err,
            &mut a,
            float_desc.as_ptr(),
            Extent(64, 64, 64),
            0
        ),
        0
    );
    assert_eq!(held(), MI, "64^3 floats");
    assert_eq!(call!(hip, "hipFreeArray", fn(*mut c_void) -> Err, a), 0);
    assert_eq!(
        call!(
            hip,
            "hipMemAllocPitch",
            fn(*mut *mut c_void, *mut usize, usize, usize, c_uint) -> Err,
            &mut a,
            &mut pitch,
            300,
            10,
            4
        ),
        0
    );
    assert_eq!((pitch, held()), (512, 8192), "10 rows of 512 bytes");
    assert_eq!(call!(hip, "hipFree", fn(*mut c_void) -> Err, a), 0);
    assert_eq!(held(), 0);
    // The device's UUID is the node's.
    let mut uuid = [0u8; 16];
    assert_eq!(
        call!(
            hip,
            "hipDeviceGetUuid",
            fn(*mut [u8; 16], c_int) -> Err,
            &mut uuid,
            0
        ),
        0
    );
    assert_eq!(uuid, node.device_info(1).expect("device").uuid_bytes);
    assert_eq!(held(), 0);
    assert_eq!(
        call!(
            hip,
            "hipMallocAsync",
            fn(*mut *mut c_void, usize, *mut c_void) -> Err,
            &mut a,
            MI as usize,
            std::ptr::null_mut()
        ),
        0
    );
    assert_eq!(held(), MI);
    let free_async = |a: *mut c_void, s: *mut c_void| {
        call!(
            hip,
            "hipFreeAsync",
            fn(*mut c_void, *mut c_void) -> Err,
            a,
            s
        )
    };
    assert_eq!(free_async(a, std::ptr::null_mut()), 0);
    let mut pool: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        call!(
            hip,
            "hipDeviceGetDefaultMemPool",
            fn(*mut *mut c_void, c_int) -> Err,
            &mut pool,
            0
        ),
        0
    );
    assert_eq!(
        call!(
            hip,
            "hipMallocFromPoolAsync",
            fn(*mut *mut c_void, usize, *mut c_void, *mut c_void) -> Err,
            &mut a,
            3 * MI as usize,
            pool,
            std::ptr::null_mut()
        ),
        0
    );
    assert_eq!(held(), 3 * MI);
    assert_eq!(free_async(a, std::ptr::null_mut()), 0);
    // The pool keeps what was freed (release threshold 0) until the next
    // synchronisation.
    assert_eq!(held(), 3 * MI);
    assert_eq!(
        call!(
            hip,
            "hipStreamSynchronize",
            fn(*mut c_void) -> Err,
            std::ptr::null_mut()
        ),
        0
    );
    assert_eq!(held(), 0);

    // Virtual memory: charged at hipMemCreate, given back once released and unmapped.
    // hipMemAllocationProp: the location's id (the device ordinal) is at byte 8.
    let mut prop = [0u8; 32];
    prop[4..8].copy_from_slice(&1i32.to_ne_bytes()); // hipMemLocationTypeDevice
    prop[8..12].copy_from_slice(&0i32.to_ne_bytes());
    let mut gran = 0usize;
    assert_eq!(
        call!(
            hip,
            "hipMemGetAllocationGranularity",
            fn(*mut usize, *const u8, c_int) -> Err,
            &mut gran,
            prop.as_ptr(),
            0
        ),
        0
    );
    assert_eq!(gran, 2 << 20);
    let mut h: *mut c_void = std::ptr::null_mut();
    let mem_create = |h: *mut *mut c_void, n: usize, prop: *const u8, flags: u64| {
        call!(
            hip,
            "hipMemCreate",
            fn(*mut *mut c_void, usize, *const u8, u64) -> Err,
            h,
            n,
            prop,
            flags
        )
    };
    assert_eq!(
        mem_create(&mut h, MI as usize, prop.as_ptr(), 0),
        1,
        "not a multiple of the granularity"
    );
    assert_eq!(mem_create(&mut h, gran, prop.as_ptr(), 0), 0);
    assert_eq!(held(), 2 * MI);
    let mut va: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        call!(
            hip,
            "hipMemAddressReserve",
            fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> Err,
            &mut va,
            gran,
            0,
            std::ptr::null_mut(),
            0
        ),
        0
    );
    assert_eq!(
        call!(
            hip,
            "hipMemMap",
            fn(*mut c_void, usize, usize, *mut c_void, u64) -> Err,
            va,
            gran,
            0,
            h,
            0
        ),
        0
    );
    assert_eq!(call!(hip, "hipMemRelease", fn(*mut c_void) -> Err, h), 0);
    assert_eq!(held(), 2 * MI, "still mapped");
    // SAFETY: `va` is mapped readable and writable for `gran` bytes.
    unsafe { va.cast::<u8>().write(1) };
    assert_eq!(
        call!(hip, "hipMemUnmap", fn(*mut c_void, usize) -> Err, va, gran),
        0
    );
    assert_eq!(held(), 0, "released and unmapped");
    assert_eq!(
        call!(
            hip,
            "hipMemAddressFree",
            fn(*mut c_void, usize) -> Err,
            va,
            gran
        ),
        0
    );

    // hiprtc to a launch: the kernel is found, loaded and occupies the device.
    let src =
        CString::new(r#"extern "C" __global__ void add_one(float* x) { x[0] += 1; }"#).unwrap();
    let mut prog: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        call!(
            hip,
            "hiprtcCreateProgram",
            fn(
                *mut *mut c_void,
                *const c_char,
                *const c_char,
                c_int,
                *const c_void,
                *const c_void,
            ) -> c_int,
            &mut prog,
            src.as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            std::ptr::null()
        ),
        0
    );
    assert_eq!(
        call!(
            hip,
            "hiprtcCompileProgram",
            fn(*mut c_void, c_int, *const c_void) -> c_int,
            prog,
            0,
            std::ptr::null()
        ),
        0
    );
    let mut size = 0usize;
    assert_eq!(
        call!(
            hip,
            "hiprtcGetCodeSize",
            fn(*mut c_void, *mut usize) -> c_int,
            prog,
            &mut size
        ),
        0
    );
    let mut code = vec![0u8; size];
    assert_eq!(
        call!(
            hip,
            "hiprtcGetCode",
            fn(*mut c_void, *mut u8) -> c_int,
            prog,
            code.as_mut_ptr()
        ),
        0
    );
    let mut module: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        call!(
            hip,
            "hipModuleLoadData",
            fn(*mut *mut c_void, *const u8) -> Err,
            &mut module,
            code.as_ptr()
        ),
        0
    );
    let mut f: *mut c_void = std::ptr::null_mut();
    let get_function = |f: *mut *mut c_void, m: *mut c_void, name: *const c_char| {
        call!(
            hip,
            "hipModuleGetFunction",
            fn(*mut *mut c_void, *mut c_void, *const c_char) -> Err,
            f,
            m,
            name
        )
    };
    assert_eq!(get_function(&mut f, module, c"missing".as_ptr()), 500);
    assert_eq!(get_function(&mut f, module, c"add_one".as_ptr()), 0);
    let before = node.device_usage(1).expect("device").launches;
    for _ in 0..3 {
        assert_eq!(
            module_launch!(hip, "hipModuleLaunchKernel", f, *mut *mut c_void = std::ptr::null_mut()),
            0
        );
    }
    // The other module launches: work-item sizes (1024 x 256 threads again), cooperative.
    let null = std::ptr::null_mut::<c_void>();
    let nulls = std::ptr::null_mut::<*mut c_void>();
    assert_eq!(
        call!(
            hip,
            "hipHccModuleLaunchKernel",
            fn(
                *mut c_void,
                u32,
                u32,
                u32,
                u32,
                u32,
                u32,
                usize,
                *mut c_void,
                *mut *mut c_void,
                *mut *mut c_void,
                *mut c_void,
                *mut c_void,
            ) -> Err,
            f,
            262_144,
            1,
            1,
            256,
            1,
            1,
            0,
            null,
            nulls,
            nulls,
            null,
            null
        ),
        0
    );
    assert_eq!(
        module_launch!(hip, "hipModuleLaunchCooperativeKernel", f),
        0
    );
    assert_eq!(call!(hip, "hipDeviceSynchronize", fn() -> Err,), 0);
    let usage = node.process(pid).expect("listed");
    assert_eq!(node.device_usage(1).expect("device").launches - before, 5);
    assert_eq!(
        usage.launches[1], 5,
        "on physical device 1, by this process"
    );
    // 2 µs + 5 ps x 262,144 threads each: about 3.3 µs, five of them.
    assert!(
        usage.busy_ns[1] >= 5 * 3_000,
        "busy {} ns",
        usage.busy_ns[1]
    );
    assert_eq!(usage.launches[2], 0);

    // hipGetProcAddress hands out the exported function itself.
    let mut got: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    assert_eq!(
        call!(
            hip,
            "hipGetProcAddress",
            fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> Err,
            c"hipMalloc".as_ptr(),
            &mut got,
            60000000,
            0,
            &mut status
        ),
        0
    );
    assert_eq!((got, status), (hip.sym("hipMalloc"), 0));
    assert_eq!(
        call!(
            hip,
            "hipGetProcAddress",
            fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> Err,
            c"hipNoSuchThing".as_ptr(),
            &mut got,
            60000000,
            0,
            &mut status
        ),
        500
    );
    assert_eq!((got, status), (std::ptr::null_mut(), 1));

    // A forked child is not the process the node's slot is for: every call fails there.
    let malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Err =
        // SAFETY: hipMalloc's C signature.
        unsafe { std::mem::transmute(hip.sym("hipMalloc")) };
    // SAFETY: the child only calls the library (an atomic load and an early return) and
    // _exit, and touches nothing the parent's other threads may hold.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut q: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out pointer; then leave without running the test harness's
        // exit handlers.
        unsafe { libc::_exit(malloc(&mut q, 4096)) };
    }
    let mut wstatus = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut wstatus, 0) }, child);
    assert!(libc::WIFEXITED(wstatus));
    assert_eq!(
        libc::WEXITSTATUS(wstatus),
        3,
        "hipErrorNotInitialized in the child"
    );
    assert_eq!(held(), 0, "the child charged nothing to the parent's slot");
}
