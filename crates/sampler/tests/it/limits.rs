//! Memory and CPU limits, eviction and recovery.

use std::time::Duration;

use edgeprof_sampler::{EvictionReason, Isolate, IsolateError, Limits, ProfileKind, Request};

use crate::support::{load, runtime, worker};

#[test]
fn growing_past_the_memory_limit_evicts_and_a_fresh_isolate_serves_next() {
    let rt = runtime();
    // Each request grows memory by 4 pages (256 KiB) and keeps it.
    let m = load(
        &rt,
        "grow.wat",
        &worker(
            r#"(func (export "edgeprof_handle") (param i32 i32) (result i64)
                 (drop (memory.grow (i32.const 4))) (i64.const 12))"#,
        ),
    );
    let limits = Limits {
        memory_bytes: 4 << 20,
        ..Limits::default()
    };
    let mut iso = Isolate::new(&rt, &m, limits).unwrap();
    assert_eq!(iso.memory_bytes(), 2 * 65536);
    let mut served = 0;
    let err = loop {
        match iso.handle(&Request::get("/")) {
            Ok(r) => {
                assert_eq!(r.status, 200);
                served += 1;
                assert!(served < 100, "never hit the limit");
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, IsolateError::ExceededMemory { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Exceeded Memory: linear memory would grow to 4325376 bytes, the limit is 4194304 bytes"
    );
    assert_eq!(served, 15);
    assert_eq!(iso.eviction(), Some(EvictionReason::ExceededMemory));
    assert!(matches!(
        iso.handle(&Request::get("/")),
        Err(IsolateError::Evicted(EvictionReason::ExceededMemory))
    ));
    assert_eq!(rt.evictions().exceeded_memory, 1);
    let mut fresh = Isolate::new(&rt, &m, limits).unwrap();
    assert_eq!(fresh.handle(&Request::get("/")).unwrap().status, 200);
    assert_eq!(fresh.memory_bytes(), 6 * 65536);
}

#[test]
fn a_runaway_request_is_stopped_at_its_cpu_limit() {
    let rt = runtime();
    let m = load(
        &rt,
        "forever.wat",
        &worker(
            r#"(func (export "edgeprof_handle") (param i32 i32) (result i64)
                 (loop $l (call $spin (i32.const 1000)) (br $l)) (i64.const 12))"#,
        ),
    );
    let limits = Limits {
        cpu_per_request: Duration::from_millis(100),
        ..Limits::default()
    };
    let mut iso = Isolate::new(&rt, &m, limits).unwrap();
    let err = iso.handle(&Request::get("/")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Exceeded CPU: the request ran past its CPU-time limit of 100ms"
    );
    assert_eq!(iso.eviction(), Some(EvictionReason::ExceededCpu));
    assert_eq!(rt.evictions().exceeded_cpu, 1);
}

#[test]
fn a_module_without_the_abi_is_refused_with_the_missing_export() {
    let rt = runtime();
    let m = rt
        .load_module("bare.wat", br#"(module (memory (export "memory") 1))"#)
        .unwrap();
    let err = Isolate::new(&rt, &m, Limits::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("module `bare.wat` does not implement the guest ABI: export `edgeprof_alloc: (i32) -> i32`"),
        "{err}"
    );
    let err = rt.load_module("bad.wat", b"(module (func").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("module `bad.wat` is not valid WAT"),
        "{err}"
    );
}

/// Regression test for issue 10: a start function (or `edgeprof_heap_seed`)
/// that loops ran with no CPU deadline, so instantiating it never returned.
#[test]
fn start_up_that_loops_is_stopped_at_the_request_cpu_limit() {
    let rt = runtime();
    let limits = Limits {
        cpu_per_request: Duration::from_millis(100),
        ..Limits::default()
    };
    let forever = r#"(loop $l (call $spin (i32.const 1000)) (br $l))"#;
    let handle = r#"(func (export "edgeprof_handle") (param i32 i32) (result i64) (i64.const 12))"#;
    let cases = [
        (
            "start.wat",
            format!("(func $start {forever}) (start $start) {handle}"),
        ),
        (
            "seed.wat",
            format!(r#"(func (export "edgeprof_heap_seed") (param i64) {forever}) {handle}"#),
        ),
    ];
    for (name, body) in cases {
        let m = load(&rt, name, &worker(&body));
        let started = std::time::Instant::now();
        let err = Isolate::new(&rt, &m, limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Exceeded CPU: the request ran past its CPU-time limit of 100ms",
            "{name}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name}: stopped only after {:?}",
            started.elapsed()
        );
    }
}

/// Regression test for issue 10: four memories of 120 MiB each got 514 MB
/// of host RSS past a 128 MiB limit that each memory alone respected.
#[test]
fn a_module_with_more_than_one_memory_does_not_start() {
    let rt = runtime();
    let m = load(
        &rt,
        "memories.wat",
        r#"(module
  (memory (export "memory") 1)
  (memory $b 1920) (memory $c 1920) (memory $d 1920)
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgeprof_handle") (param i32 i32) (result i64) (i64.const 12)))"#,
    );
    let err = Isolate::new(&rt, &m, Limits::default()).unwrap_err();
    assert!(err.to_string().contains("memory count too high"), "{err}");
}

/// Regression test for issue 10: a worker logging 64 MiB a request grew the
/// agent by 655 MB in 10 requests (the cap counted lines, not bytes, and
/// logs were never drained).
#[test]
fn logs_are_bounded_in_bytes_and_per_request() {
    let rt = runtime();
    let m = load(
        &rt,
        "loud.wat",
        r#"(module
  (import "edgeprof" "log" (func $log (param i32 i32)))
  (memory (export "memory") 1100)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $log (i32.const 16) (i32.const 67108864))
    (call $log (i32.const 16) (i32.const 16))
    (i64.const 12)))"#,
    );
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    for _ in 0..3 {
        iso.handle(&Request::get("/")).unwrap();
    }
    // Only the last request's logs are held, and only MAX_LOG_BYTES of them.
    let (lines, dropped) = iso.take_logs();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].len(), edgeprof_sampler::MAX_LOG_BYTES);
    assert_eq!(dropped, 2, "the cut line and the one after it");
}

/// What the memory view reports is what the host holds for an isolate, not
/// only its linear memory: an unexported table of 100 k elements and the
/// profiler's buffers count too (issue 10: the view said 120 MiB while the
/// host held 514 MB).
#[test]
fn host_bytes_count_tables_and_profiler_buffers_beyond_linear_memory() {
    let rt = runtime();
    let m = load(
        &rt,
        "table.wat",
        &worker(
            r#"(table 100000 funcref)
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $spin (i32.const 3000000)) (i64.const 12))"#,
        ),
    );
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let table = (100_000 * edgeprof_sampler::TABLE_ELEMENT_BYTES) as u64;
    assert_eq!(iso.memory_bytes(), 2 * 65536);
    assert_eq!(iso.host_bytes(), 2 * 65536 + table);
    iso.handle(&Request::get("/")).unwrap();
    let idle = iso.host_bytes();
    assert_eq!(idle, 2 * 65536 + table, "nothing held between requests");

    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for _ in 0..4 {
        iso.handle(&Request::get("/")).unwrap();
    }
    let during = iso.host_bytes();
    assert!(
        during > idle,
        "a capture's samples are counted: {during} bytes during, {idle} before"
    );
    let cap = prof.stop().unwrap();
    assert!(cap.samples > 0);
    assert_eq!(iso.host_bytes(), idle, "a finished capture holds nothing");
}
