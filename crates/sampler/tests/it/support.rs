//! WAT workers and helpers shared by the tests.

use edgeprof_pprof::{Profile, SampleIndex, TopOptions, TopSort};
use edgeprof_sampler::{Module, Runtime, RuntimeConfig};

/// The ABI boilerplate every WAT worker here shares: memory, a request
/// buffer at 1024 and a fixed `200` response at 0.
pub fn worker(body: &str) -> String {
    format!(
        r#"(module
  (import "edgeprof" "log" (func $log (param i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (data (i32.const 16) "tick")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func $spin (param $n i32) (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  {body}
)"#
    )
}

pub fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig::default()).expect("runtime")
}

/// One of the example WAT workers of `e2e/workers/wat/`.
pub fn example_wat(rt: &Runtime, name: &str) -> Module {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../e2e/workers/wat")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    rt.load_module(name, &bytes).expect("module loads")
}

pub fn load(rt: &Runtime, name: &str, wat: &str) -> Module {
    rt.load_module(name, wat.as_bytes()).expect("module loads")
}

/// `(function, flat, cum)` rows of `top` on the cpu values.
pub fn top(p: &Profile, index: &str) -> Vec<(String, i64, i64)> {
    let report = edgeprof_pprof::top(
        p,
        &TopOptions {
            sample_index: Some(SampleIndex::Name(index.into())),
            sort: TopSort::Flat,
            node_fraction: 0.0,
            limit: None,
            total: None,
        },
    )
    .expect("top");
    report
        .rows
        .into_iter()
        .map(|r| (r.function, r.flat, r.cum))
        .collect()
}

pub fn flat(rows: &[(String, i64, i64)], f: &str) -> i64 {
    rows.iter().find(|r| r.0 == f).map(|r| r.1).unwrap_or(0)
}

/// Runs `go tool pprof -top` on the profile and returns its stdout, or
/// `None` (after saying why) when Go is absent outside CI.
pub fn go_pprof_top(p: &Profile) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("profile.pb.gz");
    std::fs::write(&path, edgeprof_pprof::encode(p)).expect("write profile");
    let out = match std::process::Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(&path)
        .env("HOME", dir.path())
        .output()
    {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the go tool pprof check: `go` not runnable ({e}) and CI is unset");
            return None;
        }
        Err(e) => panic!("CI is set but `go` cannot run: {e}"),
    };
    assert!(
        out.status.success(),
        "go tool pprof -top failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// This thread's CPU time, from `/proc/thread-self/schedstat` (the clock
/// the sampler weighs samples with).
pub fn thread_cpu() -> std::time::Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat's first field is the CPU time in ns");
    std::time::Duration::from_nanos(ns)
}
