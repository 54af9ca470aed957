//! Other GPU-sharing projects' words (HAMi, KAI-Scheduler, Volcano's vGPU)
//! that Tessera's webhook translates into its own request, and the
//! variables HAMi-core reads that Tessera never trusts. The values are the
//! names those projects document; see docs/dropin.md.

/// A project whose pod specs Tessera accepts as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dialect {
    /// HAMi: `nvidia.com/gpu`, `nvidia.com/gpumem`, ... in container resources.
    Hami,
    /// KAI-Scheduler: `gpu-fraction` / `gpu-memory` pod annotations.
    Kai,
    /// Volcano's vGPU: `volcano.sh/vgpu-*` in container resources.
    Volcano,
}

impl Dialect {
    /// Every dialect, in the order the docs and the chart list them.
    pub const ALL: [Dialect; 3] = [Dialect::Hami, Dialect::Kai, Dialect::Volcano];

    /// The name used in flags, the chart and the original-words annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Hami => "hami",
            Dialect::Kai => "kai",
            Dialect::Volcano => "volcano",
        }
    }

    /// The dialect a flag or chart value names; the error says which are known.
    pub fn parse(name: &str) -> Result<Dialect, String> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == name)
            .ok_or_else(|| {
                format!("unknown drop-in dialect {name:?}; expected hami, kai or volcano")
            })
    }
}

/// HAMi: vGPUs (or whole cards) per container.
pub const HAMI_GPU: &str = "nvidia.com/gpu";
/// HAMi: device memory per card, MiB.
pub const HAMI_GPUMEM: &str = "nvidia.com/gpumem";
/// HAMi: device memory per card, percent of the card.
pub const HAMI_GPUMEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// HAMi: compute per card, percent of the card.
pub const HAMI_GPUCORES: &str = "nvidia.com/gpucores";
/// HAMi: task priority, `0` high, `1` low.
pub const HAMI_PRIORITY: &str = "nvidia.com/priority";
/// HAMi's resources that mark a container as HAMi's (`nvidia.com/gpu` alone
/// is NVIDIA's own device plugin's word too, so it does not).
pub const HAMI_SHARING_RESOURCES: [&str; 4] = [
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    HAMI_GPUCORES,
    HAMI_PRIORITY,
];
/// HAMi pod annotations: GPU models to use / avoid (comma-separated).
pub const HAMI_USE_GPUTYPE: &str = "nvidia.com/use-gputype";
pub const HAMI_NOUSE_GPUTYPE: &str = "nvidia.com/nouse-gputype";
/// HAMi pod annotations: GPU UUIDs to use / avoid (comma-separated).
pub const HAMI_USE_GPUUUID: &str = "nvidia.com/use-gpuuuid";
pub const HAMI_NOUSE_GPUUUID: &str = "nvidia.com/nouse-gpuuuid";
/// HAMi pod annotations: placement policy among GPUs and among nodes.
pub const HAMI_GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";
pub const HAMI_NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";

/// KAI-Scheduler pod annotation: the fraction of one GPU (`0.5`).
pub const KAI_GPU_FRACTION: &str = "gpu-fraction";
/// KAI-Scheduler pod annotation: GPU memory, MiB.
pub const KAI_GPU_MEMORY: &str = "gpu-memory";
/// KAI-Scheduler pod annotation: on how many GPUs the fraction is taken.
pub const KAI_GPU_FRACTION_NUM_DEVICES: &str = "gpu-fraction-num-devices";
/// KAI-Scheduler pod annotation: which container the fraction is for (the
/// first container when absent).
pub const KAI_GPU_FRACTION_CONTAINER: &str = "gpu-fraction-container-name";
/// KAI-Scheduler's own admission: the annotation naming the ConfigMap prefix its
/// binder writes the chosen GPU into, and the variables it points at that ConfigMap
/// (`NVIDIA_VISIBLE_DEVICES` from the key [`KAI_VISIBLE_DEVICES_KEY`]).
pub const KAI_CONFIGMAP_ANNOTATION: &str = "runai/shared-gpu-configmap";
pub const KAI_VISIBLE_DEVICES_KEY: &str = "RUNAI-VISIBLE-DEVICES";
pub const KAI_ENV: [&str; 2] = ["RUNAI_NUM_OF_GPUS", "GPU_PORTION"];
/// KAI-Scheduler's annotations, all taken off the pod once translated.
pub const KAI_ANNOTATIONS: [&str; 5] = [
    KAI_GPU_FRACTION,
    KAI_GPU_MEMORY,
    KAI_GPU_FRACTION_NUM_DEVICES,
    KAI_GPU_FRACTION_CONTAINER,
    KAI_CONFIGMAP_ANNOTATION,
];

/// Volcano: vGPUs per container.
pub const VOLCANO_VGPU_NUMBER: &str = "volcano.sh/vgpu-number";
/// Volcano: device memory per vGPU, MiB.
pub const VOLCANO_VGPU_MEMORY: &str = "volcano.sh/vgpu-memory";
/// Volcano: compute per vGPU, percent of the card.
pub const VOLCANO_VGPU_CORES: &str = "volcano.sh/vgpu-cores";
/// Volcano: device memory per vGPU, percent of the card.
pub const VOLCANO_VGPU_MEMORY_PERCENTAGE: &str = "volcano.sh/vgpu-memory-percentage";
/// Volcano's resources.
pub const VOLCANO_RESOURCES: [&str; 4] = [
    VOLCANO_VGPU_NUMBER,
    VOLCANO_VGPU_MEMORY,
    VOLCANO_VGPU_CORES,
    VOLCANO_VGPU_MEMORY_PERCENTAGE,
];

