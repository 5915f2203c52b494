//! What profiling costs, per worker, side by side in one run:
//! `cargo bench -p edgeprof-sampler --bench overhead` (after
//! `cargo xtask build-workers`, which puts the workers in `target/workers/`).
//!
//! For every example worker, the WAT spin, a recursive fib and a short
//! host-call-heavy request, five isolates serve the same request in batches
//! of about `EDGEPROF_BENCH_BATCH_MS` (default 30 ms), round by round
//! (`EDGEPROF_BENCH_ROUNDS`, default 40), the order rotating every round:
//!
//! - `off`: an engine without epoch interruption (no sampling, no CPU limit);
//! - `on`: the default engine, unprofiled;
//! - `100 Hz` and `1 kHz`: the default engine under a CPU capture that runs
//!   through all rounds;
//! - `19 Hz cont.`: the continuous profiler's captures (CPU every 52 ms and
//!   heap), as every isolate of an agent runs them.
//!
//! Printed per worker: the epoch checks' cost (`on` / `off`), the profiled
//! overhead at both rates (against `on`, the median of the per-round
//! ratios), samples taken against the expected count (the thread CPU the
//! profiled batches used / the interval), and the cost of one sample as the
//! sampler measured it and as the 1 kHz overhead implies it.
//!
//! Then request latency under steady load (requests paced at about half of
//! one core), p50 and p99 without a capture and during 100 Hz and 1 kHz
//! captures, windows alternating round by round.
//!
//! `EDGEPROF_BENCH_ONLY=name,name` limits the run to some workers;
//! `EDGEPROF_BENCH_LATENCY=0` skips the latency part.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edgeprof_sampler::{
    CaptureOwner, Isolate, Limits, Module, ProfileKind, ProfilerHandle, Request, Runtime,
    RuntimeConfig,
};

/// A worker file in `target/workers/` and the request it serves.
struct Worker {
    file: &'static str,
    method: &'static str,
    path: &'static str,
}

const fn worker(file: &'static str, method: &'static str, path: &'static str) -> Worker {
    Worker { file, method, path }
}

impl Worker {
    fn request(&self) -> Request {
        Request {
            method: self.method.into(),
            ..Request::get(self.path)
        }
    }
}

// `leftover-instrumentation.wasm` (v1) keeps 64 KiB per request by design
// and is evicted at 128 MiB after ~1900 requests: it has no steady state to
// measure. Its fix is the short allocating request.
const WORKERS: &[Worker] = &[
    worker("json-gateway.wasm", "GET", "/tree/7"),
    worker("json-gateway-fixed.wasm", "GET", "/tree/7"),
    worker("metrics-twice.wasm", "GET", "/metrics"),
    worker("metrics-twice-fixed.wasm", "GET", "/metrics"),
    worker("counter-object.wasm", "POST", "/increment"),
    worker("counter-object-fixed.wasm", "POST", "/increment"),
    worker("leftover-instrumentation-fixed.wasm", "GET", "/items/1"),
    worker("spin.wat", "GET", "/"),
    worker("fib.wat", "GET", "/"),
    worker("host-short.wat", "GET", "/"),
];

const CONFIGS: [&str; 5] = ["off", "on", "100 Hz", "1 kHz", "19 Hz cont."];

/// The continuous profiler's interval: 19 Hz in whole 1 ms ticks.
const CONTINUOUS_INTERVAL: Duration = Duration::from_millis(52);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn workers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/workers")
}

