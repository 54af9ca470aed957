//! Each policy on small clusters where the node it would like best does not
//! fit, and a property test over random clusters: no placement ever
//! over-commits a GPU, a node's CPU or its memory, and a request is refused
//! only when nothing fits.

use tessera_placement::{
    Choice, Engine, Gpu, GpuNeed, MemoryNeed, Node, PlaceError, Policy, Request, TaskMix,
};

fn gpu(model: &str, compute_free: u32) -> Gpu {
    let mut g = Gpu::new(model, 16_000);
    g.compute_free = compute_free;
    g.memory_free_mib = 16 * u64::from(compute_free);
    g
}

fn node(name: &str, cpu_free: u64, gpus: Vec<Gpu>) -> Node {
    let mut n = Node::new(name, 64_000, 256_000, gpus);
    n.cpu_free = cpu_free;
    n
}

fn share(cpu: u64, milli: u32) -> Request {
    Request::trace(cpu, 1000, 1, milli)
}

/// A mix of half-GPU tasks: what the fragmentation policies expect.
fn mix_of(reqs: &[Request]) -> TaskMix {
    TaskMix::from_requests(reqs, 1.0)
}

fn engine(nodes: Vec<Node>, p: Policy) -> Engine {
    Engine::new(
        nodes,
        p,
        &mix_of(&[share(1000, 500), share(1000, 500), share(1000, 1000)]),
    )
    .expect("valid cluster")
}

/// Node 0: a GPU with 400 free (too little for 500).
/// Node 1: GPUs with 600 and 1000 free (fits).
/// Node 2: an unused GPU but no CPU left.
/// Node 3: unused A100s, a model the request does not allow.
/// Node 4: unused T4s but no host memory left.
fn trap_cluster() -> Vec<Node> {
    let mut no_mem = node("no-mem", 64_000, vec![gpu("T4", 1000), gpu("T4", 1000)]);
    no_mem.memory_free_mib = 0;
    vec![
        node("too-small", 64_000, vec![gpu("T4", 400)]),
        node("fits", 64_000, vec![gpu("T4", 600), gpu("T4", 1000)]),
        node("no-cpu", 500, vec![gpu("T4", 1000), gpu("T4", 1000)]),
        node(
            "wrong-model",
            64_000,
            vec![gpu("A100", 1000), gpu("A100", 1000)],
        ),
        no_mem,
    ]
}

#[test]
fn every_policy_picks_only_a_node_that_fits() {
    for p in Policy::ALL {
        let mut e = engine(trap_cluster(), p);
        let mut req = share(4000, 500);
        req.models = vec!["t4".into()];
        let c = e.decide(&req).unwrap_or_else(|err| panic!("{p}: {err}"));
        assert_eq!(c.node, 1, "{p} chose {c:?}");
        assert_eq!(c.gpus.len(), 1, "{p}");
        // Whole GPUs: only node 1's unused one, so two whole GPUs fit nowhere.
        let mut whole = Request::trace(4000, 1000, 1, 1000);
        whole.models = vec!["T4".into()];
        assert_eq!(e.decide(&whole).map(|c| c.node), Ok(1), "{p}");
        let mut two = Request::trace(4000, 1000, 2, 1000);
        two.models = vec!["T4".into()];
        assert_eq!(e.decide(&two), Err(PlaceError::NoFit), "{p}");
        // Without the model constraint the A100 node holds two.
        two.models.clear();
        assert_eq!(e.decide(&two).map(|c| c.node), Ok(3), "{p}");
    }
}

#[test]
fn binpack_takes_the_fullest_fitting_gpu_and_spread_the_emptiest() {
    let nodes = || {
        vec![
            node("a", 64_000, vec![gpu("T4", 1000), gpu("T4", 1000)]),
            node("b", 64_000, vec![gpu("T4", 300), gpu("T4", 1000)]),
            node("c", 64_000, vec![gpu("T4", 250)]),
        ]
    };
    let req = share(1000, 300);
    let c = engine(nodes(), Policy::Binpack).decide(&req).unwrap();
    assert_eq!(
        c,
        Choice {
            node: 1,
            gpus: vec![0]
        },
        "the exact fit"
    );
    let c = engine(nodes(), Policy::Spread).decide(&req).unwrap();
    assert_eq!(c.node, 0, "the emptiest node");
}

