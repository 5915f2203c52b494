//! Start/stop discipline: profiling never stalls requests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use edgeprof_sampler::{Isolate, Limits, ProfileKind, ProfilerError, Request};

use crate::support::{load, runtime, worker};

/// The stated bound: the sample path never waits longer than this for the
/// profiler's lock (start/stop hold it only to swap a buffer).
const MAX_PROFILER_WAIT: Duration = Duration::from_millis(5);

#[test]
fn start_stop_100_times_while_requests_run_fails_no_request() {
    let rt = runtime();
    let m = load(
        &rt,
        "busy.wat",
        &worker(
            r#"(func (export "edgeprof_handle") (param i32 i32) (result i64)
                 (call $spin (i32.const 2000000)) (i64.const 12))"#,
        ),
    );
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || {
        let mut latencies = Vec::new();
        while !stop2.load(Ordering::Relaxed) {
            let t = Instant::now();
            let r = iso.handle(&Request::get("/"));
            latencies.push(t.elapsed());
            tx.send(r.map(|r| r.status).map_err(|e| e.to_string()))
                .unwrap();
        }
        (latencies, iso)
    });
    let mut samples = 0;
    let mut results = Vec::new();
    let t0 = Instant::now();
    // 100 start/stops at least, and as many more as it takes for 50
    // requests to run through them (a loaded machine runs fewer per cycle).
    let mut i = 0;
    while i < 100 || results.len() <= 50 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "only {} requests ran in 120 s",
            results.len()
        );
        let kind = if i % 2 == 0 {
            ProfileKind::Cpu
        } else {
            ProfileKind::Heap
        };
        prof.start(kind, Duration::from_millis(1)).unwrap();
        assert_eq!(
            prof.start(kind, Duration::from_millis(1)),
            Err(ProfilerError::AlreadyActive(kind))
        );
        std::thread::sleep(Duration::from_millis(5));
        let cap = prof.stop().unwrap();
        samples += cap.samples;
        edgeprof_pprof::validate(&cap.profile).expect("valid profile");
        results.extend(rx.try_iter());
        i += 1;
    }
    assert_eq!(prof.stop().unwrap_err(), ProfilerError::NotActive);
    stop.store(true, Ordering::Relaxed);
    let (latencies, iso) = server.join().unwrap();
    results.extend(rx.try_iter());
    assert!(
        results.iter().all(|r| r == &Ok(200)),
        "failures: {:?}",
        results
            .iter()
            .filter(|r| r != &&Ok(200))
            .collect::<Vec<_>>()
    );
    assert!(samples > 0);
    assert!(
        prof.max_lock_wait() <= MAX_PROFILER_WAIT,
        "a request waited {:?} on the profiler (bound {MAX_PROFILER_WAIT:?})",
        prof.max_lock_wait()
    );
    assert_eq!(iso.eviction(), None);
    eprintln!(
        "{} requests, max latency {:?}, max profiler wait {:?}",
        latencies.len(),
        latencies.iter().max().unwrap(),
        prof.max_lock_wait()
    );
}

#[test]
fn intervals_outside_the_tick_range_are_refused() {
    let rt = runtime();
    let m = load(
        &rt,
        "busy.wat",
        &worker(r#"(func (export "edgeprof_handle") (param i32 i32) (result i64) (i64.const 12))"#),
    );
    let iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let err = iso
        .profiler()
        .start(ProfileKind::Cpu, Duration::from_micros(100))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sampling interval 100µs is outside 1ms..=1s"
    );
}
