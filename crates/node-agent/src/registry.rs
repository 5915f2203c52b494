//! The agent's side of the control plane's `Registry`: register, heartbeat,
//! follow the deployment, fetch modules, place Durable Objects, push
//! continuous-profiling windows.
//!
//! A heartbeat also reports the final memory reading of every isolate
//! evicted since the last acknowledged one (put back for the next one if it
//! fails), and its answer renews the leases of the Durable Objects it listed
//! and names those placed elsewhere, which are dropped
//! ([`crate::lease`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use edgeprof_proto::v1::{self, registry_client::RegistryClient};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::hosting::{Hosting, ObjectKey, ScriptKey, Slot, VersionRef};

/// A module being fetched and compiled, or compiled: one cell per hash, so
/// callers of the same module wait for one fetch while other modules'
/// callers wait for nothing.
type ModuleCell = Arc<tokio::sync::OnceCell<Arc<edgeprof_sampler::Module>>>;

/// Largest gRPC message the agent accepts from the control plane: a module
/// up to the control plane's upload limit (64 MiB by default) plus its
/// envelope (issue 10: tonic's default 4 MiB made valid modules unrunnable).
pub const MAX_MESSAGE_BYTES: usize = 80 << 20;

/// How long a module that failed to fetch or compile is refused before it
/// is fetched again.
pub const MODULE_FAILURE_TTL: Duration = Duration::from_secs(10);

/// Most module failures remembered (past it, all are forgotten at once).
const MAX_MODULE_FAILURES: usize = 1024;

/// A name that is not in the deployment refetches the deployment at most
/// this often, however many unknown names are asked for.
pub const UNKNOWN_SCRIPT_REFRESH: Duration = Duration::from_secs(1);

/// Most isolates reported in one heartbeat message, so a message stays
/// well under gRPC's 4 MiB default; a machine with more sends its
/// heartbeat in chunks of this many.
pub const ISOLATES_PER_HEARTBEAT_CHUNK: usize = 2000;

/// Most chunks in one heartbeat (the control plane's bound): past
/// `ISOLATES_PER_HEARTBEAT_CHUNK` × this many isolates, the rest are
/// counted as omitted.
pub const MAX_HEARTBEAT_CHUNKS: usize = 50;

/// A deployed script as this agent knows it (by [`ScriptKey`]: its
/// account and name).
#[derive(Debug, Clone)]
pub struct DeployedScript {
    /// Versions with weights and module hashes.
    pub versions: Vec<v1::DeployedVersion>,
}

/// The control plane connection and what it told us.
pub struct Registry {
    /// One client per control-plane replica, in `--control-plane` order.
    clients: Vec<RegistryClient<Channel>>,
    /// The replica calls go to first: the last one that answered.
    current: std::sync::atomic::AtomicUsize,
    secret: String,
    /// This machine.
    pub machine: v1::Machine,
    generation: Mutex<u64>,
    scripts: RwLock<HashMap<ScriptKey, DeployedScript>>,
    modules: Mutex<HashMap<String, ModuleCell>>,
    /// Modules that failed to fetch or compile: cache key → (when, why).
    module_failures: Mutex<HashMap<String, (Instant, String)>>,
    /// Refreshes for unknown names, one at a time, and when the last ended.
    unknown_refresh: tokio::sync::Mutex<Option<Instant>>,
    /// The next heartbeat's id (its chunks share it); starts from the
    /// clock so a restarted agent does not reuse its predecessor's.
    next_heartbeat_id: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Connects lazily to the replicas at `urls` (a call dials).
    pub fn new(urls: &[String], secret: String, machine: v1::Machine) -> Result<Self> {
        if urls.is_empty() {
            bail!("--control-plane: no URL");
        }
        let clients = urls
            .iter()
            .map(|url| {
                let channel = Channel::from_shared(url.clone())
                    .with_context(|| format!("--control-plane `{url}` is not a valid URL"))?
                    .connect_timeout(std::time::Duration::from_secs(3))
                    .timeout(std::time::Duration::from_secs(10))
                    .connect_lazy();
                Ok(RegistryClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Registry {
            clients,
            current: std::sync::atomic::AtomicUsize::new(0),
            secret,
            machine,
            generation: Mutex::new(u64::MAX),
            scripts: RwLock::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            module_failures: Mutex::new(HashMap::new()),
            unknown_refresh: tokio::sync::Mutex::new(None),
            next_heartbeat_id: std::sync::atomic::AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64),
            ),
        })
    }

