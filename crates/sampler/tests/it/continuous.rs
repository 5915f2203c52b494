//! Continuous profiling beside on-demand captures: both run on one isolate,
//! neither loses the other's samples, and the continuous windows cut by
//! `rotate` hold every sample exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use edgeprof_pprof::Profile;
use edgeprof_sampler::{
    CaptureOwner, CaptureResult, Isolate, Limits, ProfileKind, ProfilerError, Request,
};

use crate::support::{flat, load, runtime, thread_cpu, top, worker};

const CONTINUOUS: CaptureOwner = CaptureOwner::Continuous;

/// 75 % of the work in `heavy`, 25 % in `light`; each request also reports
/// two sampled allocations of 1 MiB, one from each.
fn split_worker() -> String {
    let log = r#"(import "edgeprof" "log" (func $log (param i32 i32)))"#;
    worker(
        r#"
  (func $heavy (call $spin (i32.const 3000000)) (call $heap_alloc (i32.const 4096) (i32.const 1048576)))
  (func $light (call $spin (i32.const 1000000)) (call $heap_alloc (i32.const 8192) (i32.const 1048576)))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $light) (call $heavy) (i64.const 12))"#,
    )
    // Imports come before functions.
    .replacen(
        log,
        &format!(r#"{log} (import "edgeprof" "heap_alloc" (func $heap_alloc (param i32 i32)))"#),
        1,
    )
}

/// `(samples, cpu ns)` summed over a CPU profile's samples.
fn totals(p: &Profile) -> (i64, i64) {
    p.sample
        .iter()
        .fold((0, 0), |(n, c), s| (n + s.value[0], c + s.value[1]))
}

/// The share of `heavy` in a CPU profile, in percent.
fn heavy_share(p: &Profile) -> f64 {
    let rows = top(p, "cpu");
    let cum = |f: &str| rows.iter().find(|r| r.0 == f).map_or(0, |r| r.2) as f64;
    assert!(flat(&rows, "spin") > 0, "{rows:?}");
    100.0 * cum("heavy") / (cum("heavy") + cum("light"))
}

#[test]
fn an_on_demand_capture_runs_beside_the_continuous_ones() {
    let rt = runtime();
    let m = load(&rt, "split.wat", &split_worker());
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    let ms = Duration::from_millis;
    prof.start_for(CONTINUOUS, ProfileKind::Cpu, ms(10))
        .unwrap();
    prof.start_for(CONTINUOUS, ProfileKind::Heap, ms(10))
        .unwrap();
    assert_eq!(
        prof.start_for(CONTINUOUS, ProfileKind::Cpu, ms(10)),
        Err(ProfilerError::AlreadyActive(ProfileKind::Cpu)),
        "one continuous capture of each kind"
    );
    assert_eq!(prof.active(), None, "no on-demand capture yet");
    prof.start(ProfileKind::Cpu, ms(1)).unwrap();
    assert_eq!(
        prof.start(ProfileKind::Heap, ms(1)),
        Err(ProfilerError::AlreadyActive(ProfileKind::Cpu)),
        "one on-demand capture at a time"
    );
    assert_eq!(prof.active(), Some(ProfileKind::Cpu));

    // Windows cut from another thread while requests run.
    let stop = Arc::new(AtomicBool::new(false));
    let rotator = {
        let (prof, stop) = (prof.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut windows: Vec<CaptureResult> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(15));
                windows.push(prof.rotate(ProfileKind::Cpu).unwrap());
            }
            windows
        })
    };
    let cpu_before = thread_cpu();
    let mut requests = 0;
    while thread_cpu() - cpu_before < ms(800) || requests < 20 {
        assert_eq!(iso.handle(&Request::get("/")).unwrap().status, 200);
        requests += 1;
    }
    let on_demand = prof.stop().unwrap();
    stop.store(true, Ordering::Release);
    let mut windows = rotator.join().unwrap();
    windows.push(prof.rotate(ProfileKind::Cpu).unwrap());
    assert!(
        prof.running(CONTINUOUS, ProfileKind::Cpu),
        "stopping the on-demand capture leaves the continuous one running"
    );

    // Every sample the on-demand capture took is in exactly one window,
    // and nothing else is: no request ran outside the on-demand capture.
    let sum = windows.iter().fold((0, 0, 0), |(n, c, r), w| {
        let (wn, wc) = totals(&w.profile);
        (n + wn, c + wc, r + w.requests)
    });
    let (od_n, od_cpu) = totals(&on_demand.profile);
    assert_eq!(
        (sum.0, sum.1, sum.2),
        (od_n, od_cpu, on_demand.requests),
        "{} windows against the on-demand capture",
        windows.len()
    );
    assert_eq!(on_demand.requests, requests);
    assert!(windows.len() >= 5, "{} windows", windows.len());
    assert!(od_n > 200, "{od_n} samples");
    let share = heavy_share(&on_demand.profile);
    assert!((share - 75.0).abs() <= 5.0, "heavy share {share:.1} %");
    // Each window says its own interval; the samples came at the finer one.
    assert_eq!(windows[0].profile.period, 10_000_000);
    assert_eq!(on_demand.profile.period, 1_000_000);

    // Alone again, the continuous capture samples at its own interval.
    let cpu_before = thread_cpu();
    for _ in 0..10 {
        iso.handle(&Request::get("/")).unwrap();
    }
    let cpu = thread_cpu() - cpu_before;
    let alone = prof.stop_for(CONTINUOUS, ProfileKind::Cpu).unwrap();
    let expected = cpu.as_secs_f64() / 0.010;
    assert!(
        alone.samples > 0 && alone.samples as f64 <= 1.2 * expected + 2.0,
        "{} samples at 10 ms over {cpu:?} of CPU",
        alone.samples
    );
    assert_eq!(alone.requests, 10);

    // The continuous heap capture saw every sampled allocation throughout,
    // with the CPU captures beside it.
    let heap = prof.stop_for(CONTINUOUS, ProfileKind::Heap).unwrap();
    assert_eq!(heap.samples, 2 * (requests + 10));
    assert_eq!(
        prof.stop_for(CONTINUOUS, ProfileKind::Heap).unwrap_err(),
        ProfilerError::NotActive
    );
}

#[test]
fn an_on_demand_heap_capture_and_the_continuous_one_both_see_allocations() {
    let rt = runtime();
    let m = load(&rt, "split.wat", &split_worker());
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    let ms = Duration::from_millis;
    prof.start_for(CONTINUOUS, ProfileKind::Heap, ms(10))
        .unwrap();
    for _ in 0..3 {
        iso.handle(&Request::get("/")).unwrap();
    }
    prof.start(ProfileKind::Heap, ms(1)).unwrap();
    for _ in 0..5 {
        iso.handle(&Request::get("/")).unwrap();
    }
    let on_demand = prof.stop().unwrap();
    let first = prof.rotate(ProfileKind::Heap).unwrap();
    iso.handle(&Request::get("/")).unwrap();
    let second = prof.rotate(ProfileKind::Heap).unwrap();
    assert_eq!(
        (on_demand.samples, first.samples, second.samples),
        (10, 16, 2)
    );
    assert_eq!(
        (on_demand.requests, first.requests, second.requests),
        (5, 8, 1)
    );
    // Each heap profile also reports what is live: the two objects at
    // fixed addresses, the latest allocations there.
    for p in [&on_demand, &first, &second] {
        let inuse: i64 = p.profile.sample.iter().map(|s| s.value[2]).sum();
        assert!(inuse >= 2, "{inuse} objects in use");
    }
}
