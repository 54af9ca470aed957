//! hiprtc, which ROCm 5 ships inside `libamdhip64.so.5` (CuPy-ROCm looks its functions up
//! on that library).
//!
//! "Compiling" finds the program's kernels (every `__global__` function, and every name
//! expression added) and writes a code object in this library's format
//! ([`crate::module::CODE_MAGIC`]) that `hipModuleLoadData` loads: the kernels exist and
//! can be launched, and they compute nothing. The source is not checked: a program with
//! a C++ error compiles here. A program with no kernel at all fails, as it would have
//! nothing to load.

use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::{Mutex, MutexGuard};

use crate::module::CODE_MAGIC;
use crate::*;

/// One program (`hiprtcProgram`).
#[derive(Debug, Default)]
pub struct Program {
    source: String,
    /// Name expressions added before compiling, with their lowered names (the expression
    /// itself: the simulated code object names kernels as written).
    names: Vec<(String, CString)>,
    code: Option<Vec<u8>>,
    log: CString,
}

static PROGRAMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kernels a source declares: the name before the parameter list of each
/// `__global__` function, skipping `__launch_bounds__(...)`.
pub fn kernel_names(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("__global__") {
        rest = &rest[at + "__global__".len()..];
        let mut scan = rest;
        while let Some(paren) = scan.find('(') {
            let before = scan[..paren].trim_end();
            let ident_start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let ident = &before[ident_start..];
            if ident == "__launch_bounds__" {
                // Skip the bounds' own parentheses and look again.
                match scan[paren..].find(')') {
                    Some(close) => scan = &scan[paren + close + 1..],
                    None => break,
                }
                continue;
            }
            if !ident.is_empty() && !out.iter().any(|n| n == ident) {
                out.push(ident.to_string());
            }
            break;
        }
    }
    out
}

fn program(p: *mut c_void) -> Result<&'static Mutex<Program>, hiprtcResult> {
    if !lock(&PROGRAMS).contains(&(p as usize)) {
        return Err(HIPRTC_ERROR_INVALID_PROGRAM);
    }
    // SAFETY: a live program box of this module; boxes are freed only by
    // hiprtcDestroyProgram, which removes them from the live list first.
    Ok(unsafe { &*(p as *const Mutex<Program>) })
}

fn rtc_guard(body: impl FnOnce() -> Result<(), hiprtcResult>) -> hiprtcResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HIPRTC_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => HIPRTC_ERROR_INTERNAL_ERROR,
    }
}

/// # Safety
/// A non-null `out` must be writable.
unsafe fn rtc_put<T>(out: *mut T, v: T) -> Result<(), hiprtcResult> {
    // SAFETY: the caller's contract.
    unsafe { put(out, v) }.map_err(|_| HIPRTC_ERROR_INVALID_INPUT)
}

fn compile(p: &mut Program) -> Result<(), hiprtcResult> {
    let mut kernels = kernel_names(&p.source);
    for (expr, _) in &p.names {
        if !kernels.contains(expr) {
            kernels.push(expr.clone());
        }
    }
    if kernels.is_empty() {
        p.log = c"error: the program declares no __global__ function".to_owned();
        return Err(HIPRTC_ERROR_COMPILATION);
    }
    let mut code = format!("{CODE_MAGIC}\n");
    for k in &kernels {
        code.push_str("kernel ");
        code.push_str(k);
        code.push('\n');
    }
    let mut bytes = code.into_bytes();
    // The NUL is part of the code object: hipModuleLoadData is given only its address.
    bytes.push(0);
    p.code = Some(bytes);
    p.log = CString::default();
    Ok(())
}

