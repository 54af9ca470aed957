//! What this plugin has prepared, kept in a file under its plugin directory
//! so that a plugin killed between prepare and unprepare answers a repeated
//! prepare exactly as before and still unprepares after a restart. Written
//! whole to a temporary file, synced, renamed over the old one, so a crash
//! leaves the old file or the new one, never half of one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The checkpoint's file name in the plugin directory.
pub const FILE: &str = "checkpoint.json";
/// The format written; a file of another version is refused.
pub const VERSION: u32 = 1;

/// Why the checkpoint cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read the checkpoint {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the checkpoint {path} is not valid ({reason}); it is left as it is: move it away \
         to start with nothing prepared"
    )]
    Invalid { path: String, reason: String },
    #[error("cannot write the checkpoint {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One device of a prepared claim, as answered to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedDevice {
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
    /// The allocation result's `shareID`, answered again after a restart;
    /// absent in checkpoints written before it was kept (and for devices
    /// not allocated per share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    /// The claim's allocation; for a claim prepared as one allocation per
    /// request (`crate::split`), the first.
    pub allocation: String,
    /// The claim's other allocations, when it was prepared as one per
    /// request; absent for a claim of one allocation, so that records of
    /// those read as before (and an older plugin, which would not know to
    /// delete these, refuses a file with them rather than leak them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_allocations: Vec<String>,
    pub devices: Vec<PreparedDevice>,
}

impl PreparedClaim {
    /// Every allocation the claim was prepared as.
    pub fn allocations(&self) -> Vec<String> {
        std::iter::once(self.allocation.clone())
            .chain(self.more_allocations.iter().cloned())
            .collect()
    }
}

/// Every prepared claim, by uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u32,
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// The checkpoint file and what it holds.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    pub data: Checkpoint,
}

impl Store {
    /// Reads the checkpoint in `dir`; none there is an empty one.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(FILE);
        let shown = path.display().to_string();
        let data = match std::fs::read(&path) {
            Ok(bytes) => {
                let c: Checkpoint =
                    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Invalid {
                        path: shown.clone(),
                        reason: e.to_string(),
                    })?;
                if c.version != VERSION {
                    return Err(CheckpointError::Invalid {
                        path: shown,
                        reason: format!("version {}, this plugin reads {VERSION}", c.version),
                    });
                }
                c
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint {
                version: VERSION,
                claims: BTreeMap::new(),
            },
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: shown,
                    source,
                });
            }
        };
        Ok(Self { path, data })
    }

    /// Writes `data` as the checkpoint; the file is unchanged when this fails.
    pub fn save(&self, data: &Checkpoint) -> Result<(), CheckpointError> {
        let text = serde_json::to_vec_pretty(data).map_err(|e| CheckpointError::Write {
            path: self.path.display().to_string(),
            source: std::io::Error::other(e),
        })?;
        tessera_contract::file::write_durably(&self.path, &text, 0o644).map_err(|source| {
            CheckpointError::Write {
                path: self.path.display().to_string(),
                source,
            }
        })
    }

    /// Records (or replaces) a claim: written before it is kept in memory.
    pub fn insert(&mut self, uid: &str, claim: PreparedClaim) -> Result<(), CheckpointError> {
        let mut next = self.data.clone();
        next.claims.insert(uid.to_owned(), claim);
        self.save(&next)?;
        self.data = next;
        Ok(())
    }

    /// Forgets a claim: written before it is forgotten in memory.
    pub fn remove(&mut self, uid: &str) -> Result<(), CheckpointError> {
        if !self.data.claims.contains_key(uid) {
            return Ok(());
        }
        let mut next = self.data.clone();
        next.claims.remove(uid);
        self.save(&next)?;
        self.data = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_reopen_and_refuses_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        assert!(s.data.claims.is_empty());
        let c = PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            allocation: "dra-u".into(),
            more_allocations: Vec::new(),
            devices: vec![
                PreparedDevice {
                    requests: vec!["gpu".into()],
                    pool: "node".into(),
                    device: "gpu-a-s0".into(),
                    cdi_device_ids: vec!["vgpu.tessera.dev/claim=u".into()],
                    share_id: None,
                },
                PreparedDevice {
                    requests: vec!["gpu".into()],
                    pool: "node".into(),
                    device: "gpu-b".into(),
                    cdi_device_ids: vec![],
                    share_id: Some("0f0e0d0c-0000-4000-8000-000000000001".into()),
                },
            ],
        };
        s.insert("u", c.clone()).unwrap();
        let again = Store::open(dir.path()).unwrap();
        // The share id survives a restart: the kubelet is answered the same.
        assert_eq!(again.data.claims.get("u"), Some(&c));
        // A checkpoint written before share ids were kept still reads.
        std::fs::write(
            dir.path().join(FILE),
            "{\"version\": 1, \"claims\": {\"u\": {\"namespace\": \"ns\", \"name\": \"c\", \
             \"allocation\": \"dra-u\", \"devices\": [{\"requests\": [\"gpu\"], \"pool\": \"node\", \
             \"device\": \"gpu-a-s0\", \"cdiDeviceIds\": []}]}}}",
        )
        .unwrap();
        let old = Store::open(dir.path()).unwrap();
        assert_eq!(old.data.claims["u"].devices[0].share_id, None);
        assert_eq!(old.data.claims["u"].allocations(), ["dra-u"]);
        let mut s = old;
        s.insert("u", c.clone()).unwrap();
        // A claim of one allocation is written as before: no new field.
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(!text.contains("moreAllocations"), "{text}");
        // A claim of one allocation per request records them all.
        let split = PreparedClaim {
            allocation: "dra-u-1".into(),
            more_allocations: vec!["dra-u-2".into()],
            ..c.clone()
        };
        s.insert("v", split.clone()).unwrap();
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.data.claims["v"], split);
        assert_eq!(again.data.claims["v"].allocations(), ["dra-u-1", "dra-u-2"]);
        s.remove("u").unwrap();
        s.remove("v").unwrap();
        assert!(Store::open(dir.path()).unwrap().data.claims.is_empty());

        std::fs::write(
            dir.path().join(FILE),
            "{\"version\": 1, \"claims\": {\"u\": 7}}",
        )
        .unwrap();
        let e = Store::open(dir.path()).unwrap_err();
        assert!(matches!(e, CheckpointError::Invalid { .. }), "{e}");
        assert!(e.to_string().contains(FILE), "{e}");
        std::fs::write(dir.path().join(FILE), "{\"version\": 9, \"claims\": {}}").unwrap();
        assert!(
            Store::open(dir.path())
                .unwrap_err()
                .to_string()
                .contains("version 9")
        );
    }
}
