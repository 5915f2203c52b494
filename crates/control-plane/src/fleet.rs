//! The live fleet as agents report it by heartbeat, target resolution over
//! it, and the gRPC `Registry` service agents call.
//!
//! The fleet is memory only: after a restart it refills with the agents'
//! next heartbeats. Machines are also written to the database (with their
//! last heartbeat) so operators can see what once was there.
//!
//! Memory as the platform sees it: every heartbeat's per-isolate
//! `memory_bytes` is kept, per script version, for the last
//! [`MEMORY_WINDOW`] (at most [`MAX_MEMORY_READINGS`] readings per version,
//! oldest dropped first), with the eviction counters each machine last
//! reported for the version. [`Fleet::memory`] summarizes a window of it
//! with nearest-rank percentiles ([`nearest_rank`]). A reading is the
//! isolate's linear memory in use, or, for an isolate evicted for Exceeded
//! Memory, the size it tried to grow to (agents report that final reading
//! once, in the heartbeat after the eviction), so percentiles over a window
//! with such evictions show the demand above the limit.
//!
//! Durable Object leases: a machine holds a lease on the objects placed on
//! it, renewed by each of its calls (register, heartbeat,
//! `PlaceDurableObject`). An object moves to another machine only once its
//! owner has been silent for longer than the lease ([`lease_ended`]), which
//! is longer than the liveness window; the agent stops serving its objects
//! when its own count of the lease, started when it *sent* the renewing
//! call, runs out, so its lease always ends first. Heartbeat replies name
//! the listed objects now placed elsewhere, and the agent drops them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use tonic::{Request, Response, Status};

use crate::store::{DurableObjectKey, MachineRecord, Store, now_ms};

/// A machine as it registered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Machine {
    /// Machine id.
    pub id: String,
    /// Data center code.
    pub data_center: String,
    /// host:port of its NodeAgent service.
    pub grpc_address: String,
    /// Base URL of its HTTP ingress.
    pub http_address: String,
}

/// An isolate as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolate {
    /// Isolate id, unique on its machine.
    pub id: String,
    /// Owning account.
    pub account: String,
    /// Script it runs.
    pub script: String,
    /// Version it runs.
    pub version_id: String,
    /// Requests in the last 60 s.
    pub requests_last_60s: u64,
    /// Unix ms of its last request (0: none).
    pub last_request_unix_ms: i64,
    /// Hosted Durable Objects, `namespace:id`.
    pub durable_objects: Vec<String>,
    /// Linear memory in use.
    pub memory_bytes: u64,
    /// Isolates of this version evicted on this machine, as the agent
    /// counts them (cumulative).
    pub evictions: u64,
    /// Of those, evictions for exceeding the memory limit.
    pub memory_evictions: u64,
}

/// One isolate to capture, with where it lives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// Data center code.
    pub data_center: String,
    /// Machine id.
    pub machine: String,
    /// host:port of the machine's NodeAgent service.
    pub grpc_address: String,
    /// Isolate id.
    pub isolate: String,
    /// Script.
    pub script: String,
    /// Version the isolate runs.
    pub version_id: String,
    /// Requests in the last 60 s.
    pub requests_last_60s: u64,
    /// Same number, as a rate.
    pub requests_per_minute: u64,
    /// Unix ms of its last request.
    pub last_request_unix_ms: i64,
    /// Hosted Durable Objects, `namespace:id`.
    pub durable_objects: Vec<String>,
    /// Linear memory in use.
    pub memory_bytes: u64,
}

/// Which isolates a request is about.
#[derive(Debug, Clone, Default)]
pub struct TargetQuery<'a> {
    /// Owning account.
    pub account: &'a str,
    /// Script.
    pub script: &'a str,
    /// Only this version (all versions when `None`).
    pub version_id: Option<&'a str>,
    /// Only this data center.
    pub data_center: Option<&'a str>,
    /// Only the isolate hosting this Durable Object (`namespace:id`).
    pub durable_object: Option<&'a str>,
}

/// What counts as recent activity.
pub const RECENT: Duration = Duration::from_secs(60);

/// Default Durable Object lease, in heartbeat intervals.
pub const DEFAULT_LEASE_INTERVALS: u32 = 4;
/// Shortest lease accepted, in heartbeat intervals: it must outlast the
/// liveness window (2.5 intervals) so a machine that is still live never
/// loses its objects.
pub const MIN_LEASE_INTERVALS: u32 = 3;

/// Whether a machine's lease on its Durable Objects has ended at `now`: it
/// has been silent for at least `lease`, counted from its last call this
/// process saw, or from this process's start (`started`) if later, so a
/// restarted control plane waits out a full lease before moving anything;
/// and the database's record of its last heartbeat (`db_heartbeat_ms`,
/// written by whichever control plane heard it) is at least `lease` older
/// than `now_ms` too.
pub fn lease_ended(
    heard: Option<Instant>,
    started: Instant,
    now: Instant,
    db_heartbeat_ms: Option<i64>,
    now_ms: i64,
    lease: Duration,
) -> bool {
    let since = heard.map_or(started, |h| h.max(started));
    let silent = now.saturating_duration_since(since) >= lease;
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let silent_in_db = db_heartbeat_ms.is_none_or(|ms| now_ms.saturating_sub(ms) >= lease_ms);
    silent && silent_in_db
}

