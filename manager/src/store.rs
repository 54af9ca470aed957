//! The allocations on disk, and the open files of the ones being served.
//!
//! On disk, `allocations/<id>/` holds `control`, `state` and
//! `allocation.json`. A directory is built under a temporary name and
//! renamed into place, so one named after an id is always complete; a
//! restarted manager picks every allocation up again from here.
//!
//! Nothing is forgotten: every record is written twice, each time through
//! the one durable replace (`tessera_contract::file`: a temporary file,
//! fsynced, renamed over, the directory fsynced): `allocation.json`, and a
//! checksummed copy in `allocations/.records/<id>.json`, which no container
//! mounts. The control and state files are written the same way, and a
//! published allocation directory's rename is synced too.
//!
//! At start-up a record is read from the first that is whole; if both are
//! lost it is rebuilt from the control file (limits, shares; policy
//! `guaranteed`, the most restrictive), so an allocation a live process may
//! still use keeps its capacity and its place in arbitration until it is
//! deleted. Allocation files a tenant damaged (its state file is mapped
//! read-write in its container) are repaired in place (same inode: the
//! containers' mounts and mappings stay valid) from the record. Only a
//! directory with no record, no copy and no readable control file is moved
//! aside, loudly.
//!
//! Layout versions: each record carries `layout_version` ([`RECORD_VERSION`]; a record
//! without one is version 1, as written by release 0.1.0), and the control file its ABI
//! version. A record or control file of a newer layout than this manager reads stops its
//! start with one line naming the file ([`Store::load_all`]): rebuilding it as damage
//! would lose what the newer release wrote, and serving it would misread it. The state
//! file's version is never taken as that of a release: a tenant can write it, so a bad one
//! is damage, repaired as any other (see docs/upgrade.md).

use std::path::{Path, PathBuf};

use parking_lot::RwLock;
use tessera_shm::{Control, ControlSpec, State};

use crate::alloc::{AllocError, AllocationRecord, RECORD_FILE, check_id, io};
use crate::arbiter::AllocationFiles;

/// The layout version of the records this manager writes, and the newest it reads.
/// Bumped when a record changes so that an older manager would misread it.
pub const RECORD_VERSION: u32 = 1;

/// The key of a record's layout version (absent: version 1).
const VERSION_KEY: &str = "layout_version";

/// A record's JSON with its layout version, as written.
fn record_json(rec: &AllocationRecord) -> Result<Vec<u8>, serde_json::Error> {
    let mut v = serde_json::to_value(rec)?;
    if let serde_json::Value::Object(m) = &mut v {
        m.insert(VERSION_KEY.into(), RECORD_VERSION.into());
    }
    serde_json::to_vec_pretty(&v)
}

/// Why a record could not be read.
enum ReadError {
    /// Written by a newer release: never to be "recovered" by this one.
    Newer(String),
    /// Missing or damaged.
    Damaged(String),
}

impl ReadError {
    fn message(self) -> String {
        match self {
            ReadError::Newer(m) | ReadError::Damaged(m) => m,
        }
    }
}

