//! The agent's counters, exposed as Prometheus text at `/metrics`.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the request latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Process-wide counters of one agent.
#[derive(Debug, Default)]
pub struct Metrics {
    requests_ok: AtomicU64,
    requests_failed: AtomicU64,
    latency: Mutex<Histogram>,
    evictions_memory: AtomicU64,
    evictions_other: AtomicU64,
    captures_ok: AtomicU64,
    captures_failed: AtomicU64,
    forwarded: AtomicU64,
}

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    /// Records one request and how long it took.
    pub fn request(&self, ok: bool, took: Duration) {
        if ok {
            self.requests_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.requests_failed.fetch_add(1, Ordering::Relaxed);
        }
        let s = took.as_secs_f64();
        let mut h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    /// Records an isolate eviction.
    pub fn eviction(&self, memory: bool) {
        if memory {
            self.evictions_memory.fetch_add(1, Ordering::Relaxed);
        } else {
            self.evictions_other.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a finished capture.
    pub fn capture(&self, ok: bool) {
        if ok {
            self.captures_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.captures_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a Durable Object request forwarded to its owner.
    pub fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition; `isolates` and `memory_bytes` are gauges.
    pub fn render(&self, isolates: usize, memory_bytes: u64) -> String {
        let mut out = String::new();
        let g = |o: &AtomicU64| o.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_requests_total Worker requests served, by outcome."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_requests_total counter");
        let _ = writeln!(
            out,
            "edgeprof_agent_requests_total{{outcome=\"ok\"}} {}",
            g(&self.requests_ok)
        );
        let _ = writeln!(
            out,
            "edgeprof_agent_requests_total{{outcome=\"error\"}} {}",
            g(&self.requests_failed)
        );
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_request_duration_seconds Worker request latency."
        );
        let _ = writeln!(
            out,
            "# TYPE edgeprof_agent_request_duration_seconds histogram"
        );
        {
            let h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "edgeprof_agent_request_duration_seconds_bucket{{le=\"{b}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "edgeprof_agent_request_duration_seconds_bucket{{le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "edgeprof_agent_request_duration_seconds_sum {}", h.sum);
            let _ = writeln!(
                out,
                "edgeprof_agent_request_duration_seconds_count {}",
                h.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_evictions_total Isolates evicted, by cause."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_evictions_total counter");
        let _ = writeln!(
            out,
            "edgeprof_agent_evictions_total{{cause=\"exceeded_memory\"}} {}",
            g(&self.evictions_memory)
        );
        let _ = writeln!(
            out,
            "edgeprof_agent_evictions_total{{cause=\"other\"}} {}",
            g(&self.evictions_other)
        );
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_captures_total Profile captures, by outcome."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_captures_total counter");
        let _ = writeln!(
            out,
            "edgeprof_agent_captures_total{{outcome=\"ok\"}} {}",
            g(&self.captures_ok)
        );
        let _ = writeln!(
            out,
            "edgeprof_agent_captures_total{{outcome=\"error\"}} {}",
            g(&self.captures_failed)
        );
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_forwarded_total Durable Object requests forwarded to their owner."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_forwarded_total counter");
        let _ = writeln!(out, "edgeprof_agent_forwarded_total {}", g(&self.forwarded));
        let _ = writeln!(out, "# HELP edgeprof_agent_isolates Live isolates.");
        let _ = writeln!(out, "# TYPE edgeprof_agent_isolates gauge");
        let _ = writeln!(out, "edgeprof_agent_isolates {isolates}");
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_isolate_memory_bytes Host bytes held for all isolates (linear memory, tables, logs, profiler buffers)."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_isolate_memory_bytes gauge");
        let _ = writeln!(out, "edgeprof_agent_isolate_memory_bytes {memory_bytes}");
        out
    }
}
