//! The NVML wrapper bodies. Inside an allocation NVML shows only the
//! allocation: initialisation fails closed like `cuInit`; the device list
//! holds only the allocation's GPUs, numbered as CUDA numbers them
//! (`CUDA_VISIBLE_DEVICES` order, which `tessera run` and the device plugin
//! set to the allocation's UUIDs); a handle of any other GPU is not found;
//! memory info reports the allocation's view (total = the limit capped by
//! the device, used = what the allocation has reserved); process lists hold
//! only the allocation's processes; GPU utilisation is the allocation's own
//! (the sum of its processes' samples). NVML needs no membership: a
//! monitoring process reads the files without joining.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_uint, c_ulonglong};

use tessera_ffi::nvml::{
    NVML_DEVICE_UUID_V2_BUFFER_SIZE, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlProcessInfo_t, nvmlProcessInfo_v1_t, nvmlProcessUtilizationSample_t, nvmlReturn_t,
    nvmlUtilization_t,
};
use tessera_shm::layout::MAX_DEVICES;

use crate::governor::{self, Files};
use crate::table::call_real;

const OK: nvmlReturn_t = nvmlReturn_t::NVML_SUCCESS;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_NOT_FOUND;

/// What governed NVML entry points return when the process fails closed.
pub const NVML_REFUSED: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_UNINITIALIZED;

fn init(call: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    match governor::files() {
        Some(Err(())) => NVML_REFUSED,
        None | Some(Ok(_)) => call(),
    }
}

pub unsafe fn nvmlInit() -> nvmlReturn_t {
    init(|| call_real!(nvmlInit()))
}

pub unsafe fn nvmlInit_v2() -> nvmlReturn_t {
    init(|| call_real!(nvmlInit_v2()))
}

pub unsafe fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    init(|| call_real!(nvmlInitWithFlags(flags)))
}

/// A governed NVML call: `Ok(files)` to virtualise, or the result to return
/// as is (`call` is the real function, run only for an ungoverned process).
fn files_or(call: impl FnOnce() -> nvmlReturn_t) -> Result<&'static Files, nvmlReturn_t> {
    match governor::files() {
        None => Err(call()),
        Some(Err(())) => Err(NVML_REFUSED),
        Some(Ok(f)) => Ok(f),
    }
}

/// The governor of a governed process, or the real call's result.
macro_rules! files_or {
    ($pass:expr) => {
        match files_or(|| $pass) {
            Ok(f) => f,
            Err(r) => return r,
        }
    };
}

// ---------------------------------------------------------------------------
// Which GPUs the allocation shows.

/// The UUID of a real NVML device.
fn uuid_of(device: nvmlDevice_t) -> Option<String> {
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
    let r = call_real!(nvmlDeviceGetUUID(
        device,
        buf.as_mut_ptr(),
        buf.len() as c_uint
    ));
    if r != OK {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (forced above).
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) };
    uuid.to_str().ok().map(str::to_owned)
}

/// The allocation's index of an NVML device, by its UUID.
fn index_of(files: &Files, device: nvmlDevice_t) -> Option<usize> {
    files.find_uuid(&uuid_of(device)?)
}

/// The node's devices as the real NVML lists them: (handle, UUID).
fn real_devices() -> Result<Vec<(nvmlDevice_t, String)>, nvmlReturn_t> {
    let mut n: c_uint = 0;
    let r = call_real!(nvmlDeviceGetCount_v2(&mut n));
    if r != OK {
        return Err(r);
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n.min(64) {
        let mut d: nvmlDevice_t = std::ptr::null_mut();
        let r = call_real!(nvmlDeviceGetHandleByIndex_v2(i, &mut d));
        if r != OK {
            return Err(r);
        }
        out.push((d, uuid_of(d).unwrap_or_default()));
    }
    Ok(out)
}

/// The devices `CUDA_VISIBLE_DEVICES` selects, as the driver reads it:
/// indices, full UUIDs or a prefix of exactly one (`GPU-8f3a`), in the
/// listed order, stopping at the first entry that names no device (or one
/// named already). Unset is every device; empty is none.
pub fn cuda_visible(spec: Option<&str>, uuids: &[String]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < uuids.len())
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let mut hits = uuids.iter().enumerate().filter(|(_, u)| {
                u.len() >= entry.len()
                    && u.as_bytes()[..entry.len()].eq_ignore_ascii_case(entry.as_bytes())
            });
            match (hits.next(), hits.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The allocation's GPUs as NVML shows them inside it: those CUDA sees
/// that the allocation holds, in CUDA's order.
fn shown(files: &Files) -> Result<Vec<nvmlDevice_t>, nvmlReturn_t> {
    let all = real_devices()?;
    let uuids: Vec<String> = all.iter().map(|(_, u)| u.clone()).collect();
    let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    Ok(cuda_visible(spec.as_deref(), &uuids)
        .into_iter()
        .filter(|&i| files.find_uuid(&uuids[i]).is_some())
        .map(|i| all[i].0)
        .collect())
}

/// Whether a real handle is one the allocation shows.
fn is_shown(files: &Files, device: nvmlDevice_t) -> bool {
    shown(files).is_ok_and(|l| l.contains(&device))
}

fn count(files: &Files, out: *mut c_uint) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    match shown(files) {
        Ok(l) => {
            // SAFETY: non-null; the caller's to write.
            unsafe { *out = l.len() as c_uint };
            OK
        }
        Err(r) => r,
    }
}

pub unsafe fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetCount_v2(n)));
    count(f, n)
}

