//! Unit tests of the governor: quota, admission, and the pool and
//! graph-memory accounting against a fake driver.

use std::collections::HashMap;

use parking_lot::Mutex;
use tessera_ffi::cuda::{CUdevice, CUresult};
use tessera_shm::{ControlSpec, DeviceSpec, Member, Policy, create_allocation_files};

use super::files::Files;
use super::governed::{Governed, Hooks, PoolDriver};
use super::join::{pack, unpack};
use crate::config::AllocFiles;
use crate::devices::DeviceMap;
use crate::ledger::growth;

pub(crate) fn leaked_files(limits: &[u64]) -> &'static Files {
    leaked_files_with_share(limits, 1_000_000)
}

/// [`leaked_files`] with each device's compute share `share_ppm`: below a
/// whole GPU the arbiter grants the device, and until it does the grant
/// word is 0 (revoked), not open.
pub(crate) fn leaked_files_with_share(limits: &[u64], share_ppm: u32) -> &'static Files {
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let spec = ControlSpec::new(
        "test-alloc",
        limits
            .iter()
            .enumerate()
            .map(|(i, &l)| DeviceSpec {
                uuid: format!("GPU-0000000{i}-0000-0000-0000-000000000000"),
                memory_limit_bytes: l,
                compute_share_ppm: share_ppm,
                policy: Policy::Burst,
            })
            .collect(),
    );
    let (c, s) = create_allocation_files(dir.path(), &spec).unwrap();
    Box::leak(Box::new(
        Files::open(&AllocFiles {
            control: c,
            state: s,
        })
        .unwrap(),
    ))
}

fn governed(limits: &[u64], hooks: Hooks) -> Governed {
    let files = leaked_files(limits);
    let devices = DeviceMap::new(
        (0..limits.len())
            .map(|i| (i as i32, files.control.uuid(i).to_owned()))
            .collect(),
        |u| files.find_uuid(u),
    );
    let g = Governed::new(files, devices, hooks);
    g.ensure_member().unwrap();
    g
}

