//! What the control plane counts, exposed at `/metrics` in the OpenMetrics
//! text format by `prometheus-client`.
//!
//! Imports nothing of this crate.

use edgeprof_proto::rest::SessionStatus;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = [(&'static str, &'static str); 1];

/// Content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything the control plane counts.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    http_responses: Family<Labels, Counter>,
    captures_finished: Family<Labels, Counter>,
    /// Agent heartbeats received.
    pub heartbeats: Counter,
    /// Captures started.
    pub captures_started: Counter,
    /// Captures refused with 429.
    pub captures_rate_limited: Counter,
    live_machines: Gauge,
    running_captures: Gauge,
    pyroscope_windows: Family<Labels, Counter>,
}

/// What became of a window handed to the Pyroscope forwarder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyroscopeOutcome {
    /// Pyroscope answered 2xx to the push that carried it.
    Sent,
    /// Dropped, oldest first, to make room in a full queue.
    DroppedFull,
    /// Dropped because it started over an hour ago (Pyroscope refuses it).
    DroppedOld,
    /// Pyroscope answered a 4xx other than 429 to its push.
    Refused,
}

impl PyroscopeOutcome {
    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            PyroscopeOutcome::Sent => "sent",
            PyroscopeOutcome::DroppedFull => "dropped_full",
            PyroscopeOutcome::DroppedOld => "dropped_old",
            PyroscopeOutcome::Refused => "refused",
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            http_responses: Family::default(),
            captures_finished: Family::default(),
            heartbeats: Counter::default(),
            captures_started: Counter::default(),
            captures_rate_limited: Counter::default(),
            live_machines: Gauge::default(),
            running_captures: Gauge::default(),
            pyroscope_windows: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "edgeprof_http_responses",
            "HTTP responses by status class",
            m.http_responses.clone(),
        );
        registry.register(
            "edgeprof_heartbeats",
            "Agent heartbeats received",
            m.heartbeats.clone(),
        );
        registry.register(
            "edgeprof_captures_started",
            "Capture sessions started",
            m.captures_started.clone(),
        );
        registry.register(
            "edgeprof_captures_finished",
            "Capture sessions finished, by outcome",
            m.captures_finished.clone(),
        );
        registry.register(
            "edgeprof_captures_rate_limited",
            "Captures refused because too many of the same script were running",
            m.captures_rate_limited.clone(),
        );
        registry.register(
            "edgeprof_live_machines",
            "Machines whose heartbeat is current",
            m.live_machines.clone(),
        );
        registry.register(
            "edgeprof_running_captures",
            "Capture sessions in progress",
            m.running_captures.clone(),
        );
        registry.register(
            "edgeprof_pyroscope_windows",
            "Windows handed to the Pyroscope forwarder, by outcome",
            m.pyroscope_windows.clone(),
        );
        // Every series exists from the start, at zero.
        for class in ["ok", "4xx", "5xx"] {
            let _ = m.http_responses.get_or_create(&[("class", class)]);
        }
        for s in [
            SessionStatus::Done,
            SessionStatus::Partial,
            SessionStatus::Failed,
        ] {
            let _ = m.captures_finished.get_or_create(&[("status", s.as_str())]);
        }
        for o in [
            PyroscopeOutcome::Sent,
            PyroscopeOutcome::DroppedFull,
            PyroscopeOutcome::DroppedOld,
            PyroscopeOutcome::Refused,
        ] {
            let _ = m
                .pyroscope_windows
                .get_or_create(&[("outcome", o.as_str())]);
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Counts an HTTP response of `status`.
    pub fn http_response(&self, status: u16) {
        let class = match status {
            500.. => "5xx",
            400..500 => "4xx",
            _ => "ok",
        };
        self.http_responses.get_or_create(&[("class", class)]).inc();
    }

    /// Counts a capture that ended in `status`.
    pub fn capture_finished(&self, status: SessionStatus) {
        self.captures_finished
            .get_or_create(&[("status", status.as_str())])
            .inc();
    }

    /// Counts `n` windows of the Pyroscope forwarder that ended in `outcome`.
    pub fn pyroscope_windows(&self, outcome: PyroscopeOutcome, n: u64) {
        self.pyroscope_windows
            .get_or_create(&[("outcome", outcome.as_str())])
            .inc_by(n);
    }

    /// The text exposition, with the gauges set to the values given.
    pub fn render(&self, live_machines: usize, running_captures: usize) -> String {
        self.live_machines
            .set(i64::try_from(live_machines).unwrap_or(i64::MAX));
        self.running_captures
            .set(i64::try_from(running_captures).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_their_labels() {
        let m = Metrics::default();
        m.http_response(200);
        m.http_response(404);
        m.http_response(404);
        m.capture_finished(SessionStatus::Partial);
        m.captures_rate_limited.inc();
        let text = m.render(3, 1);
        for line in [
            "edgeprof_http_responses_total{class=\"ok\"} 1",
            "edgeprof_http_responses_total{class=\"4xx\"} 2",
            "edgeprof_http_responses_total{class=\"5xx\"} 0",
            "edgeprof_captures_finished_total{status=\"partial\"} 1",
            "edgeprof_captures_finished_total{status=\"done\"} 0",
            "edgeprof_captures_rate_limited_total 1",
            "edgeprof_live_machines 3",
            "edgeprof_running_captures 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }
}
