//! The images real frameworks load, parsed just far enough to know their kernels and
//! globals: fat binaries (the container NVIDIA's compilers embed in a program and the
//! runtime registers), cubins (ELF) and PTX text.
//!
//! Nothing here executes or compiles code. The parsers work on byte slices and never
//! panic on bad input: every malformed image is an [`ImageError`] that names what was
//! wrong. [`extent`] tells a caller holding only a pointer (the driver API passes images
//! without a length) how many bytes the image claims to span, so that it can read exactly
//! those bytes and no more. Format facts and their sources: `docs/simulator.md`.

pub mod elf;
pub mod fatbin;
pub mod ptx;

/// Magic of the wrapper struct `__cudaRegisterFatBinary` is given
/// (`__fatBinC_Wrapper_t`: magic, version, data pointer, filename or fatbin list).
pub const WRAPPER_MAGIC: u32 = 0x466243b1;
/// Magic of a fat binary container.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The first four bytes of an ELF file.
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";

/// Largest image (or decompressed entry) accepted: a bound on what hostile headers can
/// make the driver read or allocate.
pub const MAX_IMAGE: u64 = 1 << 30;

/// A kernel (an entry function) of an image, with what the image says about its resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// Registers per thread (a cubin's `EIATTR_REGCOUNT`).
    pub regs: Option<u32>,
    /// Static shared memory in bytes (the size of a cubin's `.nv.shared.<name>`).
    pub shared: Option<u32>,
    /// Local memory per thread in bytes (a cubin's `EIATTR_FRAME_SIZE`).
    pub local: Option<u32>,
    /// Largest block the kernel was compiled for (`.maxntid` in PTX, `EIATTR_MAX_THREADS`).
    pub max_threads: Option<u32>,
    /// Offset and size in bytes of each parameter, in order, when the image says
    /// (`EIATTR_KPARAM_INFO` in a cubin, the `.param` list in PTX).
    pub params: Option<Vec<(u32, u32)>>,
}

impl Kernel {
    pub fn named(name: &str) -> Kernel {
        Kernel {
            name: name.to_string(),
            ..Kernel::default()
        }
    }
}

/// A module-scope variable (`__device__`, `__constant__`) that the program can look up by
/// name and copy to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    pub name: String,
    pub size: u64,
    /// Initial bytes (at most `size`; the rest is zero).
    pub init: Vec<u8>,
}

/// Which kind of image a parse found (after unwrapping a fat binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Cubin,
    Ptx,
}

/// What a parsed image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub format: Format,
    /// The target architecture (`90` for sm_90 / compute_90), when the image says.
    pub arch: Option<u32>,
    pub kernels: Vec<Kernel>,
    pub globals: Vec<Global>,
}

impl Image {
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }

    pub fn global(&self, name: &str) -> Option<&Global> {
        self.globals.iter().find(|g| g.name == name)
    }
}

/// Why an image was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image truncated: {0}")]
    Truncated(&'static str),
    #[error("not a fat binary, cubin or PTX image")]
    Unrecognised,
    #[error("bad {what}: {value:#x}")]
    Field { what: &'static str, value: u64 },
    #[error("image larger than the 1 GiB the simulator reads ({0} bytes)")]
    TooLarge(u64),
    #[error("fat binary entry does not decompress: {0}")]
    Decompress(String),
    #[error("no entry for sm_{arch} in the fat binary (it has {have})")]
    NoBinaryForGpu { arch: u32, have: String },
    #[error("cubin: {0}")]
    Elf(String),
    #[error("PTX line {line}: {reason}")]
    Ptx { line: usize, reason: String },
}

/// How much of an image starting with the given prefix a caller must read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// The whole image is this many bytes.
    Known(u64),
    /// Read at least this many bytes and ask again.
    AtLeast(u64),
    /// Text: it ends at its first NUL byte.
    NulTerminated,
}

