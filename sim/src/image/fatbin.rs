//! Fat binary containers: the format `nvcc` embeds in a program (section `.nv_fatbin`) and
//! the CUDA runtime hands to the driver, holding one cubin or PTX entry per target
//! architecture, each possibly compressed (LZ4 or Zstandard).
//!
//! Layout (little endian), as documented by public reimplementations of the driver:
//!
//! ```text
//! container header, 16 bytes:   u32 magic 0xBA55ED50 | u16 version 1 | u16 header size
//!                               | u64 size of the entries that follow the header
//! entry header, >= 64 bytes:    u16 kind (1 PTX, 2 ELF) | u16 version 0x101
//!                               | u32 header size | u32 payload size (padded)
//!   @16 u32 compressed size     @28 u32 architecture (e.g. 90) | @40 u64 flags
//!   @56 u64 uncompressed size   flags 0x2000: LZ4 block, 0x8000: Zstandard frame
//! payload                       follows the entry header; the next entry starts after
//!                               header size + payload size bytes
//! ```

use std::borrow::Cow;
use std::io::Read;

use super::{Extent, FATBIN_MAGIC, Image, ImageError, MAX_IMAGE, elf, le, ptx};

/// Container header size.
pub const HEADER_LEN: u64 = 16;
/// Smallest entry header.
pub const ENTRY_HEADER_LEN: u64 = 64;
pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;
pub const FLAG_LZ4: u64 = 0x2000;
pub const FLAG_ZSTD: u64 = 0x8000;

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

/// One entry of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: u16,
    pub arch: u32,
    pub flags: u64,
    pub compression: Compression,
    /// The stored payload (compressed bytes when compressed).
    pub data: Cow<'a, [u8]>,
    /// The size the header gives for the decompressed payload.
    pub uncompressed: u64,
}

/// A parsed container: its entries, still compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatbin<'a> {
    pub entries: Vec<Entry<'a>>,
}

/// The extent of the container that `prefix` starts.
pub fn extent(prefix: &[u8]) -> Result<Extent, ImageError> {
    if (prefix.len() as u64) < HEADER_LEN {
        return Ok(Extent::AtLeast(HEADER_LEN));
    }
    let (header, size) = header(prefix)?;
    Ok(Extent::Known(header + size))
}

/// Checks a container header; returns its header length and entries' size.
fn header(b: &[u8]) -> Result<(u64, u64), ImageError> {
    let magic = le::u32(b, 0, "fat binary header")?;
    if magic != FATBIN_MAGIC {
        return Err(ImageError::Field {
            what: "fat binary magic",
            value: magic.into(),
        });
    }
    let version = le::u16(b, 4, "fat binary header")?;
    if version != 1 {
        return Err(ImageError::Field {
            what: "fat binary version",
            value: version.into(),
        });
    }
    let header = u64::from(le::u16(b, 6, "fat binary header")?);
    if header < HEADER_LEN {
        return Err(ImageError::Field {
            what: "fat binary header size",
            value: header,
        });
    }
    let size = le::u64(b, 8, "fat binary header")?;
    if size > MAX_IMAGE {
        return Err(ImageError::TooLarge(size));
    }
    Ok((header, size))
}

