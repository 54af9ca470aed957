//! Images: what programs load, read from the program's memory or a file and parsed into
//! kernels and globals ([`Code`], shared by the modules and libraries of
//! [`crate::module`]).
//!
//! An image is one of: the simulated module text of `tessera_sim::module` (`kernel <name>
//! <duration>` lines, explicit durations), or what real programs load — a fat binary (its
//! `__fatBinC_Wrapper_t` or the container itself), a cubin, or PTX text — parsed by
//! `tessera_sim::image` for kernel names, globals and resource hints; real kernels run for
//! the duration model of `tessera_sim::module::KernelTime` (`TESSERA_SIM_KERNEL_TIME`).
//!
//! Images arrive as bare pointers. They are copied out with `process_vm_readv` on this
//! process, which fails (`EFAULT`) instead of faulting on unmapped memory, reading exactly
//! the extent the image's headers claim, so a truncated or garbage image is an error code
//! and one line on stderr, never a crash. A fat binary's entry is decompressed and parsed
//! when a kernel or global is first asked for (as the driver's lazy loading does), so a
//! framework that registers hundreds of fat binaries at start pays only for what it uses.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use tessera_ffi::cuda::*;
use tessera_sim::image::{self, Extent, FATBIN_MAGIC, Global, ImageError, WRAPPER_MAGIC};
use tessera_sim::module::{Cost, KernelTime, ModuleSpec, parse_module};

use crate::CuResult;

/// Longest text image read (PTX of a large program is a few MiB).
const MAX_TEXT: usize = 64 << 20;
/// Most containers a version-2 fat binary wrapper may list.
const MAX_WRAPPED: usize = 4096;

/// One line on stderr for a rejected image or a bad setting: without it a framework shows
/// only an error code. The driver's one other place that writes is `cuInit`.
pub(crate) fn log(what: &str, e: impl std::fmt::Display) {
    let line = format!("tessera-sim libcuda: {what}: {e}\n");
    // One write(2) to the process's stderr: the line stays whole when threads log at once,
    // and it reaches fd 2 even where Rust's stderr is redirected (a test harness).
    // SAFETY: writes `line.len()` bytes of an owned buffer to fd 2.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

// ---- what an image holds ----

/// One kernel as a module knows it.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    pub name: String,
    pub cost: Cost,
    pub regs: Option<u32>,
    pub shared: Option<u32>,
    pub local: Option<u32>,
    pub max_threads: Option<u32>,
    pub params: Option<Vec<(u32, u32)>>,
}

/// Kernels and globals of an image, once parsed.
#[derive(Debug, Default)]
pub struct Contents {
    pub kernels: Vec<KernelSpec>,
    pub globals: Vec<Global>,
    /// The image's architecture (`90`), when it says.
    pub arch: Option<u32>,
}

impl Contents {
    pub(crate) fn kernel(&self, name: &str) -> Option<&KernelSpec> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

#[derive(Debug)]
enum Source {
    /// Parsed at load: the simulated text, a cubin, PTX.
    Ready,
    /// Fat binary entries chosen for the device, parsed on first use.
    Entries(Vec<image::fatbin::Entry<'static>>),
}

/// The code of a module or library: shared by a library's per-context modules.
#[derive(Debug)]
pub struct Code {
    source: Source,
    model: KernelTime,
    contents: OnceLock<Result<Contents, CUresult>>,
}

impl Code {
    fn ready(contents: Contents) -> Code {
        Code {
            source: Source::Ready,
            model: KernelTime::default(),
            contents: OnceLock::from(Ok(contents)),
        }
    }