/// The extent of the image that `prefix` starts (see [`Extent`]). A fat binary wrapper
/// is not an image: it holds pointers, which the caller follows first.
pub fn extent(prefix: &[u8]) -> Result<Extent, ImageError> {
    if prefix.len() < 4 {
        return Ok(Extent::AtLeast(4));
    }
    let magic = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    let e = if magic == FATBIN_MAGIC {
        fatbin::extent(prefix)?
    } else if prefix[..4] == ELF_MAGIC {
        elf::extent(prefix)?
    } else if magic == WRAPPER_MAGIC {
        return Err(ImageError::Field {
            what: "image (a fat binary wrapper, not its contents)",
            value: magic.into(),
        });
    } else {
        Extent::NulTerminated
    };
    match e {
        Extent::Known(n) | Extent::AtLeast(n) if n > MAX_IMAGE => Err(ImageError::TooLarge(n)),
        e => Ok(e),
    }
}

/// True when `bytes` (a text, without its NUL) is PTX rather than the simulator's own
/// module format: PTX declares `.version` before anything else.
pub fn looks_like_ptx(bytes: &[u8]) -> bool {
    ptx::first_directive(bytes) == Some(".version")
}

/// Parses a fat binary container, a cubin or PTX text. `arch` is the device's compute
/// capability as `major * 10 + minor`: a fat binary's entry is chosen for it as the
/// driver chooses.
pub fn parse(bytes: &[u8], arch: u32) -> Result<Image, ImageError> {
    if bytes.len() >= 4
        && u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == FATBIN_MAGIC
    {
        let fb = fatbin::Fatbin::parse(bytes)?;
        return fb.select(arch)?.image();
    }
    if bytes.starts_with(&ELF_MAGIC) {
        return elf::parse(bytes);
    }
    let text = match bytes.iter().position(|&b| b == 0) {
        Some(n) => &bytes[..n],
        None => bytes,
    };
    if looks_like_ptx(text) {
        return ptx::parse(text);
    }
    Err(ImageError::Unrecognised)
}

/// Little-endian field readers that fail instead of panicking.
pub(crate) mod le {
    use super::ImageError;

