//! The task mix a cluster expects, and the fragmentation of a node over it.
//!
//! Definition (the FGD paper's, Weng et al., USENIX ATC'23): a GPU's free
//! share is a *fragment* for a task type when that task cannot use it: the
//! task needs no GPU, needs more of one GPU than is free there, needs more
//! GPUs than the node has usable, another model, or more CPU than the node
//! has left. The fragmentation of a node is the expectation of that
//! unusable share over the task types, weighted by how often each comes.

use std::collections::HashMap;

use crate::cluster::{GpuNeed, MILLI, Request};

/// One kind of task, as far as fragmentation goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskType {
    pub cpu_milli: u64,
    /// GPUs it needs (0: CPU only).
    pub gpus: u32,
    /// Share of each GPU, thousandths (1000 for whole GPUs).
    pub milli: u32,
    /// Allowed models or classes (empty: any), lower case, sorted.
    pub models: Vec<String>,
}

/// One entry of a [`TaskMix`].
#[derive(Debug, Clone, PartialEq)]
pub struct MixEntry {
    pub task: TaskType,
    /// Share of the tasks of this type (the entries' weights sum to 1).
    pub weight: f64,
}

impl TaskType {
    /// The task type of a request.
    pub fn of(req: &Request) -> TaskType {
        let (gpus, milli) = match req.gpu {
            GpuNeed::None => (0, 0),
            GpuNeed::Share { compute, .. } => (1, compute),
            GpuNeed::Whole(n) => (n, MILLI),
        };
        let mut models: Vec<String> = req.models.iter().map(|m| m.to_lowercase()).collect();
        models.sort();
        models.dedup();
        TaskType {
            cpu_milli: req.cpu_milli,
            gpus,
            milli,
            models,
        }
    }
}

/// The task types a cluster expects and their weights (summing to 1).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskMix {
    pub types: Vec<MixEntry>,
}

/// Task types with their counts, the most frequent first; ties broken by the
/// type itself, so that the order does not depend on a hash map's.
fn by_frequency(counts: HashMap<TaskType, u64>) -> Vec<(TaskType, u64)> {
    let mut all: Vec<(TaskType, u64)> = counts.into_iter().collect();
    all.sort_by(|a, b| {
        b.1.cmp(&a.1).then_with(|| {
            (a.0.gpus, a.0.milli, a.0.cpu_milli, &a.0.models).cmp(&(
                b.0.gpus,
                b.0.milli,
                b.0.cpu_milli,
                &b.0.models,
            ))
        })
    });
    all
}

/// The head of `sorted` (most frequent first) that covers at least
/// `coverage` (0..=1) of `total`, and never less than one entry.
fn covering<K>(sorted: Vec<(K, u64)>, total: u64, coverage: f64) -> Vec<(K, u64)> {
    let need = (coverage.clamp(0.0, 1.0) * total as f64).ceil() as u64;
    let mut kept = Vec::new();
    let mut covered = 0u64;
    for (k, n) in sorted {
        if covered >= need && !kept.is_empty() {
            break;
        }
        covered += n;
        kept.push((k, n));
    }
    kept
}

impl TaskMix {
    /// The most frequent task types among `requests` that together cover at
    /// least `coverage` (0..=1) of them, weighted by frequency. Ties in
    /// frequency are broken by the type itself, so the mix does not depend
    /// on the order of `requests`.
    pub fn from_requests<'a>(
        requests: impl IntoIterator<Item = &'a Request>,
        coverage: f64,
    ) -> TaskMix {
        let mut counts: HashMap<TaskType, u64> = HashMap::new();
        let mut total = 0u64;
        for r in requests {
            *counts.entry(TaskType::of(r)).or_default() += 1;
            total += 1;
        }
        TaskMix::weighted(covering(by_frequency(counts), total, coverage))
    }

    /// The task types among `requests` whose *shape* (CPU, GPUs, share per
    /// GPU, the GPU models aside) is among the most frequent shapes that
    /// together cover at least `coverage` of them, each with every model
    /// list it comes with, weighted by frequency. Without model constraints
    /// this is [`TaskMix::from_requests`]. With them it keeps what FGD's cut
    /// drops: a shape asked for with many model lists splits into many
    /// rare types, so a 95% cut by type keeps the unconstrained types and
    /// loses most of the constrained ones, and the measure stops seeing
    /// which GPU models the constrained tasks need.
    pub fn by_shape<'a>(requests: impl IntoIterator<Item = &'a Request>, coverage: f64) -> TaskMix {
        let types: Vec<TaskType> = requests.into_iter().map(TaskType::of).collect();
        let shape = |t: &TaskType| (t.gpus, t.milli, t.cpu_milli);
        let mut shapes: HashMap<(u32, u32, u64), u64> = HashMap::new();
        for t in &types {
            *shapes.entry(shape(t)).or_default() += 1;
        }
        let mut order: Vec<((u32, u32, u64), u64)> = shapes.into_iter().collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let kept: std::collections::HashSet<(u32, u32, u64)> =
            covering(order, types.len() as u64, coverage)
                .into_iter()
                .map(|(s, _)| s)
                .collect();
        let mut counts: HashMap<TaskType, u64> = HashMap::new();
        for t in types {
            if kept.contains(&shape(&t)) {
                *counts.entry(t).or_default() += 1;
            }
        }
        TaskMix::weighted(by_frequency(counts))
    }

    /// The types with weights proportional to their counts.
    fn weighted(kept: Vec<(TaskType, u64)>) -> TaskMix {
        let sum: u64 = kept.iter().map(|k| k.1).sum();
        TaskMix {
            types: kept
                .into_iter()
                .map(|(task, n)| MixEntry {
                    task,
                    weight: n as f64 / sum.max(1) as f64,
                })
                .collect(),
        }
    }
}

