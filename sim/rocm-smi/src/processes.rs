//! The processes using the node's AMD devices: the node-wide list ROCm SMI 5.2 gives
//! (`rsmi_compute_process_info_get`, `_by_pid_get`, `rsmi_compute_process_gpus_get`)
//! and the per-device figure of later releases (`_by_device_get`, ROCm 5.5 on), which
//! is what the manager needs to tell one GPU's holdings from another's.

use super::*;

/// One process's holdings on the node's AMD devices: `(pid, slot, memory per AMD
/// device in ROCm SMI order, utilization per AMD device)`. A process counts when it
/// has a context or memory on one of them; dead processes are reaped first, and one
/// the driver is still tearing down still counts (its memory is still held).
fn amd_processes(node: &Node) -> Vec<(u32, usize, Vec<u64>, Vec<f64>)> {
    node.reap_dead();
    let amd = amd_devices(node);
    node.processes()
        .into_iter()
        .filter_map(|p| {
            let mem: Vec<u64> = amd.iter().map(|&i| p.memory[i as usize]).collect();
            let util: Vec<f64> = amd.iter().map(|&i| p.utilization[i as usize]).collect();
            let present = amd
                .iter()
                .enumerate()
                .any(|(k, &i)| p.contexts & (1 << i) != 0 || mem[k] > 0);
            present.then_some((p.pid, p.slot, mem, util))
        })
        .collect()
}

/// The record of a process over the devices `which` selects (indices into its lists).
fn record(
    pid: u32,
    slot: usize,
    mem: &[u64],
    util: &[f64],
    which: &[usize],
) -> rsmi_process_info_t {
    let busy: f64 = which.iter().map(|&k| util[k]).sum::<f64>() / which.len().max(1) as f64;
    rsmi_process_info_t {
        process_id: pid,
        // KFD gives each process an address-space id; the slot stands in for it.
        pasid: slot as u32 + 1,
        vram_usage: which.iter().map(|&k| mem[k]).sum(),
        sdma_usage: 0,
        cu_occupancy: (busy * 100.0).round().clamp(0.0, 100.0) as u32,
    }
}

/// The AMD devices (ROCm SMI indices) a process uses.
fn used(node: &Node, pid: u32) -> RsmiResult<Vec<usize>> {
    let amd = amd_devices(node);
    let p = node.process(pid).ok_or(RSMI_STATUS_NOT_FOUND)?;
    Ok(amd
        .iter()
        .enumerate()
        .filter(|&(_, &i)| p.contexts & (1 << i) != 0 || p.memory[i as usize] > 0)
        .map(|(k, _)| k)
        .collect())
}

/// `rsmi_compute_process_info_get`: every process using an AMD device, its VRAM summed
/// over them. With `procs` null, only the count; with too little room, as many as fit
/// and `RSMI_STATUS_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `num_items` must be valid; `procs` null or holding `*num_items` records.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_compute_process_info_get(
    procs: *mut rsmi_process_info_t,
    num_items: *mut u32,
) -> rsmi_status_t {
    guard(|| {
        let node = node()?;
        if num_items.is_null() {
            return Err(RSMI_STATUS_INVALID_ARGS);
        }
        let list = amd_processes(node);
        if procs.is_null() {
            // SAFETY: non-null, the caller's to write.
            unsafe { num_items.write(list.len() as u32) };
            return Ok(());
        }
        // SAFETY: non-null, the caller's to read.
        let room = unsafe { num_items.read() } as usize;
        let n = list.len().min(room);
        for (k, (pid, slot, mem, util)) in list.iter().take(n).enumerate() {
            let all: Vec<usize> = (0..mem.len()).collect();
            // SAFETY: k < n <= room records of the caller's array.
            unsafe { procs.add(k).write(record(*pid, *slot, mem, util, &all)) };
        }
        // SAFETY: as above.
        unsafe { num_items.write(n as u32) };
        if n < list.len() {
            return Err(RSMI_STATUS_INSUFFICIENT_SIZE);
        }
        Ok(())
    })
}

/// `rsmi_compute_process_info_by_pid_get`: one process, its VRAM summed over the AMD
/// devices; `RSMI_STATUS_NOT_FOUND` when it uses none.
///
/// # Safety
/// `proc_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_compute_process_info_by_pid_get(
    pid: u32,
    proc_: *mut rsmi_process_info_t,
) -> rsmi_status_t {
    guard(|| {
        let node = node()?;
        let (pid, slot, mem, util) = amd_processes(node)
            .into_iter()
            .find(|p| p.0 == pid)
            .ok_or(RSMI_STATUS_NOT_FOUND)?;
        let all: Vec<usize> = (0..mem.len()).collect();
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(proc_, record(pid, slot, &mem, &util, &all)) }
    })
}

/// `rsmi_compute_process_info_by_device_get` (ROCm 5.5 and later): one process's
/// figures on one device; `RSMI_STATUS_NOT_FOUND` when it does not use that device.
///
/// # Safety
/// `proc_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_compute_process_info_by_device_get(
    pid: u32,
    dv_ind: u32,
    proc_: *mut rsmi_process_info_t,
) -> rsmi_status_t {
    guard(|| {
        let node = node()?;
        device(dv_ind)?;
        let (pid, slot, mem, util) = amd_processes(node)
            .into_iter()
            .find(|p| p.0 == pid)
            .ok_or(RSMI_STATUS_NOT_FOUND)?;
        if !used(node, pid)?.contains(&(dv_ind as usize)) {
            return Err(RSMI_STATUS_NOT_FOUND);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(proc_, record(pid, slot, &mem, &util, &[dv_ind as usize])) }
    })
}

/// `rsmi_compute_process_gpus_get`: the AMD devices a process uses, as ROCm SMI
/// indices. With `dv_indices` null, only the count.
///
/// # Safety
/// `num_devices` must be valid; `dv_indices` null or holding `*num_devices` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_compute_process_gpus_get(
    pid: u32,
    dv_indices: *mut u32,
    num_devices: *mut u32,
) -> rsmi_status_t {
    guard(|| {
        let node = node()?;
        if num_devices.is_null() {
            return Err(RSMI_STATUS_INVALID_ARGS);
        }
        let list = used(node, pid)?;
        if dv_indices.is_null() {
            // SAFETY: non-null, the caller's to write.
            unsafe { num_devices.write(list.len() as u32) };
            return Ok(());
        }
        // SAFETY: non-null, the caller's to read.
        let room = unsafe { num_devices.read() } as usize;
        let n = list.len().min(room);
        for (k, dv) in list.iter().take(n).enumerate() {
            // SAFETY: k < n <= room entries of the caller's array.
            unsafe { dv_indices.add(k).write(*dv as u32) };
        }
        // SAFETY: as above.
        unsafe { num_devices.write(n as u32) };
        if n < list.len() {
            return Err(RSMI_STATUS_INSUFFICIENT_SIZE);
        }
        Ok(())
    })
}