#[derive(Debug)]
struct MachineState {
    machine: Machine,
    isolates: Vec<Isolate>,
    last_heartbeat: Instant,
}

/// The machines that heartbeat, and what runs on them.
#[derive(Debug)]
pub struct Fleet {
    machines: Mutex<HashMap<String, MachineState>>,
    memory: Mutex<HashMap<VersionKey, VersionMemory>>,
    heartbeat_interval: Duration,
    lease: Duration,
    started: Instant,
    /// When each machine last called (register, heartbeat, placement).
    heard: Mutex<HashMap<String, Instant>>,
    /// Held while a placement is decided and written, and while a
    /// heartbeat renews its machine's lease and reads which of its objects
    /// moved: so a heartbeat either sees a move or prevents it.
    placements: tokio::sync::Mutex<()>,
}

/// Longest window of memory readings kept (and the most `window_s` may ask).
pub const MEMORY_WINDOW: Duration = Duration::from_secs(300);
/// Most memory readings kept per script version; beyond it the oldest go.
pub const MAX_MEMORY_READINGS: usize = 20_000;

/// `(account, script, version_id)`.
type VersionKey = (String, String, String);

#[derive(Debug)]
struct VersionMemory {
    /// `(when, memory_bytes)`, oldest first.
    readings: VecDeque<(Instant, u64)>,
    /// Per machine: `(evictions, memory_evictions)` as last reported.
    evictions: HashMap<String, (u64, u64)>,
    last_update: Instant,
}

/// One isolate's memory as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IsolateMemory {
    /// Machine id.
    pub machine: String,
    /// Data center code.
    pub data_center: String,
    /// Isolate id.
    pub isolate: String,
    /// Linear memory in use.
    pub memory_bytes: u64,
}

/// Percentiles of the memory readings in a window (nearest rank; `None`
/// when the window holds no reading).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// Median.
    pub p50: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
    /// 99.9th percentile.
    pub p999: Option<u64>,
    /// Largest reading.
    pub max: Option<u64>,
    /// Readings in the window (one per isolate per heartbeat).
    pub samples: usize,
}

/// Eviction counters of a version, summed over the machines that report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EvictionCounts {
    /// Evictions for exceeding the memory limit ("Exceeded Memory").
    pub exceeded_memory: u64,
    /// Evictions for any reason.
    pub total: u64,
}

/// The memory view of one script version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionMemorySummary {
    /// Version id.
    pub version_id: String,
    /// Its isolates on live machines now, by data center, machine, isolate.
    pub isolates: Vec<IsolateMemory>,
    /// Percentiles over the window's readings.
    pub memory_bytes: MemoryStats,
    /// Eviction counters as last reported.
    pub evictions: EvictionCounts,
    /// The window, seconds.
    pub window_s: u64,
}

impl VersionMemorySummary {
    /// Whether anything at all is known about the version.
    pub fn has_data(&self) -> bool {
        !self.isolates.is_empty() || self.memory_bytes.samples > 0 || self.evictions.total > 0
    }
}

/// The nearest-rank `per_mille`/1000 quantile of `sorted` (ascending): the
/// smallest reading with at least that share of readings at or below it,
/// i.e. `sorted[ceil(per_mille * n / 1000) - 1]` (rank at least 1). `None`
/// for no readings. Integer arithmetic, so p99 of 100 readings is exactly
/// the 99th.
pub fn nearest_rank(sorted: &[u64], per_mille: u32) -> Option<u64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pm = per_mille.min(1000) as usize;
    let rank = (pm * n).div_ceil(1000).max(1);
    Some(sorted[rank - 1])
}

/// [`MemoryStats`] of `readings` (any order).
pub fn memory_stats(readings: &mut [u64]) -> MemoryStats {
    readings.sort_unstable();
    MemoryStats {
        p50: nearest_rank(readings, 500),
        p99: nearest_rank(readings, 990),
        p999: nearest_rank(readings, 999),
        max: readings.last().copied(),
        samples: readings.len(),
    }
}

impl Fleet {
    /// An empty fleet expecting heartbeats every `heartbeat_interval`, with
    /// the default Durable Object lease ([`DEFAULT_LEASE_INTERVALS`]).
    pub fn new(heartbeat_interval: Duration) -> Self {
        Self::with_lease(
            heartbeat_interval,
            heartbeat_interval * DEFAULT_LEASE_INTERVALS,
        )
    }

    /// An empty fleet with Durable Object leases of `lease`.
    pub fn with_lease(heartbeat_interval: Duration, lease: Duration) -> Self {
        Fleet {
            machines: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            heartbeat_interval,
            lease,
            started: Instant::now(),
            heard: Mutex::new(HashMap::new()),
            placements: tokio::sync::Mutex::new(()),
        }
    }

