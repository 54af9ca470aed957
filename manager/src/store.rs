//! The allocations on disk, and the open files of the ones being served.
//!
//! On disk, `allocations/<id>/` holds `control`, `state` and
//! `allocation.json`. A directory is built under a temporary name and
//! renamed into place, so one named after an id is always complete; a
//! restarted manager picks every allocation up again from here.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;
use tessera_shm::{Control, ControlSpec, State};

use crate::alloc::{AllocError, AllocationRecord, RECORD_FILE, check_id, io};
use crate::arbiter::AllocationFiles;

/// The allocation directories under the state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A directory that could not be loaded, moved aside so nothing is lost.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub from: PathBuf,
    pub to: PathBuf,
    pub reason: String,
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AllocError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io(path))
}

fn sync_dir(dir: &Path) {
    // Makes a rename durable; a failure here loses nothing but durability.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Store {
    /// Opens (creating) the allocations directory.
    pub fn open(dir: &Path) -> Result<Self, AllocError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        Ok(Store {
            dir: dir.to_owned(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn alloc_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Writes an allocation's files and record and publishes them at once.
    /// Returns the control and state paths.
    pub fn create(
        &self,
        rec: &AllocationRecord,
        spec: &ControlSpec,
    ) -> Result<(PathBuf, PathBuf), AllocError> {
        let final_dir = self.alloc_dir(&rec.id);
        if final_dir.exists() {
            return Err(AllocError::Conflict(format!(
                "{} already exists on disk",
                final_dir.display()
            )));
        }
        let tmp = self
            .dir
            .join(format!(".new-{}-{}", rec.id, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let result = (|| {
            tessera_shm::create_allocation_files(&tmp, spec)?;
            let json = serde_json::to_vec_pretty(rec).map_err(|e| AllocError::Io {
                path: tmp.join(RECORD_FILE),
                error: std::io::Error::other(e),
            })?;
            write_atomically(&tmp.join(RECORD_FILE), &json)?;
            // The files must be readable by containers of any uid.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(io(&tmp))?;
            std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        sync_dir(&self.dir);
        Ok((final_dir.join("control"), final_dir.join("state")))
    }

    /// Rewrites an existing allocation's record.
    pub fn save(&self, rec: &AllocationRecord) -> Result<(), AllocError> {
        let json = serde_json::to_vec_pretty(rec).map_err(|e| AllocError::Io {
            path: self.alloc_dir(&rec.id).join(RECORD_FILE),
            error: std::io::Error::other(e),
        })?;
        write_atomically(&self.alloc_dir(&rec.id).join(RECORD_FILE), &json)
    }

    /// Removes an allocation's directory.
    pub fn remove(&self, id: &str) -> Result<(), AllocError> {
        let dir = self.alloc_dir(id);
        // Renamed away first, so a crash half-way leaves no directory that
        // looks like a live allocation.
        let doomed = self
            .dir
            .join(format!(".deleted-{id}-{}", std::process::id()));
        std::fs::rename(&dir, &doomed).map_err(io(&dir))?;
        sync_dir(&self.dir);
        std::fs::remove_dir_all(&doomed).map_err(io(&doomed))
    }

    /// Reads one allocation directory's record.
    pub fn read(&self, dir: &Path) -> Result<AllocationRecord, String> {
        let path = dir.join(RECORD_FILE);
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let rec: AllocationRecord =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if rec.id != name {
            return Err(format!(
                "{}: record is for {:?}, directory is {name:?}",
                path.display(),
                rec.id
            ));
        }
        check_id(&rec.id).map_err(|e| e.to_string())?;
        Ok(rec)
    }

    /// Every allocation directory's record. Unfinished creations and
    /// deletions are cleaned up; a directory that cannot be read is moved
    /// to `.broken-<name>-<time>` and reported, never deleted.
    pub fn load_all(&self) -> Result<(Vec<AllocationRecord>, Vec<Quarantined>), AllocError> {
        let mut records = Vec::new();
        let mut broken = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(io(&self.dir))?;
        let mut names: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        for path in names {
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if name.starts_with(".new-") || name.starts_with(".deleted-") {
                // Never handed out (new) or already gone (deleted).
                let _ = std::fs::remove_dir_all(&path);
                continue;
            }
            if name.starts_with('.') || !path.is_dir() {
                continue;
            }
            match self.read(&path) {
                Ok(rec) => records.push(rec),
                Err(reason) => {
                    let stamp = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let to = self.dir.join(format!(".broken-{name}-{stamp}"));
                    std::fs::rename(&path, &to).map_err(io(&path))?;
                    broken.push(Quarantined {
                        from: path,
                        to,
                        reason,
                    });
                }
            }
        }
        Ok((records, broken))
    }
}

/// An allocation the manager serves: its record and its open files.
#[derive(Debug)]
pub struct LiveAllocation {
    record: RwLock<AllocationRecord>,
    control: Control,
    state: State,
    dir: PathBuf,
}

impl LiveAllocation {
    /// Opens the files of the allocation `rec` in `dir` and checks that
    /// they are its own.
    pub fn open(rec: AllocationRecord, dir: PathBuf) -> Result<Self, AllocError> {
        let control = Control::open_rw(&dir.join("control"))?;
        let state = State::open(&dir.join("state"), &rec.id)?;
        if control.alloc_id() != rec.id {
            return Err(AllocError::Invalid(format!(
                "{}: control file is for {:?}",
                dir.display(),
                control.alloc_id()
            )));
        }
        Ok(LiveAllocation {
            record: RwLock::new(rec),
            control,
            state,
            dir,
        })
    }

    pub fn id(&self) -> String {
        self.record.read().id.clone()
    }
    /// A copy of the record.
    pub fn record(&self) -> AllocationRecord {
        self.record.read().clone()
    }
    /// Replaces the record (the files on disk are the caller's to update).
    pub fn set_record(&self, rec: AllocationRecord) {
        *self.record.write() = rec;
    }
    /// The control file, mapped read-write.
    pub fn control(&self) -> &Control {
        &self.control
    }
    pub fn state(&self) -> &State {
        &self.state
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The arbiter reads and drives an allocation through its files.
impl AllocationFiles for LiveAllocation {
    fn control(&self) -> &Control {
        LiveAllocation::control(self)
    }
    fn state(&self) -> &State {
        LiveAllocation::state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::normalize;
    use crate::gpu::GpuInfo;
    use crate::gpu::fake::test_gpu;
    use tessera_proto::manager::v1 as pb;

    const GI: u64 = 1 << 30;

    fn gpus() -> Vec<GpuInfo> {
        vec![test_gpu(0, 16 * GI)]
    }

    fn req(uuid: &str, mem: u64, ppm: u32) -> pb::CreateAllocationRequest {
        pb::CreateAllocationRequest {
            id: "a1".into(),
            devices: vec![pb::DeviceRequest {
                gpu_uuid: uuid.into(),
                memory_limit_bytes: mem,
                compute_share_ppm: ppm,
                slices: 0,
            }],
            ..Default::default()
        }
    }

    fn norm(r: &pb::CreateAllocationRequest) -> Result<AllocationRecord, AllocError> {
        normalize(r, r.id.clone(), &gpus(), tessera_shm::Policy::Burst, 1)
    }

    #[test]
    fn store_round_trip_and_quarantine() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let g = gpus();
        let rec = norm(&req(&g[0].uuid, 4 * GI, 300_000)).unwrap();
        let (control, state) = store.create(&rec, &rec.control_spec(0)).unwrap();
        assert!(control.ends_with("a1/control") && state.ends_with("a1/state"));
        tessera_shm::Control::open(&control).unwrap();
        tessera_shm::State::open(&state, "a1").unwrap();
        assert!(matches!(
            store.create(&rec, &rec.control_spec(0)),
            Err(AllocError::Conflict(_))
        ));

        let mut owned = rec.clone();
        owned.pod = "p".into();
        store.save(&owned).unwrap();

        // Leftovers of a crash, and a broken record.
        std::fs::create_dir_all(store.dir().join(".new-x-1")).unwrap();
        std::fs::create_dir_all(store.dir().join("b2")).unwrap();
        std::fs::write(store.dir().join("b2").join(RECORD_FILE), "{not json").unwrap();

        let (recs, broken) = store.load_all().unwrap();
        assert_eq!(recs, vec![owned]);
        assert_eq!(broken.len(), 1);
        assert!(
            broken[0].reason.contains(RECORD_FILE),
            "{}",
            broken[0].reason
        );
        assert!(broken[0].to.exists(), "a broken directory is kept");
        assert!(!store.dir().join(".new-x-1").exists());

        store.remove("a1").unwrap();
        assert!(!store.alloc_dir("a1").exists());
        assert_eq!(store.load_all().unwrap().0, vec![]);
    }

    #[test]
    fn a_live_allocation_opens_only_its_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let rec = norm(&req(&gpus()[0].uuid, 4 * GI, 300_000)).unwrap();
        store.create(&rec, &rec.control_spec(0)).unwrap();
        let live = LiveAllocation::open(rec.clone(), store.alloc_dir("a1")).unwrap();
        assert_eq!(live.id(), "a1");
        assert_eq!(live.control().memory_limit(0), 4 * GI);
        let mut other = rec;
        other.id = "zz".into();
        let e = LiveAllocation::open(other, store.alloc_dir("a1")).unwrap_err();
        assert!(
            e.to_string().contains("\"a1\"") || e.to_string().contains("zz"),
            "{e}"
        );
    }
}
