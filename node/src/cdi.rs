//! Container Device Interface (CDI) specs: a [`Spec`] names devices of one
//! kind (`vendor/class`), each with the [`ContainerEdits`] a runtime applies
//! to a container that asks for it (`kind=name`); [`write_spec`] puts it in a
//! spec directory (`/var/run/cdi`) atomically, [`remove_spec`] takes it away.
//! Format: the CDI specification, `cdiVersion` [`CDI_VERSION`].
//!
//! The device plugin writes one node-wide spec of kind [`KIND_TESSERA`]
//! naming each GPU by UUID, whose edits mount the shim ([`shim_mounts`]). A
//! DRA plugin writes one spec per claim, naming its devices after the claim
//! (so a name is never reused), with the allocation's files and `TESSERA_*`
//! environment in the edits too. The GPU itself (device nodes, driver
//! libraries) comes from the NVIDIA container toolkit's own spec,
//! [`KIND_NVIDIA`]`=<uuid>` (`nvidia-ctk cdi generate`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_contract::paths::{CONTAINER_HOOK_LIBRARY, CONTAINER_PRELOAD};

/// The spec version written (the oldest that has everything used here).
pub const CDI_VERSION: &str = "0.6.0";
/// CDI kind of Tessera's devices.
pub const KIND_TESSERA: &str = "tessera.dev/gpu";
/// CDI kind of the NVIDIA container toolkit's spec: each GPU's device nodes
/// and driver libraries, by UUID.
pub const KIND_NVIDIA: &str = "nvidia.com/gpu";

/// Why a spec cannot be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("CDI spec file name {0:?}: give a plain file name ending in .json")]
    FileName(String),
    #[error("CDI kind {0:?}: expected vendor/class, e.g. tessera.dev/gpu")]
    Kind(String),
    #[error(
        "CDI device name {0:?}: expected letters, digits, '-', '_', '.' or ':', starting and ending with a letter or digit"
    )]
    DeviceName(String),
    #[error("CDI device name {0:?} appears twice in the spec")]
    Duplicate(String),
    #[error("CDI device {0:?} has no container edits (runtimes refuse such a device)")]
    NoEdits(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Host paths of the node-wide files every container under Tessera mounts
/// besides its allocation's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// The hook library (the shim) on the host.
    pub hook_library: PathBuf,
    /// The `ld.so.preload` file on the host (mounted when the node config
    /// enables `ldSoPreload`).
    pub preload_file: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            hook_library: PathBuf::from(tessera_contract::paths::HOST_HOOK_LIBRARY),
            preload_file: PathBuf::from(tessera_contract::paths::HOST_PRELOAD_FILE),
        }
    }
}

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: String,
    pub read_only: bool,
}

/// What a runtime applies to a container for one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// Environment variables set in the container.
    pub env: BTreeMap<String, String>,
    /// Mounts, in order (a later mount at the same container path replaces
    /// an earlier one).
    pub mounts: Vec<Mount>,
}

/// One device of a spec: named `kind=name` by a container that asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub edits: ContainerEdits,
}

/// A CDI spec: devices of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `vendor/class`, e.g. [`KIND_TESSERA`].
    pub kind: String,
    pub devices: Vec<Device>,
}

/// The shim's node-wide mounts: the hook library at its container path, and
/// the preload list at `/etc/ld.so.preload` when `ld_so_preload` (the node
/// config's `ldSoPreload`). All read-only.
pub fn shim_mounts(host: &HostPaths, ld_so_preload: bool) -> Vec<Mount> {
    let mut mounts = vec![Mount {
        host_path: host.hook_library.clone(),
        container_path: CONTAINER_HOOK_LIBRARY.to_owned(),
        read_only: true,
    }];
    if ld_so_preload {
        mounts.push(Mount {
            host_path: host.preload_file.clone(),
            container_path: CONTAINER_PRELOAD.to_owned(),
            read_only: true,
        });
    }
    mounts
}

/// The text of the `ld.so.preload` file: the hook's container path.
pub fn preload_contents() -> String {
    format!("{CONTAINER_HOOK_LIBRARY}\n")
}

/// Makes sure the host's preload file (what [`shim_mounts`] mounts when
/// `ldSoPreload` is on) exists with the right text; written through a
/// temporary file and a rename so no container sees half of it
/// ([`tessera_contract::file`]).
pub fn ensure_preload_file(path: &Path) -> std::io::Result<()> {
    let want = preload_contents();
    if std::fs::read_to_string(path).is_ok_and(|have| have == want) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    tessera_contract::file::write_durably(path, want.as_bytes(), 0o644)
}

