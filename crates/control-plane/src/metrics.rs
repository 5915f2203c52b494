//! Counters exposed at `/metrics` in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything the control plane counts.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP responses with a 2xx/3xx status.
    pub http_ok: Counter,
    /// HTTP responses with a 4xx status.
    pub http_client_errors: Counter,
    /// HTTP responses with a 5xx status.
    pub http_server_errors: Counter,
    /// Agent heartbeats received.
    pub heartbeats: Counter,
    /// Captures started.
    pub captures_started: Counter,
    /// Captures that ended `done`.
    pub captures_done: Counter,
    /// Captures that ended `partial`.
    pub captures_partial: Counter,
    /// Captures that ended `failed`.
    pub captures_failed: Counter,
    /// Captures refused with 429.
    pub captures_rate_limited: Counter,
}

impl Metrics {
    /// The Prometheus text exposition, with the given gauges appended.
    pub fn render(&self, live_machines: usize, running_captures: usize) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        counter(
            "edgeprof_http_responses_total",
            "HTTP responses by status class.",
            &[
                ("{class=\"ok\"}", self.http_ok.get()),
                ("{class=\"4xx\"}", self.http_client_errors.get()),
                ("{class=\"5xx\"}", self.http_server_errors.get()),
            ],
        );
        counter(
            "edgeprof_heartbeats_total",
            "Agent heartbeats received.",
            &[("", self.heartbeats.get())],
        );
        counter(
            "edgeprof_captures_started_total",
            "Capture sessions started.",
            &[("", self.captures_started.get())],
        );
        counter(
            "edgeprof_captures_finished_total",
            "Capture sessions finished, by outcome.",
            &[
                ("{status=\"done\"}", self.captures_done.get()),
                ("{status=\"partial\"}", self.captures_partial.get()),
                ("{status=\"failed\"}", self.captures_failed.get()),
            ],
        );
        counter(
            "edgeprof_captures_rate_limited_total",
            "Captures refused because too many of the same script were running.",
            &[("", self.captures_rate_limited.get())],
        );
        let _ = writeln!(
            out,
            "# HELP edgeprof_live_machines Machines whose heartbeat is current.\n# TYPE edgeprof_live_machines gauge\nedgeprof_live_machines {live_machines}"
        );
        let _ = writeln!(
            out,
            "# HELP edgeprof_running_captures Capture sessions in progress.\n# TYPE edgeprof_running_captures gauge\nedgeprof_running_captures {running_captures}"
        );
        out
    }
}
