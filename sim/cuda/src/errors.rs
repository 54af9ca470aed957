//! `cuGetErrorName` and `cuGetErrorString`: every `CUresult` of CUDA 12.9 with its name
//! and a short description, as NUL-terminated statics (the driver returns pointers to
//! constant strings); and the optional log of failing calls (`TESSERA_SIM_TRACE_ERRORS`),
//! which is how a library that gives up on a driver error is debugged here; and the error
//! log callbacks (`cuLogsRegisterCallback`), accepted and never called.

use std::ffi::{c_char, c_void};

use tessera_ffi::cuda::{CUlogsCallback, CUlogsCallbackHandle, CUresult};

use crate::{guard, put};

macro_rules! errors {
    ($($name:ident => $text:literal,)*) => {
        /// `(code, name, description)` for every known `CUresult`.
        pub static ERRORS: &[(CUresult, &str, &str)] = &[
            $((CUresult::$name, concat!(stringify!($name), "\0"), concat!($text, "\0")),)*
        ];
    };
}

errors! {
    CUDA_SUCCESS => "no error",
    CUDA_ERROR_INVALID_VALUE => "invalid argument",
    CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
    CUDA_ERROR_NOT_INITIALIZED => "initialization error",
    CUDA_ERROR_DEINITIALIZED => "driver shutting down",
    CUDA_ERROR_PROFILER_DISABLED => "profiler disabled while using external profiling tool",
    CUDA_ERROR_PROFILER_NOT_INITIALIZED => "profiler not initialized",
    CUDA_ERROR_PROFILER_ALREADY_STARTED => "profiler already started",
    CUDA_ERROR_PROFILER_ALREADY_STOPPED => "profiler already stopped",
    CUDA_ERROR_STUB_LIBRARY => "CUDA driver is a stub library",
    CUDA_ERROR_DEVICE_UNAVAILABLE => "CUDA-capable device(s) is/are busy or unavailable",
    CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
    CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
    CUDA_ERROR_DEVICE_NOT_LICENSED => "device doesn't have valid Grid license",
    CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
    CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT => "context already current",
    CUDA_ERROR_MAP_FAILED => "mapping of buffer object failed",
    CUDA_ERROR_UNMAP_FAILED => "unmapping of buffer object failed",
    CUDA_ERROR_ARRAY_IS_MAPPED => "array is mapped",
    CUDA_ERROR_ALREADY_MAPPED => "resource already mapped",
    CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
    CUDA_ERROR_ALREADY_ACQUIRED => "resource already acquired",
    CUDA_ERROR_NOT_MAPPED => "resource not mapped",
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY => "resource not mapped as array",
    CUDA_ERROR_NOT_MAPPED_AS_POINTER => "resource not mapped as pointer",
    CUDA_ERROR_ECC_UNCORRECTABLE => "uncorrectable ECC error encountered",
    CUDA_ERROR_UNSUPPORTED_LIMIT => "limit is not supported on this architecture",
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE => "exclusive-thread device already in use by a different thread",
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => "peer access is not supported between these two devices",
    CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT => "invalid OpenGL or DirectX context",
    CUDA_ERROR_NVLINK_UNCORRECTABLE => "uncorrectable NVLink error detected during the execution",
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND => "PTX JIT compiler library not found",
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION => "the provided PTX was compiled with an unsupported toolchain",
    CUDA_ERROR_JIT_COMPILATION_DISABLED => "PTX JIT compilation was disabled",
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY => "the provided execution affinity is not supported",
    CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC => "the provided PTX contains unsupported call to cudaDeviceSynchronize",
    CUDA_ERROR_CONTAINED => "an exception occurred on the device that is now contained",
    CUDA_ERROR_INVALID_SOURCE => "device kernel image is invalid",
    CUDA_ERROR_FILE_NOT_FOUND => "file not found",
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => "shared object symbol not found",
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => "shared object initialization failed",
    CUDA_ERROR_OPERATING_SYSTEM => "OS call failed or operation not supported on this OS",
    CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
    CUDA_ERROR_ILLEGAL_STATE => "the operation cannot be performed in the present state",
    CUDA_ERROR_LOSSY_QUERY => "attempted introspection would be semantically lossy",
    CUDA_ERROR_NOT_FOUND => "named symbol not found",
    CUDA_ERROR_NOT_READY => "device not ready",
    CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
    CUDA_ERROR_LAUNCH_TIMEOUT => "the launch timed out and was terminated",
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING => "launch uses incompatible texturing mode",
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => "peer access is already enabled",
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => "peer access has not been enabled",
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => "cannot set while device is active in this process",
    CUDA_ERROR_CONTEXT_IS_DESTROYED => "context is destroyed",
    CUDA_ERROR_ASSERT => "device-side assert triggered",
    CUDA_ERROR_TOO_MANY_PEERS => "peer mapping resources exhausted",
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => "part or all of the requested memory range is already mapped",
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => "pointer does not correspond to a registered memory region",
    CUDA_ERROR_HARDWARE_STACK_ERROR => "hardware stack error",
    CUDA_ERROR_ILLEGAL_INSTRUCTION => "an illegal instruction was encountered",
    CUDA_ERROR_MISALIGNED_ADDRESS => "misaligned address",
    CUDA_ERROR_INVALID_ADDRESS_SPACE => "operation not supported on global/shared address space",
    CUDA_ERROR_INVALID_PC => "invalid program counter",
    CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => "too many blocks in cooperative launch",
    CUDA_ERROR_TENSOR_MEMORY_LEAK => "tensor memory not completely freed",
    CUDA_ERROR_NOT_PERMITTED => "operation not permitted",
    CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
    CUDA_ERROR_SYSTEM_NOT_READY => "system not yet initialized",
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => "system has unsupported display driver / cuda driver combination",
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => "forward compatibility was attempted on non supported HW",
    CUDA_ERROR_MPS_CONNECTION_FAILED => "MPS client failed to connect to the MPS control daemon or the MPS server",
    CUDA_ERROR_MPS_RPC_FAILURE => "the remote procedural call between the MPS server and the MPS client failed",
    CUDA_ERROR_MPS_SERVER_NOT_READY => "MPS server is not ready to accept new MPS client requests",
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED => "the hardware resources required to create MPS client have been exhausted",
    CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED => "the hardware resources required to support device connections have been exhausted",
    CUDA_ERROR_MPS_CLIENT_TERMINATED => "the MPS client has been terminated by the server",
    CUDA_ERROR_CDP_NOT_SUPPORTED => "the module is using CUDA Dynamic Parallelism, which is not supported",
    CUDA_ERROR_CDP_VERSION_MISMATCH => "CUDA Dynamic Parallelism is not supported by this version",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "operation not permitted when stream is capturing",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => "operation failed due to a previous error during capture",
    CUDA_ERROR_STREAM_CAPTURE_MERGE => "operation would result in a merge of separate capture sequences",
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => "capture was not ended in the same stream as it began",
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED => "capturing stream has unjoined work",
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION => "dependency created on uncaptured work in another stream",
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => "operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_CAPTURED_EVENT => "operation not permitted on an event last recorded in a capturing stream",
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => "attempt to terminate a thread-local capture sequence from another thread",
    CUDA_ERROR_TIMEOUT => "wait operation timed out",
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
    CUDA_ERROR_EXTERNAL_DEVICE => "an async error has occurred in external entity outside of CUDA",
    CUDA_ERROR_INVALID_CLUSTER_SIZE => "a kernel launch error has occurred due to cluster misconfiguration",
    CUDA_ERROR_FUNCTION_NOT_LOADED => "the function handle is not loaded when calling an API that requires a loaded function",
    CUDA_ERROR_INVALID_RESOURCE_TYPE => "one or more resources passed in are not valid resource types for the operation",
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION => "one or more resources are insufficient or non-applicable for the operation",
    CUDA_ERROR_KEY_ROTATION => "an error happened during the key rotation sequence",
    CUDA_ERROR_UNKNOWN => "unknown error",
}

