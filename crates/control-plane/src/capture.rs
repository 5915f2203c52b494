//! Capture sessions: the per-script concurrency limit (and one capture per
//! isolate at a time), the fan-out of
//! `NodeAgent.Capture` to every target machine at once, the labelled merge
//! (with the requests the merged isolates served, as the session's
//! `requests` and a `requests: N` comment in the pprof), and the session's
//! state changes (`pending → capturing → merging → done |
//! partial | failed`), each persisted as it happens.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::watch;

use crate::fleet::Target;
use crate::metrics::Metrics;
use crate::store::{SessionRow, Store, StoreError, now_ms};

/// What to profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileKind {
    /// CPU time.
    Cpu,
    /// Allocations and live heap.
    Heap,
}

impl ProfileKind {
    /// `cpu` or `heap`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::Heap => "heap",
        }
    }

    fn to_proto(self) -> v1::ProfileKind {
        match self {
            ProfileKind::Cpu => v1::ProfileKind::Cpu,
            ProfileKind::Heap => v1::ProfileKind::Heap,
        }
    }
}

/// A validated capture request, its version resolved and targets found.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    /// Owning account.
    pub account: String,
    /// Script.
    pub script: String,
    /// Resolved version id.
    pub version_id: String,
    /// The selector as the user gave it.
    pub version_selector: String,
    /// Kind of profile.
    pub kind: ProfileKind,
    /// How long to capture.
    pub duration: Duration,
    /// Data-center filter.
    pub data_center: Option<String>,
    /// `namespace:id`.
    pub durable_object: Option<String>,
    /// Isolates to capture (at least one).
    pub targets: Vec<Target>,
}

/// A machine or isolate that gave no profile, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    /// Machine id.
    pub machine: String,
    /// Its data center.
    pub data_center: String,
    /// The isolate, when only one isolate of the machine failed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub isolate: Option<String>,
    /// What went wrong.
    pub reason: String,
}

/// Settings of the capture fan-out.
#[derive(Debug, Clone)]
pub struct CaptureSettings {
    /// Shared secret sent to agents.
    pub agent_secret: String,
    /// Extra time an agent gets beyond the capture duration.
    pub slack: Duration,
    /// Most concurrent captures of one script.
    pub max_per_script: usize,
    /// Largest profile accepted from one agent.
    pub max_agent_response_bytes: usize,
}

/// A capture refused because others of the same script are running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// How many captures of the script are running.
    pub running: usize,
    /// Why this one cannot start now.
    pub reason: BusyReason,
    /// Seconds until the earliest capture in the way should end.
    pub retry_after_secs: u64,
}

/// Why a capture must wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusyReason {
    /// The per-script limit is reached.
    Limit,
    /// A running capture already profiles some of the same isolates (an
    /// isolate's profiler serves one capture at a time); these, as
    /// `machine/isolate`.
    Overlap(Vec<String>),
}

/// Why a capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Too many captures of the script are running, or one profiles the
    /// same isolates.
    #[error("{} captures of this script are already running", .0.running)]
    Busy(Busy),
    /// The session could not be stored.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A capture in progress: its session, when it should end at the latest,
/// and the isolates (`machine/isolate`) it profiles.
struct Running {
    id: String,
    end: Instant,
    isolates: Vec<String>,
}

type Slots = Arc<Mutex<HashMap<(String, String), Vec<Running>>>>;

struct SlotGuard {
    slots: Slots,
    key: (String, String),
    id: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get_mut(&self.key) {
            v.retain(|r| r.id != self.id);
            if v.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

/// Starts and runs capture sessions.
#[derive(Clone)]
pub struct Captures {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    settings: Arc<CaptureSettings>,
    slots: Slots,
    finished: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl std::fmt::Debug for Captures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captures").finish_non_exhaustive()
    }
}

impl Captures {
    /// A capture runner over `store`.
    pub fn new(store: Arc<Store>, metrics: Arc<Metrics>, settings: CaptureSettings) -> Self {
        Captures {
            store,
            metrics,
            settings: Arc::new(settings),
            slots: Arc::default(),
            finished: Arc::default(),
        }
    }