/// HAMi's words for a vendor's cards other than NVIDIA's: its device plugins for AMD
/// GPUs and Hygon DCUs name the card count, the memory per card (MiB) and the compute
/// per card (percent) under the vendor's own domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HamiVendorWords {
    pub vendor: crate::Vendor,
    /// Cards per container (also the vendor's own device plugin's word, so alone it
    /// does not make a container HAMi's).
    pub gpu: &'static str,
    /// Device memory per card, MiB.
    pub gpumem: &'static str,
    /// Compute per card, percent of the card.
    pub gpucores: &'static str,
}

/// HAMi on AMD GPUs.
pub const HAMI_AMD: HamiVendorWords = HamiVendorWords {
    vendor: crate::Vendor::Amd,
    gpu: "amd.com/gpu",
    gpumem: "amd.com/gpumem",
    gpucores: "amd.com/gpucores",
};

/// HAMi on Hygon DCUs.
pub const HAMI_HYGON: HamiVendorWords = HamiVendorWords {
    vendor: crate::Vendor::Hygon,
    gpu: "hygon.com/dcunum",
    gpumem: "hygon.com/dcumem",
    gpucores: "hygon.com/dcucores",
};

/// HAMi's words per non-NVIDIA vendor Tessera translates.
pub const HAMI_VENDORS: [HamiVendorWords; 2] = [HAMI_AMD, HAMI_HYGON];

/// Pod annotation the webhook writes: the pod's original words (JSON), so
/// `kubectl get pod -o yaml` shows both. Informational: nothing reads it to
/// decide anything, which is why a copy a user wrote is harmless.
pub const ANNOTATION_ORIGINAL: &str = "tessera.dev/dropin-original";

/// Pod annotation the webhook writes on a translated pod whose ask is not a whole number
/// of slices: per container, the slices it was given and the exact memory (MiB) and
/// compute (percent of a GPU) it asked for, as JSON:
/// `{"main":{"slices":1,"memoryMiB":3000,"computePercent":30}}` (either limit may be
/// absent: that one is the slices'). The node enforces the smaller of this and the
/// granted slices, so a copy a tenant writes or edits can only lower its own limits.
pub const ANNOTATION_EXACT_LIMITS: &str = "tessera.dev/dropin-limits";

/// Pod annotation the webhook writes on a translated pod whose memory is a share of the
/// card (HAMi's `gpumem-percentage`, Volcano's `vgpu-memory-percentage`, KAI's
/// `gpu-fraction`) that is not a whole number of slices: per container, the slices it
/// was given and the share, in percent of the card (a JSON number, `33.3` allowed), as
/// `{"main":{"slices":3,"percent":30}}`; for a KAI fraction, which is a share of the
/// whole GPU, also its share of the compute, `"computePercent":30` (`33.3` for `0.333`,
/// which the whole-percent field of [`ANNOTATION_EXACT_LIMITS`] cannot hold). Only the
/// node knows the card it lands on, so the node works out the bytes at Allocate /
/// prepare; like [`ANNOTATION_EXACT_LIMITS`] it only ever lowers the slices' limits. A separate annotation, not a field of that one:
/// an older node refuses unknown fields there and would fail the pod during a rolling
/// upgrade, where it ignores this annotation and keeps the slices' limits. Its entries'
/// unknown fields are ignored for the same reason: a node from before `computePercent`
/// keeps the slices' compute.
pub const ANNOTATION_EXACT_MEMORY_PERCENT: &str = "tessera.dev/dropin-memory-percent";

/// HAMi-core's variables. The shim reads none of them (it reads only
/// `TESSERA_*` and the control file); the webhook warns when a pod sets one.
pub const HAMI_CORE_ENV: [&str; 4] = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
];

/// True for a HAMi-core variable, including the per-device
/// `CUDA_DEVICE_MEMORY_LIMIT_<n>` forms.
pub fn is_hami_core_env(name: &str) -> bool {
    HAMI_CORE_ENV.contains(&name)
        || name
            .strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialect_names_round_trip_and_unknown_names_are_refused() {
        for d in Dialect::ALL {
            assert_eq!(Dialect::parse(d.as_str()), Ok(d));
        }
        let e = Dialect::parse("HAMi").expect_err("case matters");
        assert!(e.contains("hami, kai or volcano"), "{e}");
    }

    #[test]
    fn hami_core_variables_include_the_per_device_forms() {
        assert!(is_hami_core_env("CUDA_DEVICE_MEMORY_LIMIT"));
        assert!(is_hami_core_env("CUDA_DEVICE_MEMORY_LIMIT_0"));
        assert!(is_hami_core_env("CUDA_DEVICE_SM_LIMIT"));
        assert!(!is_hami_core_env("CUDA_DEVICE_MEMORY_LIMIT_"));
        assert!(!is_hami_core_env("CUDA_DEVICE_MEMORY_LIMIT_X"));
        assert!(!is_hami_core_env("CUDA_VISIBLE_DEVICES"));
    }
}
