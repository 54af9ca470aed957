//! `cuGetExportTable`: the driver's private tables that NVIDIA's CUDA runtime (`libcudart`,
//! shared or linked into a framework) asks for before it does anything else.
//!
//! The tables are undocumented. What is known about them (their GUIDs, sizes and what
//! some entries do) comes from public reverse-engineering, ZLUDA's `dark_api` above all,
//! and from what the 12.x runtime was seen to ask for on this simulator
//! (`TESSERA_SIM_TRACE_EXPORT=1`); the code here is ours. A table is an array of
//! pointer-sized slots; most start with their own size in bytes (slot 0), one starts
//! directly with a function. Each table lives in its own file; `docs/simulator.md` lists
//! every entry and what it does here.
//!
//! A slot we do not implement holds a stub that writes one line to stderr (once per
//! slot) and returns `CUDA_ERROR_NOT_SUPPORTED`: a caller that uses it gets an error
//! code, never a jump to null. An unknown table id is `CUDA_ERROR_INVALID_VALUE` with one
//! line on stderr (once per id); the ids in [`REFUSED`], which every runtime process asks
//! for and does without, get the same error quietly.

pub mod cluster;
pub mod context_checks;
pub mod context_storage;
pub mod cudart;
pub mod cupti;
pub mod device_ext;
pub mod integrity;
pub mod tools;
pub mod tools_context;

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

use tessera_ffi::cuda::{CUresult, CUuuid};

use crate::CuResult;

/// Environment variable: when set (to anything but `0`), every table request is logged.
pub const ENV_TRACE: &str = "TESSERA_SIM_TRACE_EXPORT";

/// A table's slots, shared with C as a plain array of pointers.
#[repr(transparent)]
pub struct Slots<const N: usize>(pub [*const c_void; N]);

// SAFETY: the slots are written once at compile time (function addresses and a size) and
// only read afterwards; the pointers themselves are never dereferenced by Rust.
unsafe impl<const N: usize> Sync for Slots<N> {}

impl<const N: usize> Slots<N> {
    /// The address the runtime receives.
    pub fn as_ptr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// Slot 0 of a sized table: the table's size in bytes, stored as a pointer-sized value.
pub const fn size_slot(slots: usize) -> *const c_void {
    (slots * size_of::<usize>()) as *const c_void
}

/// For each sized table's tests: it is `TABLES[index]` under `guid`, hands out these
/// slots, starts with its own size and has no null slot.
#[cfg(test)]
fn assert_sized_table<const N: usize>(index: usize, guid: [u8; 16], table: &'static Slots<N>) {
    assert_eq!(TABLES[index].guid, guid);
    assert_eq!((TABLES[index].ptr)(), table.as_ptr());
    assert_eq!(table.0[0] as usize, N * size_of::<usize>());
    assert!(table.0.iter().all(|p| !p.is_null()));
}

#[cfg(test)]
#[test]
fn each_sized_table_is_registered_under_its_index() {
    assert_sized_table(cluster::T, cluster::GUID, &cluster::TABLE);
    assert_sized_table(tools_context::T, tools_context::GUID, &tools_context::TABLE);
    assert_sized_table(cupti::T, cupti::GUID, &cupti::TABLE);
    assert_sized_table(cudart::T, cudart::GUID, &cudart::TABLE);
    assert_sized_table(device_ext::T, device_ext::GUID, &device_ext::TABLE);
}

/// One known table.
pub struct Table {
    /// A short name for logs and docs (ZLUDA's name where it has one).
    pub name: &'static str,
    /// The table's id, in the byte order `CUuuid` carries it.
    pub guid: [u8; 16],
    /// Its slots.
    pub ptr: fn() -> *const c_void,
}

/// Parses `XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX` into the 16 bytes in written order (the
/// order in which the runtime passes the id). Compile-time, so a typo fails the build.
pub const fn guid(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    assert!(b.len() == 36, "a GUID is 36 characters");
    let mut out = [0u8; 16];
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        let hi = hex(b[i]);
        let lo = hex(b[i + 1]);
        out[n] = (hi << 4) | lo;
        n += 1;
        i += 2;
    }
    assert!(n == 16, "a GUID has 32 hex digits");
    out
}

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// Every table this driver hands out.
pub static TABLES: &[Table] = &[
    Table {
        name: "CUDART_INTERFACE",
        guid: cudart::GUID,
        ptr: || cudart::TABLE.as_ptr(),
    },
    Table {
        name: "TOOLS_TLS",
        guid: tools::TLS_GUID,
        ptr: || tools::TLS.as_ptr(),
    },
    Table {
        name: "TOOLS_RUNTIME_CALLBACK_HOOKS",
        guid: tools::HOOKS_GUID,
        ptr: || tools::HOOKS.as_ptr(),
    },
    Table {
        name: "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
        guid: context_storage::GUID,
        ptr: || context_storage::TABLE.as_ptr(),
    },
    Table {
        name: "DEVICE_EXTENDED_RT",
        guid: device_ext::GUID,
        ptr: || device_ext::TABLE.as_ptr(),
    },
    Table {
        name: "INTEGRITY_CHECK",
        guid: integrity::GUID,
        ptr: || integrity::TABLE.as_ptr(),
    },
    Table {
        name: "CONTEXT_CHECKS",
        guid: context_checks::GUID,
        ptr: || context_checks::TABLE.as_ptr(),
    },
    Table {
        name: "TOOLS_CONTEXT",
        guid: tools_context::GUID,
        ptr: || tools_context::TABLE.as_ptr(),
    },
    Table {
        name: "CLUSTER",
        guid: cluster::GUID,
        ptr: || cluster::TABLE.as_ptr(),
    },
    Table {
        name: "CUPTI",
        guid: cupti::GUID,
        ptr: || cupti::TABLE.as_ptr(),
    },
];

