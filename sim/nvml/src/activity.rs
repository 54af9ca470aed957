//! Activity: utilization from the engine's busy time, and the temperature, power, clocks
//! and performance state derived from it (see `docs/simulator.md`).

use super::*;

/// Busy fraction of the device's engine over the last `window_ns`.
fn busy(node: &Node, i: u32, window_ns: u64) -> f64 {
    node.device(i)
        .map(|d| d.busy.utilization(now_ns(), window_ns))
        .unwrap_or(0.0)
}

fn pct(x: f64) -> c_uint {
    (x * 100.0).round().clamp(0.0, 100.0) as c_uint
}

/// `nvmlDeviceGetUtilizationRates`: GPU = engine busy over the last second; memory =
/// a synthetic 40% of that (no memory traffic is simulated).
///
/// # Safety
/// `utilization` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device_: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let b = busy(node, i, 1_000_000_000);
        let u = nvmlUtilization_t {
            gpu: pct(b),
            memory: pct(b * 0.4),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(utilization, u) }
    })
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process busy on the device in the
/// last second, stamped now (µs since the epoch).
///
/// # Safety
/// `processSamplesCount` must be valid; `utilization` null or holding that many entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device_: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    processSamplesCount: *mut c_uint,
    lastSeenTimeStamp: c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if processSamplesCount.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        node.reap_dead();
        let stamp = realtime_ns() / 1000;
        let samples: Vec<nvmlProcessUtilizationSample_t> = if stamp > lastSeenTimeStamp {
            node.processes()
                .into_iter()
                .filter(|p| p.utilization[i as usize] > 0.0)
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: stamp,
                    smUtil: pct(p.utilization[i as usize]),
                    memUtil: pct(p.utilization[i as usize] * 0.4),
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        // SAFETY: non-null; the caller's to read and write.
        let room = unsafe { processSamplesCount.read() } as usize;
        // SAFETY: as above.
        unsafe { processSamplesCount.write(samples.len() as c_uint) };
        if samples.is_empty() {
            return Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND);
        }
        if utilization.is_null() || room < samples.len() {
            return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, s) in samples.into_iter().enumerate() {
            // SAFETY: k < samples.len() <= room entries of the caller's array.
            unsafe { utilization.add(k).write(s) };
        }
        Ok(())
    })
}

/// Temperature in °C: 34 idle, 78 fully busy, following the last five seconds.
pub(crate) fn temperature_c(node: &Node, i: u32) -> c_uint {
    34 + (44.0 * busy(node, i, 5_000_000_000)).round() as c_uint
}

/// `nvmlDeviceGetTemperature`.
///
/// # Safety
/// `temp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device_: nvmlDevice_t,
    sensorType: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if sensorType != nvmlTemperatureSensors_t::NVML_TEMPERATURE_GPU {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(temp, temperature_c(node, i)) }
    })
}

/// `nvmlDeviceGetTemperatureThreshold`.
///
/// # Safety
/// `temp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device_: nvmlDevice_t,
    thresholdType: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        use nvmlTemperatureThresholds_t as T;
        let v = match thresholdType {
            T::NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => 92,
            T::NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => 89,
            T::NVML_TEMPERATURE_THRESHOLD_MEM_MAX => 95,
            T::NVML_TEMPERATURE_THRESHOLD_GPU_MAX => 87,
            _ => return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(temp, v) }
    })
}

pub(crate) fn power_mw(node: &Node, i: u32) -> c_uint {
    POWER_IDLE_MW
        + ((POWER_LIMIT_MW - POWER_IDLE_MW) as f64 * busy(node, i, 1_000_000_000)).round() as c_uint
}

/// `nvmlDeviceGetPowerUsage` (mW): idle draw plus the busy share of the rest.
///
/// # Safety
/// `power` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device_: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(power, power_mw(node, i)) }
    })
}

macro_rules! power_limit {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `limit` must be null or writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device_: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t {
            guard(|| {
                live(device_)?;
                // SAFETY: the caller passes a writable pointer or null (rejected).
                unsafe { put(limit, POWER_LIMIT_MW) }
            })
        }
    )*};
}

power_limit! {
    /// `nvmlDeviceGetPowerManagementLimit` (mW).
    nvmlDeviceGetPowerManagementLimit;
    /// `nvmlDeviceGetEnforcedPowerLimit` (mW).
    nvmlDeviceGetEnforcedPowerLimit;
    /// `nvmlDeviceGetPowerManagementDefaultLimit` (mW).
    nvmlDeviceGetPowerManagementDefaultLimit;
}

/// `nvmlDeviceGetPowerManagementLimitConstraints` (mW).
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device_: nvmlDevice_t,
    minLimit: *mut c_uint,
    maxLimit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(minLimit, 200_000)?;
            put(maxLimit, POWER_LIMIT_MW)
        }
    })
}

