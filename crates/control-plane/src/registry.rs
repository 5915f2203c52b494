//! The gRPC `Registry` service agents call (register, heartbeat,
//! deployments, wasm, Durable Object placement), its agent-secret check,
//! and the conversions between the wire types and the fleet's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use tonic::{Request, Response, Status};

use crate::auth::{BearerError, bearer, secrets_equal};
use crate::fleet::{Chunk, Fleet, Isolate, Machine};
use crate::history::pyroscope::Forwarder;
use crate::metrics::Metrics;
use crate::names::DurableObjectId;
use crate::replica::Replica;
use crate::store::{DurableObjectKey, MachineRecord, Store};

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
        let value = req.metadata().get("authorization").map(|v| v.as_bytes());
        let given = match bearer(value) {
            Ok(t) => t,
            Err(BearerError::Missing) => {
                return Err(Status::unauthenticated(
                    "missing `authorization: Bearer <agent secret>` metadata",
                ));
            }
            Err(BearerError::Malformed) => {
                return Err(Status::unauthenticated(
                    "the authorization metadata must be `Bearer <agent secret>`",
                ));
            }
        };
        if !secrets_equal(given.as_bytes(), self.secret.as_bytes()) {
            return Err(Status::unauthenticated("wrong agent secret"));
        }
        Ok(req)
    }
}

/// Most isolates one heartbeat message may carry.
pub const MAX_ISOLATES_PER_HEARTBEAT: usize = 10_000;

/// Most chunks one heartbeat may be sent in: with
/// [`MAX_ISOLATES_PER_HEARTBEAT`], what the fleet holds for one machine
/// stays bounded.
pub const MAX_HEARTBEAT_CHUNKS: u32 = 50;

/// How often a machine's heartbeat marks the Durable Objects it lists as
/// seen (a write per object; the placements' time to live is at least
/// [`crate::MIN_DURABLE_OBJECT_TTL`], ten of these).
pub const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// When a machine's listed objects were last marked seen, and by which
/// chunked heartbeat, if it was one.
type Touched = (Instant, Option<u64>);

/// The gRPC `Registry` service.
#[derive(Debug, Clone)]
pub struct RegistryService {
    store: Arc<Store>,
    fleet: Arc<Fleet>,
    metrics: Arc<Metrics>,
    /// When each machine's listed objects were last marked seen, and by
    /// which heartbeat (its later chunks mark theirs too).
    touched: Arc<Mutex<HashMap<String, Touched>>>,
    pyroscope: Option<Arc<Forwarder>>,
    /// Logs every call for the other replicas (none: this process only).
    replica: Option<Arc<Replica>>,
}

impl RegistryService {
    /// A registry over `store` and `fleet`.
    pub fn new(store: Arc<Store>, fleet: Arc<Fleet>, metrics: Arc<Metrics>) -> Self {
        RegistryService {
            store,
            fleet,
            metrics,
            touched: Arc::default(),
            pyroscope: None,
            replica: None,
        }
    }

    /// Logs every registration and heartbeat for the replicas sharing the
    /// database through `replica` ([`crate::replica`]).
    pub fn with_replica(self, replica: Arc<Replica>) -> Self {
        RegistryService {
            replica: Some(replica),
            ..self
        }
    }

    /// Forwards the windows agents push to Pyroscope through `forwarder`.
    pub fn with_pyroscope(self, forwarder: Option<Arc<Forwarder>>) -> Self {
        RegistryService {
            pyroscope: forwarder,
            ..self
        }
    }