impl<'a> Fatbin<'a> {
    /// Parses a container (its entries are not decompressed yet).
    pub fn parse(b: &'a [u8]) -> Result<Fatbin<'a>, ImageError> {
        let (header, size) = header(b)?;
        let body = le::bytes(b, header, size, "fat binary entries")?;
        let mut entries = Vec::new();
        let mut at = 0u64;
        // Entries are padded to 8 bytes; a tail shorter than an entry header is padding.
        while at + ENTRY_HEADER_LEN <= size {
            let kind = le::u16(body, at, "fat binary entry")?;
            let hlen = u64::from(le::u32(body, at + 4, "fat binary entry")?);
            let payload = u64::from(le::u32(body, at + 8, "fat binary entry")?);
            let compressed = u64::from(le::u32(body, at + 16, "fat binary entry")?);
            let arch = le::u32(body, at + 28, "fat binary entry")?;
            let flags = le::u64(body, at + 40, "fat binary entry")?;
            let uncompressed = le::u64(body, at + 56, "fat binary entry")?;
            if hlen < ENTRY_HEADER_LEN {
                return Err(ImageError::Field {
                    what: "fat binary entry header size",
                    value: hlen,
                });
            }
            let compression = match (flags & FLAG_LZ4 != 0, flags & FLAG_ZSTD != 0) {
                (false, false) => Compression::None,
                (true, false) => Compression::Lz4,
                (false, true) => Compression::Zstd,
                (true, true) => {
                    return Err(ImageError::Field {
                        what: "fat binary entry flags (both LZ4 and Zstandard)",
                        value: flags,
                    });
                }
            };
            let stored = match compression {
                Compression::None => payload,
                _ if compressed <= payload => compressed,
                _ => {
                    return Err(ImageError::Field {
                        what: "fat binary entry compressed size",
                        value: compressed,
                    });
                }
            };
            let data = le::bytes(body, at + hlen, stored, "fat binary entry payload")?;
            if kind == KIND_PTX || kind == KIND_ELF {
                entries.push(Entry {
                    kind,
                    arch,
                    flags,
                    compression,
                    data: Cow::Borrowed(data),
                    uncompressed,
                });
            }
            // Other kinds (e.g. LTO IR) cannot be loaded by a driver; they are skipped.
            at = at
                .checked_add(hlen)
                .and_then(|a| a.checked_add(payload))
                .ok_or(ImageError::Truncated("fat binary entry"))?;
            if at > size {
                return Err(ImageError::Truncated("fat binary entry payload"));
            }
        }
        if entries.is_empty() {
            return Err(ImageError::Field {
                what: "fat binary (no cubin or PTX entry), size",
                value: size,
            });
        }
        Ok(Fatbin { entries })
    }

    /// The entry a device of compute capability `arch` (`major * 10 + minor`) runs, as the
    /// driver picks it: a cubin of the same major version and the highest minor version
    /// not above the device's; else the newest PTX not newer than the device (it would be
    /// compiled for it); else none (`CUDA_ERROR_NO_BINARY_FOR_GPU`).
    pub fn select(&self, arch: u32) -> Result<&Entry<'a>, ImageError> {
        let cubin = self
            .entries
            .iter()
            .filter(|e| e.kind == KIND_ELF && e.arch / 10 == arch / 10 && e.arch <= arch)
            .max_by_key(|e| e.arch);
        let ptx = || {
            self.entries
                .iter()
                .filter(|e| e.kind == KIND_PTX && e.arch <= arch)
                .max_by_key(|e| e.arch)
        };
        cubin
            .or_else(ptx)
            .ok_or_else(|| ImageError::NoBinaryForGpu {
                arch,
                have: self
                    .entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{}_{}",
                            if e.kind == KIND_ELF { "sm" } else { "compute" },
                            e.arch
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl Entry<'_> {
    /// The entry with its payload copied (a driver keeps what it loads).
    pub fn into_owned(self) -> Entry<'static> {
        Entry {
            data: Cow::Owned(self.data.into_owned()),
            ..self
        }
    }

    /// The decompressed payload.
    pub fn payload(&self) -> Result<Cow<'_, [u8]>, ImageError> {
        let limit = MAX_IMAGE;
        if self.uncompressed > limit {
            return Err(ImageError::TooLarge(self.uncompressed));
        }
        match self.compression {
            Compression::None => Ok(Cow::Borrowed(&self.data)),
            Compression::Lz4 => lz4_flex::block::decompress(&self.data, self.uncompressed as usize)
                .map(Cow::Owned)
                .map_err(|e| ImageError::Decompress(format!("LZ4: {e}"))),
            Compression::Zstd => {
                let mut src: &[u8] = &self.data;
                let decoder = ruzstd::decoding::StreamingDecoder::new(&mut src)
                    .map_err(|e| ImageError::Decompress(format!("Zstandard: {e}")))?;
                let mut out = Vec::with_capacity(self.uncompressed as usize);
                decoder
                    .take(limit + 1)
                    .read_to_end(&mut out)
                    .map_err(|e| ImageError::Decompress(format!("Zstandard: {e}")))?;
                if out.len() as u64 > limit {
                    return Err(ImageError::TooLarge(out.len() as u64));
                }
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Decompresses and parses the entry.
    pub fn image(&self) -> Result<Image, ImageError> {
        let payload = self.payload()?;
        let mut image = if self.kind == KIND_ELF {
            elf::parse(&payload)?
        } else {
            let text = &payload[..payload
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(payload.len())];
            ptx::parse(text)?
        };
        image.arch = image.arch.or(Some(self.arch));
        Ok(image)
    }
}

/// Builds containers for tests: the inverse of [`Fatbin::parse`].
#[cfg(test)]
pub mod build {
    use super::*;

    /// One entry to write: kind, architecture, the uncompressed payload, and how to store it.
    #[derive(Debug, Clone)]
    pub struct Spec<'a> {
        pub kind: u16,
        pub arch: u32,
        pub payload: &'a [u8],
        pub compression: Compression,
    }

    /// A container holding `entries`.
    pub fn container(entries: &[Spec<'_>]) -> Vec<u8> {
        let mut body = Vec::new();
        for e in entries {
            let (stored, flag) = match e.compression {
                Compression::None => (e.payload.to_vec(), 0),
                Compression::Lz4 => (lz4_flex::block::compress(e.payload), FLAG_LZ4),
                Compression::Zstd => (
                    ruzstd::encoding::compress_to_vec(
                        e.payload,
                        ruzstd::encoding::CompressionLevel::Fastest,
                    ),
                    FLAG_ZSTD,
                ),
            };
            let padded = stored.len().div_ceil(8) * 8;
            let mut h = [0u8; ENTRY_HEADER_LEN as usize];
            h[0..2].copy_from_slice(&e.kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
            h[4..8].copy_from_slice(&(ENTRY_HEADER_LEN as u32).to_le_bytes());
            h[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
            if flag != 0 {
                h[16..20].copy_from_slice(&(stored.len() as u32).to_le_bytes());
            }
            h[28..32].copy_from_slice(&e.arch.to_le_bytes());
            h[40..48].copy_from_slice(&(0x11 | flag).to_le_bytes());
            h[56..64].copy_from_slice(&(e.payload.len() as u64).to_le_bytes());
            body.extend_from_slice(&h);
            body.extend_from_slice(&stored);
            body.resize(body.len() + padded - stored.len(), 0);
        }
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }
}
