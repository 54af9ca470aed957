//! HIP memory the runtime keeps beyond a process's live allocations, under
//! the shim on a simulated AMD GPU: a stream-ordered pool's freed blocks
//! (kept up to its release threshold) are charged until the runtime gives
//! them back (a synchronisation, `hipMemPoolTrimTo`), so neither this
//! process nor another can make the device hold more than the limit, and
//! the books follow the device.

mod hip_support;

use std::time::Duration;

use hip_support::*;

const PHYSICAL: u64 = 4096 * MI;
const LIMIT: u64 = 1024 * MI;
const T: Duration = Duration::from_secs(60);
/// hipErrorOutOfMemory, as the client reports it.
const OOM: &str = "HIP_ERROR_2";

/// Waits for each of `cmds`' lines in order, each a success.
fn steps(c: &mut tessera_e2e::ProbeChild, cmds: &[&str]) {
    for cmd in cmds {
        let l = c.wait_for(cmd, T);
        assert!(l.ok, "{cmd}: {}", l.raw);
    }
}

/// What a pool keeps in the tests below: 600 MiB, more than half the limit,
/// so that a second 600 MiB fits only once the pool gives it back.
const KEPT: u64 = 600 * MI;

/// Starts a governed process whose default pool keeps [`KEPT`] (release
/// threshold 1 GiB: a stream-ordered allocation of 600 MiB freed and
/// synchronised stays on the device), then runs `then`; returns once the pool
/// keeps it. The two pool tests start from this same state, so it is built
/// here once.
fn spawn_keeping(sim: &HipSim, then: &[&str]) -> tessera_e2e::ProbeChild {
    let kept = KEPT.to_string();
    let keep = ["threshold", "1073741824", "pasync", &kept, "pfree", "sync"];
    let mut c = sim.spawn(Client::Link, true, &[&keep[..], then].concat());
    steps(&mut c, &["threshold", "pasync", "pfree", "sync"]);
    c
}

/// The device's ground truth within the limit, and the state file's books
/// equal to it.
fn books_equal_device(sim: &HipSim, at: &str) -> u64 {
    let used = sim.used();
    assert!(
        used <= LIMIT,
        "{at}: the device holds {used} B over {LIMIT} B"
    );
    assert_eq!(
        sim.state().reserved(0),
        used,
        "{at}: the books and the device differ"
    );
    used
}

#[test]
fn a_pools_kept_memory_is_charged_until_the_runtime_gives_it_back() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    // The holder: its default pool keeps the 600 MiB it freed.
    let mut holder = spawn_keeping(
        &sim,
        &["pattr", "ready", "trim", "0", "pattr", "ready", "wait"],
    );
    let attr = holder.wait_for("pattr", T);
    assert_eq!(attr.u64("reserved"), KEPT, "{}", attr.raw);
    assert_eq!(attr.u64("used"), 0, "{}", attr.raw);
    steps(&mut holder, &["ready"]);
    let used = books_equal_device(&sim, "kept after free and sync");
    assert_eq!(used, CONTEXT + KEPT, "the pool keeps its reserve");

    // Another process of the allocation: 600 MiB more would make the device
    // hold 1.2 GiB, so it is refused while the pool keeps its reserve.
    let o = sim.run(Client::Link, true, &["malloc", "629145600"]);
    assert_eq!(
        o.get("malloc").error.as_deref(),
        Some(OOM),
        "admitted over memory a pool keeps: {}{}",
        o.stdout,
        o.stderr
    );
    // Its context's quota returns once the runtime let the ended process go.
    sim.reclaim_ended();
    books_equal_device(&sim, "after the refused allocation");

    // The holder trims its pool: the runtime gives the memory back and the
    // charge follows at once.
    holder.send("go");
    let attr = holder.wait_for("pattr", T);
    assert!(attr.ok, "{}", attr.raw);
    assert_eq!(attr.u64("reserved"), 0, "{}", attr.raw);
    let ready = holder.wait_for("ready", T);
    assert!(ready.ok, "{}", ready.raw);
    let used = books_equal_device(&sim, "after the trim");
    assert_eq!(used, CONTEXT, "the trim gave the reserve back");

    // Now the other process's 600 MiB fit.
    let o = sim.run(Client::Link, true, &["malloc", "629145600", "free"]);
    o.expect_ok();
    sim.reclaim_ended();
    holder.send("go");
    assert!(holder.finish().success());
}