    /// Whether `machine_id`'s heartbeat now should mark its objects seen
    /// (and, if so, counts this one as done). `chunked` names the
    /// heartbeat a chunk belongs to: once one chunk of a heartbeat marks,
    /// all of its chunks do, so every listed object is marked.
    fn touch_due(&self, machine_id: &str, chunked: Option<u64>) -> bool {
        let now = self.fleet.clock().now();
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        match touched.get(machine_id) {
            Some((_, Some(id))) if chunked == Some(*id) => true,
            Some((at, _)) if now.saturating_duration_since(*at) < TOUCH_EVERY => false,
            _ => {
                touched.insert(machine_id.to_owned(), (now, chunked));
                true
            }
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
    if m.http_address.len() > 256 {
        return Err(Status::invalid_argument(format!(
            "machine.http_address: at most 256 bytes (got {})",
            m.http_address.len()
        )));
    }
    Ok(Machine::from(m))
}

fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!("registry: {e:#}");
    Status::internal("internal error; see the control plane's log")
}

async fn record(store: &Store, m: &Machine, now_ms: i64) -> Result<(), Status> {
    store
        .upsert_machine(&MachineRecord {
            id: m.id.clone(),
            data_center: m.data_center.clone(),
            grpc_address: m.grpc_address.clone(),
            http_address: m.http_address.clone(),
            last_heartbeat_ms: now_ms,
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
        let req = request.into_inner();
        let m = machine_from_proto(req.machine.clone())?;
        // Logged once recorded here, so other replicas never apply a call
        // this one refused.
        record(&self.store, &m, self.fleet.clock().now_ms()).await?;
        if let Some(replica) = &self.replica {
            replica.log_register(&req).await.map_err(internal)?;
        }
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
        let m = machine_from_proto(req.machine.clone())?;
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
        match req.chunks {
            0 | 1 => {}
            n if n > MAX_HEARTBEAT_CHUNKS => {
                return Err(Status::invalid_argument(format!(
                    "chunks: at most {MAX_HEARTBEAT_CHUNKS} per heartbeat (got {n})"
                )));
            }
            n if req.chunk >= n => {
                return Err(Status::invalid_argument(format!(
                    "chunk: must be below chunks ({n}) (got {})",
                    req.chunk
                )));
            }
            _ => {}
        }
        let chunk = Chunk::of(&req);
        record(&self.store, &m, self.fleet.clock().now_ms()).await?;
        if let Some(replica) = &self.replica {
            replica.log_heartbeat(&req).await.map_err(internal)?;
        }
        // Its later chunks mark their objects seen when its first did.
        let chunked = (chunk.count > 1).then_some(chunk.heartbeat_id);
        let isolates: Vec<Isolate> = req.isolates.into_iter().map(Isolate::from).collect();
        let evicted: Vec<Isolate> = req.evicted.into_iter().map(Isolate::from).collect();
        let elsewhere = {
            // Renew the lease and read which listed objects moved as one
            // step against placements (see `Fleet::placements`).
            let _placements = self.fleet.placements().await;
            self.fleet.heard(&m.id);
            let seen = self
                .touch_due(&m.id, chunked)
                .then(|| self.fleet.clock().now_ms());
            if let Some(seen) = seen
                && req.isolates_omitted > 0
            {
                // Not every object is listed: keep all of this machine's.
                self.store
                    .durable_objects_all_seen(&m.id, seen)
                    .await
                    .map_err(internal)?;
            }
            self.durable_objects_heard(&m.id, &isolates, seen).await?
        };
        if !elsewhere.is_empty() {
            let names: Vec<String> = elsewhere
                .iter()
                .map(|d| format!("{}/{} {}:{}", d.account, d.script, d.namespace, d.object_id))
                .collect();
            tracing::info!(machine = %m.id, objects = ?names, "durable objects placed elsewhere: the agent drops them");
        }
        self.fleet.heartbeat_chunk(m, chunk, isolates, &evicted);
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
        let object =
            DurableObjectId::parse("namespace", &req.namespace, "object_id", &req.object_id)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
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
        let key = DurableObjectKey {
            account: &req.account,
            script: &req.script,
            namespace: object.namespace(),
            object_id: object.id(),
        };
        // The call renews the asker's lease (its agent counts it from when
        // it sent the call); the asker's own objects never move to itself.
        record(&self.store, &asker, self.fleet.clock().now_ms()).await?;
        let placement = {
            let _placements = self.fleet.placements().await;
            self.fleet.heard(&asker.id);
            let fleet = &self.fleet;
            self.store
                .place_durable_object(
                    &key,
                    (&asker.id, &version.version_id),
                    fleet.clock().now_ms(),
                    |owner, db_heartbeat_ms| {
                        owner != asker.id && fleet.lease_ended(owner, db_heartbeat_ms)
                    },
                )
                .await
                .map_err(internal)?
        };
        if placement.created {
            tracing::info!(
                object = %object,
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
                "durable object {object} lives on machine {}, which has not been heard from for {:.1} s; \
                 it moves to a live machine once that machine's lease ends (in {:.1} s at most); retry then",
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

    async fn push_windows(
        &self,
        request: Request<v1::PushWindowsRequest>,
    ) -> Result<Response<v1::PushWindowsResponse>, Status> {
        let req = request.into_inner();
        let machine = machine_from_proto(req.machine)?;
        let now_ms = self.fleet.clock().now_ms();
        let pushed = crate::history::ingest::push(
            &self.store,
            &machine,
            req.windows,
            now_ms,
            self.pyroscope.as_deref(),
        )
        .await
        .map_err(internal)?;
        if let Some(first) = pushed.rejected.first() {
            tracing::warn!(
                machine = %machine.id,
                refused = pushed.rejected.len(),
                first = %first,
                "profile windows refused"
            );
        }
        Ok(Response::new(v1::PushWindowsResponse {
            accepted: pushed.accepted,
            rejected: pushed.rejected,
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
            .filter(|r| {
                self.fleet
                    .clock()
                    .now_ms()
                    .saturating_sub(r.last_heartbeat_ms)
                    < window
            })
            .map(|r| Machine {
                id: r.id,
                data_center: r.data_center,
                grpc_address: r.grpc_address,
                http_address: r.http_address,
            }))
    }

    /// Marks the Durable Objects `isolates` list as seen at `seen_ms`
    /// (when given); returns those placed on another machine than
    /// `machine_id`.
    async fn durable_objects_heard(
        &self,
        machine_id: &str,
        isolates: &[Isolate],
        seen_ms: Option<i64>,
    ) -> Result<Vec<v1::DurableObjectRef>, Status> {
        let mut by_script: HashMap<(&str, &str), Vec<(&str, &str)>> = HashMap::new();
        for i in isolates {
            for d in &i.durable_objects {
                if let Some(o) = d.split_once(':') {
                    by_script
                        .entry((&i.account, &i.script))
                        .or_default()
                        .push(o);
                }
            }
        }
        let mut out = Vec::new();
        for ((account, script), objects) in by_script {
            let moved = self
                .store
                .durable_objects_heard(machine_id, account, script, &objects, seen_ms)
                .await
                .map_err(internal)?;
            out.extend(
                moved
                    .into_iter()
                    .map(|(namespace, object_id)| v1::DurableObjectRef {
                        account: account.to_owned(),
                        script: script.to_owned(),
                        namespace,
                        object_id,
                    }),
            );
        }
        out.sort_by(|a, b| {
            (&a.account, &a.script, &a.namespace, &a.object_id).cmp(&(
                &b.account,
                &b.script,
                &b.namespace,
                &b.object_id,
            ))
        });
        Ok(out)
    }
}

fn lease_ms(lease: Duration) -> u32 {
    u32::try_from(lease.as_millis()).unwrap_or(u32::MAX)
}
