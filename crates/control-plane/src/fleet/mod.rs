//! The live fleet as agents report it by heartbeat, and target resolution
//! over it.
//!
//! The fleet is memory only: after a restart it refills with the agents'
//! next heartbeats (the registry also writes machines to the
//! database so operators can see what once was there). Time is read from a
//! [`Clock`], so tests move it instead of sleeping.
//!
//! - [`lease`]: the Durable Object lease rule.
//! - [`memory`]: memory readings per version and their percentiles.
//!
//! Durable Object leases: a machine holds a lease on the objects placed on
//! it, renewed by each of its calls (register, heartbeat,
//! `PlaceDurableObject`). An object moves to another machine only once its
//! owner has been silent for longer than the lease ([`lease_ended`]), which
//! is longer than the liveness window; the agent stops serving its objects
//! when its own count of the lease, started when it *sent* the renewing
//! call, runs out, so its lease always ends first. Heartbeat replies name
//! the listed objects now placed elsewhere, and the agent drops them.
//!
//! Imports only leaf modules ([`crate::clock`]); never `api`, `capture` or
//! `registry`.

pub mod lease;
pub mod memory;
pub mod wire;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use edgeprof_proto::rest::Target;

use crate::clock::Clock;

pub use lease::{DEFAULT_LEASE_INTERVALS, MIN_LEASE_INTERVALS, lease_ended};
pub use memory::{MAX_MEMORY_READINGS, MEMORY_WINDOW, has_data, memory_stats, nearest_rank};

/// A machine as it registered.
#[derive(Debug, Clone, PartialEq, Eq)]
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

#[derive(Debug)]
struct MachineState {
    machine: Machine,
    isolates: Vec<Isolate>,
    last_heartbeat: Instant,
    /// The chunked heartbeat being received, if any.
    pending: Option<Pending>,
}

/// One heartbeat sent as several chunks ([`Chunk`]), as far as it has
/// arrived.
#[derive(Debug)]
struct Pending {
    heartbeat_id: u64,
    /// Which chunks have arrived.
    arrived: Vec<bool>,
    /// The isolates they listed.
    isolates: Vec<Isolate>,
}

/// Where a heartbeat message stands in its heartbeat: chunk `index` of
/// `count` of heartbeat `heartbeat_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Shared by the chunks of one heartbeat.
    pub heartbeat_id: u64,
    /// From 0.
    pub index: u32,
    /// Chunks in the heartbeat (at least one).
    pub count: u32,
}

impl Chunk {
    /// A heartbeat in one message.
    pub const WHOLE: Chunk = Chunk {
        heartbeat_id: 0,
        index: 0,
        count: 1,
    };
}

/// The machines that heartbeat, and what runs on them.
#[derive(Debug)]
pub struct Fleet {
    machines: Mutex<HashMap<String, MachineState>>,
    memory: Mutex<HashMap<memory::VersionKey, memory::Readings>>,
    clock: Clock,
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

impl Fleet {
    /// An empty fleet on the system clock expecting heartbeats every
    /// `heartbeat_interval`, with the default Durable Object lease
    /// ([`DEFAULT_LEASE_INTERVALS`]).
    pub fn new(heartbeat_interval: Duration) -> Self {
        Self::with_lease(
            heartbeat_interval,
            heartbeat_interval * DEFAULT_LEASE_INTERVALS,
            Clock::system(),
        )
    }

    /// An empty fleet with Durable Object leases of `lease`, reading time
    /// from `clock`.
    pub fn with_lease(heartbeat_interval: Duration, lease: Duration, clock: Clock) -> Self {
        Fleet {
            machines: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            heartbeat_interval,
            lease,
            started: clock.now(),
            clock,
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
        self.heard_at(machine_id, self.clock.now());
    }

    /// Records a call from `machine_id` received at `at` (by this or
    /// another replica); a later call already recorded stands.
    pub fn heard_at(&self, machine_id: &str, at: Instant) {
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        let last = heard.entry(machine_id.to_owned()).or_insert(at);
        *last = (*last).max(at);
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
            self.clock.now(),
            db_heartbeat_ms,
            self.clock.now_ms(),
            self.lease,
        )
    }

    /// How long `machine_id` has been silent, as this process saw it
    /// (since this process started, if it never heard it).
    pub fn silent_for(&self, machine_id: &str) -> Duration {
        let since = self
            .last_heard(machine_id)
            .map_or(self.started, |h| h.max(self.started));
        self.clock.now().saturating_duration_since(since)
    }

    /// How long a machine stays live after its last heartbeat: two and a
    /// half intervals, so one late heartbeat is tolerated and a silent
    /// machine is gone before the third interval ends.
    pub fn expiry(&self) -> Duration {
        self.heartbeat_interval * 5 / 2
    }

