//! Which GPUs a pod may have: the one rule the webhook, the device plugin and the
//! scheduler extender all apply, so a GPU one of them lets through is one the others
//! let through too.
//!
//! A pod narrows its GPUs by vendor ([`ANNOTATION_GPU_VENDOR`]), by model and by UUID,
//! each as a list to use or a list to avoid (the annotations below; HAMi's
//! `nvidia.com/use-gputype` and kin are translated into them by the webhook). A GPU
//! passes when it is of the vendor asked for, its model matches one entry of the model
//! list (if any) and no entry of the excluded models, and its UUID is in the UUID list
//! (if any) and not in the excluded UUIDs.
//!
//! Models match as HAMi matches them: an entry matches when it occurs anywhere, ignoring
//! case, in the GPU's type, which is `<VENDOR>-<product name>` (`NVIDIA-NVIDIA A100-SXM4-80GB`),
//! so `A100`, `nvidia a100` and HAMi's documented `NVIDIA-NVIDIA L4` all work. UUIDs match
//! whole, ignoring case. Lists are comma-separated; blanks around entries are dropped.

use std::collections::BTreeMap;

use crate::Vendor;
use crate::labels::ANNOTATION_GPU_VENDOR;

/// Pod annotation: GPU models the pod's slices must be on (comma-separated; an entry
/// matches a model it occurs in, ignoring case).
pub const ANNOTATION_GPU_MODELS: &str = "tessera.dev/gpu-models";
/// Pod annotation: GPU models the pod's slices must not be on.
pub const ANNOTATION_GPU_MODELS_EXCLUDE: &str = "tessera.dev/gpu-models-exclude";
/// Pod annotation: GPU UUIDs the pod's slices must be on (comma-separated, whole UUIDs).
pub const ANNOTATION_GPU_UUIDS: &str = "tessera.dev/gpu-uuids";
/// Pod annotation: GPU UUIDs the pod's slices must not be on.
pub const ANNOTATION_GPU_UUIDS_EXCLUDE: &str = "tessera.dev/gpu-uuids-exclude";

/// The list annotations, in the order messages name them.
pub const LIST_ANNOTATIONS: [&str; 4] = [
    ANNOTATION_GPU_MODELS,
    ANNOTATION_GPU_MODELS_EXCLUDE,
    ANNOTATION_GPU_UUIDS,
    ANNOTATION_GPU_UUIDS_EXCLUDE,
];

/// The longest list annotation read: a pod's annotations are small, and the device
/// plugin reads this on every Allocate.
pub const MAX_LIST_LEN: usize = 4096;

/// A pod's constraint on its GPUs. The default lets every GPU through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFilter {
    pub vendor: Option<Vendor>,
    /// Model entries, one of which must match (empty: any model).
    pub models: Vec<String>,
    pub models_exclude: Vec<String>,
    /// UUIDs, one of which the GPU must be (empty: any GPU).
    pub uuids: Vec<String>,
    pub uuids_exclude: Vec<String>,
}

/// The entries of a comma-separated list: trimmed, blanks dropped.
pub fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The type HAMi gives a GPU, which model entries are matched in: `<VENDOR>-<model>`.
pub fn gpu_type(vendor: &str, model: &str) -> String {
    format!("{}-{model}", vendor.to_ascii_uppercase())
}

/// Whether a model entry matches a GPU of `vendor` and `model` (see the module).
pub fn model_matches(entry: &str, vendor: &str, model: &str) -> bool {
    gpu_type(vendor, model)
        .to_lowercase()
        .contains(&entry.trim().to_lowercase())
}