    /// How long a machine's lease on its Durable Objects lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Records a call from `machine_id`: its lease runs from now.
    pub fn heard(&self, machine_id: &str) {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(machine_id.to_owned(), Instant::now());
    }

    fn last_heard(&self, machine_id: &str) -> Option<Instant> {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(machine_id)
            .copied()
    }

    /// Whether `machine_id`'s lease has ended now ([`lease_ended`]), given
    /// the database's record of its last heartbeat.
    pub fn lease_ended(&self, machine_id: &str, db_heartbeat_ms: Option<i64>) -> bool {
        lease_ended(
            self.last_heard(machine_id),
            self.started,
            Instant::now(),
            db_heartbeat_ms,
            now_ms(),
            self.lease,
        )
    }

    /// How long `machine_id` has been silent, as this process saw it
    /// (since this process started, if it never heard it).
    pub fn silent_for(&self, machine_id: &str) -> Duration {
        self.last_heard(machine_id)
            .map_or(self.started, |h| h.max(self.started))
            .elapsed()
    }

    /// How long a machine stays live after its last heartbeat: two and a
    /// half intervals, so one late heartbeat is tolerated and a silent
    /// machine is gone before the third interval ends.
    pub fn expiry(&self) -> Duration {
        self.heartbeat_interval * 5 / 2
    }

    /// Expected heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, MachineState>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (every update is one insert), so a poisoned lock is still usable.
        self.machines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_memory(&self) -> std::sync::MutexGuard<'_, HashMap<VersionKey, VersionMemory>> {
        // Same reasoning as `lock`: each update leaves the map consistent.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a heartbeat (or registration, with no isolates yet) and the
    /// final readings of isolates evicted since the machine's last one
    /// (memory readings only: they are not listed as isolates).
    pub fn heartbeat(&self, machine: Machine, isolates: Option<Vec<Isolate>>, evicted: &[Isolate]) {
        if let Some(isolates) = &isolates {
            self.record_readings(&machine.id, isolates.iter().chain(evicted), Instant::now());
        }
        let mut map = self.lock();
        let prev = map.remove(&machine.id);
        let isolates = isolates
            .or_else(|| prev.map(|p| p.isolates))
            .unwrap_or_default();
        map.insert(
            machine.id.clone(),
            MachineState {
                machine,
                isolates,
                last_heartbeat: Instant::now(),
            },
        );
    }

    /// Whether the machine heartbeat recently.
    pub fn is_live(&self, machine_id: &str) -> bool {
        let expiry = self.expiry();
        self.lock()
            .get(machine_id)
            .is_some_and(|m| m.last_heartbeat.elapsed() < expiry)
    }

    /// A live machine by id.
    pub fn machine(&self, machine_id: &str) -> Option<Machine> {
        let expiry = self.expiry();
        self.lock()
            .get(machine_id)
            .filter(|m| m.last_heartbeat.elapsed() < expiry)
            .map(|m| m.machine.clone())
    }

    /// Live machines, by id.
    pub fn live_machines(&self) -> Vec<Machine> {
        let expiry = self.expiry();
        let mut v: Vec<Machine> = self
            .lock()
            .values()
            .filter(|m| m.last_heartbeat.elapsed() < expiry)
            .map(|m| m.machine.clone())
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Isolates matching `q` on live machines. Without a Durable Object,
    /// only isolates with a request in the last 60 s count; a Durable
    /// Object's isolate counts while its machine is live.
    pub fn targets(&self, q: &TargetQuery<'_>) -> Vec<Target> {
        let expiry = self.expiry();
        let recent_since = now_ms() - RECENT.as_millis() as i64;
        let map = self.lock();
        let mut out = Vec::new();
        for m in map.values() {
            if m.last_heartbeat.elapsed() >= expiry {
                continue;
            }
            if q.data_center.is_some_and(|dc| dc != m.machine.data_center) {
                continue;
            }
            for i in &m.isolates {
                if i.account != q.account || i.script != q.script {
                    continue;
                }
                if q.version_id.is_some_and(|v| v != i.version_id) {
                    continue;
                }
                match q.durable_object {
                    Some(dobj) => {
                        if !i.durable_objects.iter().any(|d| d == dobj) {
                            continue;
                        }
                    }
                    None => {
                        if i.requests_last_60s == 0 && i.last_request_unix_ms < recent_since {
                            continue;
                        }
                    }
                }
                out.push(Target {
                    data_center: m.machine.data_center.clone(),
                    machine: m.machine.id.clone(),
                    grpc_address: m.machine.grpc_address.clone(),
                    isolate: i.id.clone(),
                    script: i.script.clone(),
                    version_id: i.version_id.clone(),
                    requests_last_60s: i.requests_last_60s,
                    requests_per_minute: i.requests_last_60s,
                    last_request_unix_ms: i.last_request_unix_ms,
                    durable_objects: i.durable_objects.clone(),
                    memory_bytes: i.memory_bytes,
                });
            }
        }
        out.sort_by(|a, b| {
            (&a.data_center, &a.machine, &a.isolate).cmp(&(&b.data_center, &b.machine, &b.isolate))
        });
        out
    }
}

impl Fleet {
    /// Adds one heartbeat's memory readings and eviction counters at `now`,
    /// then drops readings older than [`MEMORY_WINDOW`] or beyond
    /// [`MAX_MEMORY_READINGS`], and versions nothing reported for a window.
    #[cfg(test)]
    fn record_memory(&self, machine_id: &str, isolates: &[Isolate], now: Instant) {
        self.record_readings(machine_id, isolates.iter(), now);
    }