    /// Calls `f` on the current replica; when it cannot be reached
    /// (unavailable, timed out), on each other replica in turn, and the
    /// one that answers becomes current. Any other answer, an error
    /// included, is the answer.
    async fn call<T, R, F, Fut>(&self, msg: T, f: F) -> Result<tonic::Response<R>, tonic::Status>
    where
        T: Clone,
        F: Fn(RegistryClient<Channel>, tonic::Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        use std::sync::atomic::Ordering;
        let n = self.clients.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut last = None;
        for i in 0..n {
            let at = (first + i) % n;
            match f(self.clients[at].clone(), self.request(msg.clone())).await {
                Err(s) if unreachable(&s) => {
                    if n > 1 {
                        tracing::warn!(replica = at, error = %s.message(), "control plane unreachable; trying the next");
                    }
                    last = Some(s);
                }
                answer => {
                    self.current.store(at, Ordering::Relaxed);
                    return answer;
                }
            }
        }
        Err(last.unwrap_or_else(|| tonic::Status::unavailable("no control plane")))
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Ok(v) = format!("Bearer {}", self.secret).parse() {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }

    /// Announces this machine; returns the heartbeat interval the control plane asks for (ms).
    pub async fn register(&self) -> Result<u32> {
        let resp = self
            .call(
                v1::RegisterRequest {
                    machine: Some(self.machine.clone()),
                    agent_version: env!("CARGO_PKG_VERSION").into(),
                },
                |mut c, r| async move { c.register(r).await },
            )
            .await
            .map_err(|s| anyhow!("register with the control plane: {}", s.message()))?;
        Ok(resp.into_inner().heartbeat_interval_ms)
    }

    /// Sends one heartbeat with the state of every isolate and the final
    /// readings of isolates evicted since the last one; renews the leases
    /// of the Durable Objects it listed and drops those placed elsewhere;
    /// refetches the deployment when its generation changed.
    ///
    /// More isolates than one message holds go in chunks of
    /// [`ISOLATES_PER_HEARTBEAT_CHUNK`], one call each, the evicted ones
    /// with the first: each answer renews the leases of the objects its
    /// chunk listed, so every object keeps its lease whatever the count
    /// (issue 15: past 2,000 isolates the rest were left out, and their
    /// objects lost their leases). A failed chunk ends the heartbeat; the
    /// next one sends everything again.
    pub async fn heartbeat(&self, hosting: &Hosting) -> Result<()> {
        let slots = hosting.slots();
        let max = ISOLATES_PER_HEARTBEAT_CHUNK * MAX_HEARTBEAT_CHUNKS;
        let omitted = slots.len().saturating_sub(max);
        let slots = &slots[..slots.len().min(max)];
        let chunks: Vec<&[Arc<Slot>]> = if slots.is_empty() {
            vec![&[]]
        } else {
            slots.chunks(ISOLATES_PER_HEARTBEAT_CHUNK).collect()
        };
        let heartbeat_id = self
            .next_heartbeat_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let status = |s: &Slot| {
            let (evictions, memory_evictions) = hosting.evictions(&s.key.account, &s.version_id);
            v1::IsolateStatus {
                isolate_id: s.id.clone(),
                script: s.key.script.clone(),
                version_id: s.version_id.clone(),
                account: s.key.account.clone(),
                requests_last_60s: s.requests_last_60s(),
                last_request_unix_ms: s.last_request_ms(),
                durable_objects: s.durable_object.iter().map(|o| o.wire()).collect(),
                memory_bytes: s.memory_bytes(),
                evictions,
                memory_evictions,
            }
        };
        let mut generation = None;
        for (i, chunk) in chunks.iter().enumerate() {
            let isolates: Vec<v1::IsolateStatus> = chunk.iter().map(|s| status(s)).collect();
            let listed: Vec<ObjectKey> = chunk
                .iter()
                .filter_map(|s| s.durable_object.clone())
                .collect();
            let evicted_slots = if i == 0 {
                hosting.take_evicted(ISOLATES_PER_HEARTBEAT_CHUNK)
            } else {
                Vec::new()
            };
            let evicted = evicted_slots
                .iter()
                .map(|s| v1::IsolateStatus {
                    durable_objects: Vec::new(),
                    ..status(s)
                })
                .collect();
            // The leases this chunk renews count from now, before sending.
            let sent = Instant::now();
            let resp = self
                .call(
                    v1::HeartbeatRequest {
                        machine: Some(self.machine.clone()),
                        isolates,
                        isolates_omitted: omitted as u32,
                        evicted,
                        heartbeat_id,
                        chunk: i as u32,
                        chunks: chunks.len() as u32,
                    },
                    |mut c, r| async move { c.heartbeat(r).await },
                )
                .await;
            let resp = match resp {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    hosting.restore_evicted(evicted_slots);
                    let which = match chunks.len() {
                        1 => String::new(),
                        n => format!(" (chunk {} of {n})", i + 1),
                    };
                    bail!("heartbeat{which}: {}", s.message());
                }
            };
            let elsewhere: Vec<ObjectKey> = resp
                .durable_objects_elsewhere
                .into_iter()
                .map(|d| ObjectKey {
                    script: ScriptKey {
                        account: d.account,
                        script: d.script,
                    },
                    namespace: d.namespace,
                    id: d.object_id,
                })
                .collect();
            hosting.durable_objects_renewed(
                &listed,
                &elsewhere,
                sent,
                Duration::from_millis(u64::from(resp.durable_object_lease_ms)),
            );
            generation = Some(resp.deployment_generation);
        }
        let known = *self.generation.lock().unwrap_or_else(|e| e.into_inner());
        if generation.is_some_and(|g| g != known) {
            self.refresh_deployment().await?;
        }
        Ok(())
    }

