//! A translated pod's exact limits (`tessera.dev/dropin-limits`, which the webhook writes
//! when a pod's own words ask for less than its whole slices: 3000 MiB on 4 GiB slices),
//! read from the pod by both kubelet plugins and laid over the limits of the slices the
//! pod was granted. Only ever lowered: a tenant can edit its pod's annotations after
//! admission, so the value is a ceiling the pod puts on itself, never a grant.

use std::collections::BTreeMap;

use serde::Deserialize;
use tessera_proto::manager::v1 as mgr;

pub use tessera_contract::dropin::ANNOTATION_EXACT_LIMITS;

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
}

/// The exact limits of a pod's containers, by container name; empty without the
/// annotation. The error names the annotation and says what is wrong.
pub fn from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, ExactLimit>, String> {
    let Some(raw) = annotations.get(ANNOTATION_EXACT_LIMITS) else {
        return Ok(BTreeMap::new());
    };
    let map: BTreeMap<String, ExactLimit> = serde_json::from_str(raw).map_err(|e| {
        format!("annotation {ANNOTATION_EXACT_LIMITS}: not the webhook's exact limits: {e}")
    })?;
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
    Ok(map)
}

/// Lowers `devices` (an allocation's limits, one entry per GPU) to `exact` where it is
/// below them. Applies only to an allocation of `exact.slices` slices on one GPU (the
/// webhook records exact limits only for a share of one GPU); returns whether it did.
pub fn cap(devices: &mut [mgr::DeviceRequest], exact: &ExactLimit) -> bool {
    let [d] = devices else {
        return false;
    };
    if d.slices != exact.slices {
        return false;
    }
    if let Some(m) = exact.memory_mib {
        d.memory_limit_bytes = d.memory_limit_bytes.min(m.saturating_mul(1 << 20));
    }
    if let Some(c) = exact.compute_percent {
        // Percent to ppm: exact, no rounding (1% = 10,000 ppm).
        d.compute_share_ppm = d.compute_share_ppm.min(c * 10_000);
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
                compute_percent: Some(30)
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
        };
        let mut d = [device(1, 4 * gib, 125_000)];
        assert!(cap(&mut d, &e(Some(3000), Some(10))));
        assert_eq!(d[0].memory_limit_bytes, 3000 << 20);
        assert_eq!(d[0].compute_share_ppm, 100_000);
        // A tenant's raise is no raise.
        let mut d = [device(1, 4 * gib, 125_000)];
        assert!(cap(&mut d, &e(Some(1 << 20), Some(100))));
        assert_eq!(d[0], device(1, 4 * gib, 125_000));
        // Another slice count, or slices on two GPUs: the slices' limits stay.
        let mut d = [device(2, 8 * gib, 250_000)];
        assert!(!cap(&mut d, &e(Some(3000), None)));
        assert_eq!(d[0], device(2, 8 * gib, 250_000));
        let mut two = [device(1, 4 * gib, 125_000), device(1, 4 * gib, 125_000)];
        assert!(!cap(&mut two, &e(Some(3000), None)));
        assert_eq!(two[0].memory_limit_bytes, 4 * gib);
    }
}