#[test]
fn shared_threshold_avoids_a_busy_gpu_while_a_quiet_one_fits() {
    let mut busy = gpu("T4", 500);
    busy.utilization = Some(0.95);
    let quiet = gpu("T4", 1000);
    let nodes = vec![
        node("busy", 64_000, vec![busy]),
        node("quiet", 64_000, vec![quiet]),
    ];
    let req = share(1000, 500);
    // Binpack alone takes the exact fit on the busy GPU.
    assert_eq!(
        engine(nodes.clone(), Policy::Binpack)
            .decide(&req)
            .unwrap()
            .node,
        0
    );
    let mut e = engine(nodes, Policy::SharedThreshold(0.2));
    assert_eq!(e.decide(&req).unwrap().node, 1);
    // When the quiet GPU can no longer hold it, the busy one is used.
    e.commit(
        &Choice {
            node: 1,
            gpus: vec![0],
        },
        &share(0, 600),
    )
    .unwrap();
    assert_eq!(e.decide(&req).unwrap().node, 0);
    // Utilization updates move the choice.
    e.set_utilization(0, 0, Some(0.1)).unwrap();
    assert_eq!(e.decide(&req).unwrap().node, 0);
    assert!(e.set_utilization(0, 0, Some(1.5)).is_err());
    assert!(e.set_utilization(9, 0, None).is_err());
}

#[test]
fn fragmentation_policies_keep_whole_gpus_for_whole_gpu_tasks() {
    // Half-GPU and whole-GPU tasks expected. A 500 task fits the half-used
    // GPU exactly; breaking an unused one would leave a whole-GPU task
    // nowhere to go.
    for p in [Policy::Fgd, Policy::Defrag] {
        let nodes = vec![
            node("unused", 64_000, vec![gpu("T4", 1000)]),
            node("half", 64_000, vec![gpu("T4", 500)]),
        ];
        let c = engine(nodes, p).decide(&share(1000, 500)).unwrap();
        assert_eq!(c.node, 1, "{p}");
    }
}

/// Defrag's order among placements its measure scores alike: the GPU the
/// request fills best, then the first node (first fit), not the node left
/// fullest. Two nodes, each with an unused GPU beside a half-used one; the
/// request takes the half-used GPU either way, which leaves node 1 (less CPU)
/// the fuller: first fit still takes node 0.
#[test]
fn defrag_fills_the_best_fitting_gpu_of_the_first_node() {
    let decide = |p: Policy| {
        let nodes = vec![
            node("first", 64_000, vec![gpu("T4", 1000), gpu("T4", 500)]),
            node("fuller", 32_000, vec![gpu("T4", 1000), gpu("T4", 500)]),
        ];
        engine(nodes, p).decide(&share(1000, 500)).unwrap()
    };
    let c = decide(Policy::Defrag);
    assert_eq!(c.node, 0);
    assert_eq!(c.gpus, [1], "the half-used GPU: {c:?}");
    // The same placements with binpack: the fuller node.
    assert_eq!(decide(Policy::Binpack).node, 1);
}

/// Among placements alike to within a step, defrag takes a GPU the share
/// fills exactly, else the first node, not the node whose GPU the request
/// would fill best: filling node by node keeps the other nodes whole. With no task mix every placement grows the
/// measure alike (by nothing), so node 1's tighter GPU (600 free against
/// 700) does not draw the share there; binpack's does.
#[test]
fn defrag_takes_an_exact_fill_then_the_first_node_within_a_step() {
    let nodes = vec![
        node("first", 64_000, vec![gpu("T4", 700)]),
        node("tighter", 64_000, vec![gpu("T4", 600)]),
    ];
    let decide = |nodes: &[Node], p: Policy| {
        Engine::new(nodes.to_vec(), p, &TaskMix::default())
            .unwrap()
            .decide(&share(1000, 500))
            .unwrap()
            .node
    };
    assert_eq!(decide(&nodes, Policy::Defrag), 0);
    assert_eq!(decide(&nodes, Policy::Binpack), 1);
    // A GPU the share fills exactly is taken before the first node.
    let exact = vec![
        nodes[0].clone(),
        node("exact", 64_000, vec![gpu("T4", 500)]),
    ];
    assert_eq!(decide(&exact, Policy::Defrag), 1);
}