#[test]
fn an_allocation_over_the_limit_trims_the_processs_own_pool_first() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    // The pool keeps 600 MiB; the same process then asks hipMalloc for
    // 600 MiB: it fits only once its own pool is trimmed, which the shim
    // does before refusing.
    let mut c = spawn_keeping(
        &sim,
        &[
            "ready",
            "malloc",
            "629145600",
            "pattr",
            "ready",
            "free",
            // A lowered threshold: the next synchronisation gives back.
            "threshold",
            "0",
            "pasync",
            "104857600",
            "pfree",
            "ready",
            "sync",
            "ready",
            "wait",
        ],
    );
    steps(&mut c, &["ready"]);
    assert_eq!(books_equal_device(&sim, "kept"), CONTEXT + KEPT);
    c.send("go");
    let m = c.wait_for("malloc", T);
    assert!(
        m.ok,
        "refused although its own pool could give back: {}",
        m.raw
    );
    let attr = c.wait_for("pattr", T);
    assert_eq!(
        attr.u64("reserved"),
        0,
        "the pool was trimmed: {}",
        attr.raw
    );
    steps(&mut c, &["ready"]);
    assert_eq!(
        books_equal_device(&sim, "trimmed for the allocation"),
        CONTEXT + 600 * MI
    );
    c.send("go");
    // Freed, not yet synchronised: the pool still holds the block, and so
    // do the books.
    steps(&mut c, &["free", "threshold", "pasync", "pfree", "ready"]);
    assert_eq!(
        books_equal_device(&sim, "freed, before the sync"),
        CONTEXT + 100 * MI
    );
    c.send("go");
    steps(&mut c, &["sync", "ready"]);
    assert_eq!(books_equal_device(&sim, "after the sync"), CONTEXT);
    c.send("go");
    assert!(c.finish().success());
}

#[test]
fn an_ipc_import_is_charged_once_and_only_from_the_allocations_own_exports() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    let shared = 300 * MI;
    let mut exporter = sim.spawn(
        Client::Link,
        true,
        &[
            "export",
            "314572800",
            "ready",
            "free",
            "ready",
            "sync",
            "ready",
            "wait",
        ],
    );
    let e = exporter.wait_for("export", T);
    assert!(e.ok, "{}", e.raw);
    let handle = e.str("handle").to_owned();
    steps(&mut exporter, &["ready"]);
    assert_eq!(books_equal_device(&sim, "exported"), CONTEXT + shared);

    // A handle no process of the allocation exported is refused by the
    // shim (hipErrorInvalidHandle), before the runtime sees it.
    let mut forged = handle.clone().into_bytes();
    forged[60] = if forged[60] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).expect("hex");
    let mut stranger = sim.spawn(Client::Link, true, &["import"]);
    stranger.send(&forged);
    let l = stranger.wait_for("import", T);
    assert_eq!(l.error.as_deref(), Some("HIP_ERROR_400"), "{}", l.raw);
    assert!(stranger.finish().success());
    // It never used the device: nothing charged, nothing to reclaim.
    books_equal_device(&sim, "after the refused import");

    // The importer maps it: the device holds it once, and so do the books
    // (the importer is charged its context only).
    let mut importer = sim.spawn(
        Client::Link,
        true,
        &["import", "ready", "iclose", "ready", "wait"],
    );
    importer.send(&handle);
    steps(&mut importer, &["import", "ready"]);
    assert_eq!(
        books_equal_device(&sim, "imported"),
        2 * CONTEXT + shared,
        "charged twice or not at all"
    );

    // The exporter frees it while the importer has it open: the runtime
    // keeps the pages, and the exporter stays charged for them.
    exporter.send("go");
    steps(&mut exporter, &["free", "ready"]);
    assert_eq!(
        books_equal_device(&sim, "freed while open elsewhere"),
        2 * CONTEXT + shared
    );

    // The importer closes it: the pages leave the device; the exporter's
    // charge returns at its next synchronisation.
    importer.send("go");
    steps(&mut importer, &["iclose", "ready"]);
    exporter.send("go");
    steps(&mut exporter, &["sync", "ready"]);
    assert_eq!(books_equal_device(&sim, "closed"), 2 * CONTEXT);
    importer.send("go");
    exporter.send("go");
    assert!(importer.finish().success());
    assert!(exporter.finish().success());
}

#[test]
fn a_contexts_charge_follows_what_the_driver_holds() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    // The control file says a context holds CONTEXT; the runtime's hold
    // more, then less: each process's charge follows the driver's figure
    // (ROCm SMI's per-process VRAM) once its first allocation made the
    // context.
    for real in [CONTEXT + 8 * MI, CONTEXT - 8 * MI] {
        sim.node.node().set_context_memory(real);
        let mut c = sim.spawn(Client::Link, true, &["malloc", "1048576", "ready", "wait"]);
        steps(&mut c, &["malloc", "ready"]);
        assert_eq!(
            books_equal_device(&sim, &format!("a context of {real} B")),
            real + MI
        );
        c.send("go");
        assert!(c.finish().success());
        sim.reclaim_ended();
    }
}
