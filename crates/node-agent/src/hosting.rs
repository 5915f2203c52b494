//! Isolates of deployed script versions, each on its own thread.
//!
//! A Wasmtime store serves one request at a time, so every isolate lives on a
//! dedicated OS thread that takes jobs from a channel. A [`Pool`] per script
//! version grows to `max_isolates_per_version` when every isolate is busy and
//! shrinks when isolates sit idle. A Durable Object gets an isolate of its own
//! that is never shared and never reclaimed while the object lives here, and
//! is served only while its placement lease holds ([`crate::lease`]): every
//! request to it carries the lease's end, and the isolate thread refuses a
//! request it would start later ([`ServeError::Fenced`]).
//!
//! An isolate evicted for exceeding its memory limit keeps, as its final
//! memory reading, the size it tried to grow to; evicted isolates wait in a
//! queue until a heartbeat has reported that reading ([`Hosting::take_evicted`]).
//!
//! Profiling never goes through the job channel: the capture path holds a
//! [`ProfilerHandle`] per isolate and flips it from another thread while
//! requests keep running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use edgeprof_sampler::{
    EvictionReason, Isolate, IsolateError, Limits, Module, ProfilerHandle, Request, Response,
    Runtime,
};
use tokio::sync::oneshot;

use crate::lease::{Leases, Lookup};
use crate::metrics::Metrics;

/// What a request to an isolate can end in, besides a response.
#[derive(Debug)]
pub enum ServeError {
    /// The worker failed the request (trap, exceeded memory, CPU limit…).
    Worker(String),
    /// The isolate is gone (evicted or shut down) before answering.
    Gone,
    /// The Durable Object's lease ran out before the request could start.
    Fenced,
}

/// A request, the latest moment it may start (a Durable Object's lease
/// end), and where the answer goes.
type Job = (
    Request,
    Option<Instant>,
    oneshot::Sender<Result<Response, ServeError>>,
);

/// Requests per second over the last 60 seconds.
#[derive(Debug)]
struct Window {
    buckets: [u32; 60],
    seconds: [u64; 60],
}

impl Window {
    fn record(&mut self, now_s: u64) {
        let i = (now_s % 60) as usize;
        if self.seconds[i] != now_s {
            self.seconds[i] = now_s;
            self.buckets[i] = 0;
        }
        self.buckets[i] = self.buckets[i].saturating_add(1);
    }
    fn total(&self, now_s: u64) -> u64 {
        (0..60)
            .filter(|&i| now_s.saturating_sub(self.seconds[i]) < 60)
            .map(|i| u64::from(self.buckets[i]))
            .sum()
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One isolate: its identity, its stats, and the way in.
#[derive(Debug)]
pub struct Slot {
    /// Isolate id, unique on this machine (and, with the machine id, in the fleet).
    pub id: String,
    /// Owning account.
    pub account: String,
    /// Script name.
    pub script: String,
    /// Script version id.
    pub version_id: String,
    /// `namespace:id` of the Durable Object this isolate hosts, if any.
    pub durable_object: Option<String>,
    /// Flips profiling on and off without going through the job channel.
    pub profiler: ProfilerHandle,
    jobs: std::sync::mpsc::Sender<Job>,
    queued: AtomicUsize,
    window: Mutex<Window>,
    last_request_ms: AtomicI64,
    last_used: Mutex<Instant>,
    memory_bytes: AtomicU64,
    gone: AtomicBool,
}

impl Slot {
    /// Whether the isolate is still serving.
    pub fn is_live(&self) -> bool {
        !self.gone.load(Ordering::Acquire)
    }

    /// Requests waiting or running.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests completed in the last 60 s.
    pub fn requests_last_60s(&self) -> u64 {
        let now = (unix_ms() / 1000) as u64;
        self.window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .total(now)
    }

    /// Unix ms of the last request, 0 if none.
    pub fn last_request_ms(&self) -> i64 {
        self.last_request_ms.load(Ordering::Relaxed)
    }

    /// Linear memory in use, as of the last request; for an isolate
    /// evicted for exceeding memory, the size it tried to grow to.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes.load(Ordering::Relaxed)
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Sends `request` to the isolate and waits for its answer; the
    /// isolate refuses to start it after `start_by` ([`ServeError::Fenced`]).
    pub async fn serve(
        &self,
        request: Request,
        start_by: Option<Instant>,
    ) -> Result<Response, ServeError> {
        let (tx, rx) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::Relaxed);
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if self.jobs.send((request, start_by, tx)).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ServeError::Gone);
        }
        let result = rx.await.unwrap_or(Err(ServeError::Gone));
        self.queued.fetch_sub(1, Ordering::Relaxed);
        result
    }
}

