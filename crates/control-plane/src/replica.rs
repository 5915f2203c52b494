//! Several control-plane replicas on one PostgreSQL, agreeing.
//!
//! - **The fleet**: each replica keeps the live fleet in memory, built from
//!   every registration and heartbeat *any* replica received: the receiving
//!   replica applies a call at once and appends its wire message to the
//!   database's fleet log; every replica reads the log in commit order
//!   ([`Replica::catch_up`], in the background every [`FLEET_LOG_POLL`] and
//!   before answering about targets or memory) and applies the others'
//!   calls at the time they were received. So targets, liveness, leases
//!   and memory windows agree, and the chunks of one heartbeat may reach
//!   different replicas. The log keeps [`Replica::log_keep`] (enough for
//!   every machine's latest heartbeat): a replica that starts replays it,
//!   so it knows the fleet at once, and its memory windows fill over the
//!   next [`crate::fleet::MEMORY_WINDOW`].
//! - **Liveness of replicas**: each replica records itself alive every
//!   [`REPLICA_HEARTBEAT`]; sessions of a replica silent for
//!   [`REPLICA_EXPIRY`] are failed by the others, naming it, and its
//!   capture slots freed ([`Replica::alive`]).
//! - **Capture admission** is in the database already
//!   ([`crate::capture::slots`]).
//!
//! On SQLite (one process) there is no log: the fleet is this process's.
//!
//! Imports `store` and `fleet`; never `capture`, `api` or `registry`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprof_proto::rest::SessionStatus;
use edgeprof_proto::v1;
use prost::Message;

use crate::fleet::{Chunk, Fleet, Isolate, Machine};
use crate::store::{self, LogEntry, Store, StoreError};

/// How often a replica records itself alive and looks for stopped ones.
pub const REPLICA_HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica silent this long has stopped: its sessions are failed.
pub const REPLICA_EXPIRY: Duration = Duration::from_secs(10);
/// How often the fleet log is read in the background.
pub const FLEET_LOG_POLL: Duration = Duration::from_millis(200);
/// Entries read from the fleet log per query.
pub const FLEET_LOG_BATCH: usize = 1_000;
/// Rows of stopped replicas are forgotten after this.
const FORGET_REPLICAS_AFTER: Duration = Duration::from_secs(24 * 3600);

const REGISTER: &str = "register";
const HEARTBEAT: &str = "heartbeat";

/// This replica: its id, and the fleet log when it shares the database.
#[derive(Debug)]
pub struct Replica {
    id: String,
    started_ms: i64,
    store: Arc<Store>,
    fleet: Arc<Fleet>,
    shared: bool,
    /// The last log position applied; held while reading and applying.
    applied: tokio::sync::Mutex<i64>,
}

/// What one [`Replica::alive`] round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Sessions of stopped replicas now failed.
    pub failed_sessions: Vec<String>,
    /// Fleet log entries trimmed.
    pub trimmed: u64,
}

impl Replica {
    /// A replica with a fresh id over `store` and `fleet`; it shares the
    /// fleet through the log when the store is PostgreSQL.
    pub fn new(store: Arc<Store>, fleet: Arc<Fleet>) -> Self {
        let shared = store.backend() == store::Backend::Postgres;
        Replica {
            id: uuid::Uuid::now_v7().to_string(),
            started_ms: fleet.clock().now_ms(),
            store,
            fleet,
            shared,
            applied: tokio::sync::Mutex::new(0),
        }
    }

