//! A translated pod's exact limits, read from the pod by both kubelet plugins and laid
//! over the limits of the slices the pod was granted:
//!
//! - `tessera.dev/dropin-limits`, which the webhook writes when a pod's own words ask for
//!   less than its whole slices in MiB or percent of compute (3000 MiB on 4 GiB slices);
//! - `tessera.dev/dropin-memory-percent`, when its memory is a share of the card (HAMi's
//!   `gpumem-percentage: 30`, a KAI `gpu-fraction: 0.3`): the webhook cannot know the
//!   card the pod lands on, so the bytes are worked out here, from the GPU the slices
//!   are on ([`card_memory`], [`share_bytes`]); a KAI fraction's entry also carries its
//!   share of the card's compute (`computePercent`, `33.3` allowed), which
//!   `dropin-limits`' whole-percent field cannot hold.
//!
//! Only ever lowered: a tenant can edit its pod's annotations after admission, so the
//! values are a ceiling the pod puts on itself, never a grant.

use std::collections::BTreeMap;

use serde::Deserialize;
use tessera_proto::manager::v1 as mgr;

use crate::config::SliceLayout;

pub use tessera_contract::dropin::{ANNOTATION_EXACT_LIMITS, ANNOTATION_EXACT_MEMORY_PERCENT};

/// What a share of the card's memory is rounded down to: CUDA's device page, 2 MiB, in
/// which the shim charges every allocation (docs/hook.md, "Pages"). A limit with a tail
/// below a page would show that tail in `cuMemGetInfo` and never let it be allocated;
/// rounded down, what the process sees is all usable and still no more than its share.
/// (Slices' limits and MiB asks are used as the bytes they are: no rounding there.)
pub const SHARE_PAGE: u64 = 2 << 20;

/// One container's exact ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExactLimit {
    /// The slices the webhook gave the container for it: the limits apply to an
    /// allocation of exactly this many slices (any other is not what the words were
    /// translated into, and keeps its slices' limits).
    pub slices: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    pub compute_percent: Option<u32>,
    /// A share of the card's memory, in millionths of the card, from
    /// [`ANNOTATION_EXACT_MEMORY_PERCENT`] (never from [`ANNOTATION_EXACT_LIMITS`], whose
    /// fields older nodes check strictly).
    #[serde(skip)]
    pub memory_ppm: Option<u32>,
    /// A share of the card's compute, in millionths of the GPU (a KAI fraction's: `0.333`
    /// is 333,000), from [`ANNOTATION_EXACT_MEMORY_PERCENT`]'s `computePercent`: the same
    /// unit as an allocation's `compute_share_ppm`.
    #[serde(skip)]
    pub compute_ppm: Option<u32>,
}

/// One container's entry in [`ANNOTATION_EXACT_MEMORY_PERCENT`]. Unknown fields are
/// ignored, so a later webhook may add one without an older node refusing the pod (a
/// node from before `computePercent` reads the memory share and keeps the slices'
/// compute, as it always did).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryPercent {
    slices: u32,
    percent: f64,
    /// Percent of the card's compute (a KAI fraction is a share of the whole GPU, its
    /// compute as much as its memory).
    compute_percent: Option<f64>,
}