/// Ids the runtime asks for that this driver knowingly does not provide: they are refused
/// like unknown ids (`CUDA_ERROR_INVALID_VALUE`) but without a log line, because every
/// process that uses the runtime asks for them and runs normally without them.
pub static REFUSED: &[(&str, [u8; 16])] = &[
    // Asked for first, before `cuInit`, by every 12.x runtime; its layout (several size
    // words inside one table) and meaning are unknown, and the runtime does without it.
    ("f8cff951", guid("f8cff951-2146-8b4e-b9e2-fb469e7c0dd9")),
    // Asked for when the runtime (or cuda.bindings) first loads a kernel; unknown, and
    // kernels load and launch without it.
    ("da9151d3", guid("da9151d3-3ae6-cc41-a5c0-4f26d533e328")),
    // Asked for by CUPTI 13.5 when it initialises (after `CUPTI`); ZLUDA names one of its
    // entries `getCudaState`. CUPTI answers its version and runs without it.
    ("d7bd8af8", guid("d7bd8af8-e7ac-ca4a-bdbc-fb1f1b3fcf33")),
];

/// Formats an id as the runtime's bytes, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_guid(g: &[u8; 16]) -> String {
    let h: Vec<String> = g.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Whether [`ENV_TRACE`] asks for table requests and failed symbol lookups to be logged.
pub fn tracing() -> bool {
    std::env::var_os(ENV_TRACE).is_some_and(|v| v != "0")
}

/// Writes `line` to stderr the first time `key` is seen in this process.
pub fn log_once(key: String, line: impl FnOnce() -> String) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a hostile caller looping over random ids must not grow this forever.
    let set = seen.get_or_insert_with(HashSet::new);
    if set.len() < 256 && set.insert(key) {
        say(&line());
    }
}

// `say` lives in `errors`, below every family, so that `device` can report a bad
// driver version without importing the export tables (which import `device`).
use crate::errors::say;

/// Looks `id` up; `None` for an id this driver does not know.
pub fn find(id: &[u8; 16]) -> Option<&'static Table> {
    TABLES.iter().find(|t| &t.guid == id)
}