    /// A new replica on `store` and `fleet`, started: on SQLite (one
    /// process) whatever is unfinished was the previous process's and is
    /// failed now; on PostgreSQL only sessions no replica owns are, the
    /// others' wait for their owner to stop ([`Replica::alive`]). Reads the
    /// fleet log. Returns the replica and the sessions failed.
    pub async fn start(
        store: Arc<Store>,
        fleet: Arc<Fleet>,
    ) -> Result<(Arc<Replica>, Vec<String>), StoreError> {
        let replica = Arc::new(Replica::new(store.clone(), fleet));
        let mut interrupted = store.fail_interrupted_sessions(replica.shared).await?;
        if !replica.shared {
            store.free_all_capture_slots().await?;
        }
        for id in &interrupted {
            tracing::warn!(session = %id, "session interrupted by a restart marked failed");
        }
        interrupted.extend(replica.alive().await?.failed_sessions);
        replica.catch_up().await?;
        tracing::info!(
            replica = replica.id(),
            shared = replica.shared,
            "control-plane replica"
        );
        Ok((replica, interrupted))
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the fleet is shared with other replicas through the log.
    pub fn shares_fleet(&self) -> bool {
        self.shared
    }

    /// How long the fleet log keeps an entry: past every machine's next
    /// heartbeat and the liveness window.
    pub fn log_keep(&self) -> Duration {
        (self.fleet.expiry() + self.fleet.heartbeat_interval()).max(Duration::from_secs(30))
    }

    /// Logs a registration received now (when shared).
    pub async fn log_register(&self, req: &v1::RegisterRequest) -> Result<(), StoreError> {
        self.log(REGISTER, &req.encode_to_vec()).await
    }

    /// Logs a heartbeat (message) received now (when shared).
    pub async fn log_heartbeat(&self, req: &v1::HeartbeatRequest) -> Result<(), StoreError> {
        self.log(HEARTBEAT, &req.encode_to_vec()).await
    }

    async fn log(&self, kind: &str, payload: &[u8]) -> Result<(), StoreError> {
        if !self.shared {
            return Ok(());
        }
        let now = self.fleet.clock().now_ms();
        self.store
            .append_fleet_log(&self.id, now, kind, payload)
            .await?;
        Ok(())
    }

    /// Applies the other replicas' calls logged since the last catch-up;
    /// how many.
    pub async fn catch_up(&self) -> Result<usize, StoreError> {
        if !self.shared {
            return Ok(0);
        }
        let mut applied = self.applied.lock().await;
        let mut n = 0;
        loop {
            let entries = self
                .store
                .fleet_log_after(*applied, FLEET_LOG_BATCH)
                .await?;
            let (now, now_ms) = (self.fleet.clock().now(), self.fleet.clock().now_ms());
            for e in &entries {
                if *applied > 0 && e.seq > *applied + 1 {
                    tracing::warn!(
                        from = *applied + 1,
                        to = e.seq - 1,
                        "fleet log: entries trimmed before this replica read them (it fell behind)"
                    );
                }
                *applied = e.seq;
                if e.replica_id != self.id {
                    self.apply(e, now, now_ms);
                    n += 1;
                }
            }
            if entries.len() < FLEET_LOG_BATCH {
                return Ok(n);
            }
            tokio::task::yield_now().await;
        }
    }

    fn apply(&self, e: &LogEntry, now: Instant, now_ms: i64) {
        let ago = Duration::from_millis(u64::try_from(now_ms - e.received_ms).unwrap_or(0));
        let at = now.checked_sub(ago).unwrap_or(now);
        match e.kind.as_str() {
            REGISTER => match v1::RegisterRequest::decode(e.payload.as_slice()) {
                Ok(req) => {
                    if let Some(m) = req.machine {
                        self.fleet.heard_at(&m.id, at);
                        self.fleet.registered_at(Machine::from(m), at);
                    }
                }
                Err(err) => {
                    tracing::error!(seq = e.seq, "fleet log: unreadable registration: {err}")
                }
            },
            HEARTBEAT => match v1::HeartbeatRequest::decode(e.payload.as_slice()) {
                Ok(req) => {
                    let Some(m) = req.machine.clone() else { return };
                    let chunk = Chunk::of(&req);
                    let isolates: Vec<Isolate> =
                        req.isolates.into_iter().map(Isolate::from).collect();
                    let evicted: Vec<Isolate> =
                        req.evicted.into_iter().map(Isolate::from).collect();
                    self.fleet.heard_at(&m.id, at);
                    self.fleet
                        .heartbeat_chunk_at(Machine::from(m), chunk, isolates, &evicted, at);
                }
                Err(err) => tracing::error!(seq = e.seq, "fleet log: unreadable heartbeat: {err}"),
            },
            other => tracing::error!(seq = e.seq, kind = other, "fleet log: unknown entry kind"),
        }
    }

    /// Runs in the background: reads the fleet log every
    /// [`FLEET_LOG_POLL`] and records this replica alive (failing stopped
    /// replicas' sessions) every [`REPLICA_HEARTBEAT`].
    pub async fn run(self: Arc<Self>) {
        let mut last_alive = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(FLEET_LOG_POLL).await;
            if let Err(e) = self.catch_up().await {
                tracing::error!("fleet log: {e:#}");
            }
            // One process (SQLite) has no peers to tell: its start
            // recorded it once, for the sessions it runs.
            if self.shared && last_alive.elapsed() >= REPLICA_HEARTBEAT {
                last_alive = tokio::time::Instant::now();
                if let Err(e) = self.alive().await {
                    tracing::error!("replica heartbeat: {e:#}");
                }
            }
        }
    }

    /// Records this replica alive, fails the sessions of replicas silent
    /// for [`REPLICA_EXPIRY`] (freeing their capture slots), and trims the
    /// fleet log.
    pub async fn alive(&self) -> Result<Round, StoreError> {
        let now_ms = self.fleet.clock().now_ms();
        self.store
            .replica_alive(&self.id, self.started_ms, now_ms)
            .await?;
        let mut round = Round::default();
        if !self.shared {
            return Ok(round); // one process: its start failed what was left
        }
        let cutoff = now_ms - REPLICA_EXPIRY.as_millis() as i64;
        let mut stopped = std::collections::BTreeSet::new();
        for o in self.store.orphaned_sessions(&self.id, cutoff).await? {
            let reason = match (&o.replica_id, o.last_heartbeat_ms) {
                (Some(r), Some(at)) => format!(
                    "interrupted: control-plane replica {r}, which ran this capture, stopped while it was {} \
                     (silent for {:.1} s); start the capture again",
                    o.status,
                    (now_ms - at) as f64 / 1000.0
                ),
                (Some(r), None) => format!(
                    "interrupted: control-plane replica {r}, which ran this capture, is gone (it was {}); \
                     start the capture again",
                    o.status
                ),
                (None, _) => continue, // not selected
            };
            if self
                .store
                .set_session_status(&o.id, SessionStatus::Failed, Some(&reason), None)
                .await?
            {
                tracing::warn!(session = %o.id, replica = ?o.replica_id, "{reason}");
                round.failed_sessions.push(o.id.clone());
            }
            if let Some(r) = o.replica_id {
                stopped.insert(r);
            }
        }
        for r in &stopped {
            self.store.free_capture_slots_of(r).await?;
        }
        let forget = now_ms - FORGET_REPLICAS_AFTER.as_millis() as i64;
        self.store.forget_replicas_before(forget).await?;
        let keep = now_ms - self.log_keep().as_millis() as i64;
        round.trimmed = self
            .store
            .trim_fleet_log(keep, 10 * FLEET_LOG_BATCH)
            .await?;
        Ok(round)
    }
}