/// The exact limits of a pod's containers, by container name, from both annotations;
/// empty without them. The error names the annotation and says what is wrong.
pub fn from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, ExactLimit>, String> {
    let mut map = match annotations.get(ANNOTATION_EXACT_LIMITS) {
        None => BTreeMap::new(),
        Some(raw) => serde_json::from_str::<BTreeMap<String, ExactLimit>>(raw).map_err(|e| {
            format!("annotation {ANNOTATION_EXACT_LIMITS}: not the webhook's exact limits: {e}")
        })?,
    };
    for (name, l) in &map {
        let bad = l.slices == 0
            || l.memory_mib == Some(0)
            || l.compute_percent.is_some_and(|c| c == 0 || c > 100);
        if bad {
            return Err(format!(
                "annotation {ANNOTATION_EXACT_LIMITS}: container {name:?}: slices, memoryMiB and computePercent must be above 0, computePercent at most 100"
            ));
        }
    }
    let Some(raw) = annotations.get(ANNOTATION_EXACT_MEMORY_PERCENT) else {
        return Ok(map);
    };
    let shares: BTreeMap<String, MemoryPercent> = serde_json::from_str(raw).map_err(|e| {
        format!(
            "annotation {ANNOTATION_EXACT_MEMORY_PERCENT}: not the webhook's shares of the card ({{\"<container>\":{{\"slices\":3,\"percent\":30,\"computePercent\":30}}}}): {e}"
        )
    })?;
    for (name, share) in shares {
        let ppm = percent_to_ppm(share.percent).ok_or_else(|| {
            format!(
                "annotation {ANNOTATION_EXACT_MEMORY_PERCENT}: container {name:?}: percent {} is not a share of the card above 0 and at most 100",
                share.percent
            )
        })?;
        let compute_ppm = match share.compute_percent {
            None => None,
            Some(c) => Some(percent_to_ppm(c).ok_or_else(|| {
                format!(
                    "annotation {ANNOTATION_EXACT_MEMORY_PERCENT}: container {name:?}: computePercent {c} is not a share of the card above 0 and at most 100"
                )
            })?),
        };
        if share.slices == 0 {
            return Err(format!(
                "annotation {ANNOTATION_EXACT_MEMORY_PERCENT}: container {name:?}: slices must be above 0"
            ));
        }
        let entry = map.entry(name.clone()).or_insert(ExactLimit {
            slices: share.slices,
            memory_mib: None,
            compute_percent: None,
            memory_ppm: None,
            compute_ppm: None,
        });
        if entry.slices != share.slices {
            return Err(format!(
                "annotation {ANNOTATION_EXACT_MEMORY_PERCENT}: container {name:?}: {} slices, where {ANNOTATION_EXACT_LIMITS} says {}",
                share.slices, entry.slices
            ));
        }
        entry.memory_ppm = Some(ppm);
        entry.compute_ppm = compute_ppm;
    }
    Ok(map)
}

/// A percentage of the card in millionths of it (`30` → 300,000; KAI's `0.3` written as
/// `30` or `30.000000000000004` alike), or `None` for a value that is not above 0 and at
/// most 100 (or rounds to nothing at that resolution).
fn percent_to_ppm(percent: f64) -> Option<u32> {
    if !percent.is_finite() || percent <= 0.0 || percent > 100.0 {
        return None;
    }
    // In (0, 1e6] after the checks above, so the cast neither wraps nor saturates.
    let ppm = (percent * 10_000.0).round() as u32;
    (ppm > 0).then_some(ppm)
}

/// The memory a share of "the card" is a share of, for a GPU of `gpu_memory` bytes laid
/// out as `layout`: what all its slices give (`slices × slice memory`, the same figure
/// `100%` gets as whole slices), and the GPU's whole memory where the slices are laid
/// over all of it (`memory_total / count` leaves a remainder under `count` bytes, which
/// is not a reason to take a page off the share).
pub fn card_memory(layout: &SliceLayout, gpu_memory: u64) -> u64 {
    let laid = u64::from(layout.slices)
        .saturating_mul(layout.memory_bytes)
        .min(gpu_memory);
    if gpu_memory - laid < u64::from(layout.slices) {
        gpu_memory
    } else {
        laid
    }
}

/// `ppm` millionths of a card of `card` bytes, rounded down to whole [`SHARE_PAGE`]s
/// (never up: it is a cap), and at least one page (a share too small for one is
/// below anything a process can allocate).
pub fn share_bytes(card: u64, ppm: u32) -> u64 {
    let exact = u128::from(card) * u128::from(ppm) / 1_000_000;
    // At most `card`, so it fits in u64.
    let exact = u64::try_from(exact).unwrap_or(card);
    (exact - exact % SHARE_PAGE).max(SHARE_PAGE)
}

/// GPU UUID → the memory a share of that card is a share of ([`card_memory`]).
pub type Cards = BTreeMap<String, u64>;