#[test]
fn reservations_stop_exactly_at_the_limit_and_release_returns_quota() {
    let g = governed(&[1000, 10], Hooks::NONE);
    assert_eq!(g.reserve(Some(0), 600), Ok(()));
    assert_eq!(g.reserve(Some(0), 400), Ok(()));
    assert_eq!(
        g.reserve(Some(0), 1),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(g.files.state.reserved(0), 1000);
    g.release(Some(0), 400);
    assert_eq!(g.files.state.reserved(0), 600);
    assert_eq!(
        g.reserve(Some(1), 11),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(g.files.state.oom_refused(1), 1);
    // A device outside the allocation has no quota, but zero bytes
    // cost nothing anywhere.
    assert_eq!(g.reserve(None, 1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(g.reserve(None, 0), Ok(()));
    g.files.state.audit().unwrap();
}

#[test]
fn settling_an_estimate_moves_to_the_real_size() {
    let g = governed(&[1000], Hooks::NONE);
    g.reserve(Some(0), 512).unwrap();
    g.settle(Some(0), 512, 300).unwrap();
    assert_eq!(g.files.state.reserved(0), 300);
    g.settle(Some(0), 300, 900).unwrap();
    assert_eq!(g.files.state.reserved(0), 900);
    assert_eq!(
        g.settle(Some(0), 900, 1001),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(g.files.state.reserved(0), 900);
}

/// A process that died holding 800 of 1000 bytes: a real, exited child in a
/// slot, as a crash leaves it.
fn dead_holder(g: &Governed) {
    let state = &g.files.state;
    let dead = tessera_shm::testing::exited_process();
    let m = state
        .join(&dead, &tessera_shm::testing::AssumeAlive)
        .unwrap();
    state.reserve(m, 0, 800, 1000).unwrap();
    assert_eq!(state.reserved(0), 800);
}

#[test]
fn over_the_limit_the_shim_never_returns_a_dead_processs_quota_itself() {
    let g = governed(&[1000], Hooks::NONE);
    dead_holder(&g);
    // No manager releases it: the driver may still hold that memory, so 300
    // more are refused after the wait, and the dead's 800 stay charged.
    let t0 = std::time::Instant::now();
    assert_eq!(
        g.reserve(Some(0), 300),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert!(t0.elapsed() >= super::governed::DEAD_QUOTA_WAIT);
    let state = &g.files.state;
    assert_eq!(state.reserved(0), 800);
    assert_eq!(state.oom_refused(0), 1, "one refusal, however many tries");
    state.audit().unwrap();
}

#[test]
fn over_the_limit_the_shim_waits_for_the_manager_to_release_a_dead_processs_quota() {
    let mut g = governed(&[1000], Hooks::NONE);
    // The manager below is a thread that may be scheduled late on a busy
    // box: the shim waits for it as long as it takes, so the test judges the
    // hand-off, not the scheduler (the bound itself is the test above's).
    g.dead_quota_wait = std::time::Duration::from_secs(600);
    let g: &'static Governed = Box::leak(Box::new(g));
    dead_holder(g);
    // The manager, once the shim's first try has been refused (the refusal
    // counter says so), finds the driver has let the dead process go and
    // reclaims its slot.
    let manager = std::thread::spawn(move || {
        let state = &g.files.state;
        while state.oom_refused(0) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        state.reclaim_dead(&tessera_shm::LocalLiveness::thorough(), None)
    });
    assert_eq!(g.reserve(Some(0), 300), Ok(()));
    let back = manager.join().unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].freed[0], 800);
    let state = &g.files.state;
    assert_eq!(state.reserved(0), 300);
    assert_eq!(state.oom_refused(0), 0, "granted in the end: no refusal");
    state.audit().unwrap();
}

#[test]
fn members_pack() {
    for m in [
        Member {
            slot: 0,
            generation: 0,
        },
        Member {
            slot: 1023,
            generation: (1 << 30) - 1,
        },
    ] {
        assert_eq!(unpack(pack(m)), Some(m));
    }
    assert_eq!(unpack(0), None);
}

#[test]
fn the_view_is_the_limit_capped_by_the_device() {
    let g = governed(&[1000], Hooks::NONE);
    g.reserve(Some(0), 250).unwrap();
    assert_eq!(g.files.view(Some(0), 1 << 40), (1000, 250));
    assert_eq!(g.files.view(Some(0), 500), (500, 250));
    assert_eq!(g.files.view(None, 1 << 40), (0, 0));
}

/// A driver's pools as the CUDA documentation describes them: a pool
/// takes from the device what its unused reserve lacks (rounded up to
/// `grain`), keeps freed memory, gives back what exceeds its release
/// threshold at a synchronisation, and all unused memory when trimmed.
#[derive(Debug, Default)]
struct FakePools {
    // pool → (reserved, used, threshold)
    pools: Mutex<HashMap<usize, (u64, u64, u64)>>,
    graph: Mutex<(u64, u64)>,
    grain: u64,
}

impl FakePools {
    fn new(grain: u64) -> &'static FakePools {
        Box::leak(Box::new(FakePools {
            grain,
            ..FakePools::default()
        }))
    }
    fn alloc(&self, pool: usize, bytes: u64) {
        let mut p = self.pools.lock();
        let e = p.entry(pool).or_default();
        let lack = growth(e.0, e.1, bytes, 1);
        if lack > 0 {
            e.0 += lack.div_ceil(self.grain.max(1)) * self.grain.max(1);
        }
        e.1 += bytes;
    }
    fn free(&self, pool: usize, bytes: u64) {
        self.pools.lock().get_mut(&pool).unwrap().1 -= bytes;
    }
    fn threshold(&self, pool: usize, t: u64) {
        self.pools.lock().entry(pool).or_default().2 = t;
    }
    fn sync(&self) {
        for e in self.pools.lock().values_mut() {
            e.0 = e.0.min(e.1.max(e.2));
        }
    }
    /// Ground truth: what the device holds for pools and graphs.
    fn held(&self) -> u64 {
        self.pools.lock().values().map(|e| e.0).sum::<u64>() + self.graph.lock().0
    }
}

impl PoolDriver for FakePools {
    fn pool_usage(&self, pool: usize) -> Option<(u64, u64)> {
        self.pools
            .lock()
            .get(&pool)
            .map(|e| (e.0, e.1))
            .or(Some((0, 0)))
    }
    fn pool_trim(&self, pool: usize) {
        if let Some(e) = self.pools.lock().get_mut(&pool) {
            e.0 = e.1;
        }
    }
    fn graph_usage(&self, _device: CUdevice) -> Option<(u64, u64)> {
        Some(*self.graph.lock())
    }
    fn graph_trim(&self, _device: CUdevice) {
        let mut g = self.graph.lock();
        g.0 = g.1;
    }
    /// Admission charges bytes here (the grain, when larger, is what the
    /// driver grows by past what was admitted).
    fn page(&self) -> u64 {
        1
    }
}

/// A process governed with a 1000-byte limit on one device whose pools
/// are `FakePools` of `grain`.
fn with_pools(grain: u64) -> (Governed, &'static FakePools) {
    let d = FakePools::new(grain);
    let hooks = Hooks {
        pools: Some(d),
        ..Hooks::NONE
    };
    (governed(&[1000], hooks), d)
}

fn pool_alloc(g: &Governed, d: &FakePools, pool: usize, bytes: u64) -> CUresult {
    g.pool_alloc(
        d,
        pool,
        0,
        bytes,
        || {
            d.alloc(pool, bytes);
            CUresult::CUDA_SUCCESS
        },
        || (pool as u64) << 32 | d.pools.lock()[&pool].1,
        |_| d.free(pool, bytes),
    )
}

#[test]
fn pool_memory_counts_until_the_pool_gives_it_back() {
    let (g, d) = with_pools(1);
    d.threshold(1, u64::MAX);
    assert_eq!(pool_alloc(&g, d, 1, 768), CUresult::CUDA_SUCCESS);
    let ptr = 1 << 32 | 768;
    assert_eq!(g.files.state.reserved(0), 768);
    let r = g.pool_free(ptr, || {
        d.free(1, 768);
        CUresult::CUDA_SUCCESS
    });
    assert_eq!(r, Some(CUresult::CUDA_SUCCESS));
    d.sync();
    g.reconcile_pools();
    // The pool keeps it (its threshold is maximal): still charged.
    assert_eq!(g.files.state.reserved(0), 768);
    assert_eq!(d.held(), 768);
    // Allocating again from the pool reuses the reserve: no growth.
    assert_eq!(pool_alloc(&g, d, 1, 768), CUresult::CUDA_SUCCESS);
    assert_eq!(g.files.state.reserved(0), 768);
    g.pool_free(1 << 32 | 768, || {
        d.free(1, 768);
        CUresult::CUDA_SUCCESS
    });
    // Plain memory past what is left: the pool is trimmed first, and
    // the program gets its memory (no spurious out-of-memory).
    assert_eq!(g.reserve(Some(0), 768), Ok(()));
    assert_eq!(d.held(), 0);
    assert_eq!(g.files.state.reserved(0), 768);
    assert_eq!(g.files.state.oom_refused(0), 0, "no refusal was final");
    // And past the limit for real: refused, counted once.
    assert_eq!(
        g.reserve(Some(0), 300),
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(g.files.state.oom_refused(0), 1);
    g.files.state.audit().unwrap();
}

#[test]
fn many_pools_that_keep_everything_stay_under_the_limit() {
    let (g, d) = with_pools(1);
    for pool in 1..=10usize {
        d.threshold(pool, u64::MAX);
        assert_eq!(pool_alloc(&g, d, pool, 400), CUresult::CUDA_SUCCESS);
        let held = d.pools.lock()[&pool].1;
        g.pool_free((pool as u64) << 32 | held, || {
            d.free(pool, 400);
            CUresult::CUDA_SUCCESS
        });
        d.sync();
        assert!(d.held() <= 1000, "pool {pool}: device holds {}", d.held());
        assert_eq!(g.files.state.reserved(0), d.held());
    }
    // Live allocations cannot be trimmed: past the limit is refused.
    assert_eq!(pool_alloc(&g, d, 1, 700), CUresult::CUDA_SUCCESS);
    assert_eq!(
        pool_alloc(&g, d, 2, 400),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY
    );
    assert!(d.held() <= 1000);
    g.files.state.audit().unwrap();
}

#[test]
fn a_pool_that_grows_by_more_than_admitted_is_undone_if_the_rest_does_not_fit() {
    let (g, d) = with_pools(256);
    // 100 bytes take a 256-byte grain: charged 256.
    assert_eq!(pool_alloc(&g, d, 1, 100), CUresult::CUDA_SUCCESS);
    assert_eq!(g.files.state.reserved(0), 256);
    assert_eq!(g.reserve(Some(0), 700), Ok(()));
    // 44 left; 100 more fit in the pool's reserve: no growth.
    assert_eq!(pool_alloc(&g, d, 1, 100), CUresult::CUDA_SUCCESS);
    assert_eq!(g.files.state.reserved(0), 956);
    // 40 admitted (44 left), but the grain makes it 256: undone.
    assert_eq!(pool_alloc(&g, d, 1, 96), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(d.pools.lock()[&1].1, 200, "the allocation was freed");
    assert!(d.held() + 700 <= 1000);
    assert_eq!(g.files.state.reserved(0), d.held() + 700);
    g.files.state.audit().unwrap();
}

#[test]
fn a_destroyed_pool_keeps_its_live_allocations_charged_until_freed() {
    let (g, d) = with_pools(1);
    d.threshold(5, u64::MAX);
    pool_alloc(&g, d, 5, 300);
    pool_alloc(&g, d, 5, 200);
    g.pool_free(5 << 32 | 300, || {
        d.free(5, 300);
        CUresult::CUDA_SUCCESS
    });
    assert_eq!(g.files.state.reserved(0), 500);
    g.pool_destroy(5, || {
        // The driver frees the reserve; the handle is no longer the
        // pool's (it lives on under another name until its last free).
        d.pool_trim(5);
        let e = d.pools.lock().remove(&5).unwrap();
        d.pools.lock().insert(1005, e);
        CUresult::CUDA_SUCCESS
    });
    assert_eq!(g.files.state.reserved(0), 200, "the reserve went back");
    // The handle comes back for a new pool while 200 still live.
    pool_alloc(&g, d, 5, 100);
    assert_eq!(g.files.state.reserved(0), 300);
    let freed = g.pool_free(5 << 32 | 500, || {
        d.pools.lock().remove(&1005);
        CUresult::CUDA_SUCCESS
    });
    assert_eq!(freed, Some(CUresult::CUDA_SUCCESS));
    assert_eq!(g.files.state.reserved(0), 100);
    assert_eq!(g.pool_free(0xdead, || CUresult::CUDA_SUCCESS), None);
    g.files.state.audit().unwrap();
}

#[test]
fn graph_memory_is_charged_at_launch_and_returned_when_trimmed() {
    let (g, d) = with_pools(1);
    let launch = |g: &Governed| {
        g.graph_launch(0xe, || {
            let mut m = d.graph.lock();
            m.1 = 600;
            m.0 = m.0.max(600);
            CUresult::CUDA_SUCCESS
        })
    };
    g.graph_alloc_node(0x9, 0, 600);
    g.graph_copied(0x9, 0xe, true);
    assert_eq!(launch(&g), CUresult::CUDA_SUCCESS);
    assert_eq!(g.files.state.reserved(0), 600);
    // Its allocation freed, the reserve stays: launched again, it
    // takes nothing more, even with too little left for a first one.
    d.graph.lock().1 = 0;
    assert_eq!(g.reserve(Some(0), 400), Ok(()));
    assert_eq!(launch(&g), CUresult::CUDA_SUCCESS);
    assert_eq!(g.files.state.reserved(0), 1000);
    // The graph's allocation freed, the program allocates: the graph
    // memory is trimmed to make room.
    d.graph.lock().1 = 0;
    g.release(Some(0), 400);
    assert_eq!(g.reserve(Some(0), 900), Ok(()));
    assert_eq!(d.held(), 0);
    assert_eq!(g.files.state.reserved(0), 900);
    // Relaunch needs its 600 again: refused, nothing launched.
    assert_eq!(launch(&g), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(g.files.state.reserved(0), 900);
    g.files.state.audit().unwrap();
}

#[test]
fn a_launch_refused_until_a_trim_is_admitted_for_what_it_needs_after_it() {
    let (g, d) = with_pools(1);
    // Graph memory holds 600, 300 of them live; plain memory 300.
    g.graph_alloc_node(0x9, 0, 600);
    g.graph_copied(0x9, 0xe, true);
    let launch = |g: &Governed, exec: usize, bytes: u64| {
        g.graph_launch(exec, || {
            let mut m = d.graph.lock();
            m.0 = m.0.max(m.1 + bytes);
            m.1 += bytes;
            CUresult::CUDA_SUCCESS
        })
    };
    assert_eq!(launch(&g, 0xe, 600), CUresult::CUDA_SUCCESS);
    d.graph.lock().1 = 300;
    assert_eq!(g.reserve(Some(0), 300), Ok(()));
    // A 500-byte graph: 200 past the spare before a trim, 500 after
    // it; neither fits.
    g.graph_alloc_node(0xa, 0, 500);
    g.graph_copied(0xa, 0xf, true);
    assert_eq!(launch(&g, 0xf, 500), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert!(d.held() + 300 <= 1000, "device holds {}", d.held() + 300);
    assert_eq!(g.files.state.reserved(0), d.held() + 300);
    g.files.state.audit().unwrap();
}