/// `nvmlDeviceGetTotalEnergyConsumption` (mJ since the node was created): idle draw
/// over that time plus the busy share over the work completed.
///
/// # Safety
/// `energy` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device_: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let now = now_ns();
        let u = node
            .device_usage(i)
            .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
        let done = u
            .busy_ns
            .saturating_sub(u.busy_until_ns.saturating_sub(now));
        let alive = now.saturating_sub(node.created_ns());
        // mW × ns / 1e9 = mJ
        let mj = (u128::from(POWER_IDLE_MW) * u128::from(alive)
            + u128::from(POWER_LIMIT_MW - POWER_IDLE_MW) * u128::from(done))
            / 1_000_000_000;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(energy, mj as c_ulonglong) }
    })
}

fn clock_mhz(node: &Node, i: u32, t: nvmlClockType_t, max: bool) -> NvResult<c_uint> {
    let active = max || busy(node, i, 1_000_000_000) > 0.0;
    use nvmlClockType_t as C;
    Ok(match t {
        C::NVML_CLOCK_GRAPHICS | C::NVML_CLOCK_SM => {
            if active {
                1980
            } else {
                345
            }
        }
        C::NVML_CLOCK_MEM => 2619,
        C::NVML_CLOCK_VIDEO => {
            if active {
                1755
            } else {
                765
            }
        }
        _ => return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT),
    })
}

/// Writes a device's current (or, with `max`, its highest) clock of a kind, in MHz.
///
/// # Safety
/// `clock` must be null (rejected) or writable.
unsafe fn put_clock(
    device_: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
    max: bool,
) -> NvResult<()> {
    let (node, i) = live(device_)?;
    let v = clock_mhz(node, i, type_, max)?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(clock, v) }
}

/// `nvmlDeviceGetClockInfo` (MHz): boost clocks while busy, idle clocks otherwise.
///
/// # Safety
/// `clock` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device_: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put_clock(device_, type_, clock, false) })
}

/// `nvmlDeviceGetMaxClockInfo` (MHz).
///
/// # Safety
/// `clock` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device_: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    guard(|| unsafe { put_clock(device_, type_, clock, true) })
}

/// `nvmlDeviceGetPerformanceState`: P0 while busy, P8 idle.
///
/// # Safety
/// `pState` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device_: nvmlDevice_t,
    pState: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let p = if busy(node, i, 1_000_000_000) > 0.0 {
            nvmlPstates_t::NVML_PSTATE_0
        } else {
            nvmlPstates_t::NVML_PSTATE_8
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pState, p) }
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`: "GPU idle" when idle, none otherwise.
///
/// # Safety
/// `reasons` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device_: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let r = if busy(node, i, 1_000_000_000) > 0.0 {
            0
        } else {
            u64::from(nvmlClocksEventReasonGpuIdle)
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(reasons, r) }
    })
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` (the older name).
///
/// # Safety
/// `reasons` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device_: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device_, reasons) }
}

/// `nvmlDeviceGetTemperatureV`: the versioned form; the GPU sensor only.
///
/// # Safety
/// `temperature` must be null or a valid, writable `nvmlTemperature_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device_: nvmlDevice_t,
    temperature: *mut nvmlTemperature_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if temperature.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // NVML_STRUCT_VERSION(Temperature, 1): the struct's size and version 1 in the top byte.
        let v1 = size_of::<nvmlTemperature_t>() as c_uint | (1 << 24);
        // SAFETY: non-null; the caller passes a valid struct whose version we check.
        let t = unsafe { &mut *temperature };
        if t.version != v1 {
            return Err(nvmlReturn_t::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if t.sensorType != nvmlTemperatureSensors_t::NVML_TEMPERATURE_GPU {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        t.temperature = temperature_c(node, i) as c_int;
        Ok(())
    })
}

macro_rules! idle_engine {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// Both pointers must be null or writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device_: nvmlDevice_t,
            utilization: *mut c_uint,
            samplingPeriodUs: *mut c_uint,
        ) -> nvmlReturn_t {
            guard(|| {
                live(device_)?;
                // SAFETY: the caller passes writable pointers or null (rejected).
                unsafe {
                    put(utilization, 0)?;
                    put(samplingPeriodUs, 167_000)
                }
            })
        }
    )*};
}

idle_engine! {
    /// `nvmlDeviceGetEncoderUtilization`: 0% (no video engines are simulated), over
    /// NVML's usual 167 ms sampling period.
    nvmlDeviceGetEncoderUtilization;
    /// `nvmlDeviceGetDecoderUtilization`: 0%, as the encoder.
    nvmlDeviceGetDecoderUtilization;
}

/// `nvmlDeviceGetPcieThroughput`: 0 KB/s each way (simulated copies move host memory and
/// take no bus time).
///
/// # Safety
/// `value` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device_: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        if counter.0 >= nvmlPcieUtilCounter_t::NVML_PCIE_UTIL_COUNT.0 {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(value, 0) }
    })
}