#[test]
fn commit_refuses_what_does_not_fit_and_changes_nothing() {
    let mut e = engine(trap_cluster(), Policy::Defrag);
    let before: Vec<_> = (0..e.len()).map(|i| e.gpu_free(i)).collect();
    let half = share(1000, 500);
    for bad in [
        Choice {
            node: 0,
            gpus: vec![0],
        }, // 400 free
        Choice {
            node: 1,
            gpus: vec![0, 1],
        }, // a share on two GPUs
        Choice {
            node: 1,
            gpus: vec![7],
        }, // no such GPU
        Choice {
            node: 2,
            gpus: vec![0],
        }, // no CPU
        Choice {
            node: 4,
            gpus: vec![0],
        }, // no memory
        Choice {
            node: 99,
            gpus: vec![0],
        }, // no such node
    ] {
        assert!(e.commit(&bad, &half).is_err(), "{bad:?}");
    }
    let whole2 = Request::trace(0, 0, 2, 1000);
    assert!(
        e.commit(
            &Choice {
                node: 1,
                gpus: vec![0, 1]
            },
            &whole2
        )
        .is_err(),
        "GPU 0 is in use"
    );
    assert!(
        e.commit(
            &Choice {
                node: 3,
                gpus: vec![0, 0]
            },
            &whole2
        )
        .is_err(),
        "twice the same GPU"
    );
    let after: Vec<_> = (0..e.len()).map(|i| e.gpu_free(i)).collect();
    assert_eq!(before, after);
    // And a release gives back exactly what a commit took.
    let c = e.place(&half).unwrap();
    e.release(&c, &half).unwrap();
    assert_eq!(
        (0..e.len()).map(|i| e.gpu_free(i)).collect::<Vec<_>>(),
        before
    );
    assert!(e.release(&c, &half).is_err(), "more than the GPU has");
}

#[test]
fn bad_requests_are_refused() {
    let mut e = engine(trap_cluster(), Policy::Binpack);
    let r = |gpu| Request {
        cpu_milli: 0,
        memory_mib: 0,
        gpu,
        models: vec![],
    };
    assert!(matches!(
        e.decide(&r(GpuNeed::Whole(0))),
        Err(PlaceError::InvalidRequest(_))
    ));
    let over = GpuNeed::Share {
        compute: 1500,
        memory: MemoryNeed::Mib(1),
        slices: 0,
    };
    assert!(matches!(
        e.decide(&r(over)),
        Err(PlaceError::InvalidRequest(_))
    ));
    let nothing = GpuNeed::Share {
        compute: 0,
        memory: MemoryNeed::Mib(0),
        slices: 0,
    };
    assert!(matches!(
        e.decide(&r(nothing)),
        Err(PlaceError::InvalidRequest(_))
    ));
    let mut n = node("x", 1, vec![]);
    n.cpu_free = 64_001;
    assert!(matches!(
        Engine::new(vec![n], Policy::Binpack, &TaskMix::default()),
        Err(PlaceError::InvalidNode { .. })
    ));
}

#[test]
fn slices_are_counted() {
    let mut g = Gpu::new("T4", 16_000);
    g.slices = 4;
    g.slices_free = 2;
    let mut e = engine(vec![node("a", 64_000, vec![g.clone(), g])], Policy::Binpack);
    let slices = |n| Request {
        cpu_milli: 0,
        memory_mib: 0,
        gpu: GpuNeed::Share {
            compute: 100,
            memory: MemoryNeed::Mib(1000),
            slices: n,
        },
        models: vec![],
    };
    // Two GPUs with 2 + 2 free slices: a 3-slice request fits neither.
    assert_eq!(e.decide(&slices(3)), Err(PlaceError::NoFit));
    assert!(e.place(&slices(2)).is_ok());
    assert!(e.place(&slices(2)).is_ok());
    assert_eq!(e.decide(&slices(1)), Err(PlaceError::NoFit));
}