/// Parses a record's JSON, refusing a layout newer than [`RECORD_VERSION`].
fn parse_record(bytes: &[u8], path: &Path) -> Result<AllocationRecord, ReadError> {
    let damaged = |e: serde_json::Error| ReadError::Damaged(format!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(damaged)?;
    let version = match v.get(VERSION_KEY) {
        None => 1,
        Some(n) => n.as_u64().ok_or_else(|| {
            ReadError::Damaged(format!("{}: {VERSION_KEY} is not a number", path.display()))
        })?,
    };
    if version > u64::from(RECORD_VERSION) {
        return Err(ReadError::Newer(format!(
            "{}: record layout version {version} was written by a newer Tessera; this manager \
             reads up to {RECORD_VERSION}: run the newer manager (docs/upgrade.md)",
            path.display()
        )));
    }
    serde_json::from_value(v).map_err(damaged)
}

/// A control file's ABI version, when it is a Tessera control file at all (the manager
/// writes it and containers mount it read-only, so it can be taken as the release's).
fn control_abi(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut head = [0u8; 12];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    let magic = u64::from_le_bytes(head[..8].try_into().ok()?);
    (magic == tessera_shm::layout::CONTROL_MAGIC)
        .then(|| u32::from_le_bytes(head[8..12].try_into().unwrap_or_default()))
}

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

/// What `load_all` found.
#[derive(Debug, Default)]
pub struct Loaded {
    pub records: Vec<AllocationRecord>,
    /// Directories moved aside (nothing left to rebuild them from).
    pub broken: Vec<Quarantined>,
    /// Records that were damaged and recovered: (id, how, and where from:
    /// "its checksummed copy" or "the control file").
    pub recovered: Vec<(String, String, &'static str)>,
}

/// What start-up found damaged in one allocation and repaired, reported
/// (status, metrics) until the allocation is deleted or the manager stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// What was repaired: "record", "control", "state", each once.
    pub parts: Vec<&'static str>,
    /// One line per repair, for status.
    pub notes: Vec<String>,
}

impl Recovery {
    /// Records one repair of `part`.
    pub fn add(&mut self, part: &'static str, note: String) {
        if !self.parts.contains(&part) {
            self.parts.push(part);
        }
        self.notes.push(note);
    }

    /// The metric label: the parts joined by `+` ("record+state").
    pub fn label(&self) -> String {
        self.parts.join("+")
    }

    /// The status line: every repair, `; `-separated.
    pub fn summary(&self) -> String {
        self.notes.join("; ")
    }
}

/// Where the checksummed copies of the records live, under the allocations
/// directory (a dot name: never taken for an allocation).
const RECORDS_DIR: &str = ".records";

/// FNV-1a, 64 bits: detects a damaged copy (not an adversary: only root
/// writes these files).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The checksummed form of a record: a first line `fnv1a64:<hex>`, then the
/// JSON it covers.
fn sealed(json: &[u8]) -> Vec<u8> {
    let mut out = format!("fnv1a64:{:016x}\n", fnv1a64(json)).into_bytes();
    out.extend_from_slice(json);
    out
}

fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no checksum line")?;
    let line = std::str::from_utf8(&bytes[..nl]).map_err(|_| "checksum line not text")?;
    let want = line
        .strip_prefix("fnv1a64:")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or("bad checksum line")?;
    let body = &bytes[nl + 1..];
    if fnv1a64(body) != want {
        return Err("checksum mismatch".into());
    }
    Ok(body)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AllocError> {
    tessera_contract::file::write_durably(path, bytes, 0o600).map_err(io(path))
}

fn sync_dir(dir: &Path) {
    // Makes a rename durable; a failure here loses nothing but durability.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Store {
    /// Opens (creating) the allocations directory, and proves it writable:
    /// a manager that could not write there would serve allocations it
    /// cannot record, repair or delete.
    pub fn open(dir: &Path) -> Result<Self, AllocError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // Others may pass through (a `tessera run` user to its own files),
        // not list.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(io(dir))?;
        let records = dir.join(RECORDS_DIR);
        std::fs::create_dir_all(&records).map_err(io(&records))?;
        std::fs::set_permissions(&records, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&records))?;
        let probe = dir.join(format!(".write-test-{}", std::process::id()));
        write_atomically(&probe, b"ok").map_err(|e| match e {
            AllocError::Io { error, .. } => AllocError::Io {
                path: dir.to_owned(),
                error: std::io::Error::new(error.kind(), format!("not writable: {error}")),
            },
            e => e,
        })?;
        let _ = std::fs::remove_file(&probe);
        Ok(Store {
            dir: dir.to_owned(),
        })
    }

    fn copy_path(&self, id: &str) -> PathBuf {
        self.dir.join(RECORDS_DIR).join(format!("{id}.json"))
    }

    /// Writes both copies of a record (the directory's and the sealed one).
    fn write_record(&self, dir: &Path, rec: &AllocationRecord) -> Result<(), AllocError> {
        let json = record_json(rec).map_err(|e| AllocError::Io {
            path: dir.join(RECORD_FILE),
            error: std::io::Error::other(e),
        })?;
        write_atomically(&self.copy_path(&rec.id), &sealed(&json))?;
        write_atomically(&dir.join(RECORD_FILE), &json)
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
        self.create_owned(rec, spec, None)
    }

    /// [`Store::create`], with the files private to whoever may use them
    /// (see [`secure`]): root's (containers reach them only through the
    /// device plugin's mounts), or, for `owner_uid`, that user's state file.
    pub fn create_owned(
        &self,
        rec: &AllocationRecord,
        spec: &ControlSpec,
        owner_uid: Option<u32>,
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
            self.write_record(&tmp, rec)?;
            secure(&tmp, owner_uid)?;
            std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            let _ = std::fs::remove_file(self.copy_path(&rec.id));
            return Err(e);
        }
        sync_dir(&self.dir);
        Ok((final_dir.join("control"), final_dir.join("state")))
    }

    /// Rewrites an existing allocation's record (both copies).
    pub fn save(&self, rec: &AllocationRecord) -> Result<(), AllocError> {
        self.write_record(&self.alloc_dir(&rec.id), rec)
    }

    /// Removes an allocation's directory: [`Store::retire`] then
    /// [`Store::purge`].
    pub fn remove(&self, id: &str) -> Result<(), AllocError> {
        match self.retire(id)? {
            Some(doomed) => self.purge(&doomed),
            None => Ok(()),
        }
    }

    /// The step of a delete that decides it: the directory is renamed away
    /// (and the record's copy removed). If this fails nothing has changed
    /// and the allocation must stay served; once it succeeds the allocation
    /// is gone, even across a crash (leftovers are cleaned at start-up).
    /// `None`: the directory was gone already (someone removed it, or the
    /// whole state directory, as a logout does a private manager's): there
    /// is nothing left to serve, so the delete goes through.
    pub fn retire(&self, id: &str) -> Result<Option<PathBuf>, AllocError> {
        let dir = self.alloc_dir(id);
        let doomed = self
            .dir
            .join(format!(".deleted-{id}-{}", std::process::id()));
        match std::fs::rename(&dir, &doomed) {
            Ok(()) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && std::fs::symlink_metadata(&dir).is_err() =>
            {
                let _ = std::fs::remove_file(self.copy_path(id));
                return Ok(None);
            }
            Err(e) => return Err(io(&dir)(e)),
        }
        sync_dir(&self.dir);
        let _ = std::fs::remove_file(self.copy_path(id));
        Ok(Some(doomed))
    }

    /// Removes a retired directory's files (a failure leaves only garbage
    /// that start-up removes).
    pub fn purge(&self, doomed: &Path) -> Result<(), AllocError> {
        std::fs::remove_dir_all(doomed).map_err(io(doomed))
    }

    fn check_record(rec: &AllocationRecord, name: &str, path: &Path) -> Result<(), String> {
        if rec.id != name {
            return Err(format!(
                "{}: record is for {:?}, directory is {name:?}",
                path.display(),
                rec.id
            ));
        }
        check_id(&rec.id).map_err(|e| e.to_string())
    }

    /// Reads one allocation directory's record from `allocation.json`.
    pub fn read(&self, dir: &Path) -> Result<AllocationRecord, String> {
        self.read_versioned(dir).map_err(ReadError::message)
    }

    fn read_versioned(&self, dir: &Path) -> Result<AllocationRecord, ReadError> {
        let path = dir.join(RECORD_FILE);
        let text = std::fs::read(&path)
            .map_err(|e| ReadError::Damaged(format!("{}: {e}", path.display())))?;
        let rec = parse_record(&text, &path)?;
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        Self::check_record(&rec, name, &path).map_err(ReadError::Damaged)?;
        Ok(rec)
    }

    /// Reads the sealed copy of allocation `name`'s record.
    fn read_copy(&self, name: &str) -> Result<AllocationRecord, String> {
        let path = self.copy_path(name);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let body = unseal(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let rec = parse_record(body, &path).map_err(ReadError::message)?;
        Self::check_record(&rec, name, &path)?;
        Ok(rec)
    }

    /// What can be rebuilt of a record from the allocation's control file
    /// (written only by the manager, mounted read-only): devices, limits,
    /// shares; the policy is `guaranteed`, the most restrictive; device ids,
    /// labels and owner are lost.
    fn rebuild_from_control(&self, dir: &Path, name: &str) -> Result<AllocationRecord, String> {
        let path = dir.join("control");
        let c = Control::open(&path).map_err(|e| e.to_string())?;
        if c.alloc_id() != name {
            return Err(format!(
                "{}: control is for {:?}",
                path.display(),
                c.alloc_id()
            ));
        }
        let devices = (0..c.n_devices())
            .map(|i| crate::alloc::DeviceRecord {
                gpu_uuid: c.uuid(i).to_owned(),
                memory_limit_bytes: c.memory_limit(i),
                compute_share_ppm: c.compute_share_ppm(i),
                slices: 0,
            })
            .collect();
        let rec = AllocationRecord {
            id: name.to_owned(),
            devices,
            policy: tessera_shm::Policy::Guaranteed,
            device_ids: Vec::new(),
            labels: Default::default(),
            namespace: String::new(),
            pod: String::new(),
            container: String::new(),
            created_unix_ms: 0,
        };
        Self::check_record(&rec, name, &path)?;
        Ok(rec)
    }

    /// Every allocation directory's record. Unfinished creations and
    /// deletions are cleaned up; a damaged record is recovered from its copy
    /// or the control file (and written back); only a directory nothing can
    /// be recovered from is moved to `.broken-<name>-<time>` and reported,
    /// never deleted.
    pub fn load_all(&self) -> Result<Loaded, AllocError> {
        let mut out = Loaded::default();
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
            if let Some(abi) = control_abi(&path.join("control"))
                && abi > tessera_shm::layout::ABI_VERSION
            {
                return Err(AllocError::Precondition(format!(
                    "{}: control file ABI version {abi} was written by a newer Tessera; this \
                     manager speaks {}: run the newer manager (docs/upgrade.md)",
                    path.join("control").display(),
                    tessera_shm::layout::ABI_VERSION
                )));
            }
            let first = match self.read_versioned(&path) {
                Ok(rec) => Ok(rec),
                Err(ReadError::Newer(e)) => return Err(AllocError::Precondition(e)),
                Err(ReadError::Damaged(e)) => Err(e),
            };
            let read = first.or_else(|first| {
                let (rec, how, source) = match self.read_copy(&name) {
                    Ok(rec) => (
                        rec,
                        "from its checksummed copy".to_owned(),
                        "its checksummed copy",
                    ),
                    Err(second) => match self.rebuild_from_control(&path, &name) {
                        Ok(rec) => (
                            rec,
                            format!(
                                "from the control file (policy guaranteed; device ids, \
                                 labels and owner lost; copy: {second})"
                            ),
                            "the control file",
                        ),
                        Err(third) => return Err(format!("{first}; copy: {second}; {third}")),
                    },
                };
                // Written back, so the next start finds it whole.
                if let Err(e) = self.write_record(&path, &rec) {
                    tracing::error!(allocation = %name, error = %e, "cannot rewrite a recovered record");
                }
                out.recovered
                    .push((name.clone(), format!("{first}; recovered {how}"), source));
                Ok(rec)
            });
            match read {
                Ok(rec) => {
                    // Directories made before files were private become so.
                    let owner = owner_of(&path.join("state"));
                    if let Err(e) = secure(&path, owner) {
                        tracing::warn!(allocation = %name, error = %e, "cannot make the allocation's files private");
                    }
                    // A record written before copies existed gets one now.
                    if !self.copy_path(&name).exists() {
                        let _ = self.write_record(&path, &rec);
                    }
                    out.records.push(rec)
                }
                Err(reason) => {
                    let stamp = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let to = self.dir.join(format!(".broken-{name}-{stamp}"));
                    std::fs::rename(&path, &to).map_err(io(&path))?;
                    out.broken.push(Quarantined {
                        from: path,
                        to,
                        reason,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Repairs an allocation's files in place from its record, keeping
    /// their inodes (containers have them mounted and mapped): a control
    /// file is rewritten whole from the record; a state file gets back its
    /// header (magic, ABI, size, allocation id) and its length, keeping the
    /// slots. A missing file is created. Returns what was repaired.
    pub fn repair(
        &self,
        rec: &AllocationRecord,
        spec: &ControlSpec,
    ) -> Result<Vec<String>, AllocError> {
        use std::os::unix::fs::FileExt;
        let dir = self.alloc_dir(&rec.id);
        let mut done = Vec::new();
        // Fresh files to copy from, beside the real ones (same filesystem).
        let fresh = self
            .dir
            .join(format!(".new-repair-{}-{}", rec.id, std::process::id()));
        let _ = std::fs::remove_dir_all(&fresh);
        tessera_shm::create_allocation_files(&fresh, spec)?;
        let result = (|| {
            let control = dir.join("control");
            if Control::open(&control).is_err() {
                let bytes = std::fs::read(fresh.join("control")).map_err(io(&fresh))?;
                rewrite_in_place(&control, &bytes, 0o644)?;
                done.push("control rewritten from the record".to_owned());
            }
            let state = dir.join("state");
            if State::open(&state, &rec.id).is_err() {
                let bytes = std::fs::read(fresh.join("state")).map_err(io(&fresh))?;
                if !state.exists() {
                    rewrite_in_place(&state, &bytes, 0o666)?;
                } else {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&state)
                        .map_err(io(&state))?;
                    f.set_len(bytes.len() as u64).map_err(io(&state))?;
                    use tessera_shm::layout::StateHeader;
                    // The words State::open checks; the slots are left as they are.
                    for (at, len) in [
                        (std::mem::offset_of!(StateHeader, magic), 8),
                        (std::mem::offset_of!(StateHeader, abi_version), 4),
                        (std::mem::offset_of!(StateHeader, size), 4),
                        (
                            std::mem::offset_of!(StateHeader, alloc_id),
                            tessera_shm::layout::ID_LEN,
                        ),
                    ] {
                        f.write_all_at(&bytes[at..at + len], at as u64)
                            .map_err(io(&state))?;
                    }
                    f.sync_all().map_err(io(&state))?;
                }
                done.push("state header restored".to_owned());
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&fresh);
        result.map(|()| done)
    }
}

/// The non-root owner of a state file, if it has one.
fn owner_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| m.uid())
        .filter(|&u| u != 0 && u != nix::unistd::geteuid().as_raw())
}

/// Makes an allocation directory private. Without `owner_uid` (device
/// plugin allocations): the directory is root's, mode 0700, so no local
/// user can reach the files; containers reach them through the bind mounts
/// the runtime makes as root, where only the file's own mode counts, so the
/// state file stays 0666 for container processes of any uid. With
/// `owner_uid` (a non-root `tessera run` user): the directory is 0711
/// (passable, not listable), the state file that user's, mode 0600; the
/// control file stays the manager's, 0644 (readable, not writable).
pub fn secure(dir: &Path, owner_uid: Option<u32>) -> Result<(), AllocError> {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(io(p))
    };
    let state = dir.join("state");
    set(&dir.join("control"), 0o644)?;
    set(&dir.join(RECORD_FILE), 0o600)?;
    match owner_uid {
        None => {
            set(&state, 0o666)?;
            set(dir, 0o700)
        }
        Some(uid) => {
            nix::unistd::chown(&state, Some(nix::unistd::Uid::from_raw(uid)), None).map_err(
                |e| AllocError::Io {
                    path: state.clone(),
                    error: std::io::Error::other(format!(
                        "cannot give the state file to uid {uid}: {e}"
                    )),
                },
            )?;
            set(&state, 0o600)?;
            set(dir, 0o711)
        }
    }
}

/// Writes `bytes` over `path` in place (creating it with `mode` if absent),
/// so every existing mount and mapping of it sees the new content.
fn rewrite_in_place(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AllocError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(mode)
        .open(path)
        .map_err(io(path))?;
    f.set_len(bytes.len() as u64).map_err(io(path))?;
    f.write_all_at(bytes, 0).map_err(io(path))?;
    f.sync_all().map_err(io(path))
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
    use crate::alloc::validate;
    use crate::gpu::GpuInfo;
    use crate::gpu::fake::test_gpu;
    use tessera_proto::manager::v1 as pb;

    const GI: u64 = 1 << 30;

    fn gpus() -> Vec<GpuInfo> {
        vec![test_gpu(0, 16 * GI)]
    }

    fn req(uuid: &str, mem: u64, ppm: u32) -> pb::CreateAllocationRequest {
        pb::CreateAllocationRequest::one_device("a1", uuid, mem, ppm)
    }

    fn norm(r: &pb::CreateAllocationRequest) -> Result<AllocationRecord, AllocError> {
        let rec = crate::wire::create(r)?.into_record(r.id.clone(), tessera_shm::Policy::Burst, 1);
        validate(&rec, &gpus())?;
        Ok(rec)
    }

    /// A run's allocation (owner labels) is written like a pod's and read
    /// back the same.
    #[test]
    fn a_runs_record_is_written_and_read_back() {
        use tessera_contract::labels as l;
        let mut rec = norm(&req(&gpus()[0].uuid, 4 * GI, 300_000)).unwrap();
        rec.labels.insert(l::SOURCE.into(), l::SOURCE_CLI.into());
        rec.labels.insert(l::CLI_PID.into(), "4242".into());
        rec.labels.insert(l::CLI_PIDNS.into(), "4026531836".into());
        rec.labels.insert(l::CLI_START.into(), "123456".into());
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        store.create(&rec, &rec.control_spec(0)).unwrap();
        assert_eq!(store.load_all().unwrap().records, vec![rec]);
    }

    #[test]
    fn records_carry_their_layout_version_and_a_newer_one_is_refused_not_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let g = gpus();
        let rec = norm(&req(&g[0].uuid, 4 * GI, 300_000)).unwrap();
        store.create(&rec, &rec.control_spec(0)).unwrap();
        let path = store.alloc_dir("a1").join(RECORD_FILE);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v[VERSION_KEY], RECORD_VERSION);
        // Without the key (release 0.1.0): version 1, read as it is.
        v.as_object_mut().unwrap().remove(VERSION_KEY);
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(store.load_all().unwrap().records, vec![rec.clone()]);
        // Not a number: damage, recovered from the copy.
        v[VERSION_KEY] = "two".into();
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        let loaded = store.load_all().unwrap();
        assert_eq!(loaded.records, vec![rec.clone()]);
        assert_eq!(loaded.recovered.len(), 1);
        // Newer: the start stops, naming the file, and the record is left as it was.
        v[VERSION_KEY] = (RECORD_VERSION + 1).into();
        let newer = serde_json::to_vec(&v).unwrap();
        std::fs::write(&path, &newer).unwrap();
        let e = store.load_all().unwrap_err();
        assert!(matches!(e, AllocError::Precondition(_)), "{e}");
        assert!(e.to_string().contains("newer Tessera"), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), newer);
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

        let loaded = store.load_all().unwrap();
        let (recs, broken) = (loaded.records, loaded.broken);
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
        assert_eq!(store.load_all().unwrap().records, vec![]);
        assert!(!store.copy_path("a1").exists(), "the copy goes with it");
    }

    fn created(store: &Store) -> AllocationRecord {
        let mut rec = norm(&req(&gpus()[0].uuid, 4 * GI, 300_000)).unwrap();
        rec.pod = "p".into();
        store.create(&rec, &rec.control_spec(0)).unwrap();
        rec
    }

    #[test]
    fn a_damaged_record_is_recovered_from_its_copy_then_from_the_control_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let rec = created(&store);
        let json = store.alloc_dir("a1").join(RECORD_FILE);
        std::fs::write(&json, "{\"id\": \"a1\", trunc").unwrap();
        let loaded = store.load_all().unwrap();
        assert_eq!(loaded.records, vec![rec.clone()], "the copy is the record");
        assert!(loaded.broken.is_empty());
        assert_eq!(loaded.recovered.len(), 1);
        assert!(
            loaded.recovered[0].1.contains("checksummed copy"),
            "{:?}",
            loaded.recovered
        );
        assert_eq!(loaded.recovered[0].2, "its checksummed copy");
        // Written back whole.
        assert_eq!(store.read(&store.alloc_dir("a1")).unwrap(), rec);

        // Both lost (one bit of the copy flipped): rebuilt from the control file,
        // at the most restrictive policy, capacity as it was.
        std::fs::write(&json, b"").unwrap();
        let copy = store.copy_path("a1");
        let mut bytes = std::fs::read(&copy).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        std::fs::write(&copy, &bytes).unwrap();
        let loaded = store.load_all().unwrap();
        assert_eq!(loaded.records.len(), 1);
        let r = &loaded.records[0];
        assert_eq!(r.devices, rec.devices);
        assert_eq!(r.policy, tessera_shm::Policy::Guaranteed);
        assert!(
            loaded.recovered[0].1.contains("checksum mismatch"),
            "{:?}",
            loaded.recovered
        );
        assert!(
            loaded.recovered[0].1.contains("control file"),
            "{:?}",
            loaded.recovered
        );
        assert_eq!(loaded.recovered[0].2, "the control file");
    }

    #[test]
    fn a_damaged_state_file_is_repaired_in_place() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let rec = created(&store);
        let state = store.alloc_dir("a1").join("state");
        let control = store.alloc_dir("a1").join("control");
        let inodes = (
            std::fs::metadata(&state).unwrap().ino(),
            std::fs::metadata(&control).unwrap().ino(),
        );
        // The tenant's write: the magic gone, the file grown.
        let mut bytes = std::fs::read(&state).unwrap();
        bytes[..8].copy_from_slice(b"garbage!");
        bytes.extend_from_slice(b"more");
        std::fs::write(&state, &bytes).unwrap();
        // And (an admin's accident) the control truncated.
        std::fs::write(&control, b"").unwrap();
        assert!(LiveAllocation::open(rec.clone(), store.alloc_dir("a1")).is_err());
        let done = store.repair(&rec, &rec.control_spec(0)).unwrap();
        assert_eq!(done.len(), 2, "{done:?}");
        let live = LiveAllocation::open(rec.clone(), store.alloc_dir("a1")).unwrap();
        assert_eq!(live.control().memory_limit(0), 4 * GI);
        assert_eq!(
            (
                std::fs::metadata(&state).unwrap().ino(),
                std::fs::metadata(&control).unwrap().ino()
            ),
            inodes,
            "same files: mounts and mappings stay valid"
        );
        // Nothing to repair: nothing done.
        assert!(store.repair(&rec, &rec.control_spec(0)).unwrap().is_empty());
    }

    #[test]
    fn allocation_files_are_private() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        assert_eq!(mode(store.dir()), 0o711, "passable, not listable");
        assert_eq!(mode(&store.dir().join(RECORDS_DIR)), 0o700);
        created(&store);
        let a = store.alloc_dir("a1");
        // Containers' allocation: nobody but the manager reaches the files on
        // the host; the state file's own mode lets any container uid write it
        // through its mount.
        assert_eq!(mode(&a), 0o700);
        assert_eq!(mode(&a.join("state")), 0o666);
        assert_eq!(mode(&a.join("control")), 0o644);
        assert_eq!(mode(&a.join(RECORD_FILE)), 0o600);
        // A `tessera run` user's: the state file is that user's alone.
        let me = nix::unistd::geteuid().as_raw();
        let mut rec = norm(&req(&gpus()[0].uuid, GI, 100_000)).unwrap();
        rec.id = "r1".into();
        store
            .create_owned(&rec, &rec.control_spec(0), Some(me))
            .unwrap();
        let r = store.alloc_dir("r1");
        assert_eq!(mode(&r), 0o711);
        assert_eq!(mode(&r.join("state")), 0o600);
        assert_eq!(std::fs::metadata(r.join("state")).unwrap().uid(), me);
        assert_eq!(mode(&r.join("control")), 0o644);
        // An old world-open directory is made private at start-up.
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o755)).unwrap();
        store.load_all().unwrap();
        assert_eq!(mode(&a), 0o700);
    }

    #[test]
    fn an_unwritable_state_directory_is_refused() {
        // procfs directories exist and refuse new files, even to root.
        let e = Store::open(std::path::Path::new("/proc/self/fdinfo")).unwrap_err();
        assert!(e.to_string().contains("/proc/self/fdinfo"), "{e}");
    }

    #[test]
    fn a_delete_that_cannot_rename_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("allocations")).unwrap();
        let rec = created(&store);
        // Something in the way of the rename: a non-empty directory of that name.
        let blocker = store
            .dir()
            .join(format!(".deleted-a1-{}", std::process::id()));
        std::fs::create_dir_all(blocker.join("x")).unwrap();
        assert!(store.retire("a1").is_err());
        assert!(store.alloc_dir("a1").exists());
        assert!(store.copy_path("a1").exists());
        std::fs::remove_dir_all(&blocker).unwrap();
        assert_eq!(store.load_all().unwrap().records, vec![rec]);
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
