//! Isolates of deployed script versions, each on its own thread.
//!
//! Tenancy: a script is a [`ScriptKey`] (account, script) and a Durable
//! Object an [`ObjectKey`] (account, script, namespace, id); nothing here is
//! looked up by a name alone, so two accounts' same-named scripts or
//! objects never meet.
//!
//! A Wasmtime store serves one request at a time, so every isolate lives on a
//! dedicated OS thread that takes jobs from a channel. The thread also
//! *instantiates* the isolate (start function, `edgeprof_heap_seed`) under
//! the request CPU limit: no lock is held and no async worker waits while
//! a module starts, and a module that fails to start fails the requests
//! queued for it (and, for [`START_FAILURE_TTL`], the next ones at once).
//!
//! Isolates are bounded: at most `max_isolates` per machine and
//! `max_isolates_per_account` per account ([`Caps`]); a reservation is held
//! by the isolate's thread, so threads are bounded by the same caps. A
//! [`Pool`] per script version grows to `per_version` when every isolate is
//! busy and shrinks when isolates sit idle. A Durable Object gets an isolate
//! of its own, served only while its placement lease holds
//! ([`crate::lease`]): every request to it carries the lease's end, and the
//! isolate thread refuses a request it would start later
//! ([`ServeError::Fenced`]); an object idle for the idle time is reclaimed
//! like any isolate (its in-memory state with it).
//!
//! An isolate evicted for exceeding its memory limit keeps, as its final
//! memory reading, the size it tried to grow to; evicted isolates wait in a
//! queue until a heartbeat has reported that reading ([`Hosting::take_evicted`]).
//!
//! Profiling never goes through the job channel: the capture path holds a
//! [`ProfilerHandle`] per isolate and flips it from another thread while
//! requests keep running. With continuous profiling on
//! ([`Hosting::with_continuous`]), every isolate starts its continuous CPU
//! and heap captures on its thread before it is published, and an isolate
//! whose thread ended (evicted, reclaimed, replaced, dropped) waits in a
//! bounded queue ([`Hosting::take_departed`]) until the collector has taken
//! the samples of its last window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgeprof_sampler::{
    CaptureOwner, EvictionReason, Isolate, IsolateError, Limits, Module, ProfileKind,
    ProfilerHandle, Request, Response, Runtime,
};
use tokio::sync::oneshot;

use crate::lease::{Leases, Lookup};
use crate::metrics::Metrics;

/// A deployed script: the account that owns it and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScriptKey {
    /// Owning account.
    pub account: String,
    /// Script name (unique within the account only).
    pub script: String,
}

impl std::fmt::Display for ScriptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of account {}", self.script, self.account)
    }
}

/// A Durable Object: its script (and so its account), namespace and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// The script implementing it.
    pub script: ScriptKey,
    /// Namespace within the script.
    pub namespace: String,
    /// 64-hex id.
    pub id: String,
}

impl ObjectKey {
    /// `namespace:id`, as heartbeats list it beside the isolate's account
    /// and script.
    pub fn wire(&self) -> String {
        format!("{}:{}", self.namespace, self.id)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} ({})", self.namespace, self.id, self.script)
    }
}

/// What a request to an isolate can end in, besides a response.
#[derive(Debug)]
pub enum ServeError {
    /// The worker failed the request (trap, exceeded memory, CPU limit, or
    /// the isolate could not start): the one short line the client is told
    /// ([`short_message`]; details go to the agent's log).
    Worker(String),
    /// The isolate is gone (evicted or shut down) before answering.
    Gone,
    /// The Durable Object's lease ran out before the request could start.
    Fenced,
}

/// Why no isolate could be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A cap on live isolates is reached (503).
    #[error("{0}")]
    AtCapacity(String),
    /// The version failed to start moments ago (502, not retried yet).
    #[error(
        "{script} version {version} failed to start {ago_s} s ago ({message}); it is tried again {ttl_s} s after that"
    )]
    Failing {
        /// Which script.
        script: ScriptKey,
        /// Which version.
        version: String,
        /// Seconds since.
        ago_s: u64,
        /// Why it failed (short).
        message: String,
        /// [`START_FAILURE_TTL`] in seconds.
        ttl_s: u64,
    },
    /// The OS refused a thread.
    #[error("cannot start an isolate thread: {0}")]
    Thread(String),
}