/// Evictions per script version, by cause.
#[derive(Debug, Default)]
pub struct EvictionCounts {
    /// Evictions of any cause.
    pub total: AtomicU64,
    /// Evictions for exceeding the memory limit.
    pub memory: AtomicU64,
}

/// The isolates of one script version.
#[derive(Debug, Default)]
pub struct Pool {
    slots: Vec<Arc<Slot>>,
    /// Eviction counters of this version.
    pub evictions: Arc<EvictionCounts>,
}

/// A Durable Object placed here: the version it was placed with and its
/// current isolate.
#[derive(Debug)]
struct PlacedObject {
    version: VersionRef,
    slot: Arc<Slot>,
}

/// Most evicted isolates kept for the next heartbeat; beyond it the oldest
/// readings go (with a warning), so an agent cut off from the control plane
/// stays bounded.
pub const MAX_EVICTED_KEPT: usize = 10_000;

/// Evicted isolates whose final reading no heartbeat has reported yet.
type EvictedQueue = Mutex<std::collections::VecDeque<Arc<Slot>>>;

/// Where a Durable Object's requests go on this machine.
#[derive(Debug)]
pub enum ObjectHere {
    /// Its isolate, and the end of its lease (start nothing later).
    Serving(Arc<Slot>, Instant),
    /// Placed here, but its lease ran out: ask the control plane.
    Fenced,
    /// Not placed here.
    Absent,
}

/// Everything this machine hosts.
pub struct Hosting {
    runtime: Runtime,
    limits: Limits,
    max_per_version: usize,
    machine_id: String,
    next_id: AtomicU64,
    pools: Mutex<HashMap<String, Pool>>,
    /// Objects placed here, with their leases.
    durable_objects: Mutex<Leases<PlacedObject>>,
    evicted: Arc<EvictedQueue>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Hosting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosting")
            .field("machine_id", &self.machine_id)
            .finish_non_exhaustive()
    }
}

/// Identity of what an isolate runs.
#[derive(Debug, Clone)]
pub struct VersionRef {
    /// Owning account.
    pub account: String,
    /// Script name.
    pub script: String,
    /// Version id.
    pub version_id: String,
    /// The compiled module.
    pub module: Arc<Module>,
}

impl Hosting {
    /// An empty host.
    pub fn new(
        runtime: Runtime,
        limits: Limits,
        max_per_version: usize,
        machine_id: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        Hosting {
            runtime,
            limits,
            max_per_version,
            machine_id,
            next_id: AtomicU64::new(1),
            pools: Mutex::new(HashMap::new()),
            durable_objects: Mutex::new(Leases::default()),
            evicted: Arc::default(),
            metrics,
        }
    }