    /// Captures in progress in this process.
    pub fn running(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }

    fn acquire(&self, spec: &CaptureSpec, id: &str) -> Result<SlotGuard, Busy> {
        let key = (spec.account.clone(), spec.script.clone());
        let isolates: Vec<String> = spec
            .targets
            .iter()
            .map(|t| format!("{}/{}", t.machine, t.isolate))
            .collect();
        let mut map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let running = map.entry(key.clone()).or_default();
        let now = Instant::now();
        let wait = |r: &Running| r.end.saturating_duration_since(now);
        let busy = |reason, soonest: Duration| Busy {
            running: running.len(),
            reason,
            retry_after_secs: soonest.as_secs_f64().ceil().max(1.0) as u64,
        };
        if running.len() >= self.settings.max_per_script {
            let soonest = running.iter().map(wait).min().unwrap_or_default();
            return Err(busy(BusyReason::Limit, soonest));
        }
        let in_the_way: Vec<&Running> = running
            .iter()
            .filter(|r| r.isolates.iter().any(|i| isolates.contains(i)))
            .collect();
        if !in_the_way.is_empty() {
            let mut shared: Vec<String> = isolates
                .iter()
                .filter(|i| in_the_way.iter().any(|r| r.isolates.contains(i)))
                .cloned()
                .collect();
            shared.sort();
            // All of them must end before every shared isolate is free.
            let latest = in_the_way.iter().map(|r| wait(r)).max().unwrap_or_default();
            return Err(busy(BusyReason::Overlap(shared), latest));
        }
        running.push(Running {
            id: id.to_owned(),
            end: now + spec.duration + self.settings.slack,
            isolates,
        });
        Ok(SlotGuard {
            slots: self.slots.clone(),
            key,
            id: id.to_owned(),
        })
    }

