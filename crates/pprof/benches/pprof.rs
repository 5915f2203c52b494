//! Benchmarks of the pprof library on realistic profiles: decode, merge of
//! 100 profiles (one per isolate), decode + merge together (what `edgeprof
//! merge` does), and `top`. `cargo xtask bench pprof` sets the decode+merge
//! beside `go tool pprof -proto` on the same files.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use edgeprof_pprof::{Merger, Profile, TopOptions, TopSort, collapse, decode, encode, top};

#[path = "support/synth.rs"]
mod synth;

fn profiles(n: u64) -> Vec<Profile> {
    (0..n)
        .map(|seed| synth::cpu_profile(&synth::ISOLATE, seed))
        .collect()
}

fn benches(c: &mut Criterion) {
    // `cargo test --all-targets` runs benches once each in a debug build:
    // there, a few profiles are enough to check they work.
    let n = if std::env::args().any(|a| a == "--bench") {
        100
    } else {
        4
    };
    let inputs = profiles(n);
    let encoded: Vec<Vec<u8>> = inputs.iter().map(encode).collect();
    let bytes: u64 = encoded.iter().map(|e| e.len() as u64).sum();

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes(encoded[0].len() as u64));
    g.bench_function("one_isolate_gz", |b| {
        b.iter(|| decode(&encoded[0]).unwrap())
    });
    let raw = edgeprof_pprof::encode_raw(&inputs[0]);
    g.throughput(Throughput::Bytes(raw.len() as u64));
    g.bench_function("one_isolate_raw", |b| b.iter(|| decode(&raw).unwrap()));
    g.finish();

    let mut g = c.benchmark_group("merge");
    g.sample_size(20);
    g.bench_function(BenchmarkId::new("decoded", n), |b| {
        b.iter(|| edgeprof_pprof::merge(&inputs).unwrap())
    });
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function(BenchmarkId::new("decode_and_merge", n), |b| {
        b.iter(|| {
            let mut m = Merger::new();
            for e in &encoded {
                m.add(&decode(e).unwrap()).unwrap();
            }
            m.finish().unwrap()
        })
    });
    g.finish();

    let merged = edgeprof_pprof::merge(&inputs).unwrap();
    let mut g = c.benchmark_group("report");
    for (name, p) in [("one_isolate", &inputs[0]), ("merged", &merged)] {
        g.bench_function(BenchmarkId::new("top_flat", name), |b| {
            b.iter(|| top(p, &TopOptions::default()).unwrap())
        });
        let cum = TopOptions {
            sort: TopSort::Cum,
            ..Default::default()
        };
        g.bench_function(BenchmarkId::new("top_cum", name), |b| {
            b.iter(|| top(p, &cum).unwrap())
        });
        g.bench_function(BenchmarkId::new("collapse", name), |b| {
            b.iter(|| collapse(p, None).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("encode");
    g.bench_function("merged", |b| b.iter(|| encode(&merged)));
    g.finish();
}

criterion_group!(pprof, benches);
criterion_main!(pprof);
