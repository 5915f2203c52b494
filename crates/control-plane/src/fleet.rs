//! The live fleet as agents report it by heartbeat, target resolution over
//! it, and the gRPC `Registry` service agents call.
//!
//! The fleet is memory only: after a restart it refills with the agents'
//! next heartbeats. Machines are also written to the database (with their
//! last heartbeat) so operators can see what once was there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use tonic::{Request, Response, Status};

use crate::store::{MachineRecord, Store, now_ms};

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
    heartbeat_interval: Duration,
}

impl Fleet {
    /// An empty fleet expecting heartbeats every `heartbeat_interval`.
    pub fn new(heartbeat_interval: Duration) -> Self {
        Fleet {
            machines: Mutex::new(HashMap::new()),
            heartbeat_interval,
        }
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

    /// Records a heartbeat (or registration, with no isolates yet).
    pub fn heartbeat(&self, machine: Machine, isolates: Option<Vec<Isolate>>) {
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
        self.fleet.heartbeat(m, None);
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
        let isolates = req
            .isolates
            .into_iter()
            .map(|i| Isolate {
                id: i.isolate_id,
                account: i.account,
                script: i.script,
                version_id: i.version_id,
                requests_last_60s: i.requests_last_60s,
                last_request_unix_ms: i.last_request_unix_ms,
                durable_objects: i.durable_objects,
                memory_bytes: i.memory_bytes,
            })
            .collect();
        record(&self.store, &m).await?;
        self.fleet.heartbeat(m, Some(isolates));
        self.metrics.heartbeats.inc();
        let generation = self.store.deployment_generation().await.map_err(internal)?;
        Ok(Response::new(v1::HeartbeatResponse {
            deployment_generation: generation,
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
        let fleet = self.fleet.clone();
        let placement = self
            .store
            .place_durable_object(
                &req.account,
                &req.script,
                &req.namespace,
                &req.object_id.to_ascii_lowercase(),
                (&asker.id, &version.version_id),
                |owner| owner == asker.id || fleet.is_live(owner),
            )
            .await
            .map_err(internal)?;
        let owner = if placement.machine_id == asker.id {
            asker
        } else {
            self.fleet
                .machine(&placement.machine_id)
                .ok_or_else(|| Status::unavailable("the owner machine just went away; retry"))?
        };
        Ok(Response::new(v1::PlaceDurableObjectResponse {
            owner: Some(v1::Machine {
                id: owner.id,
                data_center: owner.data_center,
                grpc_address: owner.grpc_address,
                http_address: owner.http_address,
            }),
            version_id: placement.version_id,
        }))
    }
}