    /// Stores a `pending` session and starts capturing in the background;
    /// returns the stored session.
    pub async fn start(&self, spec: CaptureSpec) -> Result<SessionRow, StartError> {
        let id = uuid::Uuid::now_v7().to_string();
        let guard = match self.acquire(&spec, &id) {
            Ok(g) => g,
            Err(busy) => {
                self.metrics.captures_rate_limited.inc();
                return Err(StartError::Busy(busy));
            }
        };
        let machines: std::collections::BTreeSet<&str> =
            spec.targets.iter().map(|t| t.machine.as_str()).collect();
        let now = now_ms();
        let row = SessionRow {
            id: id.clone(),
            account: spec.account.clone(),
            script: spec.script.clone(),
            version_id: spec.version_id.clone(),
            version_selector: spec.version_selector.clone(),
            kind: spec.kind.as_str().to_owned(),
            duration_ms: spec.duration.as_millis() as i64,
            data_center: spec.data_center.clone(),
            durable_object: spec.durable_object.clone(),
            status: "pending".into(),
            error: None,
            targets_json: serde_json::to_string(&spec.targets).unwrap_or_else(|_| "[]".into()),
            failures_json: "[]".into(),
            machines_total: machines.len() as i64,
            machines_answered: 0,
            created_at_ms: now,
            updated_at_ms: now,
            requests: None,
        };
        self.store.create_session(&row).await?;
        self.metrics.captures_started.inc();
        let (tx, rx) = watch::channel(false);
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), rx);
        let this = self.clone();
        tokio::spawn(async move {
            let session_id = id.clone();
            if let Err(e) = this.run(&id, spec).await {
                tracing::error!(session = %session_id, "capture: {e:#}");
                let reason = format!("internal error: {e}");
                if let Err(e) = this
                    .store
                    .set_session_status(&session_id, "failed", Some(&reason), None)
                    .await
                {
                    tracing::error!(session = %session_id, "capture: cannot record failure: {e:#}");
                }
                this.metrics.captures_failed.inc();
            }
            drop(guard);
            let _ = tx.send(true);
            this.finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&session_id);
        });
        Ok(row)
    }

    /// Waits until the session started by this process ends (returns at once
    /// for unknown or finished sessions).
    pub async fn wait(&self, id: &str) {
        let rx = self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    async fn run(&self, id: &str, spec: CaptureSpec) -> Result<(), StoreError> {
        self.store
            .set_session_status(id, "capturing", None, None)
            .await?;
        let mut by_machine: BTreeMap<&str, Vec<&Target>> = BTreeMap::new();
        for t in &spec.targets {
            by_machine.entry(t.machine.as_str()).or_default().push(t);
        }
        let deadline = spec.duration + self.settings.slack;
        let mut calls: FuturesUnordered<_> = by_machine
            .iter()
            .map(|(machine, targets)| {
                let machine = (*machine).to_owned();
                let address = targets[0].grpc_address.clone();
                let isolates: Vec<String> = targets.iter().map(|t| t.isolate.clone()).collect();
                let request = v1::CaptureRequest {
                    session_id: id.to_owned(),
                    isolate_ids: isolates,
                    kind: spec.kind.to_proto() as i32,
                    duration_ms: spec.duration.as_millis() as u32,
                    interval_us: 0,
                };
                let settings = self.settings.clone();
                async move {
                    let result = tokio::time::timeout(
                        deadline,
                        call_agent(&address, request, deadline, &settings),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "did not answer within {:.1} s (duration + slack)",
                            deadline.as_secs_f64()
                        ))
                    });
                    (machine, result)
                }
            })
            .collect();

        let mut answered = 0i64;
        let mut failures: Vec<Failure> = Vec::new();
        let mut responses: Vec<(String, v1::CaptureResponse)> = Vec::new();
        let dc_of = |machine: &str| {
            by_machine
                .get(machine)
                .map(|t| t[0].data_center.clone())
                .unwrap_or_default()
        };
        while let Some((machine, result)) = calls.next().await {
            answered += 1;
            match result {
                Ok(resp) => responses.push((machine, resp)),
                Err(reason) => {
                    tracing::warn!(session = %id, machine = %machine, "capture: {reason}");
                    failures.push(Failure {
                        data_center: dc_of(&machine),
                        machine,
                        isolate: None,
                        reason,
                    });
                }
            }
            let json = serde_json::to_string(&failures).unwrap_or_else(|_| "[]".into());
            self.store.set_session_progress(id, answered, &json).await?;
        }
        drop(calls);

        self.store
            .set_session_status(id, "merging", None, None)
            .await?;
        let mut merger = edgeprof_pprof::Merger::new();
        // Requests served by the isolates whose profiles are merged; `None`
        // once one of them comes from an agent that does not count them.
        let mut requests: Option<u64> = Some(0);
        let wanted: HashMap<(&str, &str), &Target> = spec
            .targets
            .iter()
            .map(|t| ((t.machine.as_str(), t.isolate.as_str()), t))
            .collect();
        for (machine, resp) in &responses {
            let dc = dc_of(machine);
            let mut returned = std::collections::HashSet::new();
            for iso in &resp.isolates {
                let Some(target) = wanted.get(&(machine.as_str(), iso.isolate_id.as_str())) else {
                    continue; // not asked for: never mix in other isolates
                };
                returned.insert(iso.isolate_id.as_str());
                let fail = |reason: String| Failure {
                    machine: machine.clone(),
                    data_center: dc.clone(),
                    isolate: Some(iso.isolate_id.clone()),
                    reason,
                };
                if !iso.error.is_empty() {
                    failures.push(fail(iso.error.clone()));
                    continue;
                }
                let profile = match edgeprof_pprof::decode(&iso.pprof) {
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(fail(format!("unreadable profile: {e}")));
                        continue;
                    }
                };
                let dobj = spec.durable_object.clone().or_else(|| {
                    let dos = if iso.durable_objects.is_empty() {
                        &target.durable_objects
                    } else {
                        &iso.durable_objects
                    };
                    (!dos.is_empty()).then(|| dos.join(","))
                });
                let mut labels: Vec<(&str, &str)> = vec![
                    ("data_center", dc.as_str()),
                    ("machine", machine.as_str()),
                    ("isolate", iso.isolate_id.as_str()),
                ];
                if let Some(d) = &dobj {
                    labels.push(("durable_object", d.as_str()));
                }
                match merger.add_labeled(&profile, &labels) {
                    Ok(()) => {
                        requests = requests.zip(iso.requests).map(|(a, b)| a.saturating_add(b));
                    }
                    Err(e) => failures.push(fail(format!("cannot merge: {e}"))),
                }
            }
            for t in by_machine.get(machine.as_str()).into_iter().flatten() {
                if !returned.contains(t.isolate.as_str()) {
                    failures.push(Failure {
                        machine: machine.clone(),
                        data_center: dc.clone(),
                        isolate: Some(t.isolate.clone()),
                        reason: "the agent returned no profile for this isolate".into(),
                    });
                }
            }
        }
        let failures_json = serde_json::to_string(&failures).unwrap_or_else(|_| "[]".into());
        self.store
            .set_session_progress(id, answered, &failures_json)
            .await?;

        if merger.is_empty() {
            let reasons: Vec<String> = failures
                .iter()
                .map(|f| match &f.isolate {
                    Some(i) => format!("{} (isolate {i}): {}", f.machine, f.reason),
                    None => format!("{}: {}", f.machine, f.reason),
                })
                .collect();
            let reason = format!("no target returned a profile: {}", reasons.join("; "));
            self.store
                .set_session_status(id, "failed", Some(&reason), None)
                .await?;
            self.metrics.captures_failed.inc();
            return Ok(());
        }
        let mut merged = match merger.finish() {
            Ok(p) => p,
            Err(e) => {
                let reason = format!("cannot merge the profiles: {e}");
                self.store
                    .set_session_status(id, "failed", Some(&reason), None)
                    .await?;
                self.metrics.captures_failed.inc();
                return Ok(());
            }
        };
        if let Some(n) = requests {
            add_comment(&mut merged, &format!("requests: {n}"));
        }
        let bytes = edgeprof_pprof::encode(&merged);
        self.store.store_profile(id, &bytes).await?;
        if let Some(n) = requests {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.store.set_session_requests(id, n).await?;
        }
        if failures.is_empty() {
            self.store
                .set_session_status(id, "done", None, None)
                .await?;
            self.metrics.captures_done.inc();
        } else {
            let mut names: Vec<&str> = failures.iter().map(|f| f.machine.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let detail = format!("no profile from {}", names.join(", "));
            self.store
                .set_session_status(id, "partial", None, Some(&detail))
                .await?;
            self.metrics.captures_partial.inc();
        }
        Ok(())
    }
}

