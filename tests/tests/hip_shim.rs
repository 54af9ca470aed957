//! The shim governing HIP on a simulated AMD GPU: a client, linked (its
//! references versioned `hip_4.2`) or looking functions up on its own
//! `dlopen` handle (as hip-python does), sees the allocation's limit and is
//! refused past it; sixteen racing processes never make the device hold
//! more than the limit, by the simulator's ground truth.

mod hip_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hip_support::*;

const PHYSICAL: u64 = 4096 * MI;
const LIMIT: u64 = 1024 * MI;
const T: Duration = Duration::from_secs(60);
/// hipErrorOutOfMemory, as the client reports it.
const OOM: &str = "HIP_ERROR_2";

#[test]
fn a_hip_client_sees_the_limit_and_is_refused_past_it() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    for client in Client::ALL {
        let o = sim.run(
            client,
            true,
            &[
                "meminfo",
                "totalmem",
                "props",
                "malloc",
                "314572800",
                "meminfo",
                "malloc",
                "805306368",
                "malloc",
                "104857600",
                "free",
                "free",
            ],
        );
        let lines = o.all("meminfo");
        assert_eq!(lines.len(), 2, "{client:?}: {}{}", o.stdout, o.stderr);
        assert!(lines[0].ok, "{client:?}: {}{}", o.stdout, o.stderr);
        assert_eq!(lines[0].u64("total"), LIMIT, "{client:?}: {}", o.stdout);
        // The process's device context is charged at its first call.
        assert_eq!(
            lines[0].u64("free"),
            LIMIT - CONTEXT,
            "{client:?}: {}",
            o.stdout
        );
        assert_eq!(o.get("totalmem").u64("bytes"), LIMIT, "{client:?}");
        assert_eq!(o.get("props").u64("total"), LIMIT, "{client:?}");
        // 300 MiB held (whole pages): the view shows the rest.
        assert_eq!(
            lines[1].u64("free"),
            LIMIT - CONTEXT - pages(300 * MI),
            "{client:?}"
        );
        let m = o.all("malloc");
        assert!(m[0].ok, "{client:?}: {}", o.stdout);
        // 768 MiB more would pass the limit: refused, as on a full GPU.
        assert!(!m[1].ok, "{client:?}: {}", o.stdout);
        assert_eq!(m[1].error.as_deref(), Some(OOM), "{client:?}");
        // A smaller one still fits afterwards.
        assert!(m[2].ok, "{client:?}: {}", o.stdout);
        assert!(
            o.all("free").iter().all(|l| l.ok),
            "{client:?}: {}",
            o.stdout
        );
        assert!(o.status.success(), "{client:?}: {}", o.stderr);
        sim.reclaim_ended();
    }
    // A pointer from hipGetProcAddress is governed too: past the limit is
    // refused.
    let o = sim.run(Client::Link, true, &["procaddr", "2147483648"]);
    assert_eq!(
        o.get("procaddr").error.as_deref(),
        Some(OOM),
        "{}",
        o.stdout
    );
    // The same client outside the allocation sees the whole device.
    let o = sim.run(Client::Link, false, &["totalmem", "malloc", "2147483648"]);
    o.expect_ok();
    assert_eq!(o.get("totalmem").u64("bytes"), PHYSICAL);
}

#[test]
fn sixteen_racers_never_make_the_device_hold_more_than_the_limit() {
    const RACERS: u32 = 16;
    const MAX_MIB: u64 = 64;
    let sim = Arc::new(HipSim::new(PHYSICAL, LIMIT));
    let mut racers: Vec<_> = (0..RACERS)
        .map(|i| {
            let seed = (1000 + i).to_string();
            let mut c = sim.spawn(
                Client::Link,
                true,
                // Join (meminfo), meet, race until refused, hold until told.
                &["meminfo", "ready", "race", &seed, "64", "wait"],
            );
            let ready = c.wait_for("ready", T);
            assert!(ready.ok);
            c
        })
        .collect();
    // A sampler of the ground truth for the whole race.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sim, stop, peak, samples) = (sim.clone(), stop.clone(), peak.clone(), samples.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                peak.fetch_max(sim.used(), Ordering::AcqRel);
                samples.fetch_add(1, Ordering::AcqRel);
                std::thread::yield_now();
            }
        })
    };
    for c in &mut racers {
        c.send("go");
    }
    let mut held = 0;
    for c in &mut racers {
        let r = c.wait_for("race", T);
        // Every racer stops at its first refusal, so the limit was reached.
        assert_eq!(r.u64("code"), 2, "{}", r.raw);
        held += r.u64("held");
    }
    // All racers hold what they got: the device holds it, within the limit,
    // and what is left is less than the largest request plus its rounding.
    let used = sim.used();
    stop.store(true, Ordering::Release);
    sampler.join().expect("sampler");
    let peak = peak.load(Ordering::Acquire).max(used);
    eprintln!(
        "16 racers: held {held} B asked, device {used} B, peak {peak} B over {} samples, limit {LIMIT} B",
        samples.load(Ordering::Acquire)
    );
    assert!(
        peak <= LIMIT,
        "the device held {peak} B over a {LIMIT} B limit"
    );
    assert!(used >= held, "the device holds at least what was asked");
    assert!(
        LIMIT - used < pages(MAX_MIB * MI),
        "every racer was refused with {} B left",
        LIMIT - used
    );
    // The books agree with the device.
    let books = sim.state().reserved(0);
    assert_eq!(books, used, "the state file's books and the device agree");
    for c in racers {
        assert!(c.finish().success());
    }
}

#[test]
fn every_family_is_charged_what_the_device_holds_and_returned_when_freed() {
    let sim = HipSim::new(PHYSICAL, LIMIT);
    let families: &[&[&str]] = &[
        &["malloc", "3145729"],
        &["managed", "5242880"],
        &["ext", "1048577"],
        &["async", "7340033"],
        &["pitch", "1000", "300"],
        &["m3d", "700", "20", "30"],
        &["array", "1000", "100"],
        &["vmm", "4194304"],
        &["procaddr", "3145728"],
    ];
    for family in families {
        let mut args = vec!["meminfo"];
        args.extend_from_slice(family);
        args.extend_from_slice(&["ready", "freeall", "free", "ready", "wait"]);
        let mut c = sim.spawn(Client::Link, true, &args);
        let ready = c.wait_for("ready", T);
        assert!(ready.ok, "{family:?}: {}", ready.raw);
        // The books hold exactly what the device holds: the context and the
        // family's allocation at the runtime's rounding.
        let (used, books) = (sim.used(), sim.state().reserved(0));
        assert_eq!(books, used, "{family:?}: the books and the device differ");
        assert!(used > CONTEXT, "{family:?}: nothing allocated");
        c.send("go");
        let ready = c.wait_for("ready", T);
        assert!(ready.ok, "{family:?}: {}", ready.raw);
        // Freed: the quota is back, only the context is left.
        assert_eq!(sim.used(), CONTEXT, "{family:?}: the device still holds it");
        assert_eq!(
            sim.state().reserved(0),
            CONTEXT,
            "{family:?}: still charged"
        );
        c.send("go");
        assert!(c.finish().success(), "{family:?}");
        sim.reclaim_ended();
    }
}