/// The body of `cuGetExportTable`.
///
/// # Safety
/// `out` must be null or writable; `id` null or a valid `CUuuid`.
pub unsafe fn get(out: *mut *const c_void, id: *const CUuuid) -> CuResult<()> {
    if out.is_null() || id.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a valid CUuuid (16 bytes, any values).
    let bytes: [u8; 16] = unsafe { (*id).bytes }.map(|b| b as u8);
    match find(&bytes) {
        Some(t) => {
            if tracing() {
                say(&format!(
                    "cuGetExportTable {} ({})",
                    format_guid(&bytes),
                    t.name
                ));
            }
            // SAFETY: `out` is non-null and writable by the caller's contract.
            unsafe { out.write((t.ptr)()) };
            Ok(())
        }
        None => {
            let refused = REFUSED.iter().any(|(_, g)| g == &bytes);
            if refused && tracing() {
                say(&format!(
                    "cuGetExportTable {} (not provided)",
                    format_guid(&bytes)
                ));
            }
            if !refused {
                log_once(format!("table {}", format_guid(&bytes)), || {
                    format!(
                        "cuGetExportTable: unknown table {} (CUDA_ERROR_INVALID_VALUE)",
                        format_guid(&bytes)
                    )
                });
            }
            // SAFETY: as above.
            unsafe { out.write(std::ptr::null()) };
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
    }
}

/// The stub in every slot we do not implement. `T` numbers the table (its index in
/// [`TABLES`]), `I` the slot. It takes no arguments: with the C calling convention on
/// x86-64 and aarch64 the caller owns its arguments, so ignoring them is sound whatever
/// the real entry's signature.
pub extern "C" fn unimplemented<const T: usize, const I: usize>() -> CUresult {
    // Logging allocates; whatever happens there must not unwind into C.
    let _ = std::panic::catch_unwind(|| {
        let name = TABLES.get(T).map_or("?", |t| t.name);
        log_once(format!("slot {T} {I}"), || {
            format!("export table {name} entry {I} is not implemented (CUDA_ERROR_NOT_SUPPORTED)")
        });
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// The stub for slot `I` of table `T`, as a slot value.
pub const fn stub<const T: usize, const I: usize>() -> *const c_void {
    unimplemented::<T, I> as *const c_void
}

/// The stubs of slots 0 to 99 of table `$t`, ten by ten: every slot needs its own
/// instance of [`unimplemented`] to log its number, and `macro_rules!` cannot count.
macro_rules! hundred_stubs {
    ($t:ident) => {
        hundred_stubs!(@tens $t [0 1 2 3 4 5 6 7 8 9] 0 1 2 3 4 5 6 7 8 9)
    };
    (@tens $t:ident $ones:tt $($ten:literal)*) => {
        [$(hundred_stubs!(@ones $t $ten $ones)),*]
    };
    (@ones $t:ident $ten:literal [$($one:literal)*]) => {
        [$(stub::<$t, { $ten * 10 + $one }>()),*]
    };
}

/// The slots of sized table `T` (`N` of them, at most 100) before any entry is
/// implemented: its size in slot 0 and the stub in every other slot. A table that
/// implements a few of many slots (`DEVICE_EXTENDED_RT`, `TOOLS_CONTEXT`) starts from this
/// and puts its entries in.
pub const fn sized_stubs<const T: usize, const N: usize>() -> [*const c_void; N] {
    assert!(N <= 100, "sized_stubs makes at most 100 slots");
    let all: [[*const c_void; 10]; 10] = hundred_stubs!(T);
    let mut slots = [std::ptr::null(); N];
    slots[0] = size_slot(N);
    let mut i = 1;
    while i < N {
        slots[i] = all[i / 10][i % 10];
        i += 1;
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_parse_in_written_order() {
        assert_eq!(
            guid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
            [
                0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
                0x9d, 0xf9
            ]
        );
        assert_eq!(
            format_guid(&cudart::GUID),
            "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"
        );
    }

    #[test]
    fn ids_are_unique_and_tables_found() {
        for (i, a) in TABLES.iter().enumerate() {
            assert!(
                TABLES[i + 1..].iter().all(|b| b.guid != a.guid),
                "{}",
                a.name
            );
            assert!(std::ptr::eq(find(&a.guid).expect("found"), a));
            assert!(!(a.ptr)().is_null());
        }
    }

    #[test]
    fn unknown_id_is_an_error_not_a_crash() {
        let id = CUuuid { bytes: [7; 16] };
        let mut out: *const c_void = 0x10usize as *const c_void;
        // SAFETY: valid pointers to locals.
        let rc = unsafe { get(&mut out, &id) };
        assert_eq!(rc, Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(out.is_null());
        // SAFETY: null arguments are rejected before any use.
        let rc = unsafe { get(std::ptr::null_mut(), &id) };
        assert_eq!(rc, Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn refused_ids_are_errors_and_not_tables() {
        for (name, id) in REFUSED {
            assert!(find(id).is_none(), "{name}");
            assert!(format_guid(id).starts_with(name));
            let id = CUuuid {
                bytes: id.map(|b| b as std::ffi::c_char),
            };
            let mut out: *const c_void = std::ptr::null();
            // SAFETY: valid pointers to locals.
            let rc = unsafe { get(&mut out, &id) };
            assert_eq!(rc, Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        }
    }

    #[test]
    fn sized_stubs_give_each_slot_its_own_stub() {
        let slots = sized_stubs::<0, 100>();
        assert_eq!(slots[0], size_slot(100));
        assert_eq!(slots[57], stub::<0, 57>());
        assert_eq!(slots[99], stub::<0, 99>());
        let distinct: HashSet<usize> = slots[1..].iter().map(|p| *p as usize).collect();
        assert_eq!(distinct.len(), 99);
        assert!(!distinct.contains(&0));
    }

    #[test]
    fn a_stub_returns_not_supported() {
        assert_eq!(unimplemented::<0, 3>(), CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
}
