//! `nvmlInit`/`nvmlShutdown`: opening the simulated node once per process, and the error strings.

use super::*;

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
static INITS: AtomicU32 = AtomicU32::new(0);

fn init() -> NvResult<()> {
    match NODE.get_or_init(|| Node::open_from_env().map_err(|e| e.to_string())) {
        Ok(_) => {
            INITS.fetch_add(1, Ordering::AcqRel);
            Ok(())
        }
        Err(e) => {
            eprintln!("tessera-sim libnvidia-ml: {e}");
            Err(nvmlReturn_t::NVML_ERROR_DRIVER_NOT_LOADED)
        }
    }
}

/// The node, while NVML is initialised.
pub(crate) fn node() -> NvResult<&'static Node> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }
    match NODE.get() {
        Some(Ok(n)) => Ok(n),
        _ => Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED),
    }
}

tessera_sim::exports! {
    /// `nvmlInit_v2` and `nvmlInit` (the pre-v2 symbol; same behaviour).
    ///
    /// # Safety
    /// No pointer arguments.
    fn [nvmlInit_v2, nvmlInit]() -> nvmlReturn_t {
        guard(init)
    }
}

/// `nvmlInitWithFlags`: `NVML_INIT_FLAG_NO_GPUS` and `NVML_INIT_FLAG_NO_ATTACH` accepted.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    guard(|| {
        if flags & !(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH) != 0 {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        init()
    })
}

/// `nvmlShutdown`: balances one init; the last one makes calls fail as uninitialised.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        INITS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| nvmlReturn_t::NVML_ERROR_UNINITIALIZED)
    })
}

macro_rules! error_strings {
    ($($name:ident => $text:literal,)*) => {
        pub(crate) fn error_text(r: nvmlReturn_t) -> &'static CStr {
            $(if r == nvmlReturn_t::$name { return $text; })*
            c"Unknown Error"
        }
    };
}

error_strings! {
    NVML_SUCCESS => c"Success",
    NVML_ERROR_UNINITIALIZED => c"Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
    NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
    NVML_ERROR_NOT_FOUND => c"Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
    NVML_ERROR_TIMEOUT => c"Timeout",
    NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
    NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM => c"GPU access blocked by the operating system",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH => c"Driver/library version mismatch",
    NVML_ERROR_IN_USE => c"In use by another client",
    NVML_ERROR_MEMORY => c"Insufficient Memory",
    NVML_ERROR_NO_DATA => c"No data",
    NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
    NVML_ERROR_DEPRECATED => c"Deprecated",
    NVML_ERROR_NOT_READY => c"Not ready",
    NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
    NVML_ERROR_INVALID_STATE => c"Invalid state",
    NVML_ERROR_UNKNOWN => c"Unknown Error",
}

/// `nvmlErrorString`: a static string for every code (unknown codes included).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    catch_unwind(|| error_text(result).as_ptr()).unwrap_or(c"Unknown Error".as_ptr())
}