/// The entry of a code, if it is one of CUDA's.
pub fn lookup(code: CUresult) -> Option<&'static (CUresult, &'static str, &'static str)> {
    ERRORS.iter().find(|(c, _, _)| *c == code)
}

/// The name of a code without its NUL, e.g. for logs.
pub fn name(code: CUresult) -> &'static str {
    lookup(code)
        .map(|(_, n, _)| n.trim_end_matches('\0'))
        .unwrap_or("CUDA_ERROR_UNRECOGNIZED")
}

/// `cuGetErrorName`: `CUDA_ERROR_INVALID_VALUE` (and `*pStr = NULL`) for an unknown code.
///
/// # Safety
/// `pStr` must be null or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    guard(|| {
        let entry = lookup(error);
        // SAFETY: the caller passes a writable pointer or null (rejected by `put`).
        unsafe {
            put(
                pStr,
                entry.map_or(std::ptr::null(), |e| e.1.as_ptr().cast()),
            )
        }?;
        entry.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuGetErrorString`.
///
/// # Safety
/// `pStr` must be null or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    guard(|| {
        let entry = lookup(error);
        // SAFETY: as in cuGetErrorName.
        unsafe {
            put(
                pStr,
                entry.map_or(std::ptr::null(), |e| e.2.as_ptr().cast()),
            )
        }?;
        entry.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })
}

/// Environment variable: when set (to anything but `0`), every driver call that fails
/// writes one line to stderr: the source place of the export that failed and the error.
/// Read once per process.
pub const ENV_TRACE_ERRORS: &str = "TESSERA_SIM_TRACE_ERRORS";

/// Logs a failed call when [`ENV_TRACE_ERRORS`] asks for it. `at` is the export's `guard`
/// call, which names the function (file and line).
pub fn trace_failure(at: &std::panic::Location<'_>, rc: CUresult) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os(ENV_TRACE_ERRORS).is_some_and(|v| v != "0")) {
        say(&format!("{}:{}: {}", at.file(), at.line(), name(rc)));
    }
}

/// One line on stderr. Never panics (unlike `eprintln!`): it runs inside entries that C
/// calls directly, which must not unwind.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "tessera-sim libcuda: {line}");
}

// ---- error log callbacks ----

/// `cuLogsRegisterCallback`: accepted; the simulated driver logs nothing through it.
///
/// # Safety
/// `callback_out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callbackFunc: CUlogsCallback,
    _userData: *mut c_void,
    callback_out: *mut CUlogsCallbackHandle,
) -> CUresult {
    guard(|| {
        if callbackFunc.is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // A non-null handle that names nothing: unregistering it is accepted.
        if !callback_out.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { callback_out.write(std::ptr::dangling_mut()) };
        }
        Ok(())
    })
}

/// `cuLogsUnregisterCallback`: accepted.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(_callback: CUlogsCallbackHandle) -> CUresult {
    CUresult::CUDA_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn names_and_strings_are_nul_terminated_and_unique() {
        for (code, name, text) in ERRORS {
            assert!(name.ends_with('\0') && text.ends_with('\0'));
            assert_eq!(
                ERRORS.iter().filter(|(c, _, _)| c == code).count(),
                1,
                "{name}"
            );
        }
    }

    #[test]
    fn get_error_name_and_string() {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out pointer.
        let rc = unsafe { cuGetErrorName(CUresult::CUDA_ERROR_OUT_OF_MEMORY, &mut p) };
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        // SAFETY: the driver returned a pointer to a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(p) };
        assert_eq!(name.to_str(), Ok("CUDA_ERROR_OUT_OF_MEMORY"));
        // SAFETY: as above.
        let rc = unsafe { cuGetErrorString(CUresult(12345), &mut p) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(p.is_null());
        // SAFETY: null out pointer is allowed and rejected.
        let rc = unsafe { cuGetErrorName(CUresult::CUDA_SUCCESS, std::ptr::null_mut()) };
        assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}
