//! The HIP bodies against a fake runtime installed in the table: first in
//! an ungoverned process (everything passes through), then governed
//! (admission, frees, the view, and the runtime calling its own entry
//! points, which must be charged once).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::devices::DeviceMap;
use crate::governor::tests::leaked_files;
use crate::table::{self, Sym, exports};

const MI: usize = 1 << 20;

static NEXT: AtomicUsize = AtomicUsize::new(0x1000_0000);
static MALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn fake_malloc(ptr: *mut *mut c_void, size: usize) -> hipError_t {
    MALLOCS.fetch_add(1, Ordering::SeqCst);
    // Distinct pointers, as a runtime gives.
    let p = NEXT.fetch_add(size.max(1).next_multiple_of(4096), Ordering::SeqCst);
    // SAFETY: the caller passes a valid pointer.
    unsafe { *ptr = p as *mut c_void };
    OK
}

unsafe extern "C" fn fake_free(_: *mut c_void) -> hipError_t {
    OK
}

/// A runtime whose managed allocation goes through its own public
/// `hipMalloc` (found through the global scope: the shim's export), as
/// ROCm's internal calls do.
unsafe extern "C" fn fake_managed(ptr: *mut *mut c_void, size: usize, _: c_uint) -> hipError_t {
    // SAFETY: the caller's pointer, passed on.
    unsafe { exports::hipMalloc(ptr, size) }
}

unsafe extern "C" fn fake_meminfo(free: *mut usize, total: *mut usize) -> hipError_t {
    // SAFETY: the caller passes valid pointers.
    unsafe {
        *free = 1000 * MI;
        *total = 1024 * MI;
    }
    OK
}

#[test]
fn hip_calls_pass_through_ungoverned_and_are_admitted_once_governed() {
    table::set_entry(Sym::hipMalloc, fake_malloc as *mut c_void);
    table::set_entry(Sym::hipFree, fake_free as *mut c_void);
    table::set_entry(Sym::hipMallocManaged, fake_managed as *mut c_void);
    table::set_entry(Sym::hipMemGetInfo, fake_meminfo as *mut c_void);
    let mut p = std::ptr::null_mut();
    let mut q = std::ptr::null_mut();

    // Ungoverned: the runtime's answer, untouched, even past any limit.
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(exports::hipMalloc(&mut p, 100 * MI), OK);
        let (mut f, mut t) = (0, 0);
        assert_eq!(exports::hipMemGetInfo(&mut f, &mut t), OK);
        assert_eq!((f, t), (1000 * MI, 1024 * MI));
    }

    // Governed by a 64 MiB allocation on one device.
    let files = leaked_files(&[64 << 20]);
    let devices = DeviceMap::new(vec![(0, files.control.uuid(0).to_owned())], |u| {
        files.find_uuid(u)
    });
    let g = install_for_test(Governed::new(files, devices, Hooks::NONE));
    let slot = g.member().unwrap().slot;
    let usage = || files.state.slot_usage(slot, 0);

    // SAFETY: valid out-pointers; the fakes read nothing else.
    unsafe {
        // 3 MiB and one byte is held as whole 4 KiB pages.
        let first = 3 * MI as u64 + HIP_PAGE;
        assert_eq!(exports::hipMalloc(&mut p, 3 * MI + 1), OK);
        assert_eq!(usage(), first);
        // The view: the limit, less what the allocation holds.
        let (mut f, mut t) = (0, 0);
        assert_eq!(exports::hipMemGetInfo(&mut f, &mut t), OK);
        assert_eq!((t as u64, f as u64), (64 << 20, (64 << 20) - first));

        // Past the limit: refused before the runtime is asked.
        let before = MALLOCS.load(Ordering::SeqCst);
        assert_eq!(exports::hipMalloc(&mut q, 61 * MI), hipErrorOutOfMemory);
        assert_eq!(MALLOCS.load(Ordering::SeqCst), before);
        assert_eq!(usage(), first);

        // The runtime's own hipMalloc inside hipMallocManaged is not
        // charged a second time.
        assert_eq!(exports::hipMallocManaged(&mut q, 10 * MI, 1), OK);
        assert_eq!(usage(), first + (10 << 20));
        assert_eq!(g.ledger.held(0).1, 2, "two allocations recorded");

        // Frees return exactly what was charged.
        assert_eq!(exports::hipFree(q), OK);
        assert_eq!(exports::hipFree(p), OK);
        assert_eq!(usage(), 0);
        // Exactly the limit fits.
        assert_eq!(exports::hipMalloc(&mut p, 64 * MI), OK);
        assert_eq!(exports::hipMalloc(&mut q, 1), hipErrorOutOfMemory);
        assert_eq!(exports::hipFree(p), OK);
    }
}