    /// The kernels and globals, parsing fat binary entries the first time.
    pub fn contents(&self) -> CuResult<&Contents> {
        let parsed = self.contents.get_or_init(|| {
            let Source::Entries(entries) = &self.source else {
                return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
            };
            let mut all = Contents::default();
            for e in entries {
                let img = e.image().map_err(|err| {
                    log("fat binary entry", &err);
                    CUresult::CUDA_ERROR_INVALID_IMAGE
                })?;
                merge(&mut all, img, self.model);
            }
            Ok(all)
        });
        parsed.as_ref().map_err(|e| *e)
    }
}

fn merge(all: &mut Contents, img: image::Image, model: KernelTime) {
    all.arch = all.arch.or(img.arch);
    for k in img.kernels {
        if all.kernel(&k.name).is_none() {
            all.kernels.push(KernelSpec {
                name: k.name,
                cost: Cost::Modelled(model),
                regs: k.regs,
                shared: k.shared,
                local: k.local,
                max_threads: k.max_threads,
                params: k.params,
            });
        }
    }
    for g in img.globals {
        if !all.globals.iter().any(|h| h.name == g.name) {
            all.globals.push(g);
        }
    }
}

fn from_spec(spec: &ModuleSpec) -> Contents {
    Contents {
        kernels: spec
            .kernels
            .iter()
            .map(|(name, cost)| KernelSpec {
                name: name.clone(),
                cost: *cost,
                regs: None,
                shared: None,
                local: None,
                max_threads: None,
                params: None,
            })
            .collect(),
        globals: Vec::new(),
        arch: None,
    }
}

/// The duration model of real kernels, read once per process.
fn kernel_time() -> CuResult<KernelTime> {
    static MODEL: OnceLock<Result<KernelTime, String>> = OnceLock::new();
    MODEL
        .get_or_init(KernelTime::from_env)
        .clone()
        .map_err(|e| {
            log("kernel time", e);
            CUresult::CUDA_ERROR_INVALID_VALUE
        })
}

fn image_error(e: &ImageError) -> CUresult {
    match e {
        ImageError::NoBinaryForGpu { .. } => CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
        ImageError::Ptx { .. } => CUresult::CUDA_ERROR_INVALID_PTX,
        _ => CUresult::CUDA_ERROR_INVALID_IMAGE,
    }
}

/// The bytes of an image, by kind, as read from the program's memory.
#[derive(Debug)]
pub enum Raw {
    /// A fat binary container, cubin, or a text without its NUL.
    Bytes(Vec<u8>),
    /// The containers a fat binary wrapper points to.
    Containers(Vec<Vec<u8>>),
}

/// Parses what [`read_image`] (or a file) gave, for a device of compute capability
/// `arch` (`major * 10 + minor`).
pub fn code_of(raw: Raw, arch: u32) -> CuResult<Code> {
    let containers = match raw {
        Raw::Containers(c) => c,
        Raw::Bytes(b) if b.starts_with(&FATBIN_MAGIC.to_le_bytes()) => vec![b],
        Raw::Bytes(b) if b.starts_with(&image::ELF_MAGIC) || image::looks_like_ptx(&b) => {
            let model = kernel_time()?;
            let img = image::parse(&b, arch).map_err(|e| {
                log("image", &e);
                image_error(&e)
            })?;
            let mut contents = Contents::default();
            merge(&mut contents, img, model);
            return Ok(Code {
                model,
                ..Code::ready(contents)
            });
        }
        Raw::Bytes(b) => {
            let text = std::str::from_utf8(&b).map_err(|_| {
                log(
                    "image",
                    "neither a fat binary, cubin, PTX nor a simulated module",
                );
                CUresult::CUDA_ERROR_INVALID_IMAGE
            })?;
            let spec = parse_module(text).map_err(|e| {
                log("simulated module", e);
                CUresult::CUDA_ERROR_INVALID_IMAGE
            })?;
            return Ok(Code::ready(from_spec(&spec)));
        }
    };
    let model = kernel_time()?;
    let mut entries = Vec::new();
    for c in &containers {
        let fb = image::fatbin::Fatbin::parse(c).map_err(|e| {
            log("fat binary", &e);
            image_error(&e)
        })?;
        let entry = fb.select(arch).map_err(|e| {
            log("fat binary", &e);
            image_error(&e)
        })?;
        entries.push(entry.clone().into_owned());
    }
    Ok(Code {
        source: Source::Entries(entries),
        model,
        contents: OnceLock::new(),
    })
}

// ---- reading images from pointers ----

/// Copies `len` bytes at `addr` of this process, or fails if any of them is not mapped.
fn read_mem(addr: usize, len: usize) -> CuResult<Vec<u8>> {
    let mut out = vec![0u8; len];
    if len == 0 {
        return Ok(out);
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: len,
    };
    // SAFETY: reads this process's own memory into `out` (len bytes, owned); the kernel
    // checks the source range and reports EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == len as isize {
        return Ok(out);
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    if n < 0 && matches!(errno, Some(libc::ENOSYS) | Some(libc::EPERM)) {
        // The call is filtered (a seccomp profile): trust the pointer, as the driver does.
        // SAFETY: the caller of the driver promised `len` readable bytes at `addr`.
        return Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec());
    }
    Err(CUresult::CUDA_ERROR_INVALID_IMAGE)
}

fn read_u32(addr: usize) -> CuResult<u32> {
    let b = read_mem(addr, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn read_u64(addr: usize) -> CuResult<u64> {
    let b = read_mem(addr, 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(&b);
    Ok(u64::from_le_bytes(a))
}

/// Reads the image an entry point was given: follows a fat binary wrapper to its
/// containers, reads containers and cubins to the extent their headers give, and texts
/// (PTX, the simulated format) to their NUL.
pub fn read_image(image: *const c_void) -> CuResult<Raw> {
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let addr = image as usize;
    let fail = |e: ImageError| {
        log("image", &e);
        image_error(&e)
    };
    let magic = read_u32(addr).inspect_err(|_| log("image", "unreadable"))?;
    if magic == WRAPPER_MAGIC {
        let version = read_u32(addr + 4)?;
        let data = read_u64(addr + 8)? as usize;
        let list = read_u64(addr + 16)? as usize;
        let mut containers = Vec::new();
        match version {
            1 => containers.push(read_extent(data).map_err(fail)?),
            2 => {
                // Version 2 (relocatable device code): a null-terminated list of prelinked
                // containers.
                for i in 0..MAX_WRAPPED {
                    let p = read_u64(list + i * 8)? as usize;
                    if p == 0 {
                        break;
                    }
                    containers.push(read_extent(p).map_err(fail)?);
                }
                if containers.is_empty() && data != 0 {
                    containers.push(read_extent(data).map_err(fail)?);
                }
            }
            v => {
                return Err(fail(ImageError::Field {
                    what: "fat binary wrapper version",
                    value: v.into(),
                }));
            }
        }
        return Ok(Raw::Containers(containers));
    }
    read_extent(addr).map(Raw::Bytes).map_err(fail)
}

/// Reads one image at `addr` to the extent its headers claim.
fn read_extent(addr: usize) -> Result<Vec<u8>, ImageError> {
    let unreadable = ImageError::Truncated("image memory is not readable");
    if addr == 0 {
        return Err(unreadable);
    }
    let mut have = read_mem(addr, 4).map_err(|_| unreadable.clone())?;
    loop {
        match image::extent(&have)? {
            Extent::Known(n) => {
                return read_mem(addr, n as usize).map_err(|_| unreadable);
            }
            Extent::AtLeast(n) => {
                if n as usize <= have.len() {
                    return Err(ImageError::Truncated("image header"));
                }
                have = read_mem(addr, n as usize).map_err(|_| unreadable.clone())?;
            }
            Extent::NulTerminated => return read_text(addr),
        }
    }
}

/// Reads a NUL-terminated text in pages (the text may end just before unmapped memory).
fn read_text(addr: usize) -> Result<Vec<u8>, ImageError> {
    let mut text = Vec::new();
    let mut at = addr;
    while text.len() < MAX_TEXT {
        // Never read across a page boundary in one call: the next page may not exist.
        let chunk = 4096 - at % 4096;
        let bytes = read_mem(at, chunk)
            .map_err(|_| ImageError::Truncated("text without a terminating NUL"))?;
        if let Some(n) = bytes.iter().position(|&b| b == 0) {
            text.extend_from_slice(&bytes[..n]);
            return Ok(text);
        }
        text.extend_from_slice(&bytes);
        at += chunk;
    }
    Err(ImageError::TooLarge(MAX_TEXT as u64))
}

/// Reads an image file (any format `cuModuleLoadData` takes); a text may end with a NUL.
pub(crate) fn read_file(fname: *const c_char) -> CuResult<Raw> {
    if fname.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    let mut bytes = std::fs::read(&path).map_err(|_| CUresult::CUDA_ERROR_FILE_NOT_FOUND)?;
    if !bytes.starts_with(&FATBIN_MAGIC.to_le_bytes()) && !bytes.starts_with(&image::ELF_MAGIC) {
        // A text file may end with a NUL (NVRTC's PTX does).
        if let Some(n) = bytes.iter().position(|&b| b == 0) {
            bytes.truncate(n);
        }
    }
    Ok(Raw::Bytes(bytes))
}
