//! Model build and layout on a large synthetic profile: 1 M samples over
//! 100 k distinct stacks (the figure DESIGN.md §6 asks for), with the two
//! halves measured side by side.

use criterion::{Criterion, criterion_main};
use edgeprof_pprof::{LineSpec, Profile, ProfileBuilder, Sample};
use edgeprof_viewer::{CallTree, Layout, LayoutOptions, TreeOptions};

/// Deterministic xorshift, so every run measures the same profile.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 2 000 functions; stacks share prefixes as real programs do (a few
/// entry points, then handlers, then a long tail of leaves).
fn profile(samples: usize, stacks: usize) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    let locations: Vec<u64> = (0..2000)
        .map(|i| {
            let f = b.function(
                &format!("module::function_{i}"),
                "",
                &format!("src/m{}.rs", i % 50),
                1,
            );
            b.location(
                0,
                0x1000 + i,
                &[LineSpec {
                    function_id: f,
                    line: (i % 300) as i64 + 1,
                    column: 0,
                }],
            )
        })
        .collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut distinct: Vec<Vec<u64>> = Vec::with_capacity(stacks);
    for _ in 0..stacks {
        let depth = 8 + rng.below(17) as usize;
        let mut stack: Vec<u64> = Vec::with_capacity(depth);
        // Root first here; pprof wants leaf first, reversed below.
        stack.push(locations[rng.below(4) as usize]);
        for d in 1..depth {
            let fanout = (4 * d * d) as u64;
            stack.push(locations[(rng.below(fanout.min(2000))) as usize]);
        }
        stack.reverse();
        distinct.push(stack);
    }
    let mut p = b.build();
    p.sample = (0..samples)
        .map(|i| Sample {
            location_id: distinct[if i < stacks {
                i
            } else {
                rng.below(stacks as u64) as usize
            }]
            .clone(),
            value: vec![1, 1_000_000],
            label: Vec::new(),
        })
        .collect();
    p
}

fn bench(c: &mut Criterion) {
    let p = profile(1_000_000, 100_000);
    let options = LayoutOptions {
        width: 1920,
        min_width: 1,
        max_depth: None,
    };
    let mut g = c.benchmark_group("model_1M_samples_100k_stacks");
    g.sample_size(10);
    g.bench_function("build", |b| {
        b.iter(|| CallTree::build(&p, &TreeOptions::default()).unwrap())
    });
    let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
    eprintln!(
        "profile: {} samples, {} call-tree nodes, {} frames",
        p.sample.len(),
        tree.nodes.len(),
        tree.frames.len()
    );
    g.bench_function("layout_1920", |b| {
        b.iter(|| Layout::new(&tree, CallTree::ROOT, options))
    });
    g.bench_function("build_and_layout", |b| {
        b.iter(|| {
            let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
            Layout::new(&tree, CallTree::ROOT, options)
        })
    });
    g.finish();
}

// criterion_group! generates an undocumented pub fn.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
use group::benches;
criterion_main!(benches);
