//! Cubins: ELF64 files for NVIDIA GPUs (`e_machine` 190, `EM_CUDA`).
//!
//! Kernels are the defined `FUNC` symbols marked `STO_CUDA_ENTRY` (0x10 in `st_other`);
//! an image without that mark on any symbol falls back to the `FUNC` symbols that live in
//! a `.text.<name>` section. Globals are the defined `OBJECT` symbols of the `.nv.global*`
//! and `.nv.constant<N>` sections (N > 0; `.nv.constant0.<kernel>` holds parameters), with
//! their initial bytes when the section has contents. Resource hints come from the
//! `.nv.info` attribute section (`EIATTR_REGCOUNT`, `EIATTR_FRAME_SIZE`) and the size of
//! `.nv.shared.<kernel>`; parameter offsets and sizes from `EIATTR_KPARAM_INFO` in
//! `.nv.info.<kernel>`.

use super::{Extent, Format, Global, Image, ImageError, Kernel, le};

pub const EM_CUDA: u16 = 190;
const HEADER_LEN: u64 = 64;
const SHDR_LEN: u64 = 64;
const SYM_LEN: u64 = 24;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STO_CUDA_ENTRY: u8 = 0x10;
const SHN_LORESERVE: u16 = 0xff00;
/// `.nv.info` attribute formats and the attributes read.
const EIFMT_SVAL: u8 = 4;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_REGCOUNT: u8 = 0x2f;
/// One kernel parameter: `u32` index, `u16` ordinal, `u16` offset, `u32` whose bits 18..32
/// are the size.
const EIATTR_KPARAM_INFO: u8 = 0x17;

fn err(reason: impl Into<String>) -> ImageError {
    ImageError::Elf(reason.into())
}

struct Header {
    shoff: u64,
    shnum: u64,
    shstrndx: u64,
    phend: u64,
    flags: u32,
    abi_version: u8,
}

fn header(b: &[u8]) -> Result<Header, ImageError> {
    let ident = le::bytes(b, 0, 16, "ELF header")?;
    if ident[..4] != super::ELF_MAGIC {
        return Err(err("bad magic"));
    }
    if ident[4] != 2 || ident[5] != 1 {
        return Err(err("not a little-endian ELF64 file"));
    }
    let machine = le::u16(b, 18, "ELF header")?;
    if machine != EM_CUDA {
        return Err(err(format!("e_machine {machine} is not EM_CUDA (190)")));
    }
    let phoff = le::u64(b, 32, "ELF header")?;
    let shoff = le::u64(b, 40, "ELF header")?;
    let flags = le::u32(b, 48, "ELF header")?;
    let phentsize = u64::from(le::u16(b, 54, "ELF header")?);
    let phnum = u64::from(le::u16(b, 56, "ELF header")?);
    let shentsize = u64::from(le::u16(b, 58, "ELF header")?);
    let shnum = u64::from(le::u16(b, 60, "ELF header")?);
    let shstrndx = u64::from(le::u16(b, 62, "ELF header")?);
    if shnum == 0 || shentsize != SHDR_LEN {
        return Err(err("no section header table"));
    }
    if shstrndx >= shnum {
        return Err(err("section name table index out of range"));
    }
    let phend = if phnum == 0 {
        0
    } else {
        phoff
            .checked_add(phnum * phentsize)
            .ok_or_else(|| err("program header table out of range"))?
    };
    Ok(Header {
        shoff,
        shnum,
        shstrndx,
        phend,
        flags,
        abi_version: ident[8],
    })
}

#[derive(Debug, Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

fn sections(b: &[u8], h: &Header) -> Result<Vec<Section>, ImageError> {
    (0..h.shnum)
        .map(|i| {
            let at = h.shoff + i * SHDR_LEN;
            let s = Section {
                name: le::u32(b, at, "section header")?,
                kind: le::u32(b, at + 4, "section header")?,
                offset: le::u64(b, at + 24, "section header")?,
                size: le::u64(b, at + 32, "section header")?,
                link: le::u32(b, at + 40, "section header")?,
            };
            if s.kind != SHT_NOBITS && i != 0 {
                s.offset
                    .checked_add(s.size)
                    .ok_or(ImageError::Truncated("section"))?;
            }
            Ok(s)
        })
        .collect()
}