/// xorshift64*: the property test's own seeded generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_request(r: &mut Rng) -> Request {
    let models = ["T4", "A100", "V100"];
    let mut req = match r.below(4) {
        0 => Request::trace(r.below(8000), r.below(16_000), 0, 0),
        1 => Request::trace(
            r.below(16_000),
            r.below(64_000),
            1 + r.below(4) as u32,
            1000,
        ),
        2 => Request {
            cpu_milli: r.below(8000),
            memory_mib: r.below(8000),
            gpu: GpuNeed::Share {
                compute: 1 + r.below(1000) as u32,
                memory: MemoryNeed::Mib(r.below(20_000)),
                slices: r.below(3) as u32,
            },
            models: vec![],
        },
        _ => Request::trace(r.below(8000), r.below(16_000), 1, 1 + r.below(999) as u32),
    };
    if r.below(4) == 0 {
        req.models = vec![models[r.below(3) as usize].into()];
    }
    req
}

/// Whether `req` fits `choice` on the test's own copy of the state.
fn fits(nodes: &[Node], req: &Request, c: &Choice) -> bool {
    let n = &nodes[c.node];
    if n.cpu_free < req.cpu_milli || n.memory_free_mib < req.memory_mib {
        return false;
    }
    let allowed = |g: &Gpu| {
        req.models.is_empty() || req.models.iter().any(|m| m.eq_ignore_ascii_case(&g.model))
    };
    match req.gpu {
        GpuNeed::None => c.gpus.is_empty(),
        GpuNeed::Share {
            compute,
            memory,
            slices,
        } => {
            let [g] = c.gpus[..] else { return false };
            let g = &n.gpus[g];
            allowed(g)
                && g.compute_free >= compute
                && g.memory_free_mib >= memory.on(g.memory_mib)
                && (g.slices == 0 || g.slices_free >= slices)
        }
        GpuNeed::Whole(k) => {
            let mut s = c.gpus.clone();
            s.sort_unstable();
            s.dedup();
            s.len() == k as usize
                && s.iter()
                    .all(|&g| allowed(&n.gpus[g]) && n.gpus[g].is_unused())
        }
    }
}

/// Every way `req` could go, by brute force (for whole GPUs, the first k
/// unused allowed GPUs: any k of them are alike).
fn any_fit(nodes: &[Node], req: &Request) -> bool {
    (0..nodes.len()).any(|i| {
        let n = &nodes[i];
        match req.gpu {
            GpuNeed::None => fits(
                nodes,
                req,
                &Choice {
                    node: i,
                    gpus: vec![],
                },
            ),
            GpuNeed::Share { .. } => (0..n.gpus.len()).any(|g| {
                fits(
                    nodes,
                    req,
                    &Choice {
                        node: i,
                        gpus: vec![g],
                    },
                )
            }),
            GpuNeed::Whole(k) => {
                let free: Vec<usize> = (0..n.gpus.len())
                    .filter(|&g| {
                        n.gpus[g].is_unused()
                            && (req.models.is_empty()
                                || req
                                    .models
                                    .iter()
                                    .any(|m| m.eq_ignore_ascii_case(&n.gpus[g].model)))
                    })
                    .take(k as usize)
                    .collect();
                free.len() == k as usize
                    && fits(
                        nodes,
                        req,
                        &Choice {
                            node: i,
                            gpus: free,
                        },
                    )
            }
        }
    })
}

fn apply(nodes: &mut [Node], req: &Request, c: &Choice) {
    let n = &mut nodes[c.node];
    n.cpu_free -= req.cpu_milli;
    n.memory_free_mib -= req.memory_mib;
    for &g in &c.gpus {
        let g = &mut n.gpus[g];
        match req.gpu {
            GpuNeed::Share {
                compute,
                memory,
                slices,
            } => {
                g.compute_free -= compute;
                g.memory_free_mib -= memory.on(g.memory_mib);
                g.slices_free = g.slices_free.saturating_sub(slices);
            }
            _ => {
                g.compute_free = 0;
                g.memory_free_mib = 0;
                g.slices_free = 0;
            }
        }
    }
}