#[test]
fn calls_inside_the_runtime_are_marked_and_the_mark_is_undone() {
    assert!(!inside());
    let seen = nested(|| (inside(), nested(inside)));
    assert_eq!(seen, (true, true));
    assert!(!inside(), "the mark is per call, undone on return");
    // Another thread is never marked by this one.
    nested(|| {
        let other = std::thread::spawn(inside).join().unwrap();
        assert!(!other);
    });
}

#[test]
fn proc_address_hands_out_wrappers_for_governed_names_only() {
    let fake = 0x1234 as *mut c_void;
    assert_eq!(procaddr::substitute(c"hipMemcpy", fake), fake);
    assert_eq!(
        procaddr::substitute(c"hipMalloc", fake),
        Sym::hipMalloc.wrapper()
    );
    // The runtime's own entry point maps to the wrapper of that symbol.
    table::set_entry(Sym::hipArrayDestroy, 0x5678 as *mut c_void);
    assert_eq!(
        procaddr::substitute(c"hipArrayDestroy", 0x5678 as *mut c_void),
        Sym::hipArrayDestroy.wrapper()
    );
    assert!(procaddr::substitute(c"hipMalloc", std::ptr::null_mut()).is_null());
    // CUDA names are not HIP's to hand out here.
    assert_eq!(procaddr::substitute(c"cuMemAlloc_v2", fake), fake);
}

#[test]
fn hip_uuids_are_matched_in_the_forms_runtimes_give_them() {
    let files = leaked_files(&[1 << 20]);
    // The control file's first UUID, as the test files write it.
    let control = files.control.uuid(0).to_owned();
    let mut raw = [0u8; 16];
    let hex: String = control[4..].chars().filter(|c| *c != '-').collect();
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    // Raw bytes, formatted as CUDA's are.
    assert!(same(&uuid_string(&raw, files), &control));
    // ROCm's form: the ASCII hex digits of a unique id the control file
    // names as `GPU-<id>` (how the manager names an AMD GPU).
    let ascii: [u8; 16] = *b"00000000deadbeef";
    let amd = leaked_amd_files("GPU-00000000deadbeef");
    assert_eq!(uuid_string(&ascii, amd), "GPU-00000000deadbeef");
    // Raw bytes whose first eight make the unique id.
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&0xdead_beef_u64.to_be_bytes());
    assert_eq!(uuid_string(&bytes, amd), "GPU-00000000deadbeef");
    // A device the allocation does not name stays outside it.
    assert_eq!(amd.find_uuid(&uuid_string(&[7; 16], amd)), None);
}

fn same(a: &str, b: &str) -> bool {
    crate::devices::same_uuid(a, b)
}

/// Allocation files naming one GPU by `uuid`.
fn leaked_amd_files(uuid: &str) -> &'static Files {
    use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let spec = ControlSpec::new(
        "hip-uuid",
        vec![DeviceSpec {
            uuid: uuid.into(),
            memory_limit_bytes: 1 << 20,
            compute_share_ppm: 1_000_000,
            policy: Policy::Burst,
        }],
    );
    let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
    Box::leak(Box::new(
        Files::open(&crate::config::AllocFiles {
            control: c,
            state: s,
        })
        .unwrap(),
    ))
}
