//! Capture sessions: the per-script concurrency limit ([`slots`], kept in
//! the database so every replica admits against the same captures), the
//! fan-out of `NodeAgent.Capture` to every target machine at once
//! ([`agent`]), the labelled merge ([`merge`], pure), and the session's
//! state changes (`pending → capturing → merging → done | partial |
//! failed`), each persisted as it happens.
//!
//! Imports `store`, `fleet`'s data and leaf modules; never `api` or
//! `registry`.

pub mod agent;
pub mod merge;
pub mod slots;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeprof_proto::rest::{ProfileKind, SessionStatus, Target};
use edgeprof_proto::v1;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::names::{AccountId, DurableObjectId, ScriptName};
use crate::store::{SessionRow, SlotRow, Store, StoreError};

pub use merge::{Limits, Outcome, merge_responses};
pub use slots::{Busy, BusyReason};

/// A validated capture request, its version resolved and targets found.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    /// Owning account.
    pub account: AccountId,
    /// Script.
    pub script: ScriptName,
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
    /// The Durable Object profiled.
    pub durable_object: Option<DurableObjectId>,
    /// Isolates to capture (at least one).
    pub targets: Vec<Target>,
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
    /// What one capture accepts from agents.
    pub limits: Limits,
    /// The control-plane replica running the captures (recorded with each
    /// session and slot, so others can fail them if it stops).
    pub replica_id: String,
}

/// How often a capture writes its progress (machines answered, failures)
/// while answers come in.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Room in one agent's answer for error strings beyond its profiles (the
/// strings are stored truncated).
const ANSWER_SLACK_BYTES: usize = 16 << 20;

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

/// Starts and runs capture sessions.
#[derive(Clone)]
pub struct Captures {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    settings: Arc<CaptureSettings>,
    clock: Clock,
    running: Arc<AtomicUsize>,
    finished: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl std::fmt::Debug for Captures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captures").finish_non_exhaustive()
    }
}

fn to_proto(kind: ProfileKind) -> v1::ProfileKind {
    match kind {
        ProfileKind::Cpu => v1::ProfileKind::Cpu,
        ProfileKind::Heap => v1::ProfileKind::Heap,
    }
}