/// The extent of the cubin that `prefix` starts: its header, then its section header
/// table, give the end of the last section or table.
pub fn extent(prefix: &[u8]) -> Result<Extent, ImageError> {
    if (prefix.len() as u64) < HEADER_LEN {
        return Ok(Extent::AtLeast(HEADER_LEN));
    }
    let h = header(prefix)?;
    let table_end = h
        .shoff
        .checked_add(h.shnum * SHDR_LEN)
        .ok_or_else(|| err("section header table out of range"))?;
    if (prefix.len() as u64) < table_end {
        return Ok(Extent::AtLeast(table_end));
    }
    let end = sections(prefix, &h)?
        .iter()
        .skip(1)
        .filter(|s| s.kind != SHT_NOBITS)
        .map(|s| s.offset.saturating_add(s.size))
        .fold(table_end.max(h.phend), u64::max);
    Ok(Extent::Known(end))
}

fn data<'a>(b: &'a [u8], s: &Section, what: &'static str) -> Result<&'a [u8], ImageError> {
    if s.kind == SHT_NOBITS {
        return Ok(&[]);
    }
    le::bytes(b, s.offset, s.size, what)
}

/// A NUL-terminated name at `at` in a string table.
fn name_at(table: &[u8], at: u32) -> Result<&str, ImageError> {
    let rest = table
        .get(at as usize..)
        .ok_or(ImageError::Truncated("string table"))?;
    let end = rest
        .iter()
        .position(|&c| c == 0)
        .ok_or(ImageError::Truncated("string table"))?;
    std::str::from_utf8(&rest[..end]).map_err(|_| err("a name is not UTF-8"))
}

struct Symbol<'a> {
    name: &'a str,
    kind: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Parses a cubin.
