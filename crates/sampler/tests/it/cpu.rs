//! CPU captures: shares, deep stacks, host frames, symbols, pprof output.

use std::time::Duration;

use edgeprof_sampler::{Isolate, Limits, ProfileKind, Request, Runtime, RuntimeConfig};

use crate::support::{example_wat, flat, go_pprof_top, load, runtime, thread_cpu, top, worker};

/// 75 % of the work in `split_heavy`, 25 % in `split_light`, by
/// construction: the same loop, 8 calls of 15 M iterations against 4 calls
/// of 10 M, interleaved.
fn split_worker() -> String {
    worker(
        r#"
  (func $split_heavy (call $spin (i32.const 15000000)))
  (func $split_light (call $spin (i32.const 10000000)))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $split_light) (call $split_heavy) (call $split_light) (call $split_heavy)
    (call $split_heavy) (call $split_light) (call $split_heavy) (call $split_light)
    (call $split_heavy) (call $split_heavy) (call $split_heavy) (call $split_heavy)
    (i64.const 12))"#,
    )
}

#[test]
fn cpu_shares_follow_a_75_25_split_within_5_points() {
    let rt = runtime();
    let m = load(&rt, "split.wat", &split_worker());
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for _ in 0..8 {
        let resp = iso.handle(&Request::get("/")).unwrap();
        assert_eq!(resp.status, 200);
    }
    let cap = prof.stop().unwrap();
    assert!(cap.samples > 200, "only {} samples", cap.samples);
    assert_eq!(cap.dropped, 0);
    let rows = top(&cap.profile, "cpu");
    // Both call the same `spin` loop, so shares are by cum of the callers.
    assert!(flat(&rows, "spin") > 0, "{rows:?}");
    assert!(
        !rows
            .iter()
            .any(|r| r.0.starts_with("[host]") && r.0 != "[host] request and response"),
        "no host calls were made: {rows:?}"
    );
    let cum = |f: &str| rows.iter().find(|r| r.0 == f).map(|r| r.2).unwrap_or(0) as f64;
    let (h, l) = (cum("split_heavy"), cum("split_light"));
    let share = 100.0 * h / (h + l);
    assert!(
        (share - 75.0).abs() <= 5.0,
        "split_heavy share {share:.1}% (rows {rows:?})"
    );
    if let Some(out) = go_pprof_top(&cap.profile) {
        assert!(out.contains("spin"), "go tool pprof -top output:\n{out}");
        assert!(
            out.contains("Type: cpu"),
            "go tool pprof -top output:\n{out}"
        );
    }
}

fn recursion_worker(depth: u32) -> String {
    worker(&format!(
        r#"
  (func $recurse (param $d i32)
    (if (i32.eqz (local.get $d))
      (then (call $spin (i32.const 20000000)))
      (else (call $recurse (i32.sub (local.get $d) (i32.const 1))))))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $recurse (i32.const {depth})) (i64.const 12))"#
    ))
}

fn deepest(cap: &edgeprof_sampler::CaptureResult, name: &str) -> usize {
    cap.profile
        .sample
        .iter()
        .map(|s| {
            edgeprof_pprof::stack_frames(&cap.profile, s)
                .iter()
                .filter(|f| f.function == name)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn recursion_deeper_than_100_frames_is_captured_whole() {
    let rt = runtime();
    let m = load(&rt, "recurse.wat", &recursion_worker(150));
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for _ in 0..5 {
        iso.handle(&Request::get("/")).unwrap();
    }
    let cap = prof.stop().unwrap();
    assert!(cap.samples > 20, "{} samples", cap.samples);
    assert_eq!(cap.truncated, 0);
    assert_eq!(deepest(&cap, "recurse"), 151);
    let frames: Vec<String> = cap
        .profile
        .function
        .iter()
        .map(|f| edgeprof_pprof::string(&cap.profile, f.name).to_string())
        .collect();
    assert!(!frames.iter().any(|f| f == "[truncated]"), "{frames:?}");
}

#[test]
fn stacks_past_the_frame_limit_are_marked_truncated() {
    let rt = Runtime::new(RuntimeConfig {
        max_frames: 50,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let m = load(&rt, "recurse.wat", &recursion_worker(150));
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for _ in 0..3 {
        iso.handle(&Request::get("/")).unwrap();
    }
    let cap = prof.stop().unwrap();
    assert!(cap.truncated > 0, "{cap:?}");
    // Every stack inside the 150-deep recursion is cut and marked; a sample
    // that lands in the host's call of `edgeprof_alloc` (placing the
    // request, 1 frame deep) is rightly whole.
    let roots: Vec<String> = cap
        .profile
        .sample
        .iter()
        .filter(|s| {
            edgeprof_pprof::stack_frames(&cap.profile, s)
                .iter()
                .any(|f| f.function == "recurse")
        })
        .map(|s| {
            edgeprof_pprof::stack_frames(&cap.profile, s)
                .last()
                .map(|f| f.function.to_string())
                .unwrap_or_default()
        })
        .collect();
    assert!(
        !roots.is_empty() && roots.iter().all(|r| r == "[truncated]"),
        "{roots:?}"
    );
}

#[test]
fn host_calls_appear_as_host_frames_under_the_calling_function() {
    let rt = runtime();
    let src = worker(
        r#"
  (func $chatty (local $i i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (i32.const 200000)))
      (call $log (i32.const 16) (i32.const 4))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l))))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $chatty) (i64.const 12))"#,
    );
    let m = load(&rt, "chatty.wat", &src);
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    iso.handle(&Request::get("/")).unwrap();
    let cap = prof.stop().unwrap();
    let host_stack = cap
        .profile
        .sample
        .iter()
        .map(|s| edgeprof_pprof::stack_frames(&cap.profile, s))
        .find(|st| st.first().map(|f| f.function) == Some("[host] edgeprof.log"))
        .expect("a [host] edgeprof.log sample");
    assert_eq!(host_stack[1].function, "chatty");
    let (lines, dropped) = iso.take_logs();
    assert_eq!(lines.len(), 1000, "log lines are capped at 1000");
    assert_eq!(dropped, 199_000);
}