/// Adds a header comment (`go tool pprof` prints it above the report).
fn add_comment(profile: &mut edgeprof_pprof::Profile, text: &str) {
    let index = match profile.string_table.iter().position(|s| s == text) {
        Some(i) => i,
        None => {
            profile.string_table.push(text.to_owned());
            profile.string_table.len() - 1
        }
    };
    let index = index as i64;
    if !profile.comment.contains(&index) {
        profile.comment.push(index);
    }
}

async fn call_agent(
    address: &str,
    request: v1::CaptureRequest,
    deadline: Duration,
    settings: &CaptureSettings,
) -> Result<v1::CaptureResponse, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("bad gRPC address `{address}`: {e}"))?
        .connect_timeout(Duration::from_secs(3).min(deadline));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {}", settings.agent_secret)
        .parse()
        .map_err(|_| "the agent secret is not a valid header value".to_owned())?;
    let mut client = v1::node_agent_client::NodeAgentClient::with_interceptor(
        channel,
        move |mut req: tonic::Request<()>| {
            req.metadata_mut().insert("authorization", auth.clone());
            Ok(req)
        },
    )
    .max_decoding_message_size(settings.max_agent_response_bytes);
    let mut req = tonic::Request::new(request);
    req.set_timeout(deadline);
    client
        .capture(req)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| match s.code() {
            // The agent saw its grpc-timeout pass: the same outcome as ours.
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => format!(
                "did not answer within {:.1} s (duration + slack)",
                deadline.as_secs_f64()
            ),
            code => format!("Capture failed: {} ({code:?})", s.message()),
        })
}
