//! Isolates of deployed script versions, each on its own thread.
//!
//! A Wasmtime store serves one request at a time, so every isolate lives on a
//! dedicated OS thread that takes jobs from a channel. A [`Pool`] per script
//! version grows to `max_isolates_per_version` when every isolate is busy and
//! shrinks when isolates sit idle. A Durable Object gets an isolate of its own
//! that is never shared and never reclaimed while the object lives here.
//!
//! Profiling never goes through the job channel: the capture path holds a
//! [`ProfilerHandle`] per isolate and flips it from another thread while
//! requests keep running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use edgeprof_sampler::{
    EvictionReason, Isolate, Limits, Module, ProfilerHandle, Request, Response, Runtime,
};
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// What a request to an isolate can end in, besides a response.
#[derive(Debug)]
pub enum ServeError {
    /// The worker failed the request (trap, exceeded memory, CPU limit…).
    Worker(String),
    /// The isolate is gone (evicted or shut down) before answering.
    Gone,
}

type Job = (Request, oneshot::Sender<Result<Response, ServeError>>);

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

    /// Linear memory in use, as of the last request.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes.load(Ordering::Relaxed)
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Sends `request` to the isolate and waits for its answer.
    pub async fn serve(&self, request: Request) -> Result<Response, ServeError> {
        let (tx, rx) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::Relaxed);
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if self.jobs.send((request, tx)).is_err() {
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

/// Everything this machine hosts.
pub struct Hosting {
    runtime: Runtime,
    limits: Limits,
    max_per_version: usize,
    machine_id: String,
    next_id: AtomicU64,
    pools: Mutex<HashMap<String, Pool>>,
    /// Objects placed here: the version they run and their current isolate.
    durable_objects: Mutex<HashMap<String, (VersionRef, Arc<Slot>)>>,
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
            durable_objects: Mutex::new(HashMap::new()),
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

    /// Places Durable Object `key` (`namespace:id`) here, running `version`,
    /// and returns its isolate (the existing one if it is already here).
    pub fn place_durable_object(&self, key: &str, version: &VersionRef) -> Result<Arc<Slot>> {
        let mut dos = self
            .durable_objects
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, slot)) = dos.get(key).filter(|(_, s)| s.is_live()) {
            return Ok(slot.clone());
        }
        let slot = self.spawn_object(key, version)?;
        dos.insert(key.to_owned(), (version.clone(), slot.clone()));
        Ok(slot)
    }

    /// The isolate of Durable Object `key` if it is placed here — recreated
    /// on the version it was placed with when its isolate was evicted —
    /// or `None` if it is not placed here.
    pub fn durable_object(&self, key: &str) -> Option<Result<Arc<Slot>>> {
        let mut dos = self
            .durable_objects
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (version, slot) = dos.get_mut(key)?;
        if !slot.is_live() {
            match self.spawn_object(key, version) {
                Ok(fresh) => *slot = fresh,
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(slot.clone()))
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
            self.durable_objects
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .filter(|(_, s)| s.is_live())
                .map(|(_, s)| s.clone()),
        );
        out
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
                    p.evictions.total.load(Ordering::Relaxed),
                    p.evictions.memory.load(Ordering::Relaxed),
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
        std::thread::Builder::new()
            .name(format!("isolate-{id}"))
            .spawn(move || serve_loop(isolate, rx, thread_slot, metrics, evictions))
            .context("cannot start an isolate thread")?;
        Ok(slot)
    }
}

fn serve_loop(
    mut isolate: Isolate,
    jobs: std::sync::mpsc::Receiver<Job>,
    slot: Arc<Slot>,
    metrics: Arc<Metrics>,
    evictions: Arc<EvictionCounts>,
) {
    while let Ok((request, reply)) = jobs.recv() {
        if slot.gone.load(Ordering::Acquire) {
            let _ = reply.send(Err(ServeError::Gone));
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
        slot.memory_bytes
            .store(isolate.memory_bytes() as u64, Ordering::Relaxed);
        metrics.request(result.is_ok(), started.elapsed());
        let _ = reply.send(result.map_err(|e| ServeError::Worker(e.to_string())));
        if let Some(reason) = isolate.eviction() {
            let memory = reason == EvictionReason::ExceededMemory;
            evictions.total.fetch_add(1, Ordering::Relaxed);
            if memory {
                evictions.memory.fetch_add(1, Ordering::Relaxed);
            }
            metrics.eviction(memory);
            tracing::info!(isolate = %slot.id, script = %slot.script, ?reason, "isolate evicted");
            slot.gone.store(true, Ordering::Release);
            // Requests already queued get `Gone` and are retried by the caller.
            while let Ok((_, reply)) = jobs.try_recv() {
                let _ = reply.send(Err(ServeError::Gone));
            }
            return;
        }
    }
}
