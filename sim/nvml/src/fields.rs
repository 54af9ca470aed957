//! Field values (`nvmlDeviceGetFieldValues`): the fields whose values the simulation
//! knows; every other field is answered `NVML_ERROR_NOT_SUPPORTED` in its own entry, as
//! NVIDIA's library does for fields a device lacks.

use super::*;

/// The value of one field, or why not.
fn field(node: &Node, i: u32, id: c_uint) -> NvResult<(nvmlValueType_t, nvmlValue_t)> {
    use nvmlValueType_t as V;
    let ull = |v: u64| {
        (
            V::NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            nvmlValue_t { ullVal: v },
        )
    };
    let ui = |v: c_uint| (V::NVML_VALUE_TYPE_UNSIGNED_INT, nvmlValue_t { uiVal: v });
    Ok(match id {
        // ECC is on and no memory error ever happens here.
        NVML_FI_DEV_ECC_CURRENT => ui(1),
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL
        | NVML_FI_DEV_ECC_DBE_VOL_TOTAL
        | NVML_FI_DEV_ECC_SBE_AGG_TOTAL
        | NVML_FI_DEV_ECC_DBE_AGG_TOTAL => ull(0),
        // Devices are not linked to each other (no peer access is simulated).
        NVML_FI_DEV_NVLINK_LINK_COUNT => ui(0),
        NVML_FI_DEV_MEMORY_TEMP => ui(activity::temperature_c(node, i)),
        NVML_FI_DEV_POWER_INSTANT => ui(activity::power_mw(node, i)),
        _ => return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED),
    })
}

/// `nvmlDeviceGetFieldValues`: fills each entry's value, type, timestamp and return code;
/// the call itself succeeds whatever the fields.
///
/// # Safety
/// `values` must point to `valuesCount` writable entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device_: nvmlDevice_t,
    valuesCount: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let n =
            usize::try_from(valuesCount).map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
        if n > 0 && values.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        let now_us = (realtime_ns() / 1000) as i64;
        for k in 0..n {
            // SAFETY: the caller passes `valuesCount` writable entries.
            let v = unsafe { &mut *values.add(k) };
            v.timestamp = now_us;
            v.latencyUsec = 0;
            match field(node, i, v.fieldId) {
                Ok((t, val)) => {
                    v.valueType = t;
                    v.value = val;
                    v.nvmlReturn = nvmlReturn_t::NVML_SUCCESS;
                }
                Err(e) => v.nvmlReturn = e,
            }
        }
        Ok(())
    })
}
