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
    placements_new: AtomicU64,
    placements_lease_ended: AtomicU64,
    continuous: ContinuousCounters,
}

/// Why a continuous-profiling window was dropped unsent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowDrop {
    /// The queue was over its byte bound: the oldest window went.
    QueueFull,
    /// Older than `--continuous-buffer` while the control plane was away.
    Expired,
    /// The control plane refused it.
    Rejected,
    /// Its pprof was over the size bound of one window.
    Oversized,
}

impl WindowDrop {
    const ALL: [WindowDrop; 4] = [
        WindowDrop::QueueFull,
        WindowDrop::Expired,
        WindowDrop::Rejected,
        WindowDrop::Oversized,
    ];

    fn label(self) -> &'static str {
        match self {
            WindowDrop::QueueFull => "queue_full",
            WindowDrop::Expired => "expired",
            WindowDrop::Rejected => "rejected",
            WindowDrop::Oversized => "oversized",
        }
    }
}

/// One metric: name, type, help, and its values by label set.
type Series = (&'static str, &'static str, &'static str, Vec<(String, u64)>);

/// Writes each series' `HELP`, `TYPE` and values.
fn write_series(out: &mut String, series: impl IntoIterator<Item = Series>) {
    for (name, kind, help, values) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in values {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    }
}

#[derive(Debug, Default)]
struct ContinuousCounters {
    dropped: [AtomicU64; 4],
    shipped: AtomicU64,
    shipped_bytes: AtomicU64,
    queue_windows: AtomicU64,
    queue_bytes: AtomicU64,
    departed_lost: AtomicU64,
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

    /// Records a request that asked the control plane where its Durable
    /// Object lives: one this machine did not hold, or (`lease_ended`) one
    /// placed here whose lease had run out (a heartbeat failed to renew
    /// it, or the control plane was away).
    pub fn placement_asked(&self, lease_ended: bool) {
        if lease_ended {
            self.placements_lease_ended.fetch_add(1, Ordering::Relaxed);
        } else {
            self.placements_new.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records `n` continuous windows dropped unsent.
    pub fn windows_dropped(&self, why: WindowDrop, n: u64) {
        let i = WindowDrop::ALL.iter().position(|w| *w == why).unwrap_or(0);
        self.continuous.dropped[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Continuous windows dropped unsent since the agent started.
    pub fn windows_dropped_total(&self) -> u64 {
        let c = &self.continuous;
        c.dropped.iter().map(|d| d.load(Ordering::Relaxed)).sum()
    }

    /// Records windows the control plane accepted, and their bytes.
    pub fn windows_shipped(&self, windows: u64, bytes: u64) {
        let c = &self.continuous;
        c.shipped.fetch_add(windows, Ordering::Relaxed);
        c.shipped_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Sets the gauges of the unsent-window queue.
    pub fn window_queue(&self, windows: usize, bytes: u64) {
        let c = &self.continuous;
        c.queue_windows.store(windows as u64, Ordering::Relaxed);
        c.queue_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Records ended isolates whose last window's samples were dropped (the
    /// queue of ended isolates was full).
    pub fn continuous_departed_lost(&self, n: u64) {
        self.continuous
            .departed_lost
            .fetch_add(n, Ordering::Relaxed);
    }

    fn render_continuous(&self, out: &mut String) {
        let c = &self.continuous;
        let g = |o: &AtomicU64| o.load(Ordering::Relaxed);
        let dropped: Vec<(String, u64)> = WindowDrop::ALL
            .iter()
            .zip(&c.dropped)
            .map(|(w, n)| (format!("{{reason=\"{}\"}}", w.label()), g(n)))
            .collect();
        let one = |v: u64| vec![(String::new(), v)];
        let series: [Series; 6] = [
            (
                "edgeprof_agent_continuous_windows_dropped_total",
                "counter",
                "Continuous-profiling windows dropped unsent, by reason.",
                dropped,
            ),
            (
                "edgeprof_agent_continuous_windows_shipped_total",
                "counter",
                "Continuous-profiling windows the control plane accepted.",
                one(g(&c.shipped)),
            ),
            (
                "edgeprof_agent_continuous_shipped_bytes_total",
                "counter",
                "Bytes of gzip'd pprof in the windows pushed successfully.",
                one(g(&c.shipped_bytes)),
            ),
            (
                "edgeprof_agent_continuous_queue_windows",
                "gauge",
                "Continuous-profiling windows waiting to be sent.",
                one(g(&c.queue_windows)),
            ),
            (
                "edgeprof_agent_continuous_queue_bytes",
                "gauge",
                "Bytes of the windows waiting to be sent.",
                one(g(&c.queue_bytes)),
            ),
            (
                "edgeprof_agent_continuous_isolates_lost_total",
                "counter",
                "Ended isolates whose last window's samples were dropped (too many ended at once).",
                one(g(&c.departed_lost)),
            ),
        ];
        write_series(out, series);
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
        write_series(
            &mut out,
            [(
                "edgeprof_agent_durable_object_placements_total",
                "counter",
                "Durable Object requests that asked the control plane where the object lives: not held here (new), or held here past its lease (lease_ended).",
                vec![
                    ("{reason=\"new\"}".to_owned(), g(&self.placements_new)),
                    (
                        "{reason=\"lease_ended\"}".to_owned(),
                        g(&self.placements_lease_ended),
                    ),
                ],
            )],
        );
        let _ = writeln!(out, "# HELP edgeprof_agent_isolates Live isolates.");
        let _ = writeln!(out, "# TYPE edgeprof_agent_isolates gauge");
        let _ = writeln!(out, "edgeprof_agent_isolates {isolates}");
        let _ = writeln!(
            out,
            "# HELP edgeprof_agent_isolate_memory_bytes Host bytes held for all isolates (linear memory, tables, logs, profiler buffers)."
        );
        let _ = writeln!(out, "# TYPE edgeprof_agent_isolate_memory_bytes gauge");
        let _ = writeln!(out, "edgeprof_agent_isolate_memory_bytes {memory_bytes}");
        self.render_continuous(&mut out);
        out
    }
}