pub unsafe fn nvmlDeviceGetCount(n: *mut c_uint) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetCount(n)));
    count(f, n)
}

fn by_index(files: &Files, index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    match shown(files) {
        Ok(l) => match l.get(index as usize) {
            Some(&d) => {
                // SAFETY: non-null; the caller's to write.
                unsafe { *out = d };
                OK
            }
            None => nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT,
        },
        Err(r) => r,
    }
}

pub unsafe fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleByIndex_v2(index, out)));
    by_index(f, index, out)
}

pub unsafe fn nvmlDeviceGetHandleByIndex(index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleByIndex(index, out)));
    by_index(f, index, out)
}

/// A lookup by name (UUID, PCI bus id, serial): the real answer, if it is
/// a GPU the allocation shows; otherwise not found, as for a GPU that is
/// not there.
fn lookup(
    files: &Files,
    out: *mut nvmlDevice_t,
    call: impl FnOnce() -> nvmlReturn_t,
) -> nvmlReturn_t {
    let r = call();
    if r != OK || out.is_null() {
        return r;
    }
    // SAFETY: the library succeeded and wrote it.
    let d = unsafe { *out };
    if is_shown(files, d) {
        OK
    } else {
        // SAFETY: as above; the caller gets no handle of a hidden GPU.
        unsafe { *out = std::ptr::null_mut() };
        NOT_FOUND
    }
}

pub unsafe fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleByUUID(uuid, out)));
    lookup(f, out, || call_real!(nvmlDeviceGetHandleByUUID(uuid, out)))
}

pub unsafe fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleByPciBusId_v2(bus, out)));
    lookup(f, out, || {
        call_real!(nvmlDeviceGetHandleByPciBusId_v2(bus, out))
    })
}

pub unsafe fn nvmlDeviceGetHandleByPciBusId(
    bus: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleByPciBusId(bus, out)));
    lookup(f, out, || {
        call_real!(nvmlDeviceGetHandleByPciBusId(bus, out))
    })
}

pub unsafe fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetHandleBySerial(serial, out)));
    lookup(f, out, || {
        call_real!(nvmlDeviceGetHandleBySerial(serial, out))
    })
}

/// `nvmlDeviceGetIndex`: the position in the allocation's list.
pub unsafe fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetIndex(device, index)));
    if index.is_null() {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    match shown(f) {
        Ok(l) => match l.iter().position(|&d| d == device) {
            Some(i) => {
                // SAFETY: non-null; the caller's to write.
                unsafe { *index = i as c_uint };
                OK
            }
            None => nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT,
        },
        Err(r) => r,
    }
}

// ---------------------------------------------------------------------------
// Memory.

/// (total, free, used) from inside the allocation, given the device's total.
fn view(files: &Files, device: nvmlDevice_t, total: u64) -> (u64, u64, u64) {
    let (total, reserved) = files.view(index_of(files, device), total);
    let used = reserved.min(total);
    (total, total - used, used)
}

pub unsafe fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let files = files_or!(call_real!(nvmlDeviceGetMemoryInfo(device, memory)));
    let r = call_real!(nvmlDeviceGetMemoryInfo(device, memory));
    if r != OK || memory.is_null() {
        return r;
    }
    // SAFETY: the library succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    (m.total, m.free, m.used) = view(files, device, m.total);
    r
}

pub unsafe fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let files = files_or!(call_real!(nvmlDeviceGetMemoryInfo_v2(device, memory)));
    let r = call_real!(nvmlDeviceGetMemoryInfo_v2(device, memory));
    if r != OK || memory.is_null() {
        return r;
    }
    // SAFETY: the library succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    (m.total, m.free, m.used) = view(files, device, m.total);
    // What the driver keeps for itself is outside the allocation's view.
    m.reserved = 0;
    r
}

// ---------------------------------------------------------------------------
// Processes.