/// How long a version that failed to start is refused before it is tried again.
pub const START_FAILURE_TTL: Duration = Duration::from_secs(10);

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
    /// Owning account and script.
    pub key: ScriptKey,
    /// Script version id.
    pub version_id: String,
    /// The Durable Object this isolate hosts, if any.
    pub durable_object: Option<ObjectKey>,
    /// Flips profiling on and off without going through the job channel;
    /// set once the isolate has started on its thread.
    profiler: OnceLock<ProfilerHandle>,
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

    /// The isolate's profiler, once it has started.
    pub fn profiler(&self) -> Option<ProfilerHandle> {
        self.profiler.get().cloned()
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

    /// What the host holds for the isolate as of its last request
    /// ([`edgeprof_sampler::Isolate::host_bytes`]: linear memory, tables,
    /// kept logs, profiler buffers); for an isolate evicted for exceeding
    /// memory, the linear memory size it tried to grow to.
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
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        result
    }

    /// Stops serving: queued and later requests get [`ServeError::Gone`].
    fn retire(&self) {
        self.gone.store(true, Ordering::Release);
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

/// A pool's key: the account, and a version of one of its scripts.
type PoolKey = (String, String);

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

/// Most ended isolates kept for the continuous collector; beyond it the
/// oldest go with the samples of their last window (counted).
pub const MAX_DEPARTED_KEPT: usize = 4096;

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

/// Bounds on live isolates (and so on isolate threads).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Most isolates of one busy script version.
    pub per_version: usize,
    /// Most isolates on this machine.
    pub machine: usize,
    /// Most isolates of one account on this machine.
    pub account: usize,
}

/// Live isolates (threads included: a reservation lives as long as its
/// isolate's thread), in all and per account.
#[derive(Debug, Default)]
struct Capacity {
    live: usize,
    per_account: HashMap<String, usize>,
}

/// One isolate's share of [`Capacity`], given back when its thread ends.
struct Reservation {
    capacity: Arc<Mutex<Capacity>>,
    account: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut c = self.capacity.lock().unwrap_or_else(|e| e.into_inner());
        c.live = c.live.saturating_sub(1);
        if let Some(n) = c.per_account.get_mut(&self.account) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_account.remove(&self.account);
            }
        }
    }
}

/// Versions that failed to start recently: version id → (when, why).
type StartFailures = Mutex<HashMap<String, (Instant, String)>>;

/// Most remembered start failures (the oldest are forgotten first).
const MAX_START_FAILURES: usize = 10_000;

