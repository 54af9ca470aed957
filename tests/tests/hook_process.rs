//! A process's life in its allocation: joining at `cuInit`, what it keeps
//! at exit, and a forked child joining on its own.

mod hook_support;

use hook_support::*;
use tessera_e2e::{Mode, sim_lib_dir};

const LIMIT: u64 = 64 * MI;

#[test]
fn a_process_that_exits_holding_memory_keeps_its_quota_until_it_is_gone() {
    let sim = Sim::new(1, 4 * LIMIT);
    sim.allocate(LIMIT);
    let o = sim.run(Mode::Link, true, &["init", "ctx", "alloc 20971520"]);
    o.expect_ok();
    // It exited: the driver freed its memory as it died, and only then may
    // the quota go to someone else. Until a reclaim, its slot holds it.
    let state = sim.state();
    assert_eq!(state.reserved(0), 20 * MI);
    let procs = state.processes(1);
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].usage, vec![20 * MI]);
    // The manager returns it once the driver has let the process go (the shim of
    // the next process never does: docs/security.md, "The exit window"); then the
    // next process can use the whole limit.
    assert_eq!(reclaim_released(&sim, &state), 1);
    assert_eq!(state.reserved(0), 0);
    let o = sim.run(
        Mode::Dlopen,
        true,
        &["init", "ctx", &format!("alloc {LIMIT}"), "free 0"],
    );
    o.expect_ok();
    assert_eq!(state.reserved(0), 0);
    // One that freed everything leaves its slot at exit.
    assert!(state.processes(1).is_empty());
    state.audit().unwrap();
}

#[test]
fn joining_happens_at_cuinit_not_before() {
    let sim = Sim::new(1, 4 * LIMIT);
    sim.allocate(LIMIT);
    let mut p = sim.spawn(Mode::ProcAddr, true);
    let l = p.cmd("count", std::time::Duration::from_secs(20));
    assert_eq!(
        l.error.as_deref(),
        Some("CUDA_ERROR_NOT_INITIALIZED"),
        "{}",
        l.raw
    );
    assert!(sim.state().processes(1).is_empty());
    assert!(p.cmd("init", std::time::Duration::from_secs(20)).ok);
    let procs = sim.state().processes(1);
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].identity.pid, p.pid());
    assert!(p.finish().success());
}

const FORK: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
#include "cuda_abi.h"
static int setup(void) {
    CUcontext c;
    int r = cuInit(0);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, 0);
    if (!r) r = cuCtxSetCurrent(c);
    return r;
}
#define MB(n) ((size_t)(n) << 20)
int main(int argc, char **argv) {
    CUdeviceptr p, q;
    int go[2];
    if (argv[1][0] == 'i') {
        /* The parent initialised and joined before forking. */
        printf("parent setup %d\n", setup());
        printf("parent 600 %d\n", cuMemAlloc_v2(&p, MB(600)));
        fflush(stdout);
        if (fork() == 0) {
            /* Not initialised here: refused without touching the
               allocation, and the parent's pointer is not ours to free. */
            printf("child alloc %d\n", cuMemAlloc_v2(&q, MB(1)));
            printf("child free %d\n", cuMemFree_v2(p));
            printf("child init %d\n", cuInit(0));
            fflush(stdout);
            _exit(0);
        }
        wait(NULL);
        printf("parent 300 %d\n", cuMemAlloc_v2(&q, MB(300)));
        printf("parent 101 %d\n", cuMemAlloc_v2(&q, MB(101)));
        return 0;
    }
    /* The parent never initialises; two children share the limit. */
    int ready[2];
    char c;
    if (pipe(go) || pipe(ready)) return 9;
    pid_t a = fork();
    if (a == 0) {
        printf("a setup %d\n", setup());
        printf("a 600 %d\n", cuMemAlloc_v2(&p, MB(600)));
        fflush(stdout);
        /* Its lines are out and its 600 MiB held: b may start. */
        if (write(ready[1], "x", 1) != 1) _exit(9);
        if (read(go[0], &c, 1) != 1) _exit(9);
        _exit(0);
    }
    /* b only once a has joined, allocated and printed: the order of the
       lines and b's refusal follow from this, not from how fast a ran. */
    close(ready[1]);
    if (read(ready[0], &c, 1) != 1) return 9;
    pid_t b = fork();
    if (b == 0) {
        printf("b setup %d\n", setup());
        printf("b 500 %d\n", cuMemAlloc_v2(&q, MB(500)));
        printf("b 400 %d\n", cuMemAlloc_v2(&q, MB(400)));
        fflush(stdout);
        _exit(0);
    }
    waitpid(b, NULL, 0);
    if (write(go[1], "x", 1) != 1) return 9;
    waitpid(a, NULL, 0);
    return 0;
}
"#;

fn fork_program(sim: &Sim) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("fork");
    let lib = format!("-L{}", sim_lib_dir().dir.display());
    cc(FORK, &exe, &[&lib, "-lcuda"]);
    let _ = sim;
    (dir, exe)
}

#[test]
fn a_forked_child_neither_uses_nor_frees_its_parents_quota() {
    let sim = Sim::new(1, 4096 * MI);
    sim.allocate(1000 * MI);
    let (_dir, exe) = fork_program(&sim);
    let o = sim.command(&exe, true).arg("initialised").output().unwrap();
    assert_eq!(
        stdout(&o),
        "parent setup 0\nparent 600 0\n\
         child alloc 3\nchild free 3\nchild init 3\n\
         parent 300 0\nparent 101 2\n",
        "{}",
        stderr(&o)
    );
    let state = sim.state();
    let procs = state.processes(1);
    assert_eq!(procs.len(), 1, "the child never joined: {procs:?}");
    assert_eq!(procs[0].usage, vec![900 * MI]);
    state.audit().unwrap();
}

#[test]
fn children_of_an_uninitialised_parent_each_join_and_share_the_limit() {
    let sim = Sim::new(1, 4096 * MI);
    sim.allocate(1000 * MI);
    let (_dir, exe) = fork_program(&sim);
    let o = sim.command(&exe, true).arg("children").output().unwrap();
    assert_eq!(
        stdout(&o),
        "a setup 0\na 600 0\nb setup 0\nb 500 2\nb 400 0\n",
        "{}",
        stderr(&o)
    );
}
