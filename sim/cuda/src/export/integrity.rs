//! `INTEGRITY_CHECK` (`d4082055-bde6-704b-8d34-ba123c66e1f2`), 3 slots: newer runtimes
//! (12.x) ask the driver to prove it is NVIDIA's by hashing what both sides know, and
//! refuse to start when the answer is wrong.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 24 |
//! | 1 | `(unsigned version, uint64 unix_seconds, uint64 out[2])` | the hash below |
//! | 2 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |
//!
//! The answer (facts from ZLUDA's reverse-engineering; the code is ours): for a `version`
//! ending in 0 or 1, a fixed pair of words; otherwise HMAC-MD2 (RFC 2104 over RFC 1319's
//! MD2) under a fixed 16-byte key, of the 48 bytes {driver version u32, `version` u32, pid
//! u32, low 32 bits of `pthread_self()`, address of `CUDART_INTERFACE`, address of this
//! table, address of slot 1, `unix_seconds` u64}, followed by 28 bytes per device
//! {UUID, PCI domain i32, PCI bus i32, PCI device i32}. The 16-byte digest is returned as
//! the two words.

use std::ffi::{c_int, c_uint, c_void};

use tessera_ffi::cuda::{CUdevice_attribute, CUresult, CUuuid};

use super::{Slots, guid, size_slot, stub};
use crate::{CuResult, guard};

pub const GUID: [u8; 16] = guid("d4082055-bde6-704b-8d34-ba123c66e1f2");
const T: usize = 5;

pub static TABLE: Slots<3> = Slots([size_slot(3), check as *const c_void, stub::<T, 2>()]);

/// The HMAC key (what a real driver's first hashing pass always produces).
const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// The answers to versions ending in 0 and 1.
const FIXED: [[u64; 2]; 2] = [
    [0x3341_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
    [0x1841_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8],
];

/// Slot 1.
unsafe extern "C" fn check(version: c_uint, unix_seconds: u64, out: *mut [u64; 2]) -> CUresult {
    guard(|| {
        let words = answer(version, unix_seconds)?;
        // SAFETY: the caller's out pointer; null is rejected.
        unsafe { crate::put(out, words) }
    })
}

fn answer(version: c_uint, unix_seconds: u64) -> CuResult<[u64; 2]> {
    if let Some(w) = FIXED.get((version % 10) as usize) {
        return Ok(*w);
    }
    let mut msg = Vec::with_capacity(48 + 28 * 16);
    msg.extend_from_slice(&(crate::device::driver_version()? as u32).to_ne_bytes());
    msg.extend_from_slice(&version.to_ne_bytes());
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { libc::pthread_self() } as u32;
    msg.extend_from_slice(&thread.to_ne_bytes());
    for p in [super::cudart::TABLE.as_ptr(), TABLE.as_ptr(), TABLE.0[1]] {
        msg.extend_from_slice(&(p as usize).to_ne_bytes());
    }
    msg.extend_from_slice(&unix_seconds.to_ne_bytes());
    let mut count: c_int = 0;
    // SAFETY: a local out pointer.
    ok(unsafe { crate::device::cuDeviceGetCount(&mut count) })?;
    for dev in 0..count {
        let mut uuid = CUuuid { bytes: [0; 16] };
        // SAFETY: a local out pointer.
        ok(unsafe { crate::device::cuDeviceGetUuid_v2(&mut uuid, dev) })?;
        msg.extend(uuid.bytes.iter().map(|b| *b as u8));
        for a in [
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
        ] {
            let mut v: c_int = 0;
            // SAFETY: a local out pointer.
            ok(unsafe { crate::device::cuDeviceGetAttribute(&mut v, a, dev) })?;
            msg.extend_from_slice(&v.to_ne_bytes());
        }
    }
    let d = hmac_md2(&KEY, &msg);
    Ok([
        u64::from_ne_bytes(d[..8].try_into().unwrap_or_default()),
        u64::from_ne_bytes(d[8..].try_into().unwrap_or_default()),
    ])
}

fn ok(rc: CUresult) -> CuResult<()> {
    if rc == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(rc)
    }
}

/// RFC 2104 HMAC over MD2, for a key of exactly MD2's block size.
pub fn hmac_md2(key: &[u8; 16], msg: &[u8]) -> [u8; 16] {
    let mut inner = Md2::default();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(msg);
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// MD2's substitution table: a permutation of 0..255 built from the digits of pi
/// (RFC 1319, section 3.2).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 (RFC 1319), streaming.
pub struct Md2 {
    state: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    len: usize,
}

impl Default for Md2 {
    fn default() -> Self {
        Md2 {
            state: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            len: 0,
        }
    }
}

impl Md2 {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.len] = b;
            self.len += 1;
            if self.len == 16 {
                let block = self.block;
                self.compress(&block);
                self.len = 0;
            }
        }
    }

    fn compress(&mut self, block: &[u8; 16]) {
        let mut last = self.checksum[15];
        for (c, &m) in self.checksum.iter_mut().zip(block) {
            *c ^= PI_SUBST[usize::from(m ^ last)];
            last = *c;
        }
        for (j, &m) in block.iter().enumerate() {
            self.state[16 + j] = m;
            self.state[32 + j] = m ^ self.state[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for x in self.state.iter_mut() {
                *x ^= PI_SUBST[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.len) as u8;
        self.update(&vec![pad; usize::from(pad)]);
        let checksum = self.checksum;
        self.update(&checksum);
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.state[..16]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2(s: &[u8]) -> String {
        let mut h = Md2::default();
        h.update(s);
        h.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(md2(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2(b"message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn fixed_answers_and_table() {
        assert_eq!(super::super::TABLES[T].guid, GUID);
        assert_eq!(answer(12090, 0), Ok(FIXED[0]));
        assert_eq!(answer(12091, 5), Ok(FIXED[1]));
    }

    #[test]
    fn hmac_depends_on_key_and_message() {
        let a = hmac_md2(&KEY, b"x");
        assert_ne!(a, hmac_md2(&KEY, b"y"));
        assert_ne!(a, hmac_md2(&[0; 16], b"x"));
        assert_eq!(a, hmac_md2(&KEY, b"x"));
    }
}
