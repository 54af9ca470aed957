//! The cluster the engine places on (nodes and their GPUs) and what a
//! request asks for.
//!
//! Units: CPU in millicores, memory in MiB, a GPU's compute in thousandths
//! of the GPU (`milli`, 1000 = the whole GPU).

/// A whole GPU's compute, in thousandths.
pub const MILLI: u32 = 1000;

/// One GPU of a node and what is free on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Product or model name (`T4`, `NVIDIA H100 80GB HBM3`, ...).
    pub model: String,
    /// The class it belongs to (`tessera.dev/gpu-class`); empty if none.
    pub class: String,
    pub memory_mib: u64,
    pub memory_free_mib: u64,
    /// Free compute share, 0..=1000.
    pub compute_free: u32,
    /// Slices the GPU is cut into (0: not counted in slices).
    pub slices: u32,
    pub slices_free: u32,
    /// Mean utilization (0..=1) lately; None if unmeasured (counts as idle).
    pub utilization: Option<f32>,
}

impl Gpu {
    /// An unused GPU, not cut into slices.
    pub fn new(model: impl Into<String>, memory_mib: u64) -> Gpu {
        Gpu {
            model: model.into(),
            class: String::new(),
            memory_mib,
            memory_free_mib: memory_mib,
            compute_free: MILLI,
            slices: 0,
            slices_free: 0,
            utilization: None,
        }
    }

    /// Nothing of it is given out.
    pub fn is_unused(&self) -> bool {
        self.compute_free >= MILLI
            && self.memory_free_mib >= self.memory_mib
            && self.slices_free >= self.slices
    }

    /// The free share of the GPU in thousandths: the smaller of its free
    /// compute and its free memory (as a share of its memory).
    pub fn free_share(&self) -> u32 {
        free_share(self.compute_free, self.memory_free_mib, self.memory_mib)
    }
}

pub(crate) fn free_share(compute_free: u32, memory_free: u64, memory: u64) -> u32 {
    // A GPU without memory (as a trace may give) is limited by compute only.
    let mem = memory_free
        .saturating_mul(u64::from(MILLI))
        .checked_div(memory)
        .unwrap_or(u64::from(MILLI));
    compute_free.min(mem.min(u64::from(MILLI)) as u32)
}

/// One node: its free CPU and host memory, and its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u64,
    pub cpu_free: u64,
    pub memory_mib: u64,
    pub memory_free_mib: u64,
    pub gpus: Vec<Gpu>,
}

impl Node {
    /// An unused node.
    pub fn new(name: impl Into<String>, cpu_milli: u64, memory_mib: u64, gpus: Vec<Gpu>) -> Node {
        Node {
            name: name.into(),
            cpu_milli,
            cpu_free: cpu_milli,
            memory_mib,
            memory_free_mib: memory_mib,
            gpus,
        }
    }
}

/// How much GPU memory a share request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryNeed {
    /// This many MiB, whatever the GPU.
    Mib(u64),
    /// This share of the chosen GPU's memory, in thousandths (rounded up).
    PerMille(u32),
}

impl MemoryNeed {
    /// MiB needed on a GPU with `memory_mib` of memory.
    pub fn on(self, memory_mib: u64) -> u64 {
        match self {
            MemoryNeed::Mib(m) => m,
            MemoryNeed::PerMille(p) => (memory_mib * u64::from(p)).div_ceil(u64::from(MILLI)),
        }
    }
}

/// What a request needs of the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuNeed {
    /// No GPU (a CPU-only pod).
    None,
    /// A share of one GPU: compute (thousandths), memory, and slices (0 when
    /// the GPU is not counted in slices).
    Share {
        compute: u32,
        memory: MemoryNeed,
        slices: u32,
    },
    /// This many unused GPUs of one node.
    Whole(u32),
}

/// One pod's request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuNeed,
    /// GPU models or classes allowed (case-insensitive); empty: any.
    pub models: Vec<String>,
}

impl Request {
    /// A request for `milli` thousandths of one GPU's compute and the same
    /// share of its memory (how `tessera simulate` reads a trace's
    /// `gpu_milli`), or of `n` whole GPUs when `milli` is 1000.
    pub fn trace(cpu_milli: u64, memory_mib: u64, num_gpu: u32, milli: u32) -> Request {
        let gpu = match (num_gpu, milli) {
            (0, _) | (_, 0) => GpuNeed::None,
            (1, m) if m < MILLI => GpuNeed::Share {
                compute: m,
                memory: MemoryNeed::PerMille(m),
                slices: 0,
            },
            (n, _) => GpuNeed::Whole(n),
        };
        Request {
            cpu_milli,
            memory_mib,
            gpu,
            models: Vec::new(),
        }
    }

    /// The GPU demand in thousandths of a GPU (what the trace counts).
    pub fn gpu_milli(&self) -> u64 {
        match self.gpu {
            GpuNeed::None => 0,
            GpuNeed::Share { compute, .. } => u64::from(compute),
            GpuNeed::Whole(n) => u64::from(n) * u64::from(MILLI),
        }
    }
}

/// Where a request goes: a node (its index in the cluster) and the GPUs on
/// it (indexes into the node's `gpus`; empty for a CPU-only request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub gpus: Vec<usize>,
}
