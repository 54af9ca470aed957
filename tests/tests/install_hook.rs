//! `tessera install-hook` under running processes: the installed shim is replaced by a new
//! build while eight processes run under it and keep calling CUDA; they all go on (they
//! keep the file they mapped), and a process started after gets the new file.

mod hook_support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hook_support::{MI, Sim, hook_lib};
use tessera_client::install_hook::{Installed, install};
use tessera_e2e::{Mode, ProbeChild, probe_binary};

const T: Duration = Duration::from_secs(30);

/// Inodes of the mappings of `pid` whose path is `lib` (the kernel appends " (deleted)"
/// once the name points elsewhere).
fn mapped_inodes(pid: u32, lib: &Path) -> Vec<(u64, bool)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let lib = lib.to_str().expect("utf-8 path");
    let mut found: Vec<(u64, bool)> = maps
        .lines()
        .filter_map(|l| {
            // address perms offset dev inode path
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            let path = f.get(5)?.trim_start();
            let deleted = path.strip_suffix(" (deleted)");
            (path == lib || deleted == Some(lib))
                .then(|| (f[4].parse().expect("inode"), deleted.is_some()))
        })
        .collect();
    found.dedup();
    found
}

fn probe_under(sim: &Sim, lib: &Path) -> ProbeChild {
    let mut c = sim.node.command(probe_binary(Mode::Dlopen));
    c.env("LD_PRELOAD", lib)
        .env("TESSERA_CONTROL", &sim.control)
        .env_remove("TESSERA_STATE")
        .env_remove("TESSERA_LOG");
    ProbeChild::start(c)
}

#[test]
fn replacing_the_installed_shim_leaves_running_processes_alone_and_serves_new_ones() {
    let sim = Sim::one_gpu(4 << 30, 1 << 30);
    let lib_dir = sim.node.dir.path().join("node-lib");
    let installed = lib_dir.join("libtessera.so");
    assert_eq!(
        install(&hook_lib(), &installed).unwrap(),
        Installed::Replaced
    );
    let old_ino = std::fs::metadata(&installed).unwrap().ino();

    // Eight processes under the installed shim, governed, each holding memory.
    let mut probes: Vec<ProbeChild> = (0..8).map(|_| probe_under(&sim, &installed)).collect();
    for p in &mut probes {
        for cmd in ["init", "ctx", "alloc 1048576"] {
            let l = p.cmd(cmd, T);
            assert!(l.ok, "{}", l.raw);
        }
        // (After its first answer: the loader has mapped the preload by then.)
        assert_eq!(mapped_inodes(p.pid(), &installed), [(old_ino, false)]);
    }

    // Each keeps calling CUDA (allocate, query, free) in a thread of the test, counting
    // the calls that succeeded; any failure stops it.
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = (0..8).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let workers: Vec<_> = probes
        .into_iter()
        .zip(&counts)
        .map(|(mut p, n)| {
            let (stop, n) = (stop.clone(), n.clone());
            std::thread::spawn(move || {
                let mut handles = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut cmds = vec![
                        "meminfo".to_owned(),
                        "totalmem".to_owned(),
                        "sync".to_owned(),
                    ];
                    // The probe never reuses a handle number: allocate on some rounds only.
                    if n.load(Ordering::Relaxed) % 8 == 0 && handles < 1000 {
                        let a = p.cmd(&format!("alloc {MI}"), T);
                        if !a.ok {
                            return (p, Err(a.raw));
                        }
                        handles += 1;
                        cmds.push(format!("free {}", a.str("h")));
                    }
                    for cmd in cmds {
                        let l = p.cmd(&cmd, T);
                        if !l.ok {
                            return (p, Err(l.raw));
                        }
                    }
                    n.fetch_add(1, Ordering::Relaxed);
                }
                (p, Ok(()))
            })
        })
        .collect();
    let all_past = |floor: &[u64]| {
        let t0 = Instant::now();
        while counts
            .iter()
            .zip(floor)
            .any(|(n, f)| n.load(Ordering::Relaxed) < f + 5)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(60) && workers.iter().all(|w| !w.is_finished()),
                "a process stopped calling CUDA: {counts:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    all_past(&[0; 8]);

    // The new build: another file (a copy with a marker appended).
    let new_build = sim.node.dir.path().join("libtessera-next.so");
    let mut bytes = std::fs::read(hook_lib()).unwrap();
    bytes.extend_from_slice(b"\0tessera-install-hook-test: next build\0");
    std::fs::write(&new_build, &bytes).unwrap();
    assert_eq!(
        install(&new_build, &installed).unwrap(),
        Installed::Replaced
    );
    let new_ino = std::fs::metadata(&installed).unwrap().ino();
    assert_ne!(new_ino, old_ino);
    assert_eq!(std::fs::read(&installed).unwrap(), bytes);

    // Every running process goes on calling CUDA after the replacement.
    let at_install: Vec<u64> = counts.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    all_past(&at_install);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let (mut p, result) = w.join().expect("worker");
        result.unwrap_or_else(|raw| panic!("a running process failed after the install: {raw}"));
        // Still on the file it mapped at its start, which no name points to any more.
        assert_eq!(mapped_inodes(p.pid(), &installed), [(old_ino, true)]);
        let l = p.cmd("meminfo", T);
        assert!(l.ok, "{}", l.raw);
        assert!(p.finish().success());
    }

    // A process started now gets the new build, and works under it.
    let mut fresh = probe_under(&sim, &installed);
    for cmd in ["init", "ctx", "alloc 1048576", "meminfo"] {
        let l = fresh.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    assert_eq!(mapped_inodes(fresh.pid(), &installed), [(new_ino, false)]);
    assert_eq!(
        fresh.cmd("meminfo", T).u64("total"),
        1 << 30,
        "the new build governs"
    );
    assert!(fresh.finish().success());
}
