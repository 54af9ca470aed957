//! The one running estimate Tessera learns lengths with: a kernel's
//! length in the shim's pacer, a host part's length in the gate, a
//! client's host gap and hold in the arbiter. One rule, so that the parts
//! that learn the same kind of length from the same kind of samples
//! cannot drift apart in how fast they follow a change.

/// The running average `old` moved a quarter of the way to `sample`.
///
/// A quarter per sample follows a change within a few samples, and one odd
/// sample (a launch behind a page fault, a step that waited on I/O) moves
/// it little. `old == 0` means nothing is learned yet: the first sample is
/// taken as it is, not averaged with a zero that was never measured.
///
/// The result is never 0 (at least 1 ns): every caller reads 0 as
/// "unknown", and a length once learned must not turn back into unknown
/// because later samples were 0 (a gap seen as no gap learns "very short",
/// not "nothing learned").
///
/// Exact for every input: computed in 128 bits, so `old * 3` cannot
/// overflow, and the average of two `u64`s always fits a `u64`.
pub fn quarter_average(old: u64, sample: u64) -> u64 {
    let avg = if old == 0 {
        sample
    } else {
        let sum = u128::from(old) * 3 + u128::from(sample);
        // At most (4 * u64::MAX) / 4: always fits; saturate rather than
        // give the shim a panic path.
        u64::try_from(sum / 4).unwrap_or(u64::MAX)
    };
    avg.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_is_taken_whole() {
        assert_eq!(quarter_average(0, 1_000), 1_000);
        assert_eq!(quarter_average(0, u64::MAX), u64::MAX);
    }

    #[test]
    fn later_samples_move_it_a_quarter_of_the_way() {
        assert_eq!(quarter_average(1_000, 2_000), 1_250);
        assert_eq!(quarter_average(2_000, 1_000), 1_750);
        assert_eq!(quarter_average(1_000, 1_000), 1_000);
        // Rounded down.
        assert_eq!(quarter_average(10, 11), 10);
    }

    #[test]
    fn never_zero() {
        // Nothing learned and a zero sample: learned as the least length.
        assert_eq!(quarter_average(0, 0), 1);
        // Learned, then zero samples: shrinks to 1, never back to unknown.
        assert_eq!(quarter_average(1, 0), 1);
        let mut est = 1_000;
        for _ in 0..100 {
            est = quarter_average(est, 0);
            assert_ne!(est, 0);
        }
        assert_eq!(est, 1);
    }

    #[test]
    fn large_values_do_not_overflow() {
        assert_eq!(quarter_average(u64::MAX, u64::MAX), u64::MAX);
        // 3 * u64::MAX / 4, exactly: where 64-bit `old * 3` would wrap.
        assert_eq!(quarter_average(u64::MAX, 0), 13_835_058_055_282_163_711);
        assert_eq!(
            quarter_average(u64::MAX / 2, u64::MAX),
            11_529_215_046_068_469_759
        );
        assert_eq!(quarter_average(1, u64::MAX), u64::MAX / 4 + 1);
    }
}