/// Everything this machine hosts.
pub struct Hosting {
    runtime: Runtime,
    limits: Limits,
    caps: Caps,
    machine_id: String,
    next_id: AtomicU64,
    pools: Mutex<HashMap<PoolKey, Pool>>,
    /// Objects placed here, with their leases.
    durable_objects: Mutex<Leases<ObjectKey, PlacedObject>>,
    capacity: Arc<Mutex<Capacity>>,
    start_failures: Arc<StartFailures>,
    evicted: Arc<EvictedQueue>,
    /// Continuous profiling's CPU interval, if it is on.
    continuous: Option<Duration>,
    /// Isolates whose thread ended since the collector last looked.
    departed: Arc<EvictedQueue>,
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
    /// Owning account and script.
    pub key: ScriptKey,
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
        caps: Caps,
        machine_id: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        Hosting {
            runtime,
            limits,
            caps,
            machine_id,
            next_id: AtomicU64::new(1),
            pools: Mutex::new(HashMap::new()),
            durable_objects: Mutex::new(Leases::default()),
            capacity: Arc::default(),
            start_failures: Arc::default(),
            evicted: Arc::default(),
            continuous: None,
            departed: Arc::default(),
            metrics,
        }
    }

    /// Profiles every isolate started from now on continuously: CPU every
    /// `interval` (whole ticks of the runtime) and heap.
    pub fn with_continuous(mut self, interval: Duration) -> Self {
        self.continuous = Some(interval);
        self
    }

    /// Isolates whose thread ended since the last call, oldest first: their
    /// continuous captures still hold the samples of their last window.
    pub fn take_departed(&self) -> Vec<Arc<Slot>> {
        let mut q = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        q.drain(..).collect()
    }

    /// The engine isolates run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn lock_pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Pool>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An isolate of `version` to send a request to: the least busy live
    /// one, or a new one when all are busy and the pool (and the caps) may
    /// grow. At a cap, a busy isolate of the version is used if there is one.
    pub fn pick(&self, version: &VersionRef) -> Result<Arc<Slot>, StartError> {
        self.check_start_failure(version)?;
        let mut pools = self.lock_pools();
        let pool = pools
            .entry((version.key.account.clone(), version.version_id.clone()))
            .or_default();
        pool.slots.retain(|s| s.is_live());
        let best = pool.slots.iter().min_by_key(|s| s.queued()).cloned();
        match best {
            Some(s) if s.queued() == 0 || pool.slots.len() >= self.caps.per_version => Ok(s),
            best => match self.spawn(version, None, pool.evictions.clone()) {
                Ok(slot) => {
                    pool.slots.push(slot.clone());
                    Ok(slot)
                }
                Err(StartError::AtCapacity(_)) if best.is_some() => {
                    Ok(best.expect("checked just now"))
                }
                Err(e) => Err(e),
            },
        }
    }

    fn check_start_failure(&self, version: &VersionRef) -> Result<(), StartError> {
        let failures = self
            .start_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match failures.get(&version.version_id) {
            Some((at, message)) if at.elapsed() < START_FAILURE_TTL => Err(StartError::Failing {
                script: version.key.clone(),
                version: version.version_id.clone(),
                ago_s: at.elapsed().as_secs(),
                message: message.clone(),
                ttl_s: START_FAILURE_TTL.as_secs(),
            }),
            _ => Ok(()),
        }
    }

    fn lock_objects(&self) -> std::sync::MutexGuard<'_, Leases<ObjectKey, PlacedObject>> {
        // Every update leaves the table consistent (one insert or remove).
        self.durable_objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Where requests for Durable Object `key` go here. A leased object
    /// whose isolate was evicted gets a fresh isolate of the version it was
    /// placed with.
    pub fn durable_object(&self, key: &ObjectKey) -> Result<ObjectHere, StartError> {
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
        let version = placed.version.clone();
        self.check_start_failure(&version)?;
        placed.slot = self.spawn_object(key, &version)?;
        Ok(ObjectHere::Serving(placed.slot.clone(), until))
    }

    /// Whether one more isolate of `account` could start now (checked
    /// before a Durable Object is placed here, so a flood of new objects
    /// over the cap creates no placements either).
    pub fn has_room(&self, account: &str) -> Result<(), StartError> {
        let c = self.capacity.lock().unwrap_or_else(|e| e.into_inner());
        self.room_in(&c, account)
    }

    fn room_in(&self, c: &Capacity, account: &str) -> Result<(), StartError> {
        if c.live >= self.caps.machine {
            return Err(StartError::AtCapacity(format!(
                "this machine runs its limit of {} isolates (--max-isolates); try again later",
                self.caps.machine
            )));
        }
        if c.per_account.get(account).copied().unwrap_or(0) >= self.caps.account {
            return Err(StartError::AtCapacity(format!(
                "account `{account}` runs its limit of {} isolates on this machine (--max-isolates-per-account); try again later",
                self.caps.account
            )));
        }
        Ok(())
    }

    fn reserve(&self, account: &str) -> Result<Reservation, StartError> {
        let mut c = self.capacity.lock().unwrap_or_else(|e| e.into_inner());
        self.room_in(&c, account)?;
        c.live += 1;
        *c.per_account.entry(account.to_owned()).or_default() += 1;
        Ok(Reservation {
            capacity: self.capacity.clone(),
            account: account.to_owned(),
        })
    }

    /// Live isolate reservations (= isolate threads): in all, and of `account`.
    #[cfg(test)]
    pub fn live_isolates(&self, account: &str) -> (usize, usize) {
        let c = self.capacity.lock().unwrap_or_else(|e| e.into_inner());
        (c.live, c.per_account.get(account).copied().unwrap_or(0))
    }

    /// The control plane answered a call sent at `sent`: `key` lives here
    /// under placement `placed_at_ms`, running `version`, leased for
    /// `lease`. Keeps the isolate of that placement (its state) or starts
    /// one; returns it and its lease's end.
    pub fn confirm_durable_object(
        &self,
        key: &ObjectKey,
        version: &VersionRef,
        placed_at_ms: i64,
        sent: Instant,
        lease: Duration,
    ) -> Result<(Arc<Slot>, Instant), StartError> {
        let mut objects = self.lock_objects();
        let (placed, until, replaced) = objects.confirm(key, placed_at_ms, sent, lease, || {
            self.check_start_failure(version)?;
            Ok::<_, StartError>(PlacedObject {
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
            _ => Err(StartError::AtCapacity(format!(
                "durable object {key}: its lease ended while it was confirmed; retry"
            ))),
        }
    }

    /// Drops Durable Object `key`: the control plane placed it elsewhere.
    pub fn drop_durable_object(&self, key: &ObjectKey) {
        if let Some(old) = self.lock_objects().remove(key) {
            tracing::info!(object = %key, isolate = %old.slot.id, "durable object placed elsewhere: dropped");
            old.slot.retire();
        }
    }

    /// A heartbeat sent at `sent` listing `listed` was acknowledged with
    /// `lease`, naming `elsewhere` as now placed on other machines: those
    /// are dropped, the other listed ones renewed.
    pub fn durable_objects_renewed(
        &self,
        listed: &[ObjectKey],
        elsewhere: &[ObjectKey],
        sent: Instant,
        lease: Duration,
    ) {
        let dropped = self.lock_objects().renewed(listed, elsewhere, sent, lease);
        for (key, old) in dropped {
            tracing::info!(object = %key, isolate = %old.slot.id, "durable object placed elsewhere: dropped");
            old.slot.retire();
        }
    }

    fn spawn_object(&self, key: &ObjectKey, version: &VersionRef) -> Result<Arc<Slot>, StartError> {
        let evictions = self
            .lock_pools()
            .entry((version.key.account.clone(), version.version_id.clone()))
            .or_default()
            .evictions
            .clone();
        self.spawn(version, Some(key.clone()), evictions)
    }

    /// Every live isolate.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        let mut out: Vec<Arc<Slot>> = Vec::new();
        for pool in self.lock_pools().values() {
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

    /// Eviction counters of a version of `account`: (total, exceeded memory).
    pub fn evictions(&self, account: &str, version_id: &str) -> (u64, u64) {
        self.lock_pools()
            .get(&(account.to_owned(), version_id.to_owned()))
            .map(|p| {
                (
                    p.evictions.total.load(Ordering::Acquire),
                    p.evictions.memory.load(Ordering::Acquire),
                )
            })
            .unwrap_or((0, 0))
    }

    /// Drops isolates idle longer than `idle` (their threads exit), Durable
    /// Objects' included (their in-memory state goes with them; the next
    /// request asks the control plane again), and pools left empty.
    pub fn reclaim_idle(&self, idle: Duration) -> usize {
        let mut n = 0;
        self.lock_pools().retain(|_, pool| {
            pool.slots.retain(|s| {
                let keep = s.is_live() && (s.queued() > 0 || s.idle_for() < idle);
                if !keep {
                    s.retire();
                    n += 1;
                }
                keep
            });
            !pool.slots.is_empty() || pool.evictions.total.load(Ordering::Acquire) > 0
        });
        let dropped = self
            .lock_objects()
            .remove_where(|_, o| o.slot.queued() == 0 && o.slot.idle_for() >= idle);
        for (key, o) in dropped {
            tracing::debug!(object = %key, isolate = %o.slot.id, "idle durable object reclaimed");
            o.slot.retire();
            n += 1;
        }
        let mut failures = self
            .start_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        failures.retain(|_, (at, _)| at.elapsed() < START_FAILURE_TTL);
        n
    }

    /// Starts an isolate of `version` on a thread of its own: the slot is
    /// returned at once (requests queue in its channel) while the thread
    /// instantiates the module under the request CPU limit.
    fn spawn(
        &self,
        version: &VersionRef,
        durable_object: Option<ObjectKey>,
        evictions: Arc<EvictionCounts>,
    ) -> Result<Arc<Slot>, StartError> {
        let reservation = self.reserve(&version.key.account)?;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{}", self.machine_id, n);
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let slot = Arc::new(Slot {
            id: id.clone(),
            key: version.key.clone(),
            version_id: version.version_id.clone(),
            durable_object,
            profiler: OnceLock::new(),
            jobs: tx,
            queued: AtomicUsize::new(0),
            window: Mutex::new(Window {
                buckets: [0; 60],
                seconds: [0; 60],
            }),
            last_request_ms: AtomicI64::new(0),
            last_used: Mutex::new(Instant::now()),
            memory_bytes: AtomicU64::new(0),
            gone: AtomicBool::new(false),
        });
        let thread_slot = slot.clone();
        let counters = Counters {
            metrics: self.metrics.clone(),
            evictions,
            evicted: self.evicted.clone(),
            start_failures: self.start_failures.clone(),
            continuous: self.continuous,
            departed: self.departed.clone(),
        };
        let (runtime, module, limits) = (self.runtime.clone(), version.module.clone(), self.limits);
        std::thread::Builder::new()
            .name(format!("isolate-{id}"))
            .spawn(move || {
                let _reservation = reservation;
                let Some(isolate) =
                    start_isolate(&runtime, &module, limits, &thread_slot, &rx, &counters)
                else {
                    return;
                };
                let (departed, metrics) = (counters.departed.clone(), counters.metrics.clone());
                let continuous = counters.continuous.is_some();
                serve_loop(isolate, rx, thread_slot.clone(), counters);
                if continuous {
                    let mut q = departed.lock().unwrap_or_else(|e| e.into_inner());
                    q.push_back(thread_slot);
                    if q.len() > MAX_DEPARTED_KEPT {
                        let n = q.len() - MAX_DEPARTED_KEPT;
                        q.drain(..n);
                        metrics.continuous_departed_lost(n as u64);
                    }
                }
            })
            .map_err(|e| StartError::Thread(e.to_string()))?;
        Ok(slot)
    }
}

/// Instantiates the isolate on its own thread. On failure the slot is
/// retired, the version remembered as failing ([`START_FAILURE_TTL`]), and
/// every request queued so far answered with the cause.
fn start_isolate(
    runtime: &Runtime,
    module: &Module,
    limits: Limits,
    slot: &Arc<Slot>,
    jobs: &std::sync::mpsc::Receiver<Job>,
    counters: &Counters,
) -> Option<Isolate> {
    match Isolate::new(runtime, module, limits) {
        Ok(isolate) => {
            let profiler = isolate.profiler();
            if let Some(interval) = counters.continuous {
                for kind in [ProfileKind::Cpu, ProfileKind::Heap] {
                    if let Err(e) = profiler.start_for(CaptureOwner::Continuous, kind, interval) {
                        tracing::warn!(isolate = %slot.id, script = %slot.key, "cannot start continuous {kind:?} profiling: {e}");
                    }
                }
            }
            let _ = slot.profiler.set(profiler);
            slot.memory_bytes
                .store(isolate.host_bytes(), Ordering::Relaxed);
            Some(isolate)
        }
        Err(e) => {
            slot.retire();
            let short = short_message(&e);
            tracing::warn!(isolate = %slot.id, script = %slot.key, version = %slot.version_id, "isolate failed to start: {}", truncate(&e.to_string(), LOGGED_ERROR_BYTES));
            {
                let mut failures = counters
                    .start_failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if failures.len() >= MAX_START_FAILURES {
                    failures.clear();
                }
                failures.insert(slot.version_id.clone(), (Instant::now(), short.clone()));
            }
            counters.metrics.request(false, Duration::ZERO);
            // Requests sent before the slot was retired are in the channel
            // (or about to be): each hears why. Later ones find the slot
            // retired, and the failure remembered.
            while let Ok((_, _, reply)) = jobs.recv_timeout(Duration::from_millis(10)) {
                let _ = reply.send(Err(ServeError::Worker(short.clone())));
            }
            None
        }
    }
}

/// Most bytes of a worker error written to the agent's log.
pub const LOGGED_ERROR_BYTES: usize = 8 << 10;

/// `s` cut to at most `max` bytes (on a char boundary), marked when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &s[..end], s.len() - end)
}

/// What the public is told about a worker's failure: one short line. A
/// trap's backtrace (often hundreds of kilobytes) goes to the agent's log.
pub fn short_message(e: &IsolateError) -> String {
    match e {
        IsolateError::Trap(_) => {
            "the worker trapped; its isolate was discarded (details in the agent's log)".into()
        }
        IsolateError::ExceededCpu { .. }
        | IsolateError::ExceededMemory { .. }
        | IsolateError::Evicted(_) => e.to_string(),
        other => {
            let text = other.to_string();
            truncate(text.lines().next().unwrap_or_default(), 300)
        }
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
    /// Versions that failed to start.
    start_failures: Arc<StartFailures>,
    /// Continuous profiling's CPU interval, if it is on.
    continuous: Option<Duration>,
    /// Where the thread leaves its slot when it ends, for the collector.
    departed: Arc<EvictedQueue>,
}

/// How often an idle isolate thread checks whether it was retired.
const RETIRED_CHECK: Duration = Duration::from_secs(1);

/// Most bytes of one request's worker logs written to the agent's log.
const LOGGED_WORKER_BYTES: usize = 4 << 10;

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
        // Logs are drained every request: the host keeps none between them.
        let (logs, dropped) = isolate.take_logs();
        if !logs.is_empty() {
            let text = logs.join("\n");
            tracing::debug!(isolate = %slot.id, script = %slot.key, lines = logs.len(), dropped, "worker log: {}", truncate(&text, LOGGED_WORKER_BYTES));
        }
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
            _ => isolate.host_bytes(),
        };
        slot.memory_bytes.store(memory, Ordering::Relaxed);
        counters.metrics.request(result.is_ok(), started.elapsed());
        let evicted = isolate.eviction();
        if let Some(reason) = evicted {
            // Retired and queued for the next heartbeat before the counters
            // move and before the caller hears of it: a heartbeat that counts
            // the eviction also carries the final reading.
            slot.retire();
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
            let detail = match &result {
                Err(e) => truncate(&e.to_string(), LOGGED_ERROR_BYTES),
                Ok(_) => String::new(),
            };
            tracing::info!(isolate = %slot.id, script = %slot.key, ?reason, memory_bytes = memory, "isolate evicted: {detail}");
        }
        if let Err(e) = &result
            && evicted.is_none()
        {
            tracing::debug!(isolate = %slot.id, script = %slot.key, "request failed: {}", truncate(&e.to_string(), LOGGED_ERROR_BYTES));
        }
        let _ = reply.send(result.map_err(|e| ServeError::Worker(short_message(&e))));
        if evicted.is_some() {
            // Requests already queued get `Gone` and are retried by the caller.
            while let Ok((_, _, reply)) = jobs.try_recv() {
                let _ = reply.send(Err(ServeError::Gone));
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprof_sampler::RuntimeConfig;

    /// A worker answering every request `200` with an empty body.
    fn worker(extra: &str) -> String {
        format!(
            r#"(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgeprof_handle") (param i32 i32) (result i64) (i64.const 12))
  {extra})"#
        )
    }

    const LOOPING_START: &str = "(func $start (loop $l (br $l))) (start $start)";
    const LOOPING_SEED: &str =
        r#"(func (export "edgeprof_heap_seed") (param i64) (loop $l (br $l)))"#;

    fn hosting(machine: &str, caps: Caps, cpu: Duration) -> Hosting {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let limits = Limits {
            cpu_per_request: cpu,
            ..Limits::default()
        };
        Hosting::new(
            runtime,
            limits,
            caps,
            machine.into(),
            Arc::new(Metrics::default()),
        )
    }

    const CAPS: Caps = Caps {
        per_version: 4,
        machine: 64,
        account: 64,
    };

    fn version(h: &Hosting, account: &str, script: &str, wat: &str) -> VersionRef {
        let module = h
            .runtime()
            .load_module(&format!("{script}.wasm"), wat.as_bytes())
            .unwrap();
        VersionRef {
            key: ScriptKey {
                account: account.into(),
                script: script.into(),
            },
            version_id: format!("{account}-{script}-v1"),
            module: Arc::new(module),
        }
    }

    async fn get(h: &Hosting, v: &VersionRef) -> Result<u16, String> {
        let slot = h.pick(v).map_err(|e| e.to_string())?;
        match slot.serve(Request::get("/"), None).await {
            Ok(r) => Ok(r.status),
            Err(ServeError::Worker(m)) => Err(m),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// Waits (bounded) until `done` holds.
    async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Regression test for issue 10: a module whose start function or
    /// `edgeprof_heap_seed` loops was instantiated in `pick`, holding the
    /// pools lock with no CPU deadline, and wedged every script.
    #[tokio::test]
    async fn a_module_that_loops_while_starting_fails_its_request_and_blocks_no_one() {
        let h = hosting("m1", CAPS, Duration::from_millis(300));
        let ok = version(&h, "b", "api", &worker(""));
        assert_eq!(get(&h, &ok).await, Ok(200));
        for (name, extra) in [("start", LOOPING_START), ("seed", LOOPING_SEED)] {
            let bad = version(&h, "a", name, &worker(extra));
            let started = Instant::now();
            let slot = h.pick(&bad).expect("picking never waits for start-up");
            assert!(started.elapsed() < Duration::from_millis(100), "{name}");
            let looping = tokio::spawn(async move { slot.serve(Request::get("/"), None).await });
            // While it loops, the other account's script answers at once.
            let mut answered = 0;
            while !looping.is_finished() {
                let t = Instant::now();
                assert_eq!(get(&h, &ok).await, Ok(200), "{name}");
                assert!(
                    t.elapsed() < Duration::from_millis(100),
                    "{name}: {:?}",
                    t.elapsed()
                );
                answered += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                answered > 0,
                "{name}: start-up did not take long enough to test"
            );
            match looping.await.unwrap() {
                Err(ServeError::Worker(m)) => assert_eq!(
                    m, "Exceeded CPU: the request ran past its CPU-time limit of 300ms",
                    "{name}"
                ),
                other => panic!("{name}: {other:?}"),
            }
            // The failure is remembered: the next request fails at once.
            let again = h.pick(&bad).unwrap_err().to_string();
            assert!(
                again.starts_with(&format!(
                    "{name} of account a version a-{name}-v1 failed to start"
                )) && again.contains("Exceeded CPU"),
                "{again}"
            );
            // Its isolate (thread and reservation) is gone.
            wait_until("the failed isolate's thread ended", || {
                h.live_isolates("a") == (1, 0)
            })
            .await;
        }
    }

    fn object(account: &str, n: u64) -> ObjectKey {
        ObjectKey {
            script: ScriptKey {
                account: account.into(),
                script: "counter".into(),
            },
            namespace: "counter".into(),
            id: format!("{n:064x}"),
        }
    }

    /// Isolate threads of machine `do` in this process (`/proc/self/task`
    /// names them).
    fn isolate_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("isolate-do-"))
            .count()
    }

    /// Regression test for issue 10: 7,000 random Durable Object ids made
    /// 6,448 threads, and then no isolate of any script could start.
    #[tokio::test]
    async fn random_durable_objects_stay_under_the_caps_and_idle_ones_are_reclaimed() {
        let caps = Caps {
            per_version: 4,
            machine: 12,
            account: 8,
        };
        let h = hosting("do", caps, Duration::from_secs(5));
        let counter = version(&h, "a", "counter", &worker(""));
        let counter_b = version(&h, "b", "counter", &worker(""));
        let other = version(&h, "b", "api", &worker(""));
        let lease = Duration::from_secs(60);
        let (mut served, mut refused) = (0, 0);
        for n in 0..300 {
            match h.confirm_durable_object(&object("a", n), &counter, 1, Instant::now(), lease) {
                Ok((slot, until)) => {
                    let r = slot.serve(Request::get("/"), Some(until)).await;
                    assert!(r.is_ok(), "{r:?}");
                    served += 1;
                }
                Err(e) => {
                    assert_eq!(
                        e.to_string(),
                        "account `a` runs its limit of 8 isolates on this machine (--max-isolates-per-account); try again later"
                    );
                    refused += 1;
                }
            }
            assert!(h.live_isolates("a").1 <= 8);
            assert!(
                isolate_threads() <= caps.machine,
                "{} threads",
                isolate_threads()
            );
        }
        assert_eq!((served, refused), (8, 292));
        // Another account still gets isolates, up to the machine's cap.
        assert_eq!(get(&h, &other).await, Ok(200));
        for n in 0..3 {
            h.confirm_durable_object(&object("b", n), &counter_b, 1, Instant::now(), lease)
                .unwrap();
        }
        let full = h
            .confirm_durable_object(&object("b", 9), &counter_b, 1, Instant::now(), lease)
            .unwrap_err();
        assert_eq!(
            full.to_string(),
            "this machine runs its limit of 12 isolates (--max-isolates); try again later"
        );
        assert!(matches!(h.has_room("c"), Err(StartError::AtCapacity(_))));
        // Idle isolates, objects included, are reclaimed: threads end and
        // the room comes back.
        assert_eq!(h.reclaim_idle(Duration::ZERO), 12);
        wait_until("every isolate thread ended", || {
            h.live_isolates("a") == (0, 0) && isolate_threads() == 0
        })
        .await;
        assert!(h.has_room("c").is_ok());
        assert_eq!(get(&h, &other).await, Ok(200));
    }
}