/// The fully qualified name a container asks for: `kind=name`.
pub fn qualified_name(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

impl Spec {
    /// Checks the kind and the device names as the CDI specification has
    /// them, and that every device has an edit; a runtime refuses a spec
    /// that breaks them.
    pub fn validate(&self) -> Result<(), CdiError> {
        let label = |s: &str, extra: &[char]| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        match self.kind.split_once('/') {
            Some((vendor, class))
                if label(vendor, &['-', '_', '.']) && label(class, &['-', '_']) => {}
            _ => return Err(CdiError::Kind(self.kind.clone())),
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            if !label(&d.name, &['-', '_', '.', ':']) {
                return Err(CdiError::DeviceName(d.name.clone()));
            }
            if !seen.insert(d.name.as_str()) {
                return Err(CdiError::Duplicate(d.name.clone()));
            }
            if d.edits.env.is_empty() && d.edits.mounts.is_empty() {
                return Err(CdiError::NoEdits(d.name.clone()));
            }
        }
        Ok(())
    }

    /// The spec as JSON, the way a runtime reads it.
    pub fn to_json(&self) -> serde_json::Value {
        let devices: Vec<serde_json::Value> = self
            .devices
            .iter()
            .map(|d| {
                let mounts: Vec<serde_json::Value> = d
                    .edits
                    .mounts
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "hostPath": m.host_path.display().to_string(),
                            "containerPath": m.container_path,
                            "options": [if m.read_only { "ro" } else { "rw" }, "nosuid", "nodev", "bind"],
                        })
                    })
                    .collect();
                let mut edits = serde_json::Map::new();
                if !d.edits.env.is_empty() {
                    let env: Vec<String> =
                        d.edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    edits.insert("env".into(), env.into());
                }
                edits.insert("mounts".into(), mounts.into());
                serde_json::json!({"name": d.name, "containerEdits": edits})
            })
            .collect();
        serde_json::json!({"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": devices})
    }
}

fn check_file_name(file_name: &str) -> Result<(), CdiError> {
    let plain = !file_name.starts_with('.')
        && file_name.len() > ".json".len()
        && file_name.ends_with(".json")
        && !file_name.contains(['/', '\0']);
    if plain {
        Ok(())
    } else {
        Err(CdiError::FileName(file_name.to_owned()))
    }
}

/// Writes `spec` to `dir/file_name` (a plain name ending in `.json`; the
/// directory is made if missing) unless the file already holds exactly that;
/// `Ok(true)` when written. Through a temporary file and a rename, so a
/// runtime never reads half a spec. The spec is validated first.
pub fn write_spec(dir: &Path, file_name: &str, spec: &Spec) -> Result<bool, CdiError> {
    check_file_name(file_name)?;
    spec.validate()?;
    let path = dir.join(file_name);
    let io = |source| CdiError::Io {
        path: path.display().to_string(),
        source,
    };
    let text = serde_json::to_string_pretty(&spec.to_json())
        .map_err(|e| io(std::io::Error::other(e)))?
        + "\n";
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    // The temporary file is a dot file: runtimes read only `*.json` and
    // `*.yaml`, never it; a runtime never reads half a spec, and a written
    // spec is still there after a crash.
    tessera_contract::file::write_durably(&path, text.as_bytes(), 0o644).map_err(io)?;
    Ok(true)
}

