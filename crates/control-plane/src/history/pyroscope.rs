//! Forwards stored windows to Grafana Pyroscope over its push API
//! (`POST {url}/push.v1.PusherService/Push`, the Connect unary protocol:
//! `Content-Type: application/proto`, the body an encoded `PushRequest`).
//!
//! Invariant: ingest never waits on Pyroscope. [`Forwarder::hand_off`] only
//! takes a lock to append to a queue bounded in windows and bytes (a full
//! queue drops its oldest windows); one background task drains it, one
//! batch at a time, so memory is at most the queue's bound plus one batch.
//! Windows that started over an hour ago are dropped (Pyroscope refuses
//! them), in the queue and while a batch is being retried. Every window
//! ends counted in `edgeprof_pyroscope_windows_total{outcome}`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use edgeprof_proto::pyroscope::push::v1 as push;
use edgeprof_proto::pyroscope::types::v1::LabelPair;
use edgeprof_proto::rest::ProfileKind;
use prost::Message;

use crate::clock::Clock;
use crate::metrics::{Metrics, PyroscopeOutcome};
use crate::store::NewWindow;
use crate::text::truncate;

/// Pyroscope refuses profiles older than this (its `reject_older_than`
/// default), so older windows are not sent.
pub const MAX_AGE_MS: i64 = 3_600_000;
/// The path of the push method under the base URL.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// First wait before a retry; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Most bytes of a refusal's body logged.
const MAX_LOGGED_BODY: usize = 512;

/// Where and how windows are forwarded, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyroscopeConfig {
    /// Base URL, `http://host:port[/prefix]`, without a trailing `/`.
    pub url: String,
    /// Sent as `X-Scope-OrgID` (Pyroscope's tenant header).
    pub tenant: Option<String>,
    /// Timeout of one push request, connection included.
    pub timeout: Duration,
    /// Most windows queued.
    pub max_queued_windows: usize,
    /// Most gzip'd pprof bytes queued.
    pub max_queued_bytes: usize,
    /// Most windows one push carries.
    pub max_batch_windows: usize,
    /// Most gzip'd pprof bytes one push carries (a single larger window
    /// still goes alone).
    pub max_batch_bytes: usize,
}

impl PyroscopeConfig {
    /// Defaults for `url` (`http` or `https`, no query or fragment) and
    /// `tenant`, or what is wrong with them.
    pub fn new(url: &str, tenant: Option<&str>) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}`: {e}"))?;
        match parsed.scheme() {
            "http" => {}
            "https" => {
                return Err(format!(
                    "`{url}`: https is not supported yet (this build's HTTP client has no TLS); use http"
                ));
            }
            s => return Err(format!("`{url}`: scheme `{s}` must be http")),
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("`{url}`: needs a host"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(format!("`{url}`: must not have a query or fragment"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(format!("`{url}`: must not carry credentials"));
        }
        if let Some(t) = tenant {
            check_tenant(t)?;
        }
        Ok(PyroscopeConfig {
            url: parsed.as_str().trim_end_matches('/').to_owned(),
            tenant: tenant.map(str::to_owned),
            timeout: Duration::from_secs(10),
            max_queued_windows: 4_096,
            max_queued_bytes: 256 << 20,
            max_batch_windows: 256,
            max_batch_bytes: 16 << 20,
        })
    }
}

/// A tenant id as Pyroscope (like Mimir and Loki) accepts it: 1–150 of
/// `[a-zA-Z0-9!-_.*'()]`, not `.` or `..`.
fn check_tenant(t: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c);
    if t.is_empty() || t.len() > 150 || !t.chars().all(ok) || t == "." || t == ".." {
        return Err(format!(
            "tenant `{t}`: must be 1–150 of a-z, A-Z, 0-9 and !-_.*'() (not `.` or `..`)"
        ));
    }
    Ok(())
}

/// The queue and its sender; see the module doc.
#[derive(Debug)]
pub struct Forwarder {
    config: PyroscopeConfig,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
    metrics: Arc<Metrics>,
    clock: Clock,
}