    pub fn bytes<'a>(
        b: &'a [u8],
        at: u64,
        len: u64,
        what: &'static str,
    ) -> Result<&'a [u8], ImageError> {
        let start = usize::try_from(at).map_err(|_| ImageError::Truncated(what))?;
        let len = usize::try_from(len).map_err(|_| ImageError::Truncated(what))?;
        let end = start.checked_add(len).ok_or(ImageError::Truncated(what))?;
        b.get(start..end).ok_or(ImageError::Truncated(what))
    }

    pub fn u16(b: &[u8], at: u64, what: &'static str) -> Result<u16, ImageError> {
        let s = bytes(b, at, 2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    pub fn u32(b: &[u8], at: u64, what: &'static str) -> Result<u32, ImageError> {
        let s = bytes(b, at, 4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub fn u64(b: &[u8], at: u64, what: &'static str) -> Result<u64, ImageError> {
        let s = bytes(b, at, 8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::fatbin::build::{Spec, container};
    use super::fatbin::{Compression, Fatbin, KIND_ELF, KIND_PTX};
    use super::*;

    const CUBIN: &[u8] = include_bytes!("fixtures/kernels.sm_90.cubin");
    const PTX: &[u8] = include_bytes!("fixtures/kernels.ptx");
    const KERNELS: [&str; 4] = [
        "tessera_add",
        "tessera_fill",
        "_Z16tessera_scale_byIfEvPT_i",
        "_Z16tessera_scale_byIdEvPT_i",
    ];

    fn names(image: &Image) -> Vec<&str> {
        let mut v: Vec<&str> = image.kernels.iter().map(|k| k.name.as_str()).collect();
        v.sort_unstable();
        v
    }

    fn sorted(names: &[&'static str]) -> Vec<&'static str> {
        let mut v = names.to_vec();
        v.sort_unstable();
        v
    }

    #[test]
    fn cubin_kernels_globals_and_attributes() {
        let image = parse(CUBIN, 90).expect("NVRTC's cubin parses");
        assert_eq!(image.format, Format::Cubin);
        assert_eq!(image.arch, Some(90));
        assert_eq!(names(&image), sorted(&KERNELS));
        // NVRTC gave tessera_add 12 registers (EIATTR_REGCOUNT in .nv.info).
        assert_eq!(image.kernel("tessera_add").and_then(|k| k.regs), Some(12));
        // (const float *a, const float *b, float *c, int n); (float *out, float v, int n).
        let add = image.kernel("tessera_add").and_then(|k| k.params.clone());
        assert_eq!(add, Some(vec![(0, 8), (8, 8), (16, 8), (24, 4)]));
        let fill = image.kernel("tessera_fill").and_then(|k| k.params.clone());
        assert_eq!(fill, Some(vec![(0, 8), (8, 4), (12, 4)]));
        let scale = image.global("tessera_scale").expect("initialised global");
        assert_eq!(
            (scale.size, scale.init.as_slice()),
            (4, &2.0f32.to_le_bytes()[..])
        );
        let table = image.global("tessera_table").expect("zeroed global");
        assert_eq!((table.size, table.init.len()), (256, 0));
        assert_eq!(image.globals.len(), 2, "{:?}", image.globals);
    }

    #[test]
    fn ptx_kernels_and_globals() {
        assert!(looks_like_ptx(PTX));
        let image = parse(PTX, 90).expect("NVRTC's PTX parses");
        assert_eq!(image.format, Format::Ptx);
        assert_eq!(image.arch, Some(90));
        assert_eq!(names(&image), sorted(&KERNELS));
        let scale = image.global("tessera_scale").expect("initialised global");
        assert_eq!(
            (scale.size, scale.init.as_slice()),
            (4, &2.0f32.to_le_bytes()[..])
        );
        assert_eq!(image.global("tessera_table").map(|g| g.size), Some(256));
        // The layout the cubin records too.
        let add = image.kernel("tessera_add").and_then(|k| k.params.clone());
        assert_eq!(add, Some(vec![(0, 8), (8, 8), (16, 8), (24, 4)]));
        let fill = image.kernel("tessera_fill").and_then(|k| k.params.clone());
        assert_eq!(fill, Some(vec![(0, 8), (8, 4), (12, 4)]));
    }

    #[test]
    fn ptx_declarations() {
        let text = b"// c\n.version 8.0\n.target sm_80\n.address_size 64\n\
            .visible .global .align 4 .u32 arr[3] = {1, 0x10, -1};\n\
            .const .align 8 .f64 one = 0d3FF0000000000000;\n\
            .global .b8 bytes[] = {1, 2, 3};\n\
            .global .v2 .f32 pair[2][2];\n\
            .extern .global .u32 elsewhere;\n\
            .global .u64 addr = generic(arr);\n\
            /* block\n comment */ .extern .entry declared(.param .u64 p);\n\
            .func helper() { ret; }\n\
            .weak .entry w(.param .u32 n, .param .align 16 .b8 s[24], .param .u8 c) .maxntid 256, 1, 1 { { ret; } }\n\
            .entry plain { ret; }\n";
        let image = parse(text, 80).expect("valid PTX");
        assert_eq!(image.arch, Some(80));
        assert_eq!(names(&image), ["plain", "w"]);
        assert_eq!(image.kernel("w").and_then(|k| k.max_threads), Some(256));
        let w = image.kernel("w").and_then(|k| k.params.clone());
        assert_eq!(w, Some(vec![(0, 4), (16, 24), (40, 1)]));
        assert_eq!(
            image.kernel("plain").and_then(|k| k.params.clone()),
            Some(vec![])
        );
        let arr = image.global("arr").expect("arr");
        let want: Vec<u8> = [1u32, 16, u32::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!((arr.size, &arr.init), (12, &want));
        let one = image.global("one").expect("one");
        assert_eq!(
            (one.size, one.init.as_slice()),
            (8, &1.0f64.to_le_bytes()[..])
        );
        assert_eq!(
            image.global("bytes").map(|g| (g.size, g.init.clone())),
            Some((3, vec![1, 2, 3]))
        );
        assert_eq!(image.global("pair").map(|g| g.size), Some(32));
        assert_eq!(
            image.global("addr").map(|g| (g.size, g.init.len())),
            Some((8, 0))
        );
        assert!(image.global("elsewhere").is_none());
    }

    #[test]
    fn bad_ptx_is_an_error_with_its_line() {
        for (text, line) in [
            (&b".target sm_90\n.version 8.0\n"[..], 1),
            (b".version 8.0\n.entry k(\n{ ret;\n", 2),
            (b".version 8.0\n}\n", 2),
            (
                b".version 8.0\n.visible .entry (.param .u32 a) { ret; }\n",
                2,
            ),
            (b".version 8.0\n.entry k { ret; }\n.global .u32 x", 3),
            (b".version 8.0\n/* open\n", 2),
            (b".version 8.0\n.global .u32 q[x];\n", 2),
            (b".version 8.0\n\xff\n", 2),
            (b"   \n// only a comment\n", 1),
        ] {
            match ptx::parse(text) {
                Err(ImageError::Ptx { line: l, .. }) => {
                    assert_eq!(l, line, "{}", String::from_utf8_lossy(text))
                }
                other => panic!("{} gave {other:?}", String::from_utf8_lossy(text)),
            }
        }
        assert!(!looks_like_ptx(b"kernel step 50us\n"));
        assert!(!looks_like_ptx(b"# .version\nkernel a 0"));
        assert_eq!(parse(b"kernel a 1ms", 90), Err(ImageError::Unrecognised));
    }

    fn fatbin(compression: Compression) -> Vec<u8> {
        container(&[
            Spec {
                kind: KIND_ELF,
                arch: 90,
                payload: CUBIN,
                compression,
            },
            Spec {
                kind: KIND_PTX,
                arch: 90,
                payload: PTX,
                compression,
            },
        ])
    }

    #[test]
    fn fat_binaries_plain_and_compressed() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let fb = fatbin(c);
            assert_eq!(extent(&fb), Ok(Extent::Known(fb.len() as u64)), "{c:?}");
            let parsed = Fatbin::parse(&fb).expect("container");
            assert_eq!(parsed.entries.len(), 2);
            assert!(parsed.entries.iter().all(|e| e.compression == c));
            // sm_90 runs the cubin; a 10.0 device only the PTX.
            let image = parse(&fb, 90).expect("sm_90");
            assert_eq!(
                (image.format, names(&image)),
                (Format::Cubin, sorted(&KERNELS))
            );
            let image = parse(&fb, 100).expect("sm_100 from PTX");
            assert_eq!(
                (image.format, names(&image)),
                (Format::Ptx, sorted(&KERNELS))
            );
            // An 8.9 device has neither: no binary for it.
            assert!(matches!(
                parse(&fb, 89),
                Err(ImageError::NoBinaryForGpu { arch: 89, .. })
            ));
        }
    }

    #[test]
    fn cubin_selection_follows_major_version() {
        let fb = container(&[
            Spec {
                kind: KIND_ELF,
                arch: 80,
                payload: b"eighty",
                compression: Compression::None,
            },
            Spec {
                kind: KIND_ELF,
                arch: 86,
                payload: b"eighty-six",
                compression: Compression::None,
            },
            Spec {
                kind: KIND_ELF,
                arch: 90,
                payload: b"ninety",
                compression: Compression::None,
            },
        ]);
        let parsed = Fatbin::parse(&fb).expect("container");
        let pick = |arch| parsed.select(arch).map(|e| e.arch);
        assert_eq!(pick(80), Ok(80));
        assert_eq!(pick(87), Ok(86));
        assert_eq!(pick(90), Ok(90));
        assert!(pick(75).is_err() && pick(100).is_err());
    }

    #[test]
    fn extents() {
        assert_eq!(extent(&CUBIN[..2]), Ok(Extent::AtLeast(4)));
        match extent(&CUBIN[..64]) {
            Ok(Extent::AtLeast(n)) => {
                assert!(n > 64 && n <= CUBIN.len() as u64);
                assert_eq!(
                    extent(&CUBIN[..n as usize]),
                    Ok(Extent::Known(CUBIN.len() as u64))
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(extent(PTX), Ok(Extent::NulTerminated));
        assert_eq!(extent(b"kernel a 0\0"), Ok(Extent::NulTerminated));
        let wrapper = WRAPPER_MAGIC.to_le_bytes();
        assert!(extent(&wrapper).is_err());
        let mut huge = fatbin(Compression::None);
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(extent(&huge), Err(ImageError::TooLarge(_))));
    }

    /// Deterministic byte noise for the fuzz-ish tests.
    fn noise(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn truncated_images_are_errors() {
        let images = [
            CUBIN.to_vec(),
            fatbin(Compression::None),
            fatbin(Compression::Lz4),
            fatbin(Compression::Zstd),
        ];
        for image in &images {
            for len in 0..image.len() {
                assert!(
                    parse(&image[..len], 90).is_err(),
                    "prefix of {len} bytes parsed"
                );
            }
        }
        for len in 0..PTX.len() {
            // A PTX prefix may end after a whole statement; it must never panic.
            let _ = parse(&PTX[..len], 90);
        }
    }

    #[test]
    fn corrupted_images_never_panic() {
        let mut seed = 11;
        let images = [
            CUBIN.to_vec(),
            PTX.to_vec(),
            fatbin(Compression::None),
            fatbin(Compression::Lz4),
            fatbin(Compression::Zstd),
        ];
        for image in &images {
            for _ in 0..400 {
                let mut bad = image.clone();
                for _ in 0..1 + noise(&mut seed) % 8 {
                    let at = (noise(&mut seed) as usize) % bad.len();
                    bad[at] = noise(&mut seed) as u8;
                }
                let _ = extent(&bad);
                let _ = parse(&bad, 90);
            }
        }
        for magic in [
            &FATBIN_MAGIC.to_le_bytes()[..],
            &ELF_MAGIC[..],
            b".version 8.0\n",
        ] {
            for _ in 0..200 {
                let len = (noise(&mut seed) % 512) as usize;
                let mut bytes = magic.to_vec();
                bytes.extend((0..len).map(|_| noise(&mut seed) as u8));
                let _ = extent(&bytes);
                let _ = parse(&bytes, 90);
            }
        }
    }

    #[test]
    fn hostile_sizes_are_refused_not_allocated() {
        // An LZ4 entry that claims a 1 TiB payload.
        let mut fb = fatbin(Compression::Lz4);
        let at = 16 + 56;
        fb[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(parse(&fb, 90), Err(ImageError::TooLarge(_))));
        // A compressed size larger than the stored payload.
        let mut fb = fatbin(Compression::Zstd);
        fb[16 + 16..16 + 20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&fb, 90).is_err());
        // An ELF whose section table lies past the end.
        let mut elf = CUBIN.to_vec();
        elf[40..48].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert!(parse(&elf, 90).is_err() && extent(&elf).is_err());
    }

    /// Lists what the parser finds in the fat binaries of a framework's shared library
    /// (section `.nv_fatbin`), e.g. `TESSERA_SCAN_SO=.../libtorch_cuda.so`. Their images
    /// are NVIDIA's and a framework's, so they are read in place, not committed.
    #[test]
    #[ignore = "needs TESSERA_SCAN_SO: a framework library with fat binaries"]
    fn scans_a_framework_library() {
        let path = std::env::var("TESSERA_SCAN_SO").expect("set TESSERA_SCAN_SO");
        let so = std::fs::read(&path).expect("readable library");
        let (off, size) = elf_section(&so, ".nv_fatbin").expect("a .nv_fatbin section");
        let section = &so[off..off + size];
        let (mut at, mut containers, mut kernels) = (0usize, 0, 0);
        while at + 16 <= section.len() {
            if section[at..at + 4] != FATBIN_MAGIC.to_le_bytes() {
                at += 8;
                continue;
            }
            let Ok(Extent::Known(n)) = extent(&section[at..]) else {
                panic!("container at {at}: bad header");
            };
            let image = parse(&section[at..at + n as usize], 90)
                .unwrap_or_else(|e| panic!("container at {at}: {e}"));
            containers += 1;
            kernels += image.kernels.len();
            at += n as usize;
        }
        eprintln!("{path}: {containers} fat binaries, {kernels} kernels for sm_90");
        assert!(containers > 0);
    }

    /// Offset and size of a section of a host (x86-64) ELF file.
    fn elf_section(b: &[u8], want: &str) -> Option<(usize, usize)> {
        let shoff = le::u64(b, 40, "").ok()? as usize;
        let shnum = le::u16(b, 60, "").ok()? as usize;
        let shstrndx = le::u16(b, 62, "").ok()? as usize;
        let sh = |i: usize| shoff + i * 64;
        let stroff = le::u64(b, (sh(shstrndx) + 24) as u64, "").ok()? as usize;
        (0..shnum).find_map(|i| {
            let name = le::u32(b, sh(i) as u64, "").ok()? as usize;
            let end = b[stroff + name..].iter().position(|&c| c == 0)?;
            (&b[stroff + name..stroff + name + end] == want.as_bytes()).then(|| {
                let off = le::u64(b, (sh(i) + 24) as u64, "").ok()? as usize;
                let size = le::u64(b, (sh(i) + 32) as u64, "").ok()? as usize;
                Some((off, size))
            })?
        })
    }
}