#[test]
fn a_module_without_names_gives_wasm_function_frames_and_a_build_id() {
    let rt = runtime();
    // Same worker, no `$names`: strip the name section by re-encoding as
    // binary without names.
    let wasm = wat::parse_str(recursion_worker(3)).unwrap();
    let stripped = strip_names(&wasm);
    let m = rt.load_module("anon.wasm", &stripped).unwrap();
    assert_eq!(m.build_id().len(), 64);
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    iso.handle(&Request::get("/")).unwrap();
    let cap = prof.stop().unwrap();
    let rows = top(&cap.profile, "samples");
    assert!(
        rows.iter().any(|r| r.0.starts_with("wasm-function[")),
        "{rows:?}"
    );
    let mapping = &cap.profile.mapping[0];
    assert_eq!(
        edgeprof_pprof::string(&cap.profile, mapping.build_id),
        m.build_id()
    );
    assert_eq!(
        edgeprof_pprof::string(&cap.profile, mapping.filename),
        "anon.wasm"
    );
}

/// The module without its `name` custom section.
fn strip_names(wasm: &[u8]) -> Vec<u8> {
    let mut out = wasm[..8].to_vec();
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        let payload = payload.unwrap();
        if let Some((id, range)) = payload.as_section() {
            if let wasmparser::Payload::CustomSection(c) = &payload
                && c.name() == "name"
            {
                continue;
            }
            out.push(id);
            leb(&mut out, range.len() as u32);
            out.extend_from_slice(&wasm[range]);
        }
    }
    out
}

fn leb(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
}

#[test]
fn the_example_wat_worker_splits_75_25_between_hot_and_cold() {
    let rt = runtime();
    let m = example_wat(&rt, "spin.wat");
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for _ in 0..150 {
        assert_eq!(iso.handle(&Request::get("/")).unwrap().status, 200);
    }
    let cap = prof.stop().unwrap();
    let rows = top(&cap.profile, "cpu");
    let cum = |f: &str| rows.iter().find(|r| r.0 == f).map(|r| r.2).unwrap_or(0) as f64;
    let share = 100.0 * cum("hot") / (cum("hot") + cum("cold"));
    assert!(
        (share - 75.0).abs() <= 5.0,
        "hot share {share:.1}% ({} samples, rows {rows:?})",
        cap.samples
    );
}

#[test]
fn a_capture_counts_the_requests_that_began_while_it_ran() {
    let rt = runtime();
    let src = worker(
        r#"
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $spin (i32.const 100000)) (i64.const 12))"#,
    );
    let m = load(&rt, "light.wat", &src);
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let prof = iso.profiler();
    let mut serve = |n: usize| {
        for _ in 0..n {
            assert_eq!(iso.handle(&Request::get("/")).unwrap().status, 200);
        }
    };
    serve(3);
    prof.start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    serve(7);
    let cpu = prof.stop().unwrap();
    serve(2);
    prof.start(ProfileKind::Heap, Duration::from_millis(1))
        .unwrap();
    serve(4);
    let heap = prof.stop().unwrap();
    serve(1);
    assert_eq!((cpu.requests, heap.requests), (7, 4));
}

/// Regression test for issue 12: a profiled isolate took a stack sample on
/// every host call, so a worker making 100 k host calls per request got
/// 100 k samples per request at any rate. Samples follow the interval:
/// about the CPU used over the interval, at both rates.
#[test]
fn samples_follow_the_interval_not_the_number_of_host_calls() {
    let rt = runtime();
    let m = example_wat(&rt, "host-calls.wat");
    for interval_ms in [1, 10] {
        let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
        let prof = iso.profiler();
        let interval = Duration::from_millis(interval_ms);
        prof.start(ProfileKind::Cpu, interval).unwrap();
        let cpu_before = thread_cpu();
        let mut requests = 0u64;
        while thread_cpu() - cpu_before < Duration::from_millis(600) || requests < 2 {
            assert_eq!(iso.handle(&Request::get("/")).unwrap().status, 200);
            requests += 1;
        }
        let cpu = thread_cpu() - cpu_before;
        let cap = prof.stop().unwrap();
        let expected = cpu.as_secs_f64() / interval.as_secs_f64();
        let host_calls = requests * 100_000;
        assert!(
            (cap.samples as f64 - expected).abs() <= 0.2 * expected + 2.0,
            "{} samples at {interval:?} over {cpu:?} of CPU ({expected:.0} expected) and {host_calls} host calls",
            cap.samples
        );
        let rows = top(&cap.profile, "cpu");
        let total: i64 = rows.iter().map(|r| r.1).sum();
        assert!(
            flat(&rows, "[host] edgeprof.log") > total / 10,
            "the host calls are sampled too: {rows:?}"
        );
    }
}