    /// [`Fleet::record_memory`] over live and evicted isolates alike.
    fn record_readings<'a>(
        &self,
        machine_id: &str,
        isolates: impl Iterator<Item = &'a Isolate> + Clone,
        now: Instant,
    ) {
        // The agent counts evictions per version and machine and repeats
        // the count on each of the version's isolates: this heartbeat's
        // largest value per version stands for the machine.
        let mut counts: HashMap<(&str, &str, &str), (u64, u64)> = HashMap::new();
        for i in isolates.clone() {
            let c = counts
                .entry((&i.account, &i.script, &i.version_id))
                .or_insert((0, 0));
            *c = (c.0.max(i.evictions), c.1.max(i.memory_evictions));
        }
        let mut mem = self.lock_memory();
        for i in isolates {
            let key = (i.account.clone(), i.script.clone(), i.version_id.clone());
            let v = mem.entry(key).or_insert_with(|| VersionMemory {
                readings: VecDeque::new(),
                evictions: HashMap::new(),
                last_update: now,
            });
            v.readings.push_back((now, i.memory_bytes));
            v.last_update = now;
            if let Some(c) =
                counts.get(&(i.account.as_str(), i.script.as_str(), i.version_id.as_str()))
            {
                v.evictions.insert(machine_id.to_owned(), *c);
            }
        }
        let cutoff = now.checked_sub(MEMORY_WINDOW);
        mem.retain(|_, v| {
            while v.readings.len() > MAX_MEMORY_READINGS {
                v.readings.pop_front();
            }
            if let Some(cutoff) = cutoff {
                while v.readings.front().is_some_and(|(t, _)| *t < cutoff) {
                    v.readings.pop_front();
                }
                v.last_update >= cutoff
            } else {
                true
            }
        });
    }

    /// The memory view of `version_id` of `account/script` over the last
    /// `window` (at most [`MEMORY_WINDOW`]).
    pub fn memory(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
        window: Duration,
    ) -> VersionMemorySummary {
        self.memory_at(account, script, version_id, window, Instant::now())
    }

    fn memory_at(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
        window: Duration,
        now: Instant,
    ) -> VersionMemorySummary {
        let window = window.min(MEMORY_WINDOW);
        let since = now.checked_sub(window);
        let key = (account.to_owned(), script.to_owned(), version_id.to_owned());
        let (mut readings, evictions) = {
            let mem = self.lock_memory();
            match mem.get(&key) {
                None => (Vec::new(), EvictionCounts::default()),
                Some(v) => {
                    let readings: Vec<u64> = v
                        .readings
                        .iter()
                        .filter(|(t, _)| since.is_none_or(|s| *t >= s))
                        .map(|(_, b)| *b)
                        .collect();
                    let evictions = v.evictions.values().fold(
                        EvictionCounts::default(),
                        |acc, (total, memory)| EvictionCounts {
                            exceeded_memory: acc.exceeded_memory + memory,
                            total: acc.total + total,
                        },
                    );
                    (readings, evictions)
                }
            }
        };
        let expiry = self.expiry();
        let mut isolates: Vec<IsolateMemory> = {
            let map = self.lock();
            map.values()
                .filter(|m| m.last_heartbeat.elapsed() < expiry)
                .flat_map(|m| {
                    m.isolates
                        .iter()
                        .filter(|i| {
                            i.account == account && i.script == script && i.version_id == version_id
                        })
                        .map(|i| IsolateMemory {
                            machine: m.machine.id.clone(),
                            data_center: m.machine.data_center.clone(),
                            isolate: i.id.clone(),
                            memory_bytes: i.memory_bytes,
                        })
                })
                .collect()
        };
        isolates.sort_by(|a, b| {
            (&a.data_center, &a.machine, &a.isolate).cmp(&(&b.data_center, &b.machine, &b.isolate))
        });
        VersionMemorySummary {
            version_id: version_id.to_owned(),
            isolates,
            memory_bytes: memory_stats(&mut readings),
            evictions,
            window_s: window.as_secs(),
        }
    }
}

/// Compares two secrets in time independent of where they differ.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks `authorization: Bearer <secret>` on agent calls.
#[derive(Clone)]
pub struct AgentAuth {
    secret: Arc<str>,
}

impl std::fmt::Debug for AgentAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentAuth(..)")
    }
}

