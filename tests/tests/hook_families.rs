//! One test per allocation family: through each of the three client
//! styles, an allocation is charged exactly what the simulated device holds
//! for it (its bytes in whole 2 MiB pages), its free returns the quota, and beyond the limit the family is
//! refused with nothing reaching the device.

mod hook_support;

use std::time::Duration;

use hook_support::*;
use tessera_e2e::{Mode, sim_lib_dir};

const LIMIT: u64 = 64 * MI;
const T: Duration = Duration::from_secs(20);

/// Allocates `bytes` of `kind` in a governed probe and checks the state
/// file, the probe's own view and the device's ground truth at each step.
fn family(kind: &str, bytes: u64) {
    for mode in Mode::ALL {
        let sim = Sim::new(1, 4 * LIMIT);
        sim.allocate(LIMIT);
        let mut p = sim.spawn(mode, true);
        let ctx = |l: &Line| format!("{kind} {mode:?}: {}", l.raw);
        for c in ["init", "ctx"] {
            let l = p.cmd(c, T);
            assert!(l.ok, "{}", ctx(&l));
        }
        let base = sim.used(0);

        let l = p.cmd(&format!("alloc {bytes} {kind}"), T);
        assert!(l.ok, "{}", ctx(&l));
        let got = pages(l.u64("bytes"));
        assert!(got >= bytes, "{}", ctx(&l));
        assert_eq!(sim.state().reserved(0), got, "charged: {}", ctx(&l));
        assert_eq!(sim.used(0) - base, got, "the device holds it: {}", ctx(&l));
        let m = p.cmd("meminfo", T);
        assert_eq!(m.u64("free"), LIMIT - got, "{}", ctx(&m));
        assert_eq!(m.u64("total"), LIMIT, "{}", ctx(&m));

        let l = p.cmd("free 0", T);
        assert!(l.ok, "{}", ctx(&l));
        assert_eq!(sim.state().reserved(0), 0, "returned: {}", ctx(&l));
        assert_eq!(sim.used(0), base, "{}", ctx(&l));

        let l = p.cmd(&format!("alloc {} {kind}", LIMIT + 1), T);
        assert_eq!(
            l.error.as_deref(),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{}",
            ctx(&l)
        );
        assert_eq!(sim.used(0), base, "nothing reached the device: {}", ctx(&l));
        assert_eq!(sim.state().reserved(0), 0);
        assert_eq!(sim.state().oom_refused(0), 1);

        // The whole limit still fits.
        let l = p.cmd(&format!("alloc {LIMIT} {kind}"), T);
        assert!(l.ok, "{}", ctx(&l));
        assert_eq!(sim.state().reserved(0), LIMIT);
        let l = p.cmd("free 1", T);
        assert!(l.ok, "{}", ctx(&l));
        assert!(p.finish().success());
        sim.state().audit().unwrap();
        assert_eq!(sim.state().reserved(0), 0);
    }
}

#[test]
fn plain() {
    family("plain", 3 * MI + 12345);
}

#[test]
fn pitch() {
    // The probe asks for 512-byte rows; the charge is the real pitch × rows.
    family("pitch", 3 * MI + 12345);
}

#[test]
fn managed() {
    family("managed", 3 * MI + 12345);
}

#[test]
fn async_from_the_default_pool() {
    family("async", 3 * MI + 12345);
}

#[test]
fn pool() {
    family("pool", 3 * MI + 12345);
}

#[test]
fn vmm() {
    // Rounded up to the 2 MiB granularity by the probe.
    family("vmm", 3 * MI + 12345);
}

#[test]
fn array() {
    family("array", 3 * MI + 12345);
}

#[test]
fn array3d() {
    family("array3d", 3 * MI + 12345);
}

#[test]
fn mipmapped() {
    family("mipmapped", 3 * MI + 12345);
}

#[test]
fn host_memory_is_not_device_memory() {
    let sim = Sim::new(1, 4 * LIMIT);
    sim.allocate(LIMIT);
    let o = sim.run(
        Mode::Link,
        true,
        &[
            "init",
            "ctx",
            &format!("alloc {} host", 2 * LIMIT),
            "meminfo",
        ],
    );
    o.expect_ok();
    assert_eq!(o.get("meminfo").u64("free"), LIMIT);
}

const VMM: &str = r#"
#include <stdio.h>
#include <string.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr, Handle;
typedef void *CUcontext;
typedef struct { int type; int id; } Loc;
typedef struct {
    int type, handleTypes;
    Loc location;
    void *win32;
    unsigned char flags[8];
} Prop;
typedef struct { Loc location; int flags; } Access;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemCreate(Handle *, size_t, const Prop *, unsigned long long);
CUresult cuMemRelease(Handle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, Handle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const Access *, size_t);
#define SZ ((size_t)40 << 20)
int main(void) {
    CUcontext c;
    Handle h, h2;
    CUdeviceptr va;
    Prop p;
    memset(&p, 0, sizeof p);
    p.type = 1;
    p.location.type = 1;
    Access a = {{1, 0}, 3};
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 3;
    /* Create, map, and release the handle at once: the mapping keeps the
       memory, as with the real driver. */
    printf("create %d\n", cuMemCreate(&h, SZ, &p, 0));
    printf("reserve %d\n", cuMemAddressReserve(&va, SZ, 0, 0, 0));
    printf("map %d\n", cuMemMap(va, SZ, 0, h, 0));
    printf("access %d\n", cuMemSetAccess(va, SZ, &a, 1));
    printf("release %d\n", cuMemRelease(h));
    printf("create-while-mapped %d\n", cuMemCreate(&h2, SZ, &p, 0));
    printf("unmap %d\n", cuMemUnmap(va, SZ));
    printf("create-after-unmap %d\n", cuMemCreate(&h2, SZ, &p, 0));
    printf("release %d\n", cuMemRelease(h2));
    return 0;
}
"#;

#[test]
fn vmm_memory_released_while_mapped_counts_until_unmapped() {
    let sim = Sim::new(1, 4 * LIMIT);
    sim.allocate(LIMIT);
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("vmm");
    let lib = format!("-L{}", sim_lib_dir().dir.display());
    cc(VMM, &exe, &[&lib, "-lcuda"]);
    let o = sim.command(&exe, true).output().unwrap();
    assert_eq!(
        stdout(&o),
        "create 0\nreserve 0\nmap 0\naccess 0\nrelease 0\n\
         create-while-mapped 2\nunmap 0\ncreate-after-unmap 0\nrelease 0\n",
        "{}",
        stderr(&o)
    );
    let state = sim.state();
    assert_eq!(state.reserved(0), 0);
    assert!(state.processes(1).is_empty(), "it held nothing at exit");
}