impl GpuFilter {
    /// The constraint a pod's annotations state, or what is wrong with them (one line
    /// naming the annotation and quoting its value).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<GpuFilter, String> {
        let mut f = GpuFilter::default();
        if let Some(v) = annotations.get(ANNOTATION_GPU_VENDOR) {
            f.vendor = Some(
                v.parse::<Vendor>()
                    .map_err(|e| format!("annotation {ANNOTATION_GPU_VENDOR}: {v:?}: {e}"))?,
            );
        }
        let list = |key: &str| -> Result<Vec<String>, String> {
            let Some(v) = annotations.get(key) else {
                return Ok(Vec::new());
            };
            if v.len() > MAX_LIST_LEN {
                return Err(format!(
                    "annotation {key} is {} bytes, over {MAX_LIST_LEN}",
                    v.len()
                ));
            }
            let entries = split_list(v);
            if entries.is_empty() {
                return Err(format!(
                    "annotation {key}: {v:?} names nothing; give a comma-separated list or remove it"
                ));
            }
            Ok(entries)
        };
        f.models = list(ANNOTATION_GPU_MODELS)?;
        f.models_exclude = list(ANNOTATION_GPU_MODELS_EXCLUDE)?;
        f.uuids = list(ANNOTATION_GPU_UUIDS)?;
        f.uuids_exclude = list(ANNOTATION_GPU_UUIDS_EXCLUDE)?;
        Ok(f)
    }

    /// True when it lets every GPU through.
    pub fn is_empty(&self) -> bool {
        *self == GpuFilter::default()
    }

    /// Why a GPU of `vendor`, `model` and `uuid` does not pass, naming the annotation;
    /// `None` when it passes.
    pub fn refusal(&self, vendor: &str, model: &str, uuid: &str) -> Option<String> {
        if let Some(v) = self.vendor
            && !v.as_str().eq_ignore_ascii_case(vendor.trim())
        {
            return Some(format!(
                "GPU {uuid} is {vendor}'s, not {v}'s ({ANNOTATION_GPU_VENDOR})"
            ));
        }
        if !self.models.is_empty() && !self.models.iter().any(|m| model_matches(m, vendor, model)) {
            return Some(format!(
                "GPU {uuid} ({model}) is none of {ANNOTATION_GPU_MODELS}: {:?}",
                self.models.join(",")
            ));
        }
        if let Some(m) = self
            .models_exclude
            .iter()
            .find(|m| model_matches(m, vendor, model))
        {
            return Some(format!(
                "GPU {uuid} ({model}) is {m:?}, which {ANNOTATION_GPU_MODELS_EXCLUDE} excludes"
            ));
        }
        let same = |u: &String| u.eq_ignore_ascii_case(uuid);
        if !self.uuids.is_empty() && !self.uuids.iter().any(same) {
            return Some(format!(
                "GPU {uuid} is none of {ANNOTATION_GPU_UUIDS}: {:?}",
                self.uuids.join(",")
            ));
        }
        if self.uuids_exclude.iter().any(same) {
            return Some(format!(
                "GPU {uuid} is excluded by {ANNOTATION_GPU_UUIDS_EXCLUDE}"
            ));
        }
        None
    }

    /// Whether a GPU of `vendor`, `model` and `uuid` passes.
    pub fn passes(&self, vendor: &str, model: &str, uuid: &str) -> bool {
        self.refusal(vendor, model, uuid).is_none()
    }

    /// The same rule as a DRA CEL selector over the attributes the DRA driver
    /// publishes in `domain` (`vendor`, `productName`, `uuid`), for a claim written
    /// by hand; `None` when it lets every GPU through. Kubernetes' CEL has the
    /// string library (`lowerAscii`, `upperAscii`) this uses.
    pub fn cel(&self, domain: &str) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let attr = |name: &str| format!("device.attributes[{}].{name}", cel_string(domain));
        let gpu_type = format!(
            "({}.upperAscii() + \"-\" + {}).lowerAscii()",
            attr("vendor"),
            attr("productName")
        );
        let contains = |entries: &[String]| {
            let any: Vec<String> = entries
                .iter()
                .map(|e| format!("{gpu_type}.contains({})", cel_string(&e.to_lowercase())))
                .collect();
            format!("({})", any.join(" || "))
        };
        let uuids = |entries: &[String]| {
            let list: Vec<String> = entries
                .iter()
                .map(|u| cel_string(&u.to_lowercase()))
                .collect();
            format!("{}.lowerAscii() in [{}]", attr("uuid"), list.join(", "))
        };
        let mut terms = Vec::new();
        if let Some(v) = self.vendor {
            terms.push(format!("{} == {}", attr("vendor"), cel_string(v.as_str())));
        }
        if !self.models.is_empty() {
            terms.push(contains(&self.models));
        }
        if !self.models_exclude.is_empty() {
            terms.push(format!("!{}", contains(&self.models_exclude)));
        }
        if !self.uuids.is_empty() {
            terms.push(uuids(&self.uuids));
        }
        if !self.uuids_exclude.is_empty() {
            terms.push(format!("!({})", uuids(&self.uuids_exclude)));
        }
        Some(terms.join(" && "))
    }
}