impl AgentAuth {
    /// Accepts calls carrying `secret`.
    pub fn new(secret: &str) -> Self {
        AgentAuth {
            secret: secret.into(),
        }
    }
}

impl tonic::service::Interceptor for AgentAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(value) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "missing `authorization: Bearer <agent secret>` metadata",
            ));
        };
        let given = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !secrets_equal(given.as_bytes(), self.secret.as_bytes()) {
            return Err(Status::unauthenticated("wrong agent secret"));
        }
        Ok(req)
    }
}

/// Most isolates one heartbeat may carry.
pub const MAX_ISOLATES_PER_HEARTBEAT: usize = 10_000;

/// The gRPC `Registry` service.
#[derive(Debug, Clone)]
pub struct RegistryService {
    store: Arc<Store>,
    fleet: Arc<Fleet>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl RegistryService {
    /// A registry over `store` and `fleet`.
    pub fn new(
        store: Arc<Store>,
        fleet: Arc<Fleet>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        RegistryService {
            store,
            fleet,
            metrics,
        }
    }
}

fn machine_from_proto(m: Option<v1::Machine>) -> Result<Machine, Status> {
    let m = m.ok_or_else(|| Status::invalid_argument("machine: required"))?;
    let check = |field: &str, v: &str, max: usize| {
        if v.is_empty() || v.len() > max {
            Err(Status::invalid_argument(format!(
                "machine.{field}: must be 1–{max} bytes (got {})",
                v.len()
            )))
        } else {
            Ok(())
        }
    };
    check("id", &m.id, 128)?;
    check("data_center", &m.data_center, 32)?;
    check("grpc_address", &m.grpc_address, 256)?;
    Ok(Machine {
        id: m.id,
        data_center: m.data_center,
        grpc_address: m.grpc_address,
        http_address: m.http_address,
    })
}

fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!("registry: {e:#}");
    Status::internal("internal error; see the control plane's log")
}

async fn record(store: &Store, m: &Machine) -> Result<(), Status> {
    store
        .upsert_machine(&MachineRecord {
            id: m.id.clone(),
            data_center: m.data_center.clone(),
            grpc_address: m.grpc_address.clone(),
            http_address: m.http_address.clone(),
            last_heartbeat_ms: now_ms(),
        })
        .await
        .map_err(internal)
}