    /// The engine isolates run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// An isolate of `version` to send a request to: the least busy live
    /// one, or a new one when all are busy and the pool may grow.
    pub fn pick(&self, version: &VersionRef) -> Result<Arc<Slot>> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let pool = pools.entry(version.version_id.clone()).or_default();
        pool.slots.retain(|s| s.is_live());
        let best = pool.slots.iter().min_by_key(|s| s.queued()).cloned();
        match best {
            Some(s) if s.queued() == 0 || pool.slots.len() >= self.max_per_version => Ok(s),
            _ => {
                let slot = self.spawn(version, None, pool.evictions.clone())?;
                pool.slots.push(slot.clone());
                Ok(slot)
            }
        }
    }

    fn lock_objects(&self) -> std::sync::MutexGuard<'_, Leases<PlacedObject>> {
        // Every update leaves the table consistent (one insert or remove).
        self.durable_objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Where requests for Durable Object `key` (`namespace:id`) go here. A
    /// leased object whose isolate was evicted gets a fresh isolate of the
    /// version it was placed with.
    pub fn durable_object(&self, key: &str) -> Result<ObjectHere> {
        let mut objects = self.lock_objects();
        let until = match objects.lookup(key, Instant::now()) {
            Lookup::Absent => return Ok(ObjectHere::Absent),
            Lookup::Fenced => return Ok(ObjectHere::Fenced),
            Lookup::Serving { value, until } if value.slot.is_live() => {
                return Ok(ObjectHere::Serving(value.slot.clone(), until));
            }
            Lookup::Serving { until, .. } => until,
        };
        let placed = objects.get_mut(key).expect("looked up just now");
        placed.slot = self.spawn_object(key, &placed.version)?;
        Ok(ObjectHere::Serving(placed.slot.clone(), until))
    }

    /// The control plane answered a call sent at `sent`: `key` lives here
    /// under placement `placed_at_ms`, running `version`, leased for
    /// `lease`. Keeps the isolate of that placement (its state) or starts
    /// one; returns it and its lease's end.
    pub fn confirm_durable_object(
        &self,
        key: &str,
        version: &VersionRef,
        placed_at_ms: i64,
        sent: Instant,
        lease: Duration,
    ) -> Result<(Arc<Slot>, Instant)> {
        let mut objects = self.lock_objects();
        let (placed, until, replaced) = objects.confirm(key, placed_at_ms, sent, lease, || {
            Ok::<_, anyhow::Error>(PlacedObject {
                version: version.clone(),
                slot: self.spawn_object(key, version)?,
            })
        })?;
        let slot = placed.slot.clone();
        if let Some(old) = replaced {
            tracing::info!(object = %key, isolate = %old.slot.id, "stale copy of a durable object replaced");
            old.slot.retire();
        }
        if slot.is_live() {
            return Ok((slot, until));
        }
        drop(objects);
        // Evicted while fenced: recreate it on its version.
        match self.durable_object(key)? {
            ObjectHere::Serving(slot, until) => Ok((slot, until)),
            _ => anyhow::bail!("durable object {key}: its lease ended while it was confirmed"),
        }
    }

    /// Drops Durable Object `key`: the control plane placed it elsewhere.
    pub fn drop_durable_object(&self, key: &str) {
        if let Some(old) = self.lock_objects().remove(key) {
            tracing::info!(object = %key, isolate = %old.slot.id, "durable object placed elsewhere: dropped");
            old.slot.retire();
        }
    }

    /// A heartbeat sent at `sent` listing `listed` was acknowledged with
    /// `lease`, naming `elsewhere` as now placed on other machines.
    pub fn durable_objects_renewed(
        &self,
        listed: &[String],
        elsewhere: &[String],
        sent: Instant,
        lease: Duration,
    ) {
        let dropped = self.lock_objects().renewed(listed, elsewhere, sent, lease);
        for (key, old) in dropped {
            tracing::info!(object = %key, isolate = %old.slot.id, "durable object placed elsewhere: dropped");
            old.slot.retire();
        }
    }

    fn spawn_object(&self, key: &str, version: &VersionRef) -> Result<Arc<Slot>> {
        let evictions = self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(version.version_id.clone())
            .or_default()
            .evictions
            .clone();
        self.spawn(version, Some(key.to_owned()), evictions)
    }

    /// Every live isolate.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        let mut out: Vec<Arc<Slot>> = Vec::new();
        for pool in self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            out.extend(pool.slots.iter().filter(|s| s.is_live()).cloned());
        }
        out.extend(
            self.lock_objects()
                .values()
                .filter(|o| o.slot.is_live())
                .map(|o| o.slot.clone()),
        );
        out
    }

    /// Isolates evicted since the last call, oldest first, at most `max`
    /// (the rest stay for the next call). Put them back with
    /// [`Hosting::restore_evicted`] if the heartbeat carrying them fails.
    pub fn take_evicted(&self, max: usize) -> Vec<Arc<Slot>> {
        let mut q = self.evicted.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Returns evicted isolates a failed heartbeat could not report, ahead
    /// of any evicted since.
    pub fn restore_evicted(&self, slots: Vec<Arc<Slot>>) {
        let mut q = self.evicted.lock().unwrap_or_else(|e| e.into_inner());
        for s in slots.into_iter().rev() {
            q.push_front(s);
        }
        bound_evicted(&mut q);
    }

    /// The live isolate with this id.
    pub fn find(&self, isolate_id: &str) -> Option<Arc<Slot>> {
        self.slots().into_iter().find(|s| s.id == isolate_id)
    }

    /// Eviction counters of a version: (total, exceeded memory).
    pub fn evictions(&self, version_id: &str) -> (u64, u64) {
        self.pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(version_id)
            .map(|p| {
                (
                    p.evictions.total.load(Ordering::Acquire),
                    p.evictions.memory.load(Ordering::Acquire),
                )
            })
            .unwrap_or((0, 0))
    }

    /// Drops pool isolates idle longer than `idle` (their threads exit).
    /// Durable Object isolates stay: their state lives in them.
    pub fn reclaim_idle(&self, idle: Duration) -> usize {
        let mut n = 0;
        for pool in self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values_mut()
        {
            pool.slots.retain(|s| {
                let keep = s.is_live() && (s.queued() > 0 || s.idle_for() < idle);
                if !keep {
                    s.gone.store(true, Ordering::Release);
                    n += 1;
                }
                keep
            });
        }
        n
    }

    fn spawn(
        &self,
        version: &VersionRef,
        durable_object: Option<String>,
        evictions: Arc<EvictionCounts>,
    ) -> Result<Arc<Slot>> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{}", self.machine_id, n);
        let isolate =
            Isolate::new(&self.runtime, &version.module, self.limits).with_context(|| {
                format!(
                    "cannot start an isolate of {} {}",
                    version.script, version.version_id
                )
            })?;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let slot = Arc::new(Slot {
            id: id.clone(),
            account: version.account.clone(),
            script: version.script.clone(),
            version_id: version.version_id.clone(),
            durable_object,
            profiler: isolate.profiler(),
            jobs: tx,
            queued: AtomicUsize::new(0),
            window: Mutex::new(Window {
                buckets: [0; 60],
                seconds: [0; 60],
            }),
            last_request_ms: AtomicI64::new(0),
            last_used: Mutex::new(Instant::now()),
            memory_bytes: AtomicU64::new(isolate.memory_bytes() as u64),
            gone: AtomicBool::new(false),
        });
        let thread_slot = slot.clone();
        let metrics = self.metrics.clone();
        let evicted = self.evicted.clone();
        std::thread::Builder::new()
            .name(format!("isolate-{id}"))
            .spawn(move || {
                serve_loop(
                    isolate,
                    rx,
                    thread_slot,
                    Counters {
                        metrics,
                        evictions,
                        evicted,
                    },
                )
            })
            .context("cannot start an isolate thread")?;
        Ok(slot)
    }
}

