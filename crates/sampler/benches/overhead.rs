//! Sampling overhead, side by side in one run: a CPU-bound WAT worker
//! (a) unprofiled, (b) under a CPU capture at 100 Hz and at 1000 Hz on the
//! same engine, and (c) on an engine without `epoch_interruption` against
//! one with it (the cost of the epoch checks themselves).
//!
//! `cargo bench -p edgeprof-sampler --bench overhead`; compare the
//! per-request times within each group.

use std::time::Duration;

use criterion::{Criterion, criterion_main};
use edgeprof_sampler::{Isolate, Limits, ProfileKind, Request, Runtime, RuntimeConfig};

const WORKER: &str = r#"(module
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func $mix (param $x i32) (param $i i32) (result i32)
    (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
  (func $spin (param $n i32) (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (call $mix (local.get $x) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $spin (i32.const 2000000)) (i64.const 12)))"#;

fn isolate(rt: &Runtime) -> Isolate {
    let m = rt.load_module("bench.wat", WORKER.as_bytes()).unwrap();
    Isolate::new(rt, &m, Limits::default()).unwrap()
}

fn sampling(c: &mut Criterion) {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let req = Request::get("/");
    let mut g = c.benchmark_group("sampling overhead (cpu-bound request)");
    g.measurement_time(Duration::from_secs(8));
    let mut iso = isolate(&rt);
    g.bench_function("unprofiled", |b| b.iter(|| iso.handle(&req).unwrap()));
    for (label, interval) in [("100 Hz", 10), ("1000 Hz", 1)] {
        let mut iso = isolate(&rt);
        let prof = iso.profiler();
        prof.start(ProfileKind::Cpu, Duration::from_millis(interval))
            .unwrap();
        g.bench_function(format!("profiled {label}"), |b| {
            b.iter(|| iso.handle(&req).unwrap())
        });
        let cap = prof.stop().unwrap();
        eprintln!("{label}: {} samples, {} dropped", cap.samples, cap.dropped);
    }
    g.finish();
}

fn epochs(c: &mut Criterion) {
    let req = Request::get("/");
    let mut g = c.benchmark_group("epoch instrumentation (unprofiled)");
    g.measurement_time(Duration::from_secs(8));
    for (label, on) in [
        ("epoch_interruption off", false),
        ("epoch_interruption on", true),
    ] {
        let rt = Runtime::new(RuntimeConfig {
            epoch_interruption: on,
            ..RuntimeConfig::default()
        })
        .unwrap();
        let mut iso = isolate(&rt);
        g.bench_function(label, |b| b.iter(|| iso.handle(&req).unwrap()));
    }
    g.finish();
}

mod group {
    //! The generated `benches` function has no doc comment.
    #![allow(missing_docs)]
    use super::{epochs, sampling};
    criterion::criterion_group!(benches, sampling, epochs);
}
criterion_main!(group::benches);
