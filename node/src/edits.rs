//! A container's edits for one allocation, built from the manager's answer:
//! the one place either plugin turns a `CreateAllocation` answer into the
//! environment and mounts a container gets (the device plugin's Allocate
//! response, the DRA plugin's per-claim CDI spec).
//!
//! The manager says what belongs to the allocation (`Allocation.env`: the
//! `TESSERA_*` variables and the GPUs in `NVIDIA_VISIBLE_DEVICES`;
//! `Allocation.mounts`: its control file read-only, its state file
//! read-write, the hook; `manager/src/wire.rs`). The plugin adds what only
//! it knows: how the node's device-list strategy hands the GPUs over, and
//! the node-wide shim files. Those come from the plugin's [`HostPaths`], in
//! place of the manager's hook mount, because under the `cdi` strategy the
//! device plugin's node-wide spec mounts them from there: one hook file
//! whichever strategy a container came through.

use std::path::PathBuf;

use tessera_contract::env;
use tessera_contract::paths::{CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY, CONTAINER_STATE};
use tessera_proto::manager::v1 as mgr;

use crate::cdi::{ContainerEdits, HostPaths, Mount, shim_mounts};
use crate::config::DeviceListStrategy;

/// Where the `volume-mounts` strategy puts one (empty) mount per GPU; also
/// the value of `NVIDIA_VISIBLE_DEVICES` under that strategy, as NVIDIA's
/// device plugin has it.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// The host side of those mounts: only their container paths mean something.
pub const VOLUME_MOUNTS_HOST: &str = "/dev/null";

/// What the plugin adds to the manager's answer.
#[derive(Debug, Clone, Copy)]
pub struct EditOptions<'a> {
    /// The node-wide files on the host.
    pub host: &'a HostPaths,
    /// How the GPUs themselves reach the container: `envvar` sets
    /// `NVIDIA_VISIBLE_DEVICES` to their UUIDs (the manager's value);
    /// `volume_mounts` mounts `/dev/null` at [`VOLUME_MOUNTS_ROOT`]`/<uuid>`
    /// for each and, without `envvar`, points `NVIDIA_VISIBLE_DEVICES` at
    /// that directory (the toolkit then reads the mounts); `cdi` alone adds
    /// nothing here (the GPUs come as CDI devices named beside these edits).
    pub gpus: DeviceListStrategy,
    /// Mount the hook (and the preload list when `ld_so_preload`); false
    /// when another CDI spec a container names mounts them.
    pub shim_files: bool,
    /// The node config's `ldSoPreload`: `/etc/ld.so.preload` mounted.
    pub ld_so_preload: bool,
    /// Set `LD_PRELOAD` to the hook (the DRA plugin: its pods never pass the
    /// webhook, which prepends the hook to the pod's own `LD_PRELOAD`).
    pub ld_preload: bool,
}

/// The manager's answer lacks something every container needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditsError {
    #[error(
        "the manager's answer for allocation {id:?} has no {what}; is the manager older than the plugin?"
    )]
    Missing { id: String, what: String },
}