impl Captures {
    /// A capture runner over `store`, reading time from `clock`.
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        settings: CaptureSettings,
        clock: Clock,
    ) -> Self {
        Captures {
            store,
            metrics,
            settings: Arc::new(settings),
            clock,
            running: Arc::default(),
            finished: Arc::default(),
        }
    }

    /// Captures in progress in this process.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Stores a `pending` session and starts capturing in the background;
    /// returns the stored session.
    pub async fn start(&self, spec: CaptureSpec) -> Result<SessionRow, StartError> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = self.clock.now_ms();
        let until = spec.duration + self.settings.slack;
        let slot = SlotRow {
            session_id: id.clone(),
            end_ms: now.saturating_add(i64::try_from(until.as_millis()).unwrap_or(i64::MAX)),
            isolates: spec
                .targets
                .iter()
                .map(|t| format!("{}/{}", t.machine, t.isolate))
                .collect(),
        };
        let (account, script) = (spec.account.to_string(), spec.script.to_string());
        let max = self.settings.max_per_script;
        let replica = self.settings.replica_id.as_str();
        self.store
            .take_capture_slot((&account, &script), replica, &slot, now, |running| {
                slots::admit(running, &slot.isolates, now, max)
            })
            .await?
            .map_err(|busy| {
                self.metrics.captures_rate_limited.inc();
                StartError::Busy(busy)
            })?;
        let guard = Running::new(self.running.clone());
        let machines: std::collections::BTreeSet<&str> =
            spec.targets.iter().map(|t| t.machine.as_str()).collect();
        let row = SessionRow {
            id: id.clone(),
            account: spec.account.to_string(),
            script: spec.script.to_string(),
            version_id: spec.version_id.clone(),
            version_selector: spec.version_selector.clone(),
            kind: spec.kind,
            duration_ms: spec.duration.as_millis() as i64,
            data_center: spec.data_center.clone(),
            durable_object: spec.durable_object.as_ref().map(ToString::to_string),
            status: SessionStatus::Pending,
            error: None,
            targets_json: serde_json::to_string(&spec.targets).unwrap_or_else(|_| "[]".into()),
            failures_json: "[]".into(),
            machines_total: machines.len() as i64,
            machines_answered: 0,
            created_at_ms: now,
            updated_at_ms: now,
            requests: None,
        };
        if let Err(e) = self.store.create_session_on(&row, Some(replica)).await {
            self.free_slot(&id).await;
            return Err(e.into());
        }
        self.metrics.captures_started.inc();
        let (tx, rx) = watch::channel(false);
        self.lock_finished().insert(id.clone(), rx);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.run(&id, spec).await {
                tracing::error!(session = %id, "capture: {e:#}");
                let reason = format!("internal error: {e}");
                if let Err(e) = this
                    .store
                    .set_session_status(&id, SessionStatus::Failed, Some(&reason), None)
                    .await
                {
                    tracing::error!(session = %id, "capture: cannot record failure: {e:#}");
                }
                this.metrics.capture_finished(SessionStatus::Failed);
            }
            this.free_slot(&id).await;
            drop(guard);
            let _ = tx.send(true);
            this.lock_finished().remove(&id);
        });
        Ok(row)
    }

    async fn free_slot(&self, id: &str) {
        // If this fails the slot still ends at its `end_ms`.
        if let Err(e) = self.store.free_capture_slot(id).await {
            tracing::error!(session = %id, "capture: cannot free its slot: {e:#}");
        }
    }

    fn lock_finished(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the session started by this process ends (returns at once
    /// for unknown or finished sessions).
    pub async fn wait(&self, id: &str) {
        let rx = self.lock_finished().get(id).cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Asks every machine at once, recording progress as answers come in.
    ///
    /// Each call runs as its own task, so a slow database write of the
    /// progress never holds a call back (the database also takes every
    /// agent's heartbeat); progress is written at most every
    /// [`PROGRESS_EVERY`] while answers come in, and once when the last
    /// machine has answered.
    async fn collect(
        &self,
        id: &str,
        spec: &CaptureSpec,
    ) -> Result<Vec<merge::Answer>, StoreError> {
        let mut by_machine: BTreeMap<&str, Vec<&Target>> = BTreeMap::new();
        for t in &spec.targets {
            by_machine.entry(t.machine.as_str()).or_default().push(t);
        }
        let deadline = spec.duration + self.settings.slack;
        let limits = self.settings.limits;
        // Dropped with `collect` (a shutdown), the set aborts its calls.
        let mut calls = tokio::task::JoinSet::new();
        let mut machine_of = HashMap::with_capacity(by_machine.len());
        for (machine, targets) in &by_machine {
            let address = targets[0].grpc_address.clone();
            let request = v1::CaptureRequest {
                session_id: id.to_owned(),
                isolate_ids: targets.iter().map(|t| t.isolate.clone()).collect(),
                kind: to_proto(spec.kind) as i32,
                duration_ms: spec.duration.as_millis() as u32,
                interval_us: 0,
            };
            let max_bytes = limits
                .max_profile_bytes
                .saturating_mul(targets.len())
                .saturating_add(ANSWER_SLACK_BYTES)
                .min(limits.max_capture_bytes);
            let secret = self.settings.agent_secret.clone();
            let task = calls.spawn(async move {
                let call = agent::call_agent(&address, request, deadline, &secret, max_bytes);
                tokio::time::timeout(deadline, call)
                    .await
                    .unwrap_or_else(|_| Err(agent::timed_out(deadline)))
            });
            machine_of.insert(task.id(), (*machine).to_owned());
        }
        let mut answers = Vec::with_capacity(by_machine.len());
        let mut held = 0usize;
        let mut failures = Vec::new();
        // Progress written: when, and how many answers it counted.
        let (mut written_at, mut written) = (tokio::time::Instant::now(), 0);
        loop {
            let next = calls.join_next_with_id();
            let joined = if answers.len() > written {
                // Answers not recorded yet: record them when their turn comes
                // even if no other answer arrives by then.
                match tokio::time::timeout_at(written_at + PROGRESS_EVERY, next).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        self.write_progress(id, answers.len(), &failures).await?;
                        (written_at, written) = (tokio::time::Instant::now(), answers.len());
                        continue;
                    }
                }
            } else {
                next.await
            };
            let Some(joined) = joined else { break };
            let (task, mut result) = match joined {
                Ok((task, result)) => (task, result),
                Err(e) => (e.id(), Err(format!("the call to the agent failed: {e}"))),
            };
            let machine = machine_of.remove(&task).unwrap_or_default();
            if let Ok(resp) = &result {
                let size = merge::answer_bytes(resp);
                if held.saturating_add(size) > limits.max_capture_bytes {
                    result = Err(format!(
                        "answer of {size} bytes dropped: the capture holds at most {} bytes from all agents",
                        limits.max_capture_bytes
                    ));
                } else {
                    held += size;
                }
            }
            if let Err(reason) = &result {
                tracing::warn!(session = %id, machine = %machine, "capture: {}", merge::bounded(reason));
                failures.push(edgeprof_proto::rest::Failure {
                    data_center: by_machine
                        .get(machine.as_str())
                        .map(|t| t[0].data_center.clone())
                        .unwrap_or_default(),
                    machine: machine.clone(),
                    isolate: None,
                    reason: merge::bounded(reason),
                });
            }
            answers.push((machine, result));
        }
        if answers.len() > written {
            self.write_progress(id, answers.len(), &failures).await?;
        }
        Ok(answers)
    }

    async fn write_progress(
        &self,
        id: &str,
        answered: usize,
        failures: &[edgeprof_proto::rest::Failure],
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(failures).unwrap_or_else(|_| "[]".into());
        self.store
            .set_session_progress(id, answered as i64, &json)
            .await
    }

    async fn run(&self, id: &str, spec: CaptureSpec) -> Result<(), StoreError> {
        if !self
            .store
            .set_session_status(id, SessionStatus::Capturing, None, None)
            .await?
        {
            return Ok(()); // ended meanwhile (failed by another replica)
        }
        let answers = self.collect(id, &spec).await?;
        let answered = answers.len() as i64;
        self.store
            .set_session_status(id, SessionStatus::Merging, None, None)
            .await?;
        let limits = self.settings.limits;
        // Decoding and merging is CPU work: off the async workers.
        let outcome =
            tokio::task::spawn_blocking(move || merge_responses(&spec, &answers, &limits))
                .await
                .map_err(|e| StoreError::Corrupt(format!("the merge panicked: {e}")))?;
        let failures_json =
            serde_json::to_string(&outcome.failures).unwrap_or_else(|_| "[]".into());
        self.store
            .set_session_progress(id, answered, &failures_json)
            .await?;
        if let Some(bytes) = &outcome.profile {
            self.store.store_profile(id, bytes).await?;
        }
        if let Some(n) = outcome.requests {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.store.set_session_requests(id, n).await?;
        }
        self.store
            .set_session_status(
                id,
                outcome.status,
                outcome.error.as_deref(),
                outcome.detail.as_deref(),
            )
            .await?;
        self.metrics.capture_finished(outcome.status);
        Ok(())
    }
}

/// Counts a capture of this process while alive.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Running(count)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