#[derive(Debug, Default)]
struct Queue {
    windows: VecDeque<NewWindow>,
    bytes: usize,
}

impl Forwarder {
    /// A forwarder and its background task (aborted when the handle is).
    pub fn start(
        config: PyroscopeConfig,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Result<(Arc<Forwarder>, tokio::task::JoinHandle<()>), String> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .build()
            .map_err(|e| format!("Pyroscope HTTP client: {e}"))?;
        let f = Arc::new(Forwarder {
            config,
            queue: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            metrics,
            clock,
        });
        let task = tokio::spawn(f.clone().run(client));
        Ok((f, task))
    }

    /// Queues stored windows to be forwarded, without waiting: the oldest
    /// queued windows make room when the queue is full.
    pub fn hand_off(&self, windows: Vec<NewWindow>) {
        if windows.is_empty() {
            return;
        }
        let mut dropped = 0;
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            for w in windows {
                q.bytes += w.pprof.len();
                q.windows.push_back(w);
            }
            while q.windows.len() > self.config.max_queued_windows
                || (q.bytes > self.config.max_queued_bytes && q.windows.len() > 1)
            {
                if let Some(old) = q.windows.pop_front() {
                    q.bytes -= old.pprof.len();
                    dropped += 1;
                }
            }
        }
        if dropped > 0 {
            self.metrics
                .pyroscope_windows(PyroscopeOutcome::DroppedFull, dropped);
            tracing::warn!(
                dropped,
                "Pyroscope forwarding queue full: oldest windows dropped"
            );
        }
        self.wake.notify_one();
    }

    /// The next batch, oldest first, without windows too old to send.
    fn take_batch(&self) -> Vec<NewWindow> {
        let now_ms = self.clock.now_ms();
        let (mut batch, mut bytes, mut old) = (Vec::new(), 0, 0);
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(w) = q.windows.front() {
            let size = w.pprof.len();
            let fresh = now_ms - w.start_ms <= MAX_AGE_MS;
            if fresh
                && !batch.is_empty()
                && (batch.len() >= self.config.max_batch_windows
                    || bytes + size > self.config.max_batch_bytes)
            {
                break;
            }
            let Some(w) = q.windows.pop_front() else {
                break;
            };
            q.bytes -= size;
            if fresh {
                bytes += size;
                batch.push(w);
            } else {
                old += 1;
            }
        }
        drop(q);
        self.count_old(old);
        batch
    }

    fn count_old(&self, n: u64) {
        if n > 0 {
            self.metrics
                .pyroscope_windows(PyroscopeOutcome::DroppedOld, n);
            tracing::warn!(
                dropped = n,
                "windows older than an hour dropped: Pyroscope refuses them"
            );
        }
    }

    async fn run(self: Arc<Self>, client: reqwest::Client) {
        loop {
            let batch = self.take_batch();
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            self.send(&client, batch).await;
        }
    }

    /// Pushes one batch until Pyroscope takes or refuses it, or its
    /// windows grow too old.
    async fn send(&self, client: &reqwest::Client, mut batch: Vec<NewWindow>) {
        let url = format!("{}{PUSH_PATH}", self.config.url);
        let mut backoff = FIRST_BACKOFF;
        // Encoded once, again only when old windows leave the batch; a
        // retry sends the same bytes (`Bytes` clones share them).
        let mut body = Bytes::from(push_request(&batch).encode_to_vec());
        loop {
            let n = batch.len() as u64;
            match self.post(client, &url, body.clone()).await {
                Ok(()) => {
                    self.metrics.pyroscope_windows(PyroscopeOutcome::Sent, n);
                    return;
                }
                Err(Failure::Refused(reason)) => {
                    self.metrics.pyroscope_windows(PyroscopeOutcome::Refused, n);
                    tracing::error!(windows = n, "Pyroscope refused a push: {reason}");
                    return;
                }
                Err(Failure::Retry(reason)) => {
                    tracing::warn!(
                        windows = n,
                        retry_in_ms = backoff.as_millis() as u64,
                        "Pyroscope push failed: {reason}"
                    );
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let now_ms = self.clock.now_ms();
            let before = batch.len();
            batch.retain(|w| now_ms - w.start_ms <= MAX_AGE_MS);
            if batch.len() < before {
                self.count_old((before - batch.len()) as u64);
                if batch.is_empty() {
                    return;
                }
                body = Bytes::from(push_request(&batch).encode_to_vec());
            }
        }
    }

    async fn post(&self, client: &reqwest::Client, url: &str, body: Bytes) -> Result<(), Failure> {
        let mut req = client
            .post(url)
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1")
            .body(body);
        if let Some(t) = &self.config.tenant {
            req = req.header("x-scope-orgid", t);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| Failure::Retry(format!("POST {url}: {:#}", anyhow::Error::new(e))))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let mut text = Vec::new();
        while text.len() < MAX_LOGGED_BODY {
            match resp.chunk().await {
                Ok(Some(c)) => text.extend_from_slice(&c),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&text);
        let reason = format!(
            "POST {url}: {status}: {}",
            truncate(text.trim(), MAX_LOGGED_BODY)
        );
        if status.is_client_error() && status != reqwest::StatusCode::TOO_MANY_REQUESTS {
            Err(Failure::Refused(reason))
        } else {
            Err(Failure::Retry(reason))
        }
    }
}

enum Failure {
    /// Worth trying again: no answer, a 5xx or 429.
    Retry(String),
    /// Another 4xx: the same push would be refused again.
    Refused(String),
}

/// One `RawProfileSeries` per (account, script, version, data center,
/// machine, kind), its windows as samples, oldest first.
pub fn push_request(windows: &[NewWindow]) -> push::PushRequest {
    let mut series: BTreeMap<_, push::RawProfileSeries> = BTreeMap::new();
    for w in windows {
        let key = (
            &w.account,
            &w.script,
            &w.version_id,
            &w.data_center,
            &w.machine_id,
            w.kind.as_str(),
        );
        series
            .entry(key)
            .or_insert_with(|| push::RawProfileSeries {
                labels: labels(w),
                samples: Vec::new(),
            })
            .samples
            .push(push::RawSample {
                raw_profile: w.pprof.clone(),
                id: String::new(),
            });
    }
    push::PushRequest {
        series: series.into_values().collect(),
    }
}

/// A window's labels, sorted by name (names all match
/// `[a-zA-Z_][a-zA-Z0-9_]*`, as Pyroscope requires; far below its 30).
fn labels(w: &NewWindow) -> Vec<LabelPair> {
    let name = match w.kind {
        ProfileKind::Cpu => "process_cpu",
        ProfileKind::Heap => "memory",
    };
    [
        ("__name__", name),
        ("account", &w.account),
        ("data_center", &w.data_center),
        ("machine", &w.machine_id),
        ("service_name", &w.script),
        ("version", &w.version_id),
    ]
    .into_iter()
    .map(|(name, value)| LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_tenants_are_checked() {
        let ok = PyroscopeConfig::new("http://127.0.0.1:4040/", Some("team-a")).unwrap();
        assert_eq!(ok.url, "http://127.0.0.1:4040");
        for (url, tenant, error) in [
            ("ftp://h:1", None, "scheme `ftp` must be http"),
            ("http://h:1/?a=b", None, "must not have a query or fragment"),
            ("http://u:p@h:1", None, "must not carry credentials"),
            ("h:1", None, "scheme `h` must be http"),
            ("http://h:1", Some("a b"), "tenant `a b`: must be"),
            ("http://h:1", Some(""), "tenant ``: must be"),
        ] {
            let e = PyroscopeConfig::new(url, tenant).unwrap_err();
            assert!(e.contains(error), "{url} {tenant:?}: {e}");
        }
    }
}