fn load(rt: &Runtime, file: &str) -> Module {
    let path = workers_dir().join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo xtask build-workers` first)",
            path.display()
        )
    });
    rt.load_module(file, &bytes).expect("worker compiles")
}

/// This thread's CPU time (`/proc/thread-self/schedstat`, in ns: the clock
/// the sampler reads), for the expected sample count.
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns: u64 = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Row {
    name: String,
    request_us: f64,
    epoch: f64,
    hz100: f64,
    khz1: f64,
    hz19: f64,
    samples: [(u64, f64); 3],
    sample_ns: [f64; 2],
    marginal_ns: f64,
}

fn overhead(w: &Worker, rounds: usize, batch: Duration) -> Row {
    let off_rt = Runtime::new(RuntimeConfig {
        epoch_interruption: false,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let (m_off, m) = (load(&off_rt, w.file), load(&rt, w.file));
    let mut isolates = [
        Isolate::new(&off_rt, &m_off, Limits::default()).unwrap(),
        Isolate::new(&rt, &m, Limits::default()).unwrap(),
        Isolate::new(&rt, &m, Limits::default()).unwrap(),
        Isolate::new(&rt, &m, Limits::default()).unwrap(),
        Isolate::new(&rt, &m, Limits::default()).unwrap(),
    ];
    let req = w.request();
    // Warm up every isolate alike (a worker's cost may grow with the
    // requests it served: counter-object's does) and size the batch on
    // another one.
    for iso in &mut isolates {
        for _ in 0..20 {
            assert_eq!(iso.handle(&req).unwrap().status, 200, "{}", w.file);
        }
    }
    let mut sizing = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < batch {
        sizing.handle(&req).unwrap();
        n += 1;
    }
    let per_batch = n.max(1);
    let profilers: Vec<ProfilerHandle> = isolates[2..].iter().map(Isolate::profiler).collect();
    profilers[0]
        .start(ProfileKind::Cpu, Duration::from_millis(10))
        .unwrap();
    profilers[1]
        .start(ProfileKind::Cpu, Duration::from_millis(1))
        .unwrap();
    for kind in [ProfileKind::Cpu, ProfileKind::Heap] {
        profilers[2]
            .start_for(CaptureOwner::Continuous, kind, CONTINUOUS_INTERVAL)
            .unwrap();
    }
    let mut times: Vec<Vec<f64>> = (0..5).map(|_| Vec::with_capacity(rounds)).collect();
    let mut cpu = [Duration::ZERO; 5];
    for round in 0..rounds {
        for k in 0..5 {
            let c = (round + k) % 5;
            let iso = &mut isolates[c];
            let cpu0 = thread_cpu();
            let t0 = Instant::now();
            for _ in 0..per_batch {
                iso.handle(&req).unwrap();
            }
            times[c].push(t0.elapsed().as_secs_f64());
            cpu[c] += thread_cpu() - cpu0;
        }
    }
    let mut caps: Vec<_> = profilers[..2].iter().map(|p| p.stop().unwrap()).collect();
    caps.push(
        profilers[2]
            .stop_for(CaptureOwner::Continuous, ProfileKind::Cpu)
            .unwrap(),
    );
    let ratio = |a: usize, b: usize| {
        let mut r: Vec<f64> = times[a]
            .iter()
            .zip(&times[b])
            .map(|(x, y)| x / y - 1.0)
            .collect();
        100.0 * median(&mut r)
    };
    let base_batch = median(&mut times[1].clone());
    let khz1 = ratio(3, 1);
    let samples_per_batch = caps[1].samples as f64 / rounds as f64;
    Row {
        name: w.file.to_string(),
        request_us: base_batch / per_batch as f64 * 1e6,
        epoch: ratio(1, 0),
        hz100: ratio(2, 1),
        khz1,
        hz19: ratio(4, 1),
        samples: [
            (caps[0].samples, cpu[2].as_secs_f64() / 0.010),
            (caps[1].samples, cpu[3].as_secs_f64() / 0.001),
            (
                caps[2].samples,
                cpu[4].as_secs_f64() / CONTINUOUS_INTERVAL.as_secs_f64(),
            ),
        ],
        sample_ns: [0, 1]
            .map(|i| caps[i].sample_time.as_nanos() as f64 / caps[i].samples.max(1) as f64),
        marginal_ns: khz1 / 100.0 * base_batch * 1e9 / samples_per_batch.max(1.0),
    }
}

fn pct(x: f64) -> String {
    format!("{x:+.2} %")
}

fn latency(w: &Worker, rounds: usize, window: usize) {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let m = load(&rt, w.file);
    let mut iso = Isolate::new(&rt, &m, Limits::default()).unwrap();
    let req = w.request();
    let t = Instant::now();
    for _ in 0..20 {
        iso.handle(&req).unwrap();
    }
    // Paced at half of one core: each request starts a period after the
    // previous one started, the period twice the service time.
    let period = t.elapsed() / 20 * 2;
    let prof = iso.profiler();
    let mut lat: [Vec<Duration>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..3 {
            let c = (round + k) % 3;
            if c > 0 {
                let interval = Duration::from_millis(if c == 1 { 10 } else { 1 });
                prof.start(ProfileKind::Cpu, interval).unwrap();
            }
            let mut next = Instant::now();
            for _ in 0..window {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep(next - now);
                }
                next += period;
                let t0 = Instant::now();
                iso.handle(&req).unwrap();
                lat[c].push(t0.elapsed());
            }
            if c > 0 {
                prof.stop().unwrap();
            }
        }
    }
    let q = |v: &mut Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
    };
    let mut p = [[Duration::ZERO; 2]; 3];
    for (c, v) in lat.iter_mut().enumerate() {
        p[c] = [q(v, 0.50), q(v, 0.99)];
    }
    println!(
        "{:<38} {:>5} req  p50 {:>9.1?} / {:>9.1?} / {:>9.1?}   p99 {:>9.1?} / {:>9.1?} / {:>9.1?}   p99 ratio {:.3} / {:.3}",
        w.file,
        lat[0].len(),
        p[0][0],
        p[1][0],
        p[2][0],
        p[0][1],
        p[1][1],
        p[2][1],
        p[1][1].as_secs_f64() / p[0][1].as_secs_f64(),
        p[2][1].as_secs_f64() / p[0][1].as_secs_f64(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes
    // nothing: then only check that the benchmark runs at all.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = env_u64("EDGEPROF_BENCH_ROUNDS", if quick { 2 } else { 40 }) as usize;
    let batch = Duration::from_millis(env_u64(
        "EDGEPROF_BENCH_BATCH_MS",
        if quick { 2 } else { 30 },
    ));
    let only = std::env::var("EDGEPROF_BENCH_ONLY").ok();
    let selected: Vec<&Worker> = WORKERS
        .iter()
        .filter(|w| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| w.file.starts_with(n)))
        })
        .collect();
    println!(
        "profiling overhead: {rounds} rounds of ~{batch:?} per configuration ({}), order rotating; medians of per-round ratios",
        CONFIGS.join(", ")
    );
    println!(
        "{:<38} {:>9} {:>9} {:>9} {:>9} {:>11} {:>20} {:>20} {:>18} {:>16} {:>9}",
        "worker",
        "request",
        "epoch",
        "100 Hz",
        "1 kHz",
        "19 Hz cont.",
        "samples 100 Hz",
        "samples 1 kHz",
        "samples 19 Hz",
        "ns/sample",
        "marginal"
    );
    for w in &selected {
        let r = overhead(w, rounds, batch);
        let s = |(taken, expected): (u64, f64)| {
            format!(
                "{taken}/{expected:.0} ({:+.0} %)",
                100.0 * (taken as f64 / expected - 1.0)
            )
        };
        println!(
            "{:<38} {:>7.1}µs {:>9} {:>9} {:>9} {:>11} {:>20} {:>20} {:>18} {:>7.0} {:>7.0} {:>9.0}",
            r.name,
            r.request_us,
            pct(r.epoch),
            pct(r.hz100),
            pct(r.khz1),
            pct(r.hz19),
            s(r.samples[0]),
            s(r.samples[1]),
            s(r.samples[2]),
            r.sample_ns[0],
            r.sample_ns[1],
            r.marginal_ns,
        );
    }
    if std::env::var("EDGEPROF_BENCH_LATENCY").as_deref() == Ok("0") {
        return;
    }
    let (lrounds, window) = if quick { (1, 5) } else { (10, 100) };
    println!(
        "\nrequest latency at half a core of steady load, {lrounds} rounds of {window} requests per configuration: no capture / 100 Hz / 1 kHz"
    );
    for w in selected
        .iter()
        .filter(|w| ["json-gateway.wasm", "metrics-twice.wasm", "host-short.wat"].contains(&w.file))
    {
        latency(w, lrounds, window);
    }
}