#[test]
fn no_policy_ever_overcommits_on_random_clusters() {
    let mut r = Rng(0x7e55e7a);
    for round in 0..40 {
        let models = ["T4", "A100", "V100"];
        let nodes: Vec<Node> = (0..1 + r.below(12))
            .map(|i| {
                let model = models[r.below(3) as usize];
                let gpus = (0..r.below(5))
                    .map(|_| {
                        let mut g = Gpu::new(model, 8000 + 8000 * r.below(3));
                        g.compute_free = r.below(1001) as u32;
                        g.memory_free_mib = r.below(g.memory_mib + 1);
                        if r.below(3) == 0 {
                            g.slices = 1 + r.below(8) as u32;
                            g.slices_free = r.below(u64::from(g.slices) + 1) as u32;
                        }
                        if r.below(2) == 0 {
                            // Unused GPUs are common; whole-GPU requests need them.
                            g.compute_free = 1000;
                            g.memory_free_mib = g.memory_mib;
                            g.slices_free = g.slices;
                        }
                        g
                    })
                    .collect();
                let mut n = Node::new(format!("n{i}"), 32_000, 128_000, gpus);
                n.cpu_free = r.below(32_001);
                n.memory_free_mib = r.below(128_001);
                n
            })
            .collect();
        let reqs: Vec<Request> = (0..30).map(|_| random_request(&mut r)).collect();
        let mix = TaskMix::from_requests(&reqs, 0.95);
        for p in Policy::ALL {
            let mut truth = nodes.clone();
            let mut e = Engine::new(nodes.clone(), p, &mix).unwrap();
            for _ in 0..60 {
                let req = random_request(&mut r);
                // `ranked` (the extender's order) agrees with `decide`: its
                // first node is the one decided, and it lists exactly the
                // nodes that can hold the request.
                let all: Vec<usize> = (0..truth.len()).collect();
                let order = e.ranked(&req, &all).unwrap();
                let fitting: Vec<usize> = all
                    .iter()
                    .copied()
                    .filter(|&i| any_fit(&truth[i..=i], &req))
                    .collect();
                let mut sorted: Vec<usize> = order.iter().map(|o| o.0).collect();
                sorted.sort_unstable();
                assert_eq!(sorted, fitting, "round {round} {p}: {req:?}");
                match e.decide(&req) {
                    Ok(c) => {
                        let best = order[0].1;
                        let mine = order.iter().find(|o| o.0 == c.node).unwrap().1;
                        assert!(
                            mine.total_cmp(&best).is_eq(),
                            "round {round} {p}: {mine:?} {best:?}"
                        );
                        assert!(
                            fits(&truth, &req, &c),
                            "round {round} {p}: {req:?} at {c:?}"
                        );
                        e.commit(&c, &req).unwrap();
                        apply(&mut truth, &req, &c);
                    }
                    Err(PlaceError::NoFit) => {
                        assert!(
                            !any_fit(&truth, &req),
                            "round {round} {p}: refused {req:?} that fits"
                        );
                    }
                    Err(err) => panic!("{err}"),
                }
                for (i, n) in truth.iter().enumerate() {
                    let want: Vec<_> = n
                        .gpus
                        .iter()
                        .map(|g| (g.compute_free, g.memory_free_mib, g.slices_free))
                        .collect();
                    assert_eq!(e.gpu_free(i), Some(want), "round {round} {p}");
                    assert_eq!(e.node_free(i), Some((n.cpu_free, n.memory_free_mib)));
                }
            }
        }
    }
}

#[test]
fn a_cluster_ten_times_larger_decides_alike() {
    // The index groups alike nodes: ten copies of a cluster answer the same
    // request with a node of the same state.
    let one = trap_cluster();
    let ten: Vec<Node> = (0..10).flat_map(|_| one.clone()).collect();
    for p in Policy::ALL {
        let a = engine(one.clone(), p).decide(&share(1000, 500)).unwrap();
        let b = engine(ten.clone(), p).decide(&share(1000, 500)).unwrap();
        assert_eq!(one[a.node].name, ten[b.node].name, "{p}");
    }
}
