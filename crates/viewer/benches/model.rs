//! Model build and layout on a large synthetic profile: 1 M samples over
//! 100 k distinct stacks (the figure DESIGN.md §6 asks for), with the two
//! halves measured side by side.

use criterion::{Criterion, criterion_main};
use edgeprof_viewer::{CallTree, Layout, LayoutOptions, TreeOptions, synthetic};

fn bench(c: &mut Criterion) {
    let p = synthetic::profile(1_000_000, 100_000);
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
