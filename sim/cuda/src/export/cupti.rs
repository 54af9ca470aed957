//! `CUPTI` (`7cb63f9b-9ca4-8e42-a484-beb66e6aed7f`): the table NVIDIA's profiling library
//! (CUPTI, `libcupti.so`) asks for when it first initialises, even for `cuptiGetVersion`.
//! JAX's CUDA plugin calls that at import to check the CUPTI it loads; refused the table,
//! CUPTI 13.5 fails the call (`CUPTI_ERROR_INVALID_PARAMETER`) and JAX starts without its
//! CUDA backend.
//!
//! Given the table, CUPTI answers its version without calling any entry: initialising is
//! all a program that does not profile asks of it. Its real size is unknown (ZLUDA's table
//! dump names two of its entries, one CUPTI's initialisation); here it has 100 slots, each
//! a stub that says so if a profiler ever calls it.
//!
//! | slot | entry | here |
//! |---|---|---|
//! | 0 | size in bytes | 800 |
//! | 1-99 | unknown | stub: `CUDA_ERROR_NOT_SUPPORTED` |

use super::{Slots, guid, sized_stubs};

pub const GUID: [u8; 16] = guid("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f");
pub(super) const T: usize = 9;
const N: usize = 100;

pub static TABLE: Slots<N> = Slots(sized_stubs::<T, N>());