#[tonic::async_trait]
impl v1::registry_server::Registry for RegistryService {
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let m = machine_from_proto(request.into_inner().machine)?;
        record(&self.store, &m).await?;
        tracing::info!(machine = %m.id, data_center = %m.data_center, "agent registered");
        self.fleet.heard(&m.id);
        self.fleet.heartbeat(m, None, &[]);
        Ok(Response::new(v1::RegisterResponse {
            heartbeat_interval_ms: self.fleet.heartbeat_interval().as_millis() as u32,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let req = request.into_inner();
        let m = machine_from_proto(req.machine)?;
        if req.isolates.len() > MAX_ISOLATES_PER_HEARTBEAT {
            return Err(Status::invalid_argument(format!(
                "isolates: at most {MAX_ISOLATES_PER_HEARTBEAT} per heartbeat (got {})",
                req.isolates.len()
            )));
        }
        if req.evicted.len() > MAX_ISOLATES_PER_HEARTBEAT {
            return Err(Status::invalid_argument(format!(
                "evicted: at most {MAX_ISOLATES_PER_HEARTBEAT} per heartbeat (got {})",
                req.evicted.len()
            )));
        }
        let isolates: Vec<Isolate> = req.isolates.into_iter().map(isolate_from_proto).collect();
        let evicted: Vec<Isolate> = req.evicted.into_iter().map(isolate_from_proto).collect();
        record(&self.store, &m).await?;
        let elsewhere = {
            // Renew the lease and read which listed objects moved as one
            // step against placements (see `Fleet::placements`).
            let _placements = self.fleet.placements.lock().await;
            self.fleet.heard(&m.id);
            self.durable_objects_elsewhere(&m.id, &isolates).await?
        };
        if !elsewhere.is_empty() {
            tracing::info!(machine = %m.id, objects = ?elsewhere, "durable objects placed elsewhere: the agent drops them");
        }
        self.fleet.heartbeat(m, Some(isolates), &evicted);
        self.metrics.heartbeats.inc();
        let generation = self.store.deployment_generation().await.map_err(internal)?;
        Ok(Response::new(v1::HeartbeatResponse {
            deployment_generation: generation,
            durable_object_lease_ms: lease_ms(self.fleet.lease()),
            durable_objects_elsewhere: elsewhere,
        }))
    }

    async fn get_deployment(
        &self,
        _request: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<v1::GetDeploymentResponse>, Status> {
        let generation = self.store.deployment_generation().await.map_err(internal)?;
        let scripts = self.store.all_deployments().await.map_err(internal)?;
        Ok(Response::new(v1::GetDeploymentResponse {
            generation,
            scripts: scripts
                .into_iter()
                .map(|s| v1::DeployedScript {
                    account: s.account,
                    script: s.script,
                    versions: s
                        .versions
                        .into_iter()
                        .map(|(version_id, weight, wasm_sha256)| v1::DeployedVersion {
                            version_id,
                            weight,
                            wasm_sha256,
                        })
                        .collect(),
                })
                .collect(),
        }))
    }

    async fn get_script_version(
        &self,
        request: Request<v1::GetScriptVersionRequest>,
    ) -> Result<Response<v1::GetScriptVersionResponse>, Status> {
        let id = request.into_inner().version_id;
        let Some((account, v, wasm)) = self.store.version_wasm(&id).await.map_err(internal)? else {
            return Err(Status::not_found(format!("version {id}: no such version")));
        };
        Ok(Response::new(v1::GetScriptVersionResponse {
            version_id: v.id,
            script: v.script,
            account,
            wasm,
            wasm_sha256: v.wasm_sha256,
        }))
    }

    async fn place_durable_object(
        &self,
        request: Request<v1::PlaceDurableObjectRequest>,
    ) -> Result<Response<v1::PlaceDurableObjectResponse>, Status> {
        let req = request.into_inner();
        let asker = machine_from_proto(req.machine)?;
        if let Err(e) = crate::api::validate_durable_object(&req.namespace, &req.object_id) {
            return Err(Status::invalid_argument(e.message));
        }
        let deployment = self
            .store
            .deployment(&req.account, &req.script)
            .await
            .map_err(internal)?;
        // A new object runs the script's most heavily weighted version.
        let Some(version) = deployment.first() else {
            return Err(Status::not_found(format!(
                "script {}/{}: not deployed",
                req.account, req.script
            )));
        };
        let object_id = req.object_id.to_ascii_lowercase();
        let key = DurableObjectKey {
            account: &req.account,
            script: &req.script,
            namespace: &req.namespace,
            object_id: &object_id,
        };
        // The call renews the asker's lease (its agent counts it from when
        // it sent the call); the asker's own objects never move to itself.
        record(&self.store, &asker).await?;
        let placement = {
            let _placements = self.fleet.placements.lock().await;
            self.fleet.heard(&asker.id);
            let fleet = &self.fleet;
            self.store
                .place_durable_object(
                    &key,
                    (&asker.id, &version.version_id),
                    |owner, db_heartbeat_ms| {
                        owner != asker.id && fleet.lease_ended(owner, db_heartbeat_ms)
                    },
                )
                .await
                .map_err(internal)?
        };
        if placement.created {
            tracing::info!(
                object = %format!("{}:{}", req.namespace, object_id),
                machine = %asker.id,
                "durable object placed"
            );
        }
        let owner = if placement.machine_id == asker.id {
            asker
        } else if let Some(owner) = self.fleet.machine(&placement.machine_id) {
            owner
        } else if let Some(owner) = self
            .recently_heard_in_database(&placement.machine_id)
            .await?
        {
            owner
        } else {
            // The owner missed the liveness window but still holds its
            // lease: it may be serving the object, so it cannot move yet,
            // and it may not answer, so do not send the caller there.
            let silent = self.fleet.silent_for(&placement.machine_id);
            let left = self.fleet.lease().saturating_sub(silent);
            let mut status = Status::unavailable(format!(
                "durable object {}:{object_id} lives on machine {}, which has not been heard from for {:.1} s; \
                 it moves to a live machine once that machine's lease ends (in {:.1} s at most); retry then",
                req.namespace,
                placement.machine_id,
                silent.as_secs_f64(),
                left.as_secs_f64(),
            ));
            // The agent turns it into the HTTP answer's Retry-After.
            if let Ok(v) = left.as_millis().to_string().parse() {
                status.metadata_mut().insert("retry-after-ms", v);
            }
            return Err(status);
        };
        Ok(Response::new(v1::PlaceDurableObjectResponse {
            owner: Some(v1::Machine {
                id: owner.id,
                data_center: owner.data_center,
                grpc_address: owner.grpc_address,
                http_address: owner.http_address,
            }),
            version_id: placement.version_id,
            placed_at_ms: placement.placed_at_ms,
            durable_object_lease_ms: lease_ms(self.fleet.lease()),
        }))
    }
}

impl RegistryService {
    /// `machine_id` as the database records it, if its last heartbeat there
    /// is within the liveness window: another control plane sharing the
    /// database hears it, or this one did just before a restart.
    async fn recently_heard_in_database(
        &self,
        machine_id: &str,
    ) -> Result<Option<Machine>, Status> {
        let record = self.store.machine(machine_id).await.map_err(internal)?;
        let window = i64::try_from(self.fleet.expiry().as_millis()).unwrap_or(i64::MAX);
        Ok(record
            .filter(|r| now_ms().saturating_sub(r.last_heartbeat_ms) < window)
            .map(|r| Machine {
                id: r.id,
                data_center: r.data_center,
                grpc_address: r.grpc_address,
                http_address: r.http_address,
            }))
    }

    /// Of the Durable Objects `isolates` list, those placed on another
    /// machine than `machine_id` (`namespace:id`).
    async fn durable_objects_elsewhere(
        &self,
        machine_id: &str,
        isolates: &[Isolate],
    ) -> Result<Vec<String>, Status> {
        let mut by_script: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
        for i in isolates {
            for d in &i.durable_objects {
                by_script
                    .entry((&i.account, &i.script))
                    .or_default()
                    .push(d);
            }
        }
        let mut out = Vec::new();
        for ((account, script), objects) in by_script {
            out.extend(
                self.store
                    .durable_objects_elsewhere(machine_id, account, script, &objects)
                    .await
                    .map_err(internal)?,
            );
        }
        out.sort();
        Ok(out)
    }
}

fn lease_ms(lease: Duration) -> u32 {
    u32::try_from(lease.as_millis()).unwrap_or(u32::MAX)
}

fn isolate_from_proto(i: v1::IsolateStatus) -> Isolate {
    Isolate {
        id: i.isolate_id,
        account: i.account,
        script: i.script,
        version_id: i.version_id,
        requests_last_60s: i.requests_last_60s,
        last_request_unix_ms: i.last_request_unix_ms,
        durable_objects: i.durable_objects,
        memory_bytes: i.memory_bytes,
        evictions: i.evictions,
        memory_evictions: i.memory_evictions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso(id: &str, version: &str, memory_bytes: u64, evictions: (u64, u64)) -> Isolate {
        Isolate {
            id: id.into(),
            account: "acme".into(),
            script: "api".into(),
            version_id: version.into(),
            requests_last_60s: 1,
            last_request_unix_ms: now_ms(),
            durable_objects: Vec::new(),
            memory_bytes,
            evictions: evictions.0,
            memory_evictions: evictions.1,
        }
    }

    #[test]
    fn lease_rules() {
        let lease = Duration::from_secs(10);
        let started = Instant::now();
        let s = Duration::from_secs(1);
        let now_ms = 1_000_000;
        let ended = |heard: Option<Instant>, now: Instant, db: Option<i64>| {
            lease_ended(heard, started, now, db, now_ms, lease)
        };
        // Heard 9.999 s ago: held; 10 s ago: ended.
        let heard = Some(started + s);
        assert!(!ended(
            heard,
            started + 11 * s - Duration::from_millis(1),
            None
        ));
        assert!(ended(heard, started + 11 * s, None));
        // Never heard by this process: counted from its start, so a
        // restarted control plane waits out a full lease.
        assert!(!ended(None, started + 9 * s, None));
        assert!(ended(None, started + 10 * s, None));
        // A heartbeat another control plane recorded in the database
        // within the lease keeps it, whatever this process heard.
        assert!(!ended(None, started + 60 * s, Some(now_ms - 9_999)));
        assert!(ended(None, started + 60 * s, Some(now_ms - 10_000)));
        // A database clock ahead of ours never ends a lease early.
        assert!(!ended(None, started + 60 * s, Some(now_ms + 5_000)));
    }

    #[test]
    fn default_lease_outlasts_the_liveness_window() {
        let fleet = Fleet::new(Duration::from_secs(2));
        assert_eq!(fleet.lease(), Duration::from_secs(8));
        assert!(fleet.lease() > fleet.expiry());
        assert!(Duration::from_secs(2) * MIN_LEASE_INTERVALS > fleet.expiry());
    }

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(nearest_rank(&[], 500), None);
        assert_eq!(nearest_rank(&[7], 500), Some(7));
        assert_eq!(nearest_rank(&[7], 999), Some(7));
        assert_eq!(nearest_rank(&[7], 0), Some(7));
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&hundred, 500), Some(50));
        assert_eq!(nearest_rank(&hundred, 990), Some(99));
        // ceil(99.9) = 100: with 100 readings p99.9 is the largest.
        assert_eq!(nearest_rank(&hundred, 999), Some(100));
        let thousand: Vec<u64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&thousand, 999), Some(999));
        assert_eq!(nearest_rank(&thousand, 990), Some(990));
        // Two readings: the median is the lower one (rank ceil(1.0) = 1).
        assert_eq!(nearest_rank(&[10, 20], 500), Some(10));
        assert_eq!(nearest_rank(&[10, 20], 501), Some(20));
        // Three: the middle one.
        assert_eq!(nearest_rank(&[1, 2, 3], 500), Some(2));
    }

    #[test]
    fn memory_stats_sorts_and_counts() {
        let mut r = vec![5, 1, 4, 2, 3];
        let s = memory_stats(&mut r);
        assert_eq!(
            s,
            MemoryStats {
                p50: Some(3),
                p99: Some(5),
                p999: Some(5),
                max: Some(5),
                samples: 5
            }
        );
        assert_eq!(memory_stats(&mut []), MemoryStats::default());
    }

    fn machine(id: &str, dc: &str) -> Machine {
        Machine {
            id: id.into(),
            data_center: dc.into(),
            grpc_address: "127.0.0.1:1".into(),
            http_address: String::new(),
        }
    }

    #[test]
    fn window_selects_recent_readings_and_drops_old_ones() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        // One reading a second for 400 s: 100 MiB before t0+200 s, 1 MiB after.
        for s in 0..400u64 {
            let bytes = if s < 200 { 100 << 20 } else { 1 << 20 };
            fleet.record_memory(
                "m1",
                &[iso("i1", "v1", bytes, (0, 0))],
                t0 + Duration::from_secs(s),
            );
        }
        let now = t0 + Duration::from_secs(399);
        // The last 60 s: all small.
        let m = fleet.memory_at("acme", "api", "v1", Duration::from_secs(60), now);
        assert_eq!(m.memory_bytes.samples, 61);
        assert_eq!(m.memory_bytes.max, Some(1 << 20));
        assert_eq!(m.window_s, 60);
        // The full window keeps readings from t0+99 s on (older ones were
        // dropped): 101 large and 200 small, so p50 small, p99 large.
        let m = fleet.memory_at("acme", "api", "v1", MEMORY_WINDOW, now);
        assert_eq!(m.memory_bytes.samples, 301);
        assert_eq!(m.memory_bytes.p50, Some(1 << 20));
        assert_eq!(m.memory_bytes.p99, Some(100 << 20));
        // Asking for more than the window gives the window.
        let m = fleet.memory_at("acme", "api", "v1", Duration::from_secs(10_000), now);
        assert_eq!(m.window_s, MEMORY_WINDOW.as_secs());
        assert_eq!(m.memory_bytes.samples, 301);
        // Other versions and scripts know nothing.
        let m = fleet.memory_at("acme", "api", "v2", MEMORY_WINDOW, now);
        assert_eq!(m.memory_bytes, MemoryStats::default());
        assert!(!m.has_data());
    }

    #[test]
    fn readings_per_version_are_bounded() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        let many: Vec<Isolate> = (0..1000)
            .map(|n| iso(&format!("i{n}"), "v1", n, (0, 0)))
            .collect();
        for k in 0..25u64 {
            fleet.record_memory("m1", &many, t0 + Duration::from_millis(k));
        }
        let m = fleet.memory_at(
            "acme",
            "api",
            "v1",
            MEMORY_WINDOW,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(m.memory_bytes.samples, MAX_MEMORY_READINGS);
    }

    #[test]
    fn versions_silent_for_a_window_are_forgotten() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        fleet.record_memory("m1", &[iso("i1", "old", 5, (3, 2))], t0);
        fleet.record_memory(
            "m1",
            &[iso("i2", "new", 6, (0, 0))],
            t0 + MEMORY_WINDOW + Duration::from_secs(1),
        );
        assert_eq!(fleet.lock_memory().len(), 1);
        let m = fleet.memory_at("acme", "api", "old", MEMORY_WINDOW, t0);
        assert_eq!(m.evictions, EvictionCounts::default());
    }

    #[test]
    fn evictions_sum_machines_latest_reports() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        // m1 reports the version's counters on both isolates: counted once.
        fleet.record_memory(
            "m1",
            &[iso("a", "v1", 1, (4, 3)), iso("b", "v1", 1, (4, 3))],
            t0,
        );
        fleet.record_memory("m2", &[iso("c", "v1", 1, (1, 0))], t0);
        let m = fleet.memory_at("acme", "api", "v1", MEMORY_WINDOW, t0);
        assert_eq!(
            m.evictions,
            EvictionCounts {
                exceeded_memory: 3,
                total: 5
            }
        );
        // A newer report from m1 replaces its old one.
        fleet.record_memory(
            "m1",
            &[iso("a", "v1", 1, (6, 5))],
            t0 + Duration::from_secs(1),
        );
        let m = fleet.memory_at(
            "acme",
            "api",
            "v1",
            MEMORY_WINDOW,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(
            m.evictions,
            EvictionCounts {
                exceeded_memory: 5,
                total: 7
            }
        );
    }

    #[test]
    fn isolates_listed_from_live_machines() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        fleet.heartbeat(
            machine("m2", "sjc"),
            Some(vec![iso("z", "v1", 300, (0, 0)), iso("o", "v2", 9, (0, 0))]),
            &[],
        );
        fleet.heartbeat(
            machine("m1", "lhr"),
            Some(vec![iso("y", "v1", 200, (0, 0))]),
            &[],
        );
        let m = fleet.memory("acme", "api", "v1", Duration::from_secs(60));
        assert_eq!(
            m.isolates,
            vec![
                IsolateMemory {
                    machine: "m1".into(),
                    data_center: "lhr".into(),
                    isolate: "y".into(),
                    memory_bytes: 200
                },
                IsolateMemory {
                    machine: "m2".into(),
                    data_center: "sjc".into(),
                    isolate: "z".into(),
                    memory_bytes: 300
                },
            ]
        );
        assert_eq!(m.memory_bytes.samples, 2);
        assert_eq!(m.memory_bytes.p50, Some(200));
        assert_eq!(m.memory_bytes.max, Some(300));
    }
}