/// The allocation's processes, by the pids NVML may report for them: the
/// pid in this process's pid namespace (the same container, or
/// `tessera run`), and the host pid the manager records.
///
/// The state file is the tenant's own, so a forged entry can at most show
/// a process of another allocation that the tenant names by host pid; a
/// pid in this namespace is one of this container's own processes.
fn our_pids(files: &Files) -> Vec<u32> {
    let me = tessera_shm::ProcIdentity::current();
    let mut out = vec![me.pid];
    for p in files.state.processes(MAX_DEVICES) {
        if p.identity.pidns == me.pidns && p.identity.pid != 0 {
            out.push(p.identity.pid);
        }
        if p.host_pid != 0 {
            out.push(p.host_pid);
        }
    }
    out
}

/// Keeps, in the first `*count` entries of `infos`, those of the
/// allocation's processes, and sets `*count` to how many. `pid` reads an
/// entry's pid.
///
/// # Safety
///
/// `infos` holds at least `*count` initialised entries; `count` is valid.
unsafe fn keep_ours<T: Copy>(
    files: &Files,
    count: *mut c_uint,
    infos: *mut T,
    pid: impl Fn(&T) -> u32,
) {
    // SAFETY: per the contract.
    let n = unsafe { *count } as usize;
    if infos.is_null() || n == 0 {
        return;
    }
    let ours = our_pids(files);
    let mut kept = 0;
    for i in 0..n {
        // SAFETY: i < n entries the library wrote.
        let e = unsafe { *infos.add(i) };
        if ours.contains(&pid(&e)) {
            // SAFETY: kept <= i < n.
            unsafe { *infos.add(kept) = e };
            kept += 1;
        }
    }
    // SAFETY: per the contract.
    unsafe { *count = kept as c_uint };
}

/// A process-list call, filtered. The caller's buffer may be too small for
/// the whole list but big enough for the allocation's part: the list is
/// read into a buffer of the shim's own, then the allocation's part copied
/// out, with NVML's own rule (`NVML_ERROR_INSUFFICIENT_SIZE` and the count
/// needed) applied to that part.
fn processes<T: Copy + Default>(
    files: &Files,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    call: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
    pid: impl Fn(&T) -> u32,
) -> nvmlReturn_t {
    if count.is_null() {
        return call(count, infos);
    }
    if !is_shown(files, device) {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null; the caller's to read.
    let room = unsafe { *count } as usize;
    let mut buf: Vec<T> = Vec::new();
    let mut n: c_uint = 0;
    let mut read = false;
    // Ask for the size, then read; the list may grow in between.
    for _ in 0..4 {
        n = buf.len() as c_uint;
        let p = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        match call(&mut n, p) {
            OK => {
                read = true;
                break;
            }
            nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE => buf = vec![T::default(); n as usize + 8],
            r => return r,
        }
    }
    if !read {
        return nvmlReturn_t::NVML_ERROR_UNKNOWN;
    }
    n = n.min(buf.len() as c_uint);
    // SAFETY: `buf` holds `n` entries the library wrote.
    unsafe { keep_ours(files, &mut n, buf.as_mut_ptr(), pid) };
    let n = n as usize;
    // SAFETY: non-null; the caller's to write.
    unsafe { *count = n as c_uint };
    if n == 0 {
        return OK;
    }
    if infos.is_null() || room < n {
        return nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's array holds `room` >= n entries.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), infos, n) };
    OK
}

macro_rules! process_lists {
    ($($name:ident : $ty:ty;)*) => {
        $(
            pub unsafe fn $name(device: nvmlDevice_t, count: *mut c_uint, infos: *mut $ty) -> nvmlReturn_t {
                let f = files_or!(call_real!($name(device, count, infos)));
                processes(f, device, count, infos, |c, i| call_real!($name(device, c, i)), |e| e.pid)
            }
        )*
    };
}

process_lists! {
    nvmlDeviceGetComputeRunningProcesses: nvmlProcessInfo_v1_t;
    nvmlDeviceGetComputeRunningProcesses_v2: nvmlProcessInfo_t;
    nvmlDeviceGetComputeRunningProcesses_v3: nvmlProcessInfo_t;
    nvmlDeviceGetGraphicsRunningProcesses: nvmlProcessInfo_v1_t;
    nvmlDeviceGetGraphicsRunningProcesses_v2: nvmlProcessInfo_t;
    nvmlDeviceGetGraphicsRunningProcesses_v3: nvmlProcessInfo_t;
    nvmlDeviceGetMPSComputeRunningProcesses: nvmlProcessInfo_v1_t;
    nvmlDeviceGetMPSComputeRunningProcesses_v2: nvmlProcessInfo_t;
    nvmlDeviceGetMPSComputeRunningProcesses_v3: nvmlProcessInfo_t;
}

// ---------------------------------------------------------------------------
// Activity: the allocation's own.

/// `nvmlDeviceGetProcessUtilization`: the allocation's processes' samples.
pub unsafe fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    since: c_ulonglong,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetProcessUtilization(
        device, samples, count, since
    )));
    let r = processes(
        f,
        device,
        count,
        samples,
        |c, s| call_real!(nvmlDeviceGetProcessUtilization(device, s, c, since)),
        |e| e.pid,
    );
    // NVML answers "not found" when there is no sample to give.
    // SAFETY: `count` is non-null when `processes` returned OK.
    if r == OK && !count.is_null() && unsafe { *count } == 0 {
        return NOT_FOUND;
    }
    r
}

