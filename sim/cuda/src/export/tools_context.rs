//! `TOOLS_CONTEXT` (`21318c60-9714-3248-8ca6-41ff7324c8f2`), 95 slots: a table CUDA 13.4 and
//! newer runtimes (and cuBLAS/cuFFT) require, of per-context queries for tools. Its size
//! (a size word and 94 entries, as driver 595 serves it) is a public fact; its entries'
//! meanings mostly are not.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 760 |
//! | others | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use super::{Slots, guid, size_slot, stub};

pub const GUID: [u8; 16] = guid("21318c60-9714-3248-8ca6-41ff7324c8f2");
const T: usize = 7;
const N: usize = 95;

pub static TABLE: Slots<N> = Slots([
    size_slot(N),
    stub::<T, 1>(),
    stub::<T, 2>(),
    stub::<T, 3>(),
    stub::<T, 4>(),
    stub::<T, 5>(),
    stub::<T, 6>(),
    stub::<T, 7>(),
    stub::<T, 8>(),
    stub::<T, 9>(),
    stub::<T, 10>(),
    stub::<T, 11>(),
    stub::<T, 12>(),
    stub::<T, 13>(),
    stub::<T, 14>(),
    stub::<T, 15>(),
    stub::<T, 16>(),
    stub::<T, 17>(),
    stub::<T, 18>(),
    stub::<T, 19>(),
    stub::<T, 20>(),
    stub::<T, 21>(),
    stub::<T, 22>(),
    stub::<T, 23>(),
    stub::<T, 24>(),
    stub::<T, 25>(),
    stub::<T, 26>(),
    stub::<T, 27>(),
    stub::<T, 28>(),
    stub::<T, 29>(),
    stub::<T, 30>(),
    stub::<T, 31>(),
    stub::<T, 32>(),
    stub::<T, 33>(),
    stub::<T, 34>(),
    stub::<T, 35>(),
    stub::<T, 36>(),
    stub::<T, 37>(),
    stub::<T, 38>(),
    stub::<T, 39>(),
    stub::<T, 40>(),
    stub::<T, 41>(),
    stub::<T, 42>(),
    stub::<T, 43>(),
    stub::<T, 44>(),
    stub::<T, 45>(),
    stub::<T, 46>(),
    stub::<T, 47>(),
    stub::<T, 48>(),
    stub::<T, 49>(),
    stub::<T, 50>(),
    stub::<T, 51>(),
    stub::<T, 52>(),
    stub::<T, 53>(),
    stub::<T, 54>(),
    stub::<T, 55>(),
    stub::<T, 56>(),
    stub::<T, 57>(),
    stub::<T, 58>(),
    stub::<T, 59>(),
    stub::<T, 60>(),
    stub::<T, 61>(),
    stub::<T, 62>(),
    stub::<T, 63>(),
    stub::<T, 64>(),
    stub::<T, 65>(),
    stub::<T, 66>(),
    stub::<T, 67>(),
    stub::<T, 68>(),
    stub::<T, 69>(),
    stub::<T, 70>(),
    stub::<T, 71>(),
    stub::<T, 72>(),
    stub::<T, 73>(),
    stub::<T, 74>(),
    stub::<T, 75>(),
    stub::<T, 76>(),
    stub::<T, 77>(),
    stub::<T, 78>(),
    stub::<T, 79>(),
    stub::<T, 80>(),
    stub::<T, 81>(),
    stub::<T, 82>(),
    stub::<T, 83>(),
    stub::<T, 84>(),
    stub::<T, 85>(),
    stub::<T, 86>(),
    stub::<T, 87>(),
    stub::<T, 88>(),
    stub::<T, 89>(),
    stub::<T, 90>(),
    stub::<T, 91>(),
    stub::<T, 92>(),
    stub::<T, 93>(),
    stub::<T, 94>(),
]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_registered_under_its_index() {
        super::super::assert_sized_table(T, GUID, &TABLE);
    }
}
