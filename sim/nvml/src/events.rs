//! Event sets: XID errors injected through `tessera_sim::Node` arrive here.

use super::*;

/// An event set: which event types it wants from which devices, and the last XID
/// sequence number it has delivered per device.
#[derive(Debug, Default)]
pub struct EventSet {
    regs: Mutex<Vec<(u32, u64, u64)>>,
}

static SETS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// Event types the simulated devices raise.
const SUPPORTED_EVENTS: u64 = nvmlEventTypeXidCriticalError as u64;

fn event_set(set: nvmlEventSet_t) -> NvResult<&'static EventSet> {
    let sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
    if !sets.contains(&(set as usize)) {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: registered sets are leaked boxes that stay alive until `nvmlEventSetFree`
    // removes them from SETS; callers must not use a set after freeing it (NVML's contract).
    Ok(unsafe { &*(set as *const EventSet) })
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        node()?;
        if set.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        let p = Box::into_raw(Box::<EventSet>::default());
        SETS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize);
        // SAFETY: checked non-null above.
        unsafe { set.write(p.cast()) };
        Ok(())
    })
}

/// `nvmlEventSetFree`.
///
/// # Safety
/// `set` must not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        node()?;
        if !SETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(set as usize))
        {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: it was a registered leaked box, now unregistered, so this is its only free.
        drop(unsafe { Box::from_raw(set as *mut EventSet) });
        Ok(())
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: XID critical errors.
///
/// # Safety
/// `eventTypes` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device_: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(eventTypes, SUPPORTED_EVENTS) }
    })
}

/// `nvmlDeviceRegisterEvents`: only events after registration are delivered.
///
/// # Safety
/// Handles are checked; no pointer is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device_: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let s = event_set(set)?;
        if eventTypes & !SUPPORTED_EVENTS != 0 {
            return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED);
        }
        let seen = node
            .device(i)
            .map(|d| d.xid_seq.load(Ordering::Acquire))
            .unwrap_or(0);
        let mut regs = s.regs.lock().unwrap_or_else(|e| e.into_inner());
        regs.retain(|r| r.0 != i);
        regs.push((i, eventTypes, seen));
        Ok(())
    })
}

/// `nvmlEventSetWait_v2`: the next event of a registered device, waiting up to
/// `timeoutms` (a futex on the node state, woken by the injecting process).
///
/// # Safety
/// `data` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let node = node()?;
        let s = event_set(set)?;
        if data.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        let deadline = now_ns().saturating_add(u64::from(timeoutms) * 1_000_000);
        loop {
            let seq = node.event_seq();
            {
                let mut regs = s.regs.lock().unwrap_or_else(|e| e.into_inner());
                for r in regs.iter_mut() {
                    if r.1 & SUPPORTED_EVENTS == 0 {
                        continue;
                    }
                    let (events, _) = node.xid_events_since(r.0, r.2);
                    if let Some(e) = events.first() {
                        r.2 = e.seq;
                        let d = nvmlEventData_t {
                            device: handle(r.0),
                            eventType: SUPPORTED_EVENTS,
                            eventData: e.xid,
                            gpuInstanceId: u32::MAX,
                            computeInstanceId: u32::MAX,
                        };
                        // SAFETY: checked non-null above.
                        unsafe { data.write(d) };
                        return Ok(());
                    }
                }
            }
            let now = now_ns();
            if now >= deadline {
                return Err(nvmlReturn_t::NVML_ERROR_TIMEOUT);
            }
            node.wait_event(seq, (deadline - now).min(100_000_000));
        }
    })
}