/// A CEL string literal of `s`: double-quoted, `\\` and `"` escaped, control
/// characters as `\u` escapes, so a pod's list can never end the literal.
fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(pairs: &[(&str, &str)]) -> GpuFilter {
        let a: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        GpuFilter::from_annotations(&a).expect("valid")
    }

    const A100: (&str, &str, &str) = ("nvidia", "NVIDIA A100-SXM4-80GB", "GPU-aaaa");
    const L4: (&str, &str, &str) = ("nvidia", "NVIDIA L4", "GPU-bbbb");
    const MI210: (&str, &str, &str) = ("amd", "AMD Instinct MI210", "GPU-0123456789abcdef");

    fn passes(f: &GpuFilter, g: (&str, &str, &str)) -> bool {
        f.passes(g.0, g.1, g.2)
    }

    #[test]
    fn models_match_as_hami_matches_them() {
        for entry in [
            "A100",
            "a100",
            "NVIDIA A100",
            "NVIDIA-NVIDIA A100",
            " sxm4 ",
        ] {
            let f = filter(&[(ANNOTATION_GPU_MODELS, entry)]);
            assert!(passes(&f, A100), "{entry}");
            assert!(!passes(&f, L4), "{entry}");
        }
        let f = filter(&[(ANNOTATION_GPU_MODELS, "NVIDIA-NVIDIA L4")]);
        assert!(passes(&f, L4) && !passes(&f, A100));
        let both = filter(&[(ANNOTATION_GPU_MODELS, "A100, L4")]);
        assert!(passes(&both, A100) && passes(&both, L4) && !passes(&both, MI210));
        let not = filter(&[(ANNOTATION_GPU_MODELS_EXCLUDE, "l4")]);
        assert!(passes(&not, A100) && !passes(&not, L4) && passes(&not, MI210));
        let e = not.refusal(L4.0, L4.1, L4.2).expect("refused");
        assert!(
            e.contains(ANNOTATION_GPU_MODELS_EXCLUDE) && e.contains("GPU-bbbb"),
            "{e}"
        );
    }

    #[test]
    fn uuids_match_whole_and_vendor_is_exact() {
        let f = filter(&[(ANNOTATION_GPU_UUIDS, "gpu-AAAA,GPU-cccc")]);
        assert!(passes(&f, A100) && !passes(&f, L4));
        let not = filter(&[(ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-aaaa")]);
        assert!(!passes(&not, A100) && passes(&not, L4));
        let prefix = filter(&[(ANNOTATION_GPU_UUIDS, "GPU-aa")]);
        assert!(!passes(&prefix, A100), "a UUID is never a prefix match");
        let amd = filter(&[(ANNOTATION_GPU_VENDOR, "amd")]);
        assert!(passes(&amd, MI210) && !passes(&amd, A100));
        let e = amd.refusal(A100.0, A100.1, A100.2).expect("refused");
        assert!(e.contains(ANNOTATION_GPU_VENDOR), "{e}");
        let all = filter(&[
            (ANNOTATION_GPU_VENDOR, "nvidia"),
            (ANNOTATION_GPU_MODELS, "NVIDIA"),
            (ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-bbbb"),
        ]);
        assert!(passes(&all, A100) && !passes(&all, L4) && !passes(&all, MI210));
        assert!(filter(&[]).is_empty() && passes(&filter(&[]), MI210));
    }

    #[test]
    fn the_rule_as_a_cel_selector() {
        assert_eq!(filter(&[]).cel("d"), None);
        let f = filter(&[
            (ANNOTATION_GPU_VENDOR, "nvidia"),
            (ANNOTATION_GPU_MODELS, "A100,L4"),
            (ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-B"),
        ]);
        let a = |n: &str| format!("device.attributes[\"vgpu.tessera.dev\"].{n}");
        let t = format!(
            "({}.upperAscii() + \"-\" + {}).lowerAscii()",
            a("vendor"),
            a("productName")
        );
        assert_eq!(
            f.cel("vgpu.tessera.dev").expect("a selector"),
            format!(
                "{} == \"nvidia\" && ({t}.contains(\"a100\") || {t}.contains(\"l4\")) && !({}.lowerAscii() in [\"gpu-b\"])",
                a("vendor"),
                a("uuid")
            )
        );
        let hostile = filter(&[(ANNOTATION_GPU_MODELS, "x\") || true || (\"")]);
        let cel = hostile.cel("d").expect("a selector");
        assert!(cel.contains(r#"contains("x\") || true || (\"")"#), "{cel}");
    }

    #[test]
    fn bad_annotations_are_named() {
        let bad = |k: &str, v: &str| {
            let a = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            GpuFilter::from_annotations(&a).expect_err(v)
        };
        let e = bad(ANNOTATION_GPU_MODELS, " , ");
        assert!(
            e.contains(ANNOTATION_GPU_MODELS) && e.contains("names nothing"),
            "{e}"
        );
        let e = bad(ANNOTATION_GPU_VENDOR, "intel");
        assert!(
            e.contains(ANNOTATION_GPU_VENDOR) && e.contains("intel"),
            "{e}"
        );
        let e = bad(ANNOTATION_GPU_UUIDS, &"x".repeat(MAX_LIST_LEN + 1));
        assert!(e.contains("over"), "{e}");
    }
}