    /// Fetches what this machine should run.
    pub async fn refresh_deployment(&self) -> Result<()> {
        let resp = self
            .call(
                v1::GetDeploymentRequest {
                    machine: Some(self.machine.clone()),
                },
                |mut c, r| async move { c.get_deployment(r).await },
            )
            .await
            .map_err(|s| anyhow!("get deployment: {}", s.message()))?
            .into_inner();
        let scripts: HashMap<ScriptKey, DeployedScript> = resp
            .scripts
            .into_iter()
            .map(|s| {
                (
                    ScriptKey {
                        account: s.account,
                        script: s.script,
                    },
                    DeployedScript {
                        versions: s.versions,
                    },
                )
            })
            .collect();
        // Compiled modules no deployed version uses any more are dropped
        // (live isolates keep theirs): the table stays as large as the
        // deployment, not as everything ever deployed.
        let deployed: std::collections::HashSet<&str> = scripts
            .values()
            .flat_map(|d| d.versions.iter().map(|v| v.wasm_sha256.as_str()))
            .collect();
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|hash, cell| deployed.contains(hash.as_str()) || !cell.initialized());
        *self.scripts.write().unwrap_or_else(|e| e.into_inner()) = scripts;
        *self.generation.lock().unwrap_or_else(|e| e.into_inner()) = resp.generation;
        Ok(())
    }

    fn known(&self, script: &ScriptKey) -> Option<DeployedScript> {
        self.scripts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(script)
            .cloned()
    }

    /// The deployment entry of `script`. An unknown one refetches the
    /// deployment, but at most once per [`UNKNOWN_SCRIPT_REFRESH`] for all
    /// unknown names together (issue 10: each request for an unknown name
    /// cost one `GetDeployment`); a newly deployed script is also seen at
    /// the next heartbeat.
    pub async fn script(&self, script: &ScriptKey) -> Result<Option<DeployedScript>> {
        if let Some(s) = self.known(script) {
            return Ok(Some(s));
        }
        let mut last = self.unknown_refresh.lock().await;
        if let Some(s) = self.known(script) {
            return Ok(Some(s));
        }
        if last.is_some_and(|t| t.elapsed() < UNKNOWN_SCRIPT_REFRESH) {
            return Ok(None);
        }
        let refreshed = self.refresh_deployment().await;
        *last = Some(Instant::now());
        refreshed?;
        Ok(self.known(script))
    }

    /// The compiled module of a version (fetched and compiled once per
    /// hash). No lock is held while fetching or compiling: requests for
    /// other modules go on meanwhile.
    pub async fn version(
        &self,
        hosting: &Hosting,
        key: &ScriptKey,
        version_id: &str,
        sha256: &str,
    ) -> Result<VersionRef> {
        let cache_key = if sha256.is_empty() {
            format!("version {version_id}")
        } else {
            sha256.to_owned()
        };
        let cell = self
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(cache_key.clone())
            .or_default()
            .clone();
        let module = match cell
            .get_or_try_init(|| async {
                // Also checked here: callers that waited on a fetch that
                // failed would each fetch again otherwise.
                self.recent_module_failure(&cache_key)?;
                self.fetch_module(hosting, key, version_id, sha256).await
            })
            .await
        {
            Ok(m) => m.clone(),
            Err(e) if e.is::<RecentFailure>() => return Err(e),
            Err(e) => {
                let why = crate::hosting::truncate(&format!("{e:#}"), 1024);
                let mut failures = self
                    .module_failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                failures.retain(|_, (at, _)| at.elapsed() < MODULE_FAILURE_TTL);
                if failures.len() >= MAX_MODULE_FAILURES {
                    failures.clear();
                }
                failures.insert(cache_key, (Instant::now(), why));
                return Err(e);
            }
        };
        Ok(VersionRef {
            key: key.clone(),
            version_id: version_id.into(),
            module,
        })
    }

    /// Fails with the remembered cause if the module failed to fetch or
    /// compile less than [`MODULE_FAILURE_TTL`] ago.
    fn recent_module_failure(&self, cache_key: &str) -> Result<(), RecentFailure> {
        let failures = self
            .module_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match failures.get(cache_key) {
            Some((at, why)) if at.elapsed() < MODULE_FAILURE_TTL => Err(RecentFailure(format!(
                "{why} ({} s ago; fetched again {} s after that)",
                at.elapsed().as_secs(),
                MODULE_FAILURE_TTL.as_secs()
            ))),
            _ => Ok(()),
        }
    }

    async fn fetch_module(
        &self,
        hosting: &Hosting,
        key: &ScriptKey,
        version_id: &str,
        sha256: &str,
    ) -> Result<Arc<edgeprof_sampler::Module>> {
        let resp = self
            .call(
                v1::GetScriptVersionRequest {
                    version_id: version_id.into(),
                },
                |mut c, r| async move { c.get_script_version(r).await },
            )
            .await
            .map_err(|s| anyhow!("fetch version {version_id}: {}", s.message()))?
            .into_inner();
        let actual = hex::encode(Sha256::digest(&resp.wasm));
        let expected = [sha256, resp.wasm_sha256.as_str()];
        if let Some(said) = expected.iter().find(|h| !h.is_empty() && **h != actual) {
            bail!(
                "version {version_id}: wasm bytes hash to {actual}, the control plane said {said}"
            );
        }
        let runtime = hosting.runtime().clone();
        let name = format!("{}.wasm", key.script);
        let wasm = resp.wasm;
        let module = tokio::task::spawn_blocking(move || runtime.load_module(&name, &wasm))
            .await
            .context("module compilation panicked")?
            .with_context(|| format!("version {version_id} of {key} does not compile"))?;
        Ok(Arc::new(module))
    }

    /// Sends a batch of continuous-profiling windows; `dropped_total`
    /// counts the windows this agent dropped unsent since it started.
    pub async fn push_windows(
        &self,
        windows: Vec<v1::ProfileWindow>,
        dropped_total: u64,
    ) -> Result<v1::PushWindowsResponse, tonic::Status> {
        let resp = self
            .call(
                v1::PushWindowsRequest {
                    machine: Some(self.machine.clone()),
                    windows,
                    dropped_total,
                },
                |mut c, r| async move { c.push_windows(r).await },
            )
            .await?;
        Ok(resp.into_inner())
    }

    /// Where Durable Object `namespace:object_id` lives (placing it here
    /// on first use), and when the call was sent: a lease the answer grants
    /// counts from then.
    pub async fn place_durable_object(
        &self,
        account: &str,
        script: &str,
        namespace: &str,
        object_id: &str,
    ) -> Result<(v1::PlaceDurableObjectResponse, Instant)> {
        let sent = Instant::now();
        let resp = self
            .call(
                v1::PlaceDurableObjectRequest {
                    machine: Some(self.machine.clone()),
                    account: account.into(),
                    script: script.into(),
                    namespace: namespace.into(),
                    object_id: object_id.into(),
                },
                |mut c, r| async move { c.place_durable_object(r).await },
            )
            .await
            .map_err(|s| PlacementUnavailable {
                message: format!(
                    "place durable object {namespace}:{object_id}: {}",
                    s.message()
                ),
                retry_after: s
                    .metadata()
                    .get(RETRY_AFTER_MS)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .map(Duration::from_millis),
            })?;
        Ok((resp.into_inner(), sent))
    }
}

/// A module failed to fetch or compile moments ago (not fetched again yet).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RecentFailure(String);

/// gRPC metadata key with which the control plane says, in milliseconds,
/// when a refused placement is worth asking for again.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The control plane could not place an object now (e.g. its owner is
/// silent but still leased), and maybe when to ask again.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PlacementUnavailable {
    /// What the control plane said.
    pub message: String,
    /// When to ask again, if the control plane said.
    pub retry_after: Option<Duration>,
}

/// Whether `s` says the replica could not be reached (so another may
/// answer), rather than answering: a replica's own "unavailable, retry
/// after" (an object whose silent owner still holds its lease) is an
/// answer every replica would give.
fn unreachable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    ) && s.metadata().get(RETRY_AFTER_MS).is_none()
}