hip_api! {
    /// `hiprtcCreateProgram`: the headers are not read.
    ///
    /// # Safety
    /// `prog` must be null or writable; `src` a C string.
    "hip_4.2" fn hiprtcCreateProgram(
        prog: *mut *mut c_void,
        src: *const c_char,
        _name: *const c_char,
        _num_headers: c_int,
        _headers: *const *const c_char,
        _include_names: *const *const c_char,
    ) -> hiprtcResult {
        rtc_guard(|| {
            if prog.is_null() || src.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated source.
            let source = unsafe { CStr::from_ptr(src) }.to_string_lossy().into_owned();
            let p = Box::into_raw(Box::new(Mutex::new(Program { source, ..Program::default() })));
            lock(&PROGRAMS).push(p as usize);
            // SAFETY: checked non-null; the caller passes a writable pointer.
            unsafe { rtc_put(prog, p.cast()) }
        })
    }

    /// `hiprtcDestroyProgram`.
    ///
    /// # Safety
    /// `prog` must be null or point to a program handle.
    "hip_4.2" fn hiprtcDestroyProgram(prog: *mut *mut c_void) -> hiprtcResult {
        rtc_guard(|| {
            if prog.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            // SAFETY: non-null; the caller passes a readable handle.
            let p = unsafe { *prog };
            {
                let mut live = lock(&PROGRAMS);
                let i = live.iter().position(|&x| x == p as usize).ok_or(HIPRTC_ERROR_INVALID_PROGRAM)?;
                live.swap_remove(i);
            }
            // SAFETY: removed from the live list: the last use of the box made above.
            drop(unsafe { Box::from_raw(p.cast::<Mutex<Program>>()) });
            // SAFETY: as above; HIP nulls the caller's handle.
            unsafe { *prog = std::ptr::null_mut() };
            Ok(())
        })
    }

    /// `hiprtcAddNameExpression`.
    ///
    /// # Safety
    /// `expr` must be null or a C string.
    "hip_4.2" fn hiprtcAddNameExpression(prog: *mut c_void, expr: *const c_char) -> hiprtcResult {
        rtc_guard(|| {
            if expr.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated string.
            let e = unsafe { CStr::from_ptr(expr) };
            let mut p = lock(program(prog)?);
            let text = e.to_string_lossy().trim().to_string();
            p.names.push((text, e.to_owned()));
            Ok(())
        })
    }

    /// `hiprtcCompileProgram`: the options are not read.
    ///
    /// # Safety
    /// No pointer is read.
    "hip_4.2" fn hiprtcCompileProgram(prog: *mut c_void, _n: c_int, _options: *const *const c_char) -> hiprtcResult {
        rtc_guard(|| compile(&mut lock(program(prog)?)))
    }

    /// `hiprtcGetLoweredName`: a name expression's kernel name.
    ///
    /// # Safety
    /// `expr` must be null or a C string; `lowered` null or writable.
    "hip_4.2" fn hiprtcGetLoweredName(prog: *mut c_void, expr: *const c_char, lowered: *mut *const c_char) -> hiprtcResult {
        rtc_guard(|| {
            if expr.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated string.
            let want = unsafe { CStr::from_ptr(expr) }.to_string_lossy().trim().to_string();
            let p = lock(program(prog)?);
            if p.code.is_none() {
                return Err(HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION);
            }
            let (_, name) = p.names.iter().find(|(e, _)| *e == want).ok_or(HIPRTC_ERROR_INVALID_INPUT)?;
            // The string lives in the program's box, as long as the program: HIP's rule.
            // SAFETY: the caller's contract.
            unsafe { rtc_put(lowered, name.as_ptr()) }
        })
    }

    /// `hiprtcGetCodeSize`: bytes of the code object, its NUL included.
    ///
    /// # Safety
    /// `size` must be null or writable.
    "hip_4.2" fn hiprtcGetCodeSize(prog: *mut c_void, size: *mut usize) -> hiprtcResult {
        rtc_guard(|| {
            let p = lock(program(prog)?);
            let n = p.code.as_ref().map_or(0, Vec::len);
            // SAFETY: the caller's contract.
            unsafe { rtc_put(size, n) }
        })
    }

    /// `hiprtcGetCode`.
    ///
    /// # Safety
    /// `code` must be null or valid for `hiprtcGetCodeSize` bytes.
    "hip_4.2" fn hiprtcGetCode(prog: *mut c_void, code: *mut c_char) -> hiprtcResult {
        rtc_guard(|| {
            if code.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            let p = lock(program(prog)?);
            let bytes = p.code.as_ref().ok_or(HIPRTC_ERROR_INVALID_PROGRAM)?;
            // SAFETY: the caller passes a buffer of the size hiprtcGetCodeSize gave.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), code.cast::<u8>(), bytes.len()) };
            Ok(())
        })
    }

    /// `hiprtcGetProgramLogSize`: bytes of the log, its NUL included.
    ///
    /// # Safety
    /// `size` must be null or writable.
    "hip_4.2" fn hiprtcGetProgramLogSize(prog: *mut c_void, size: *mut usize) -> hiprtcResult {
        rtc_guard(|| {
            let n = lock(program(prog)?).log.as_bytes_with_nul().len();
            // SAFETY: the caller's contract.
            unsafe { rtc_put(size, n) }
        })
    }

    /// `hiprtcGetProgramLog`.
    ///
    /// # Safety
    /// `log` must be null or valid for `hiprtcGetProgramLogSize` bytes.
    "hip_4.2" fn hiprtcGetProgramLog(prog: *mut c_void, log: *mut c_char) -> hiprtcResult {
        rtc_guard(|| {
            if log.is_null() {
                return Err(HIPRTC_ERROR_INVALID_INPUT);
            }
            let p = lock(program(prog)?);
            let bytes = p.log.as_bytes_with_nul();
            // SAFETY: the caller passes a buffer of the size hiprtcGetProgramLogSize gave.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), log.cast::<u8>(), bytes.len()) };
            Ok(())
        })
    }

    /// `hiprtcVersion`: the ROCm release of the headers read, 5.2.
    ///
    /// # Safety
    /// `major` and `minor` must be null or writable.
    "hip_4.2" fn hiprtcVersion(major: *mut c_int, minor: *mut c_int) -> hiprtcResult {
        rtc_guard(|| {
            // SAFETY: the caller's contract.
            unsafe {
                rtc_put(major, 5)?;
                rtc_put(minor, 2)
            }
        })
    }

    /// `hiprtcGetErrorString`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hiprtcGetErrorString(result: hiprtcResult) -> *const c_char {
        match result {
            HIPRTC_SUCCESS => c"HIPRTC_SUCCESS",
            HIPRTC_ERROR_INVALID_INPUT => c"HIPRTC_ERROR_INVALID_INPUT",
            HIPRTC_ERROR_INVALID_PROGRAM => c"HIPRTC_ERROR_INVALID_PROGRAM",
            HIPRTC_ERROR_COMPILATION => c"HIPRTC_ERROR_COMPILATION",
            HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION => {
                c"HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION"
            }
            _ => c"HIPRTC_ERROR_INTERNAL_ERROR",
        }
        .as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_found_with_and_without_bounds() {
        let src = r#"
            extern "C" __global__ void cupy_add(const float* a, float* b) { }
            __global__ void __launch_bounds__(512, 2) bounded(int n) { }
            template<typename T> __global__ void templ(T x) { }
            __device__ int helper(int x) { return x; }
            __global__ void _cupy_preprocess_dummy_kernel_() { }
        "#;
        assert_eq!(
            kernel_names(src),
            [
                "cupy_add",
                "bounded",
                "templ",
                "_cupy_preprocess_dummy_kernel_"
            ]
        );
        assert!(kernel_names("int main() { return 0; }").is_empty());
    }

    #[test]
    fn a_program_without_kernels_fails_with_a_log() {
        let mut p = Program {
            source: "int x;".into(),
            ..Program::default()
        };
        assert_eq!(compile(&mut p), Err(HIPRTC_ERROR_COMPILATION));
        assert!(p.log.to_string_lossy().contains("no __global__"));
        let mut p = Program {
            source: "__global__ void k() {}".into(),
            names: vec![("templ<float>".into(), c"templ<float>".to_owned())],
            ..Program::default()
        };
        compile(&mut p).expect("compiles");
        let code = p.code.expect("code");
        assert_eq!(code.last(), Some(&0));
        let kernels = crate::module::parse_code(&code).expect("loads");
        let names: Vec<&str> = kernels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["k", "templ<float>"]);
    }
}