/// The container's edits for `alloc` (see the module docs). Errors when the
/// answer lacks the control or state mount or a `TESSERA_*` variable: a
/// container without them would run ungoverned or fail closed.
pub fn allocation_edits(
    alloc: &mgr::Allocation,
    opts: EditOptions<'_>,
) -> Result<ContainerEdits, EditsError> {
    let missing = |what: &str| EditsError::Missing {
        id: alloc.id.clone(),
        what: what.to_owned(),
    };
    for key in [env::CONTROL, env::STATE, env::ALLOCATION] {
        if !alloc.env.contains_key(key) {
            return Err(missing(&format!("{key} in its environment")));
        }
    }
    for path in [CONTAINER_CONTROL, CONTAINER_STATE] {
        if !alloc.mounts.iter().any(|m| m.container_path == path) {
            return Err(missing(&format!("mount at {path}")));
        }
    }
    let mut edits = ContainerEdits::default();
    for (k, v) in &alloc.env {
        if k != env::NVIDIA_VISIBLE_DEVICES {
            edits.env.insert(k.clone(), v.clone());
        }
    }
    let uuids: Vec<&str> = alloc.devices.iter().map(|d| d.gpu_uuid.as_str()).collect();
    if opts.gpus.envvar {
        // The manager's value when it gave one (its GPUs, in the
        // allocation's order), else the same built from its devices.
        let v = alloc
            .env
            .get(env::NVIDIA_VISIBLE_DEVICES)
            .cloned()
            .unwrap_or_else(|| uuids.join(","));
        edits.env.insert(env::NVIDIA_VISIBLE_DEVICES.to_owned(), v);
    } else if opts.gpus.volume_mounts {
        edits.env.insert(
            env::NVIDIA_VISIBLE_DEVICES.to_owned(),
            VOLUME_MOUNTS_ROOT.to_owned(),
        );
    }
    if opts.ld_preload {
        edits.env.insert(
            env::LD_PRELOAD.to_owned(),
            CONTAINER_HOOK_LIBRARY.to_owned(),
        );
    }
    edits.mounts = alloc
        .mounts
        .iter()
        .filter(|m| m.container_path != CONTAINER_HOOK_LIBRARY)
        .map(|m| Mount {
            host_path: PathBuf::from(&m.host_path),
            container_path: m.container_path.clone(),
            read_only: m.read_only,
        })
        .collect();
    if opts.shim_files {
        edits
            .mounts
            .extend(shim_mounts(opts.host, opts.ld_so_preload));
    }
    if opts.gpus.volume_mounts {
        for u in &uuids {
            edits.mounts.push(Mount {
                host_path: PathBuf::from(VOLUME_MOUNTS_HOST),
                container_path: format!("{VOLUME_MOUNTS_ROOT}/{u}"),
                read_only: true,
            });
        }
    }
    Ok(edits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::ManagerApi;
    use crate::testing::FakeManager;
    use tessera_contract::paths::CONTAINER_PRELOAD;

    fn answer() -> mgr::Allocation {
        let m = FakeManager::new("/manager/libtessera.so");
        futures::executor::block_on(
            m.create_allocation(mgr::CreateAllocationRequest {
                id: "a1".into(),
                devices: ["GPU-b", "GPU-a"]
                    .iter()
                    .map(|u| mgr::DeviceRequest {
                        gpu_uuid: (*u).into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
        )
        .expect("create")
    }

    fn host() -> HostPaths {
        HostPaths {
            hook_library: "/node/libtessera.so".into(),
            preload_file: "/node/ld.so.preload".into(),
        }
    }

    const ENVVAR: DeviceListStrategy = DeviceListStrategy {
        envvar: true,
        volume_mounts: false,
        cdi: false,
    };
    const VOLUMES: DeviceListStrategy = DeviceListStrategy {
        envvar: false,
        volume_mounts: true,
        cdi: false,
    };
    const CDI: DeviceListStrategy = DeviceListStrategy {
        envvar: false,
        volume_mounts: false,
        cdi: true,
    };

    fn opts(host: &HostPaths, gpus: DeviceListStrategy) -> EditOptions<'_> {
        EditOptions {
            host,
            gpus,
            shim_files: true,
            ld_so_preload: false,
            ld_preload: false,
        }
    }

    fn mount<'a>(e: &'a ContainerEdits, path: &str) -> Option<&'a Mount> {
        e.mounts.iter().find(|m| m.container_path == path)
    }

    #[test]
    fn the_allocations_files_and_env_come_from_the_manager() {
        let a = answer();
        let h = host();
        let e = allocation_edits(&a, opts(&h, ENVVAR)).expect("edits");
        assert_eq!(e.env[env::ALLOCATION], "a1");
        assert_eq!(e.env[env::CONTROL], CONTAINER_CONTROL);
        assert_eq!(e.env[env::NVIDIA_VISIBLE_DEVICES], "GPU-b,GPU-a");
        assert!(!e.env.contains_key(env::LD_PRELOAD), "the webhook's to set");
        let c = mount(&e, CONTAINER_CONTROL).expect("control");
        assert_eq!(c.host_path, PathBuf::from(&a.control_path));
        assert!(c.read_only, "limits are never the tenant's to write");
        assert!(!mount(&e, CONTAINER_STATE).expect("state").read_only);
        // The hook from the node's paths, once; no preload list unasked.
        let hooks: Vec<_> = e
            .mounts
            .iter()
            .filter(|m| m.container_path == CONTAINER_HOOK_LIBRARY)
            .collect();
        assert_eq!(hooks.len(), 1);
        assert_eq!(hooks[0].host_path, h.hook_library);
        assert!(mount(&e, CONTAINER_PRELOAD).is_none());
    }

    #[test]
    fn each_strategy_hands_the_gpus_over_its_own_way() {
        let a = answer();
        let h = host();
        let v = allocation_edits(&a, opts(&h, VOLUMES)).expect("edits");
        assert_eq!(v.env[env::NVIDIA_VISIBLE_DEVICES], VOLUME_MOUNTS_ROOT);
        let m = mount(&v, &format!("{VOLUME_MOUNTS_ROOT}/GPU-a")).expect("GPU-a");
        assert_eq!(m.host_path, PathBuf::from(VOLUME_MOUNTS_HOST));
        let both = DeviceListStrategy {
            envvar: true,
            ..VOLUMES
        };
        let b = allocation_edits(&a, opts(&h, both)).expect("edits");
        assert_eq!(b.env[env::NVIDIA_VISIBLE_DEVICES], "GPU-b,GPU-a");
        assert_eq!(b.mounts.len(), 5, "two files, the hook, two GPUs");

        let mut o = opts(&h, CDI);
        o.shim_files = false;
        let c = allocation_edits(&a, o).expect("edits");
        assert!(!c.env.contains_key(env::NVIDIA_VISIBLE_DEVICES));
        assert!(
            mount(&c, CONTAINER_HOOK_LIBRARY).is_none(),
            "the node spec's"
        );
        assert_eq!(c.mounts.len(), 2, "the allocation's two files");

        let mut o = opts(&h, CDI);
        o.ld_preload = true;
        o.ld_so_preload = true;
        let d = allocation_edits(&a, o).expect("edits");
        assert_eq!(d.env[env::LD_PRELOAD], CONTAINER_HOOK_LIBRARY);
        assert_eq!(
            mount(&d, CONTAINER_PRELOAD).expect("preload").host_path,
            h.preload_file
        );
    }

    #[test]
    fn an_answer_without_the_allocations_files_is_refused() {
        let h = host();
        let mut a = answer();
        a.mounts.retain(|m| m.container_path != CONTAINER_STATE);
        let e = allocation_edits(&a, opts(&h, ENVVAR)).unwrap_err();
        assert!(e.to_string().contains(CONTAINER_STATE), "{e}");
        let mut a = answer();
        a.env.remove(env::CONTROL);
        let e = allocation_edits(&a, opts(&h, ENVVAR)).unwrap_err();
        assert!(e.to_string().contains(env::CONTROL), "{e}");
    }
}