/// A task type compiled against the engine's GPU kinds.
#[derive(Debug, Clone)]
pub(crate) struct CompiledType {
    pub cpu_milli: u64,
    pub gpus: u32,
    pub milli: u32,
    /// Per GPU kind: may the task use it.
    pub allowed: Vec<bool>,
    pub weight: f64,
}

/// What fragmentation needs of one GPU: its kind and its free share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FragGpu {
    pub kind: u16,
    pub free: u32,
}

/// What the two measures need of a node's GPUs, summed per task type, so
/// that the measures of the node after one or a few of its GPUs change
/// follow from a pass over the types alone (the engine ranks each GPU of a
/// node as a candidate: a pass over types × GPUs per candidate was most of
/// a decision's time). Integer sums: adding and taking away GPUs is exact,
/// and the measures come out the same as from the GPUs directly.
#[derive(Debug, Clone)]
pub(crate) struct NodeSums {
    /// Free share of the node's GPUs.
    total: u64,
    per_type: Vec<TypeSums>,
}

#[derive(Debug, Clone, Copy, Default)]
struct TypeSums {
    /// Allowed GPUs with at least the type's share free, and their free share.
    usable_n: u32,
    usable_sum: u64,
    /// Copies of the type the allowed GPUs hold by their free share alone:
    /// for a share type, the sum of ⌊free / share⌋; for whole GPUs, the
    /// unused GPUs (a copy takes `gpus` of them).
    copies: u64,
}

impl NodeSums {
    pub fn new(types: &[CompiledType], gpus: &[FragGpu]) -> NodeSums {
        let mut s = NodeSums {
            total: 0,
            per_type: vec![TypeSums::default(); types.len()],
        };
        for g in gpus {
            s.add(types, *g);
        }
        s
    }

    /// One GPU's part of each sum.
    fn part(t: &CompiledType, g: FragGpu) -> (u32, u64, u64) {
        if !t.allowed.get(usize::from(g.kind)).copied().unwrap_or(false) {
            return (0, 0, 0);
        }
        let usable = g.free >= t.milli;
        let copies = if t.milli == 0 {
            0
        } else if t.milli >= MILLI {
            u64::from(g.free >= MILLI)
        } else {
            u64::from(g.free / t.milli)
        };
        (
            u32::from(usable),
            if usable { u64::from(g.free) } else { 0 },
            copies,
        )
    }

    /// Counts one more GPU.
    pub fn add(&mut self, types: &[CompiledType], g: FragGpu) {
        self.total += u64::from(g.free);
        for (t, s) in types.iter().zip(&mut self.per_type) {
            let (n, sum, copies) = Self::part(t, g);
            s.usable_n += n;
            s.usable_sum += sum;
            s.copies += copies;
        }
    }

    /// Takes away a GPU counted before (in the state it was counted in).
    pub fn remove(&mut self, types: &[CompiledType], g: FragGpu) {
        self.total -= u64::from(g.free);
        for (t, s) in types.iter().zip(&mut self.per_type) {
            let (n, sum, copies) = Self::part(t, g);
            s.usable_n -= n;
            s.usable_sum -= sum;
            s.copies -= copies;
        }
    }

    /// The expected unusable free share (thousandths of a GPU) with
    /// `cpu_free` CPU left: for each type, all of it if the type needs no
    /// GPU, more CPU than is left or more GPUs than hold its share; else
    /// the GPUs' free share that is below the type's share.
    pub fn fragmentation(&self, types: &[CompiledType], cpu_free: u64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        for (t, s) in types.iter().zip(&self.per_type) {
            let unusable = if t.gpus == 0 || cpu_free < t.cpu_milli || s.usable_n < t.gpus {
                self.total
            } else {
                self.total - s.usable_sum
            };
            frag += t.weight * unusable as f64;
        }
        frag
    }