/// `nvmlDeviceGetUtilizationRates`: what a `nvidia-smi` user inside the
/// allocation expects is the activity of the allocation (the GPU it was
/// given), not a neighbour's: the sum of its processes' samples over the
/// last second, capped at 100 %. Withheld (`NVML_ERROR_NOT_SUPPORTED`,
/// shown as N/A) where the driver has no per-process samples.
pub unsafe fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    util: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    let f = files_or!(call_real!(nvmlDeviceGetUtilizationRates(device, util)));
    if util.is_null() {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    if !is_shown(f, device) {
        return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
    }
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut buf = vec![nvmlProcessUtilizationSample_t::default(); 64];
    let mut n = buf.len() as c_uint;
    // SAFETY: `buf` holds `n` entries; `n` is ours.
    let r = unsafe {
        nvmlDeviceGetProcessUtilization(
            device,
            buf.as_mut_ptr(),
            &mut n,
            now_us.saturating_sub(1_000_000),
        )
    };
    let (gpu, mem) = match r {
        OK => buf[..n as usize].iter().fold((0u32, 0u32), |(g, m), s| {
            (g.saturating_add(s.smUtil), m.saturating_add(s.memUtil))
        }),
        NOT_FOUND => (0, 0),
        nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE => (100, 100),
        nvmlReturn_t::NVML_ERROR_FUNCTION_NOT_FOUND => {
            return nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED;
        }
        r => return r,
    };
    // SAFETY: non-null; the caller's to write.
    unsafe {
        (*util).gpu = gpu.min(100);
        (*util).memory = mem.min(100);
    }
    OK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cuda_visible_devices_reads_as_the_driver_reads_it() {
        let uuids = u(&[
            "GPU-8f3a0000-1111-2222-3333-444444444444",
            "GPU-8f3b0000-1111-2222-3333-555555555555",
            "GPU-12345678-aaaa-bbbb-cccc-dddddddddddd",
        ]);
        assert_eq!(cuda_visible(None, &uuids), vec![0, 1, 2]);
        assert_eq!(cuda_visible(Some(""), &uuids), Vec::<usize>::new());
        assert_eq!(cuda_visible(Some("2,0"), &uuids), vec![2, 0]);
        assert_eq!(cuda_visible(Some("GPU-1234, 1"), &uuids), vec![2, 1]);
        assert_eq!(
            cuda_visible(Some("gpu-8F3B0000-1111-2222-3333-555555555555"), &uuids),
            vec![1]
        );
        // Ambiguous prefix, unknown index, repeats: parsing stops there.
        assert_eq!(cuda_visible(Some("0,GPU-8f3"), &uuids), vec![0]);
        assert_eq!(cuda_visible(Some("1,7,0"), &uuids), vec![1]);
        assert_eq!(cuda_visible(Some("1,1,0"), &uuids), vec![1]);
        assert_eq!(cuda_visible(Some("GPU-,0"), &uuids), Vec::<usize>::new());
        assert_eq!(cuda_visible(Some("MIG-1,0"), &uuids), Vec::<usize>::new());
    }

    #[test]
    fn only_the_allocations_entries_are_kept_in_order() {
        let files = crate::governor::tests::leaked_files(&[1000]);
        let me = std::process::id();
        let mut list = [
            nvmlProcessInfo_v1_t {
                pid: 1,
                usedGpuMemory: 9,
            },
            nvmlProcessInfo_v1_t {
                pid: me,
                usedGpuMemory: 5,
            },
            nvmlProcessInfo_v1_t {
                pid: 2,
                usedGpuMemory: 7,
            },
        ];
        let mut n: c_uint = 3;
        // SAFETY: three initialised entries.
        unsafe { keep_ours(files, &mut n, list.as_mut_ptr(), |e| e.pid) };
        assert_eq!(n, 1);
        assert_eq!((list[0].pid, list[0].usedGpuMemory), (me, 5));
    }
}