    /// The clock the fleet reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Held while a placement is decided and written, and while a
    /// heartbeat renews its machine's lease and reads which of its objects
    /// moved: so a heartbeat either sees a move or prevents it.
    pub async fn placements(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.placements.lock().await
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

    fn lock_memory(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<memory::VersionKey, memory::Readings>> {
        // Same reasoning as `lock`: each update leaves the map consistent.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a heartbeat (or registration, with no isolates yet) and the
    /// final readings of isolates evicted since the machine's last one
    /// (memory readings only: they are not listed as isolates). A
    /// heartbeat in one message is one chunk of one ([`Chunk::WHOLE`]).
    pub fn heartbeat(&self, machine: Machine, isolates: Option<Vec<Isolate>>, evicted: &[Isolate]) {
        match isolates {
            Some(isolates) => self.heartbeat_chunk(machine, Chunk::WHOLE, isolates, evicted),
            None => self.registered_at(machine, self.clock.now()),
        }
    }

    /// Records a registration received at `at` (by this or another
    /// replica): the machine is live, its isolates as they were.
    pub fn registered_at(&self, machine: Machine, at: Instant) {
        Self::state_in(&mut self.lock(), machine, at);
    }

    /// Records one chunk of a heartbeat. The chunks of a heartbeat collect
    /// aside, and when the last of them has arrived their isolates replace
    /// the machine's list; until then the list is the last complete
    /// heartbeat's, so a heartbeat with a chunk missing changes nothing
    /// and what is held per machine stays bounded by one heartbeat's
    /// chunks. A chunk repeated (a retry) counts once.
    pub fn heartbeat_chunk(
        &self,
        machine: Machine,
        chunk: Chunk,
        isolates: Vec<Isolate>,
        evicted: &[Isolate],
    ) {
        self.heartbeat_chunk_at(machine, chunk, isolates, evicted, self.clock.now());
    }

    /// [`Fleet::heartbeat_chunk`] for a chunk received at `at`, by this or
    /// another replica (the replicas' fleet log,
    /// `crate::replica`).
    pub fn heartbeat_chunk_at(
        &self,
        machine: Machine,
        chunk: Chunk,
        isolates: Vec<Isolate>,
        evicted: &[Isolate],
        at: Instant,
    ) {
        self.record_readings(&machine.id, isolates.iter().chain(evicted), at);
        let mut map = self.lock();
        let state = Self::state_in(&mut map, machine, at);
        let count = chunk.count as usize;
        let pending = match &mut state.pending {
            Some(p) if p.heartbeat_id == chunk.heartbeat_id && p.arrived.len() == count => p,
            other => other.insert(Pending {
                heartbeat_id: chunk.heartbeat_id,
                arrived: vec![false; count],
                isolates: Vec::new(),
            }),
        };
        if let Some(arrived) = pending.arrived.get_mut(chunk.index as usize)
            && !*arrived
        {
            *arrived = true;
            pending.isolates.extend(isolates);
        }
        if pending.arrived.iter().all(|a| *a) {
            state.isolates = std::mem::take(&mut pending.isolates);
            state.pending = None;
        }
    }

    /// `machine`'s state in `map`, its registration and heartbeat time
    /// brought up to `now` (unless a later call was recorded already).
    fn state_in(
        map: &mut HashMap<String, MachineState>,
        machine: Machine,
        now: Instant,
    ) -> &mut MachineState {
        let state = map
            .entry(machine.id.clone())
            .or_insert_with(|| MachineState {
                machine: machine.clone(),
                isolates: Vec::new(),
                last_heartbeat: now,
                pending: None,
            });
        state.machine = machine;
        state.last_heartbeat = state.last_heartbeat.max(now);
        state
    }

    /// Whether the machine heartbeat recently.
    pub fn is_live(&self, machine_id: &str) -> bool {
        let expiry = self.expiry();
        self.lock()
            .get(machine_id)
            .is_some_and(|m| self.clock.now().saturating_duration_since(m.last_heartbeat) < expiry)
    }

    /// A live machine by id.
    pub fn machine(&self, machine_id: &str) -> Option<Machine> {
        let expiry = self.expiry();
        self.lock()
            .get(machine_id)
            .filter(|m| self.clock.now().saturating_duration_since(m.last_heartbeat) < expiry)
            .map(|m| m.machine.clone())
    }

    /// Live machines, by id.
    pub fn live_machines(&self) -> Vec<Machine> {
        let expiry = self.expiry();
        let mut v: Vec<Machine> = self
            .lock()
            .values()
            .filter(|m| self.clock.now().saturating_duration_since(m.last_heartbeat) < expiry)
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
        let recent_since = self.clock.now_ms() - RECENT.as_millis() as i64;
        let now = self.clock.now();
        let map = self.lock();
        let mut out = Vec::new();
        for m in map.values() {
            if now.saturating_duration_since(m.last_heartbeat) >= expiry {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn iso(
        id: &str,
        version: &str,
        memory_bytes: u64,
        evictions: (u64, u64),
    ) -> Isolate {
        Isolate {
            id: id.into(),
            account: "acme".into(),
            script: "api".into(),
            version_id: version.into(),
            requests_last_60s: 1,
            last_request_unix_ms: Clock::system().now_ms(),
            durable_objects: Vec::new(),
            memory_bytes,
            evictions: evictions.0,
            memory_evictions: evictions.1,
        }
    }

    pub(crate) fn machine(id: &str, dc: &str) -> Machine {
        Machine {
            id: id.into(),
            data_center: dc.into(),
            grpc_address: "127.0.0.1:1".into(),
            http_address: String::new(),
        }
    }

    #[test]
    fn default_lease_outlasts_the_liveness_window() {
        let fleet = Fleet::new(Duration::from_secs(2));
        assert_eq!(fleet.lease(), Duration::from_secs(8));
        assert!(fleet.lease() > fleet.expiry());
        assert!(Duration::from_secs(2) * MIN_LEASE_INTERVALS > fleet.expiry());
    }
}