    /// The expected share (thousandths of a GPU) the task mix cannot fill
    /// with `cpu_free` CPU left: for each type, what is left after as many
    /// copies of it as the node can still hold, by its GPUs and by its CPU.
    pub fn leftover(&self, types: &[CompiledType], cpu_free: u64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        for (t, s) in types.iter().zip(&self.per_type) {
            let usable = if t.gpus == 0 || t.milli == 0 {
                0
            } else {
                let by_gpu = if t.milli >= MILLI {
                    s.copies / u64::from(t.gpus)
                } else {
                    s.copies
                };
                let by_cpu = cpu_free.checked_div(t.cpu_milli).unwrap_or(u64::MAX);
                (by_gpu.min(by_cpu) * u64::from(t.gpus) * u64::from(t.milli)).min(self.total)
            };
            frag += t.weight * (self.total - usable) as f64;
        }
        frag
    }
}

/// The expected unusable free share (thousandths of a GPU) of a node with
/// `cpu_free` CPU left and these GPUs ([`NodeSums::fragmentation`]).
pub(crate) fn node_fragmentation(types: &[CompiledType], cpu_free: u64, gpus: &[FragGpu]) -> f64 {
    NodeSums::new(types, gpus).fragmentation(types, cpu_free)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(cpu: u64, gpus: u32, milli: u32, weight: f64) -> CompiledType {
        CompiledType {
            cpu_milli: cpu,
            gpus,
            milli,
            allowed: vec![true, false],
            weight,
        }
    }

    #[test]
    fn fragment_is_what_a_task_cannot_use() {
        let gpus = [
            FragGpu { kind: 0, free: 300 },
            FragGpu {
                kind: 0,
                free: 1000,
            },
        ];
        // A half-GPU task can use the whole GPU but not the 300.
        assert_eq!(
            node_fragmentation(&[ty(0, 1, 500, 1.0)], 8000, &gpus),
            300.0
        );
        // A 0.2 task can use both.
        assert_eq!(node_fragmentation(&[ty(0, 1, 200, 1.0)], 8000, &gpus), 0.0);
        // Two whole GPUs: the node has one; everything is a fragment.
        assert_eq!(
            node_fragmentation(&[ty(0, 2, 1000, 1.0)], 8000, &gpus),
            1300.0
        );
        // Not enough CPU left: everything.
        assert_eq!(
            node_fragmentation(&[ty(9000, 1, 200, 1.0)], 8000, &gpus),
            1300.0
        );
        // CPU-only tasks use no GPU.
        assert_eq!(
            node_fragmentation(&[ty(1000, 0, 0, 1.0)], 8000, &gpus),
            1300.0
        );
        // A model the task may not use.
        let other = [FragGpu {
            kind: 1,
            free: 1000,
        }];
        assert_eq!(
            node_fragmentation(&[ty(0, 1, 200, 1.0)], 8000, &other),
            1000.0
        );
        // Weighted mix.
        let mix = [ty(0, 1, 500, 0.5), ty(0, 2, 1000, 0.5)];
        assert_eq!(
            node_fragmentation(&mix, 8000, &gpus),
            0.5 * 300.0 + 0.5 * 1300.0
        );
    }

    #[test]
    fn mix_keeps_the_most_frequent_types_up_to_the_coverage() {
        let mut reqs = Vec::new();
        for _ in 0..90 {
            reqs.push(Request::trace(1000, 0, 1, 500));
        }
        for _ in 0..6 {
            reqs.push(Request::trace(2000, 0, 1, 1000));
        }
        for _ in 0..4 {
            reqs.push(Request::trace(1000, 0, 0, 0));
        }
        let mix = TaskMix::from_requests(&reqs, 0.95);
        assert_eq!(mix.types.len(), 2);
        assert_eq!(mix.types[0].task.milli, 500);
        assert!((mix.types[0].weight - 90.0 / 96.0).abs() < 1e-12);
        let all = TaskMix::from_requests(&reqs, 1.0);
        assert_eq!(all.types.len(), 3);
        let w: f64 = all.types.iter().map(|t| t.weight).sum();
        assert!((w - 1.0).abs() < 1e-12);
    }

    /// Both measures straight from the GPUs, type by type, GPU by GPU.
    fn direct(types: &[CompiledType], cpu: u64, gpus: &[FragGpu]) -> (f64, f64) {
        let total: u64 = gpus.iter().map(|g| u64::from(g.free)).sum();
        if total == 0 {
            return (0.0, 0.0);
        }
        let (mut frag, mut left) = (0.0, 0.0);
        for t in types {
            let ok = |g: &&FragGpu| t.allowed[usize::from(g.kind)];
            let usable: Vec<&FragGpu> = gpus
                .iter()
                .filter(ok)
                .filter(|g| g.free >= t.milli)
                .collect();
            let unusable = if t.gpus == 0 || cpu < t.cpu_milli || (usable.len() as u32) < t.gpus {
                total
            } else {
                total - usable.iter().map(|g| u64::from(g.free)).sum::<u64>()
            };
            frag += t.weight * unusable as f64;
            let fill = if t.gpus == 0 || t.milli == 0 {
                0
            } else {
                let by_gpu = if t.milli >= MILLI {
                    gpus.iter().filter(ok).filter(|g| g.free >= MILLI).count() as u64
                        / u64::from(t.gpus)
                } else {
                    gpus.iter()
                        .filter(ok)
                        .map(|g| u64::from(g.free / t.milli))
                        .sum()
                };
                let by_cpu = cpu.checked_div(t.cpu_milli).unwrap_or(u64::MAX);
                (by_gpu.min(by_cpu) * u64::from(t.gpus) * u64::from(t.milli)).min(total)
            };
            left += t.weight * (total - fill) as f64;
        }
        (frag, left)
    }

    #[test]
    fn sums_changed_gpu_by_gpu_measure_as_the_gpus_do() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut below = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..500 {
            let types: Vec<CompiledType> = (0..1 + below(6))
                .map(|_| CompiledType {
                    cpu_milli: 1000 * below(8),
                    gpus: below(4) as u32,
                    milli: [0, 110, 470, 500, 810, 1000][below(6) as usize],
                    allowed: vec![true, below(2) == 0],
                    weight: 0.1 + below(10) as f64 / 10.0,
                })
                .collect();
            let mut gpus: Vec<FragGpu> = (0..below(9))
                .map(|_| FragGpu {
                    kind: below(2) as u16,
                    free: [0, 60, 190, 530, 1000][below(5) as usize],
                })
                .collect();
            let mut sums = NodeSums::new(&types, &gpus);
            // Change a few GPUs the way a candidate does: take the old
            // state away, count the new one.
            for _ in 0..below(4) {
                if gpus.is_empty() {
                    break;
                }
                let i = below(gpus.len() as u64) as usize;
                let new = FragGpu {
                    kind: gpus[i].kind,
                    free: below(1001) as u32,
                };
                sums.remove(&types, gpus[i]);
                sums.add(&types, new);
                gpus[i] = new;
            }
            let cpu = 1000 * below(10);
            let (frag, left) = direct(&types, cpu, &gpus);
            assert_eq!(sums.fragmentation(&types, cpu), frag, "{types:?} {gpus:?}");
            assert_eq!(sums.leftover(&types, cpu), left, "{types:?} {gpus:?}");
        }
    }

    /// A shape asked for with several model lists is kept whole when the
    /// shape is frequent, though each (shape, models) alone is rare; with
    /// no model lists, the mix is FGD's.
    #[test]
    fn the_mix_by_shape_keeps_every_model_list_of_a_kept_shape() {
        let mut reqs = Vec::new();
        for m in ["T4", "G2", "P100", "V100M16", "V100M32"] {
            for _ in 0..3 {
                let mut r = Request::trace(1000, 0, 1, 500);
                r.models = vec![m.into()];
                reqs.push(r);
            }
        }
        for _ in 0..10 {
            reqs.push(Request::trace(2000, 0, 1, 1000));
        }
        // By type: the 10 whole-GPU tasks first, then 3 of each model
        // list; FGD's cut at 60% (15 of 25) keeps the whole-GPU type and
        // two of the five lists. By shape, the half-GPU shape (15 tasks)
        // covers 60% alone and keeps all five lists.
        let fgd = TaskMix::from_requests(&reqs, 0.6);
        assert_eq!(fgd.types.len(), 3);
        let by_shape = TaskMix::by_shape(&reqs, 0.6);
        assert_eq!(by_shape.types.len(), 5);
        assert!(by_shape.types.iter().all(|t| t.task.milli == 500));
        let mut lists: Vec<&str> = by_shape
            .types
            .iter()
            .map(|t| t.task.models[0].as_str())
            .collect();
        lists.sort_unstable();
        assert_eq!(lists, ["g2", "p100", "t4", "v100m16", "v100m32"]);
        let plain: Vec<Request> = reqs
            .iter()
            .map(|r| Request {
                models: Vec::new(),
                ..r.clone()
            })
            .collect();
        assert_eq!(
            TaskMix::by_shape(&plain, 0.95),
            TaskMix::from_requests(&plain, 0.95)
        );
    }
}