/// Removes `dir/file_name`; `Ok(false)` when it was not there.
pub fn remove_spec(dir: &Path, file_name: &str) -> Result<bool, CdiError> {
    check_file_name(file_name)?;
    let path = dir.join(file_name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CdiError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim_edits() -> ContainerEdits {
        ContainerEdits {
            env: BTreeMap::new(),
            mounts: shim_mounts(&HostPaths::default(), false),
        }
    }

    fn device(name: &str, edits: ContainerEdits) -> Device {
        Device {
            name: name.into(),
            edits,
        }
    }

    #[test]
    fn json_has_the_names_env_and_mounts() {
        let host = HostPaths::default();
        let mut edits = ContainerEdits {
            env: [("TESSERA_ALLOCATION".to_owned(), "a1".to_owned())].into(),
            mounts: shim_mounts(&host, true),
        };
        edits.mounts.push(Mount {
            host_path: "/var/lib/tessera/allocations/a1/state".into(),
            container_path: "/run/tessera/alloc/state".into(),
            read_only: false,
        });
        let env_only = ContainerEdits {
            env: [("A".to_owned(), "1".to_owned())].into(),
            mounts: Vec::new(),
        };
        let spec = Spec {
            kind: KIND_TESSERA.into(),
            devices: vec![device("claim-1234-0", edits), device("GPU-b", env_only)],
        };
        spec.validate().expect("valid");
        let j = spec.to_json();
        assert_eq!(j["cdiVersion"], "0.6.0");
        assert_eq!(j["kind"], "tessera.dev/gpu");
        assert_eq!(j["devices"][0]["name"], "claim-1234-0");
        let e = &j["devices"][0]["containerEdits"];
        assert_eq!(e["env"], serde_json::json!(["TESSERA_ALLOCATION=a1"]));
        assert_eq!(
            e["mounts"][0]["hostPath"],
            "/var/lib/tessera/lib/libtessera.so"
        );
        assert_eq!(e["mounts"][0]["containerPath"], CONTAINER_HOOK_LIBRARY);
        assert_eq!(
            e["mounts"][0]["options"],
            serde_json::json!(["ro", "nosuid", "nodev", "bind"])
        );
        assert_eq!(e["mounts"][1]["containerPath"], "/etc/ld.so.preload");
        assert_eq!(e["mounts"][2]["options"][0], "rw");
        assert_eq!(
            j["devices"][1]["containerEdits"]["mounts"],
            serde_json::json!([])
        );
        let mounts_only = Spec {
            kind: KIND_TESSERA.into(),
            devices: vec![device(
                "GPU-c",
                ContainerEdits {
                    env: BTreeMap::new(),
                    mounts: shim_mounts(&host, false),
                },
            )],
        };
        let e = &mounts_only.to_json()["devices"][0]["containerEdits"];
        assert!(e.get("env").is_none(), "no env key without env: {e}");
        assert_eq!(shim_mounts(&host, false).len(), 1);
        assert_eq!(
            qualified_name(KIND_TESSERA, "GPU-b"),
            "tessera.dev/gpu=GPU-b"
        );
    }

    #[test]
    fn write_is_atomic_idempotent_and_removable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let device = |name: &str, _: ContainerEdits| device(name, shim_edits());
        let d = dir.path().join("cdi");
        let mut spec = Spec {
            kind: KIND_TESSERA.into(),
            devices: vec![device("GPU-a", ContainerEdits::default())],
        };
        assert!(write_spec(&d, "tessera.json", &spec).expect("write"));
        assert!(
            !write_spec(&d, "tessera.json", &spec).expect("same"),
            "unchanged: not rewritten"
        );
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("tessera.json")).expect("read"))
                .expect("json");
        assert_eq!(back, spec.to_json());
        spec.devices
            .push(device("GPU-b", ContainerEdits::default()));
        assert!(write_spec(&d, "tessera.json", &spec).expect("changed"));
        let names: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["tessera.json"], "no temporary file left");
        assert!(remove_spec(&d, "tessera.json").expect("remove"));
        assert!(!remove_spec(&d, "tessera.json").expect("gone"));
    }

    #[test]
    fn bad_specs_and_names_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = |name: &str| Spec {
            kind: KIND_TESSERA.into(),
            devices: vec![device(name, shim_edits())],
        };
        for bad in ["", "-a", "a-", "a/b", "a b", "é"] {
            assert!(
                matches!(
                    write_spec(dir.path(), "x.json", &ok(bad)),
                    Err(CdiError::DeviceName(_))
                ),
                "{bad:?}"
            );
        }
        let mut twice = ok("a");
        twice.devices.push(device("a", shim_edits()));
        assert!(matches!(
            write_spec(dir.path(), "x.json", &twice),
            Err(CdiError::Duplicate(_))
        ));
        let mut empty = ok("a");
        empty.devices[0].edits = ContainerEdits::default();
        assert!(matches!(
            write_spec(dir.path(), "x.json", &empty),
            Err(CdiError::NoEdits(_))
        ));
        for kind in ["tessera.dev", "/gpu", "tessera.dev/", "a/b/c", "a/b.c"] {
            let mut s = ok("a");
            s.kind = kind.into();
            assert!(
                matches!(write_spec(dir.path(), "x.json", &s), Err(CdiError::Kind(_))),
                "{kind:?}"
            );
        }
        for name in ["", ".json", "../x.json", "x.yaml", ".x.json", "a/x.json"] {
            assert!(
                matches!(
                    write_spec(dir.path(), name, &ok("a")),
                    Err(CdiError::FileName(_))
                ),
                "{name:?}"
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }
}