impl Slot {
    /// Stops serving: queued and later requests get [`ServeError::Gone`].
    fn retire(&self) {
        self.gone.store(true, Ordering::Release);
    }
}

fn bound_evicted(q: &mut std::collections::VecDeque<Arc<Slot>>) {
    if q.len() > MAX_EVICTED_KEPT {
        let n = q.len() - MAX_EVICTED_KEPT;
        q.drain(..n);
        tracing::warn!(
            "{n} evicted isolates' final memory readings dropped unreported (no heartbeat got through)"
        );
    }
}

/// Where an isolate thread counts what happens to it.
struct Counters {
    metrics: Arc<Metrics>,
    /// Of the isolate's version.
    evictions: Arc<EvictionCounts>,
    /// Evicted isolates awaiting a heartbeat.
    evicted: Arc<EvictedQueue>,
}

/// How often an idle isolate thread checks whether it was retired.
const RETIRED_CHECK: Duration = Duration::from_secs(1);

fn serve_loop(
    mut isolate: Isolate,
    jobs: std::sync::mpsc::Receiver<Job>,
    slot: Arc<Slot>,
    counters: Counters,
) {
    loop {
        // The slot holds the channel's sender, so the channel never closes
        // while this thread holds the slot: a retired isolate (reclaimed,
        // replaced, dropped) is noticed here, and its thread exits.
        let (request, start_by, reply) = match jobs.recv_timeout(RETIRED_CHECK) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) if slot.is_live() => continue,
            Err(_) => return,
        };
        if !slot.is_live() {
            let _ = reply.send(Err(ServeError::Gone));
            while let Ok((_, _, reply)) = jobs.try_recv() {
                let _ = reply.send(Err(ServeError::Gone));
            }
            return;
        }
        if start_by.is_some_and(|t| Instant::now() >= t) {
            let _ = reply.send(Err(ServeError::Fenced));
            continue;
        }
        let started = Instant::now();
        let result = isolate.handle(&request);
        let now_ms = unix_ms();
        slot.window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record((now_ms / 1000) as u64);
        slot.last_request_ms.store(now_ms, Ordering::Relaxed);
        // The final reading of an isolate evicted for exceeding memory is
        // the size it tried to reach: that is the demand the limit cut off.
        let memory = match &result {
            Err(IsolateError::ExceededMemory { requested, .. }) => *requested as u64,
            _ => isolate.memory_bytes() as u64,
        };
        slot.memory_bytes.store(memory, Ordering::Relaxed);
        counters.metrics.request(result.is_ok(), started.elapsed());
        let evicted = isolate.eviction();
        if let Some(reason) = evicted {
            // Retired and queued for the next heartbeat before the counters
            // move and before the caller hears of it: a heartbeat that counts
            // the eviction also carries the final reading.
            slot.gone.store(true, Ordering::Release);
            {
                let mut q = counters.evicted.lock().unwrap_or_else(|e| e.into_inner());
                q.push_back(slot.clone());
                bound_evicted(&mut q);
            }
            let exceeded_memory = reason == EvictionReason::ExceededMemory;
            counters.evictions.total.fetch_add(1, Ordering::Release);
            if exceeded_memory {
                counters.evictions.memory.fetch_add(1, Ordering::Release);
            }
            counters.metrics.eviction(exceeded_memory);
            tracing::info!(isolate = %slot.id, script = %slot.script, ?reason, memory_bytes = memory, "isolate evicted");
        }
        let _ = reply.send(result.map_err(|e| ServeError::Worker(e.to_string())));
        if evicted.is_some() {
            // Requests already queued get `Gone` and are retried by the caller.
            while let Ok((_, _, reply)) = jobs.try_recv() {
                let _ = reply.send(Err(ServeError::Gone));
            }
            return;
        }
    }
}