/// Lowers `devices` (an allocation's limits, one entry per GPU) to `exact` where it is
/// below them. Applies only to an allocation of `exact.slices` slices on one GPU (the
/// webhook records exact limits only for a share of one GPU); returns whether it did.
/// A share of the card is a share of the device's GPU in `cards`; one missing there
/// (the node no longer has it) keeps the slices' memory.
pub fn cap(devices: &mut [mgr::DeviceRequest], exact: &ExactLimit, cards: &Cards) -> bool {
    let [d] = devices else {
        return false;
    };
    if d.slices != exact.slices {
        return false;
    }
    if let Some(m) = exact.memory_mib {
        d.memory_limit_bytes = d.memory_limit_bytes.min(m.saturating_mul(1 << 20));
    }
    if let Some(ppm) = exact.memory_ppm {
        match cards.get(&d.gpu_uuid) {
            Some(&card) => d.memory_limit_bytes = d.memory_limit_bytes.min(share_bytes(card, ppm)),
            None => {
                tracing::warn!(gpu = %d.gpu_uuid, "a share of the card's memory for a GPU the node does not list; the slices' memory stays");
            }
        }
    }
    if let Some(c) = exact.compute_percent {
        // Percent to ppm: exact, no rounding (1% = 10,000 ppm).
        d.compute_share_ppm = d.compute_share_ppm.min(c * 10_000);
    }
    if let Some(ppm) = exact.compute_ppm {
        // Already a share of the whole GPU, the allocation's unit: no card to look up.
        d.compute_share_ppm = d.compute_share_ppm.min(ppm);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(ANNOTATION_EXACT_LIMITS.to_owned(), v.to_owned())])
    }

    fn device(slices: u32, memory: u64, ppm: u32) -> mgr::DeviceRequest {
        mgr::DeviceRequest {
            gpu_uuid: "GPU-a".into(),
            memory_limit_bytes: memory,
            compute_share_ppm: ppm,
            slices,
        }
    }

    #[test]
    fn the_webhooks_value_parses_and_bad_ones_name_the_annotation() {
        assert!(
            from_annotations(&BTreeMap::new())
                .expect("absent")
                .is_empty()
        );
        let m = from_annotations(&ann(
            r#"{"main":{"slices":3,"memoryMiB":3000,"computePercent":30},"b":{"slices":1}}"#,
        ))
        .expect("parses");
        assert_eq!(
            m["main"],
            ExactLimit {
                slices: 3,
                memory_mib: Some(3000),
                compute_percent: Some(30),
                memory_ppm: None,
                compute_ppm: None,
            }
        );
        assert_eq!(m["b"].memory_mib, None);
        for bad in [
            "3000",
            r#"{"main":{"memoryMiB":3000}}"#,
            r#"{"main":{"slices":1,"memoryMiB":-1}}"#,
            r#"{"main":{"slices":1,"memoryMiB":0}}"#,
            r#"{"main":{"slices":1,"computePercent":101}}"#,
            r#"{"main":{"slices":0}}"#,
            r#"{"main":{"slices":1,"memory":"99Gi"}}"#,
        ] {
            let e = from_annotations(&ann(bad)).expect_err(bad);
            assert!(e.contains(ANNOTATION_EXACT_LIMITS), "{e}");
        }
    }

    #[test]
    fn exact_limits_only_ever_lower_and_only_their_own_slice_count() {
        let gib = 1u64 << 30;
        let e = |m, c| ExactLimit {
            slices: 1,
            memory_mib: m,
            compute_percent: c,
            memory_ppm: None,
            compute_ppm: None,
        };
        let cards = Cards::new();
        let mut d = [device(1, 4 * gib, 125_000)];
        assert!(cap(&mut d, &e(Some(3000), Some(10)), &cards));
        assert_eq!(d[0].memory_limit_bytes, 3000 << 20);
        assert_eq!(d[0].compute_share_ppm, 100_000);
        // A tenant's raise is no raise.
        let mut d = [device(1, 4 * gib, 125_000)];
        assert!(cap(&mut d, &e(Some(1 << 20), Some(100)), &cards));
        assert_eq!(d[0], device(1, 4 * gib, 125_000));
        // Another slice count, or slices on two GPUs: the slices' limits stay.
        let mut d = [device(2, 8 * gib, 250_000)];
        assert!(!cap(&mut d, &e(Some(3000), None), &cards));
        assert_eq!(d[0], device(2, 8 * gib, 250_000));
        let mut two = [device(1, 4 * gib, 125_000), device(1, 4 * gib, 125_000)];
        assert!(!cap(&mut two, &e(Some(3000), None), &cards));
        assert_eq!(two[0].memory_limit_bytes, 4 * gib);
    }

    fn ann2(limits: Option<&str>, percent: &str) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([(
            ANNOTATION_EXACT_MEMORY_PERCENT.to_owned(),
            percent.to_owned(),
        )]);
        if let Some(l) = limits {
            m.insert(ANNOTATION_EXACT_LIMITS.to_owned(), l.to_owned());
        }
        m
    }

    #[test]
    fn memory_shares_parse_beside_exact_limits_and_bad_ones_name_the_annotation() {
        let m =
            from_annotations(&ann2(None, r#"{"cuda":{"slices":3,"percent":30}}"#)).expect("parses");
        assert_eq!(
            m["cuda"],
            ExactLimit {
                slices: 3,
                memory_mib: None,
                compute_percent: None,
                memory_ppm: Some(300_000),
                compute_ppm: None,
            }
        );
        // KAI's 0.3 as the float it is, a fraction of a percent, and a later webhook's
        // field an older node does not know: all read.
        let m = from_annotations(&ann2(
            None,
            r#"{"a":{"slices":3,"percent":30.000000000000004},"b":{"slices":1,"percent":0.5},"c":{"slices":1,"percent":10,"later":true}}"#,
        ))
        .expect("parses");
        assert_eq!(m["a"].memory_ppm, Some(300_000));
        assert_eq!(m["b"].memory_ppm, Some(5_000));
        assert_eq!(m["c"].memory_ppm, Some(100_000));
        assert_eq!(m["a"].compute_ppm, None);
        // A KAI fraction's compute share beside its memory share: 0.3 and 0.333 of the
        // GPU, in the allocation's unit.
        let m = from_annotations(&ann2(
            None,
            r#"{"a":{"slices":3,"percent":30,"computePercent":30},"b":{"slices":3,"percent":33.3,"computePercent":33.3}}"#,
        ))
        .expect("parses");
        assert_eq!(m["a"].compute_ppm, Some(300_000));
        assert_eq!(m["b"].memory_ppm, Some(333_000));
        assert_eq!(m["b"].compute_ppm, Some(333_000));
        // Beside a compute percentage for the same container and slices: one limit.
        let m = from_annotations(&ann2(
            Some(r#"{"cuda":{"slices":3,"computePercent":20}}"#),
            r#"{"cuda":{"slices":3,"percent":30}}"#,
        ))
        .expect("parses");
        assert_eq!(m["cuda"].compute_percent, Some(20));
        assert_eq!(m["cuda"].memory_ppm, Some(300_000));
        for bad in [
            "30",
            r#"{"cuda":{"slices":3,"percent":0}}"#,
            r#"{"cuda":{"slices":3,"percent":100.5}}"#,
            r#"{"cuda":{"slices":3,"percent":-5}}"#,
            r#"{"cuda":{"slices":3,"percent":"30"}}"#,
            r#"{"cuda":{"slices":3,"percent":"half"}}"#,
            r#"{"cuda":{"slices":3,"percent":0.00001}}"#,
            r#"{"cuda":{"slices":3}}"#,
            r#"{"cuda":{"slices":0,"percent":30}}"#,
            r#"{"cuda":{"slices":3,"percent":30,"computePercent":0}}"#,
            r#"{"cuda":{"slices":3,"percent":30,"computePercent":101}}"#,
            r#"{"cuda":{"slices":3,"percent":30,"computePercent":"30"}}"#,
            r#"{"cuda":{"slices":3,"computePercent":30}}"#,
        ] {
            let e = from_annotations(&ann2(None, bad)).expect_err(bad);
            assert!(e.contains(ANNOTATION_EXACT_MEMORY_PERCENT), "{bad}: {e}");
        }
        let e = from_annotations(&ann2(
            Some(r#"{"cuda":{"slices":2,"memoryMiB":3000}}"#),
            r#"{"cuda":{"slices":3,"percent":30}}"#,
        ))
        .expect_err("two slice counts");
        assert!(e.contains(ANNOTATION_EXACT_MEMORY_PERCENT), "{e}");
        // The older annotation keeps refusing a share written into it.
        let e = from_annotations(&ann(r#"{"cuda":{"slices":3,"memoryPpm":300000}}"#))
            .expect_err("not a field there");
        assert!(e.contains(ANNOTATION_EXACT_LIMITS), "{e}");
    }

    #[test]
    fn a_share_of_the_card_is_its_bytes_rounded_down_to_whole_pages() {
        let gib = 1u64 << 30;
        let mib = 1u64 << 20;
        // 30% of an 80 GiB card is exactly 24 GiB.
        assert_eq!(share_bytes(80 * gib, 300_000), 24 * gib);
        // 30% of an H100's 81559 MiB is 24467.7 MiB: 24466 MiB in whole 2 MiB pages.
        assert_eq!(share_bytes(81_559 * mib, 300_000), 24_466 * mib);
        // 30% of the 32 GiB eight 4 GiB slices make: 9830.4 MiB, 9830 MiB.
        assert_eq!(share_bytes(32 * gib, 300_000), 9_830 * mib);
        // KAI's 1/3 (33.3333%) of 80 GiB, and the whole card.
        assert_eq!(share_bytes(80 * gib, 333_333), 27_306 * mib);
        assert_eq!(share_bytes(80 * gib, 1_000_000), 80 * gib);
        // Never nothing.
        assert_eq!(share_bytes(gib, 1), SHARE_PAGE);

        // The card: the whole GPU where slices are laid over all of it (a remainder
        // of the division is no reason to lose a page); the slices' where they are a
        // fixed size that leaves some of the GPU out.
        let layout = |slices, memory_bytes| SliceLayout {
            slices,
            memory_bytes,
            compute_ppm: 1_000_000 / slices,
            capped: false,
        };
        assert_eq!(card_memory(&layout(8, 10 * gib), 80 * gib), 80 * gib);
        let third = 80 * gib / 3;
        assert_eq!(card_memory(&layout(3, third), 80 * gib), 80 * gib);
        assert_eq!(share_bytes(80 * gib, 500_000), 40 * gib);
        assert_eq!(card_memory(&layout(8, 4 * gib), 40 * gib), 32 * gib);
        // A layout the node config resolves (slicesPerGpu alone) is the first case.
        let spec = crate::config::SliceSpec {
            slices_per_gpu: Some(3),
            ..Default::default()
        };
        assert_eq!(card_memory(&spec.layout(80 * gib), 80 * gib), 80 * gib);
    }

    #[test]
    fn a_share_of_the_card_lowers_and_never_raises() {
        let gib = 1u64 << 30;
        let share = |slices, ppm| ExactLimit {
            slices,
            memory_mib: None,
            compute_percent: None,
            memory_ppm: Some(ppm),
            compute_ppm: None,
        };
        let cards = Cards::from([("GPU-a".to_owned(), 80 * gib)]);
        // 30% of an 80 GiB card on three 10 GiB slices (37.5%): 24 GiB, compute kept.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &share(3, 300_000), &cards));
        assert_eq!(d[0], device(3, 24 * gib, 375_000));
        // With a MiB figure too, the smaller holds.
        let mut d = [device(3, 30 * gib, 375_000)];
        let both = ExactLimit {
            memory_mib: Some(20 * 1024),
            ..share(3, 300_000)
        };
        assert!(cap(&mut d, &both, &cards));
        assert_eq!(d[0].memory_limit_bytes, 20 * gib);
        // A tenant's 100% is no raise; another slice count, or an unknown GPU, keeps
        // the slices' memory.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &share(3, 1_000_000), &cards));
        assert_eq!(d[0], device(3, 30 * gib, 375_000));
        let mut d = [device(4, 40 * gib, 500_000)];
        assert!(!cap(&mut d, &share(3, 300_000), &cards));
        assert_eq!(d[0].memory_limit_bytes, 40 * gib);
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &share(3, 300_000), &Cards::new()));
        assert_eq!(d[0].memory_limit_bytes, 30 * gib);
    }

    #[test]
    fn a_share_of_the_cards_compute_lowers_and_never_raises() {
        let gib = 1u64 << 30;
        let fraction = |slices, ppm| ExactLimit {
            slices,
            memory_mib: None,
            compute_percent: None,
            memory_ppm: Some(ppm),
            compute_ppm: Some(ppm),
        };
        let cards = Cards::from([("GPU-a".to_owned(), 80 * gib)]);
        // KAI's 0.3 on three of eight slices (37.5%): 30% of the GPU's compute, exactly,
        // and 24 GiB.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &fraction(3, 300_000), &cards));
        assert_eq!(d[0], device(3, 24 * gib, 300_000));
        // 0.333: 333,000 ppm, not the slices' 375,000.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &fraction(3, 333_000), &cards));
        assert_eq!(d[0].compute_share_ppm, 333_000);
        // Needs no card: a GPU the node no longer lists still gets the compute share.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &fraction(3, 300_000), &Cards::new()));
        assert_eq!(d[0], device(3, 30 * gib, 300_000));
        // A tenant's whole card is no raise; with a whole-percent cap beside it, the
        // smaller holds.
        let mut d = [device(3, 30 * gib, 375_000)];
        assert!(cap(&mut d, &fraction(3, 1_000_000), &cards));
        assert_eq!(d[0], device(3, 30 * gib, 375_000));
        let mut d = [device(3, 30 * gib, 375_000)];
        let both = ExactLimit {
            compute_percent: Some(20),
            ..fraction(3, 300_000)
        };
        assert!(cap(&mut d, &both, &cards));
        assert_eq!(d[0].compute_share_ppm, 200_000);
        // Another slice count keeps the slices' compute.
        let mut d = [device(4, 40 * gib, 500_000)];
        assert!(!cap(&mut d, &fraction(3, 300_000), &cards));
        assert_eq!(d[0].compute_share_ppm, 500_000);
    }
}
