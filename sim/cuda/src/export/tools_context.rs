//! `TOOLS_CONTEXT` (`21318c60-9714-3248-8ca6-41ff7324c8f2`), 95 slots: a table CUDA 13.4 and
//! newer runtimes (and cuBLAS/cuFFT) require, of per-context queries for tools. Its size
//! (a size word and 94 entries, as driver 595 serves it) is a public fact; its entries'
//! meanings mostly are not.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 760 |
//! | others | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use super::{Slots, guid, sized_stubs};

pub const GUID: [u8; 16] = guid("21318c60-9714-3248-8ca6-41ff7324c8f2");
const T: usize = 7;
const N: usize = 95;

pub static TABLE: Slots<N> = Slots(sized_stubs::<T, N>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_registered_under_its_index() {
        super::super::assert_sized_table(T, GUID, &TABLE);
    }
}
