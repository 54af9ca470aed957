//! Another local user against the allocations' host files: they were 0666 in 0755
//! directories, so anyone on the node could zero or forge any allocation's accounting.
//! Now an allocation made for containers lives in a root-only directory (containers reach
//! their files through the device plugin's mounts), and a `tessera run` user's state file
//! is that user's alone. Checked through the real manager; when the test runs as root it
//! also tries the writes as `nobody` (uid 65534) and they must fail.

mod manager_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use manager_support::*;
use tessera_e2e::SimNode;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(10);
const NOBODY: u32 = 65534;

role_test!();

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
}

/// Whether `nobody` can append to `path` (run through a shell as that user).
fn nobody_can_write(path: &Path) -> bool {
    std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("printf x >> \"$1\"")
        .arg("sh")
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("spawn as nobody")
        .success()
}

#[test]
fn other_local_users_cannot_reach_an_allocations_files() {
    let n = SimNode::e2e(1, 0xf11e);
    let dir = n.dir.path().join("m");
    let m = ManagerProc::start(&n, &dir, &[]);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "private", &uuid, GI, 1_000_000);
    let state = Path::new(&a.state_path);
    let alloc_dir = state.parent().unwrap();
    let allocations = alloc_dir.parent().unwrap();
    assert_eq!(mode(allocations), 0o711, "passable, not listable");
    let me = nix::unistd::geteuid().as_raw();
    let owned_by_me = std::fs::metadata(state).unwrap().uid() == me;
    if me == 0 {
        // Open every directory above the allocations to everyone (the test's temp
        // dir is private), so only the manager's own modes can stop nobody.
        let mut p = allocations.parent();
        while let Some(d) = p {
            if d == n.dir.path().parent().unwrap() {
                break;
            }
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
            p = d.parent();
        }
        // Made by root for containers: root's directory, nobody else gets in.
        assert_eq!(mode(alloc_dir), 0o700);
        assert!(!nobody_can_write(state), "nobody wrote the state file");
        assert!(
            !nobody_can_write(&alloc_dir.join("control")),
            "nobody wrote the control file"
        );
        // The check is real: a 0666 file beside the state file is out of nobody's
        // reach too, and within it once the directory is opened up.
        let probe = alloc_dir.join("probe");
        std::fs::write(&probe, b"").unwrap();
        std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!nobody_can_write(&probe));
        std::fs::set_permissions(alloc_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(nobody_can_write(&probe), "the check itself is blind");
        std::fs::set_permissions(alloc_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_file(&probe).unwrap();
    } else {
        // The test (and so the manager) runs as an ordinary user: the allocation's
        // directory is still closed to everyone else.
        assert!(owned_by_me);
        assert_eq!(mode(alloc_dir) & 0o077, 0o011, "others may only pass");
        assert_eq!(mode(state) & 0o077, 0, "others cannot touch the state file");
    }
    // And the allocation still works for its own process (as a container's would,
    // through the paths it was given).
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", "alloc 1048576"] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    w.kill();
    m.stop();
}