pub fn parse(b: &[u8]) -> Result<Image, ImageError> {
    let h = header(b)?;
    match extent(b)? {
        Extent::Known(n) if n <= b.len() as u64 => {}
        _ => return Err(ImageError::Truncated("cubin shorter than its headers say")),
    }
    let secs = sections(b, &h)?;
    let shstr = data(b, &secs[h.shstrndx as usize], "section name table")?;
    let names: Vec<&str> = secs
        .iter()
        .map(|s| name_at(shstr, s.name))
        .collect::<Result<_, _>>()?;
    let symtab = secs
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .ok_or_else(|| err("no symbol table"))?;
    let strtab = secs
        .get(symtab.link as usize)
        .ok_or_else(|| err("symbol table's string table index out of range"))?;
    let strtab = data(b, strtab, "string table")?;
    let raw = data(b, symtab, "symbol table")?;
    let mut symbols = Vec::with_capacity(raw.len() / SYM_LEN as usize);
    for i in 1..(raw.len() as u64 / SYM_LEN) {
        let at = i * SYM_LEN;
        let info = le::bytes(raw, at + 4, 1, "symbol")?[0];
        symbols.push(Symbol {
            name: name_at(strtab, le::u32(raw, at, "symbol")?)?,
            kind: info & 0xf,
            other: le::bytes(raw, at + 5, 1, "symbol")?[0],
            shndx: le::u16(raw, at + 6, "symbol")?,
            value: le::u64(raw, at + 8, "symbol")?,
            size: le::u64(raw, at + 16, "symbol")?,
        });
    }
    let section_name = |shndx: u16| -> Option<&str> {
        if shndx == 0 || shndx >= SHN_LORESERVE {
            return None;
        }
        names.get(usize::from(shndx)).copied()
    };

    let marked = symbols
        .iter()
        .any(|s| s.kind == STT_FUNC && s.other & STO_CUDA_ENTRY != 0);
    let mut kernels: Vec<Kernel> = Vec::new();
    // Symbol index (as .nv.info names it) of each kernel.
    let mut kernel_syms: Vec<(u64, usize)> = Vec::new();
    for (i, s) in symbols.iter().enumerate() {
        if s.kind != STT_FUNC || s.name.is_empty() {
            continue;
        }
        let Some(sec) = section_name(s.shndx) else {
            continue;
        };
        let entry = if marked {
            s.other & STO_CUDA_ENTRY != 0
        } else {
            sec.strip_prefix(".text.") == Some(s.name)
        };
        if entry && kernels.iter().all(|k| k.name != s.name) {
            kernel_syms.push((i as u64 + 1, kernels.len()));
            let shared = names
                .iter()
                .position(|n| n.strip_prefix(".nv.shared.") == Some(s.name))
                .map(|j| secs[j].size.min(u64::from(u32::MAX)) as u32);
            kernels.push(Kernel {
                shared,
                ..Kernel::named(s.name)
            });
        }
    }
    // Attributes of `.nv.info` (and `.nv.info.<kernel>`): 4-byte records (format, attribute,
    // 16-bit value or payload length); only EIFMT_SVAL records carry a payload.
    for (j, n) in names.iter().enumerate() {
        if *n != ".nv.info" && !n.starts_with(".nv.info.") {
            continue;
        }
        let info = data(b, &secs[j], ".nv.info")?;
        // The kernel a `.nv.info.<kernel>` section describes (looked up once per section).
        let kernel_of_section = n
            .strip_prefix(".nv.info.")
            .and_then(|kn| kernels.iter().position(|k| k.name == kn));
        let mut at = 0usize;
        while at + 4 <= info.len() {
            let (fmt, attr) = (info[at], info[at + 1]);
            let len = usize::from(u16::from_le_bytes([info[at + 2], info[at + 3]]));
            at += 4;
            if fmt != EIFMT_SVAL {
                continue;
            }
            let Some(payload) = info.get(at..at + len) else {
                break;
            };
            at += len;
            if let (EIATTR_KPARAM_INFO, true, Some(k)) = (attr, len >= 12, kernel_of_section) {
                let ordinal = usize::from(u16::from_le_bytes([payload[4], payload[5]]));
                let offset = u32::from(u16::from_le_bytes([payload[6], payload[7]]));
                let word = u32::from_le_bytes([payload[8], payload[9], payload[10], payload[11]]);
                let size = (word >> 18) & 0x3fff;
                let params = kernels[k].params.get_or_insert_with(Vec::new);
                if ordinal < 4096 {
                    if params.len() <= ordinal {
                        params.resize(ordinal + 1, (0, 0));
                    }
                    params[ordinal] = (offset, size);
                }
            }
            if (attr == EIATTR_REGCOUNT || attr == EIATTR_FRAME_SIZE) && len >= 8 {
                let sym = u64::from(u32::from_le_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]));
                let v = u32::from_le_bytes([payload[4], payload[5], payload[6], payload[7]]);
                if let Some(&(_, k)) = kernel_syms.iter().find(|(s, _)| *s == sym) {
                    if attr == EIATTR_REGCOUNT {
                        kernels[k].regs = Some(v);
                    } else {
                        kernels[k].local = Some(v);
                    }
                }
            }
        }
    }

    let mut globals: Vec<Global> = Vec::new();
    for s in &symbols {
        if s.kind != STT_OBJECT || s.size == 0 || s.name.is_empty() {
            continue;
        }
        let Some(sec) = section_name(s.shndx) else {
            continue;
        };
        let user_constant = sec
            .strip_prefix(".nv.constant")
            .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0));
        if !(sec.starts_with(".nv.global") || user_constant) {
            continue;
        }
        if globals.iter().any(|g| g.name == s.name) {
            continue;
        }
        let contents = data(b, &secs[usize::from(s.shndx)], "global's section")?;
        let init = if contents.is_empty() {
            Vec::new()
        } else {
            le::bytes(contents, s.value, s.size, "global's initial value")?.to_vec()
        };
        globals.push(Global {
            name: s.name.to_string(),
            size: s.size,
            init,
        });
    }

    // e_flags carries the SM version: in its low byte up to ELF ABI version 7, in bits
    // 8..16 from version 8 (CUDA 12.8's cubins for sm_100 and later).
    let arch = if h.abi_version >= 8 {
        (h.flags >> 8) & 0xff
    } else {
        h.flags & 0xff
    };
    Ok(Image {
        format: Format::Cubin,
        arch: (arch != 0).then_some(arch),
        kernels,
        globals,
    })
}
