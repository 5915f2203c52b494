//! The edgeprof control plane: accounts and their API tokens, scripts and
//! versions, deployments, the registry of node agents (fed by heartbeats),
//! capture sessions fanned out to agents and merged into one pprof, and the
//! REST API people and the CLI use.
//!
//! Modules, in import order (each imports only those before it):
//! `store ← fleet ← {capture, history, replica} ← {api, registry}`, with the leaf modules
//! [`clock`], [`auth`], [`names`], [`text`] and [`metrics`] usable by all.
//!
//! - [`store`]: the database (embedded SQLite or PostgreSQL, same SQL).
//! - [`fleet`]: live machines and isolates, target resolution, leases,
//!   memory windows.
//! - [`capture`]: sessions, the per-script limit, fan-out and the pure
//!   merge ([`capture::merge_responses`]).
//! - [`replica`]: several replicas on one PostgreSQL agreeing (the fleet
//!   log, replica liveness).
//! - [`api`]: the axum router ([`api::app`]) over `edgeprof_proto::rest`.
//! - [`registry`]: the gRPC `Registry` service agents call, and its auth.
//! - [`server`]: the HTTP listener's edges (connection cap, timeouts, TLS).
//! - [`ControlPlane::start`]: binds both listeners and runs everything,
//!   with retention in the background.
//!
//! Architecture invariant: this is the only crate that talks to the
//! database. It never depends on the node agent, the CLI or the viewer; it
//! speaks to agents only through the wire types of `edgeprof-proto`, and
//! converts them to its own domain types at the edge ([`registry`],
//! [`capture`]).

pub mod api;
pub mod auth;
pub mod capture;
pub mod clock;
pub mod dashboard;
pub mod fleet;
pub mod history;
pub mod metrics;
pub mod names;
pub mod registry;
pub mod replica;
pub mod server;
pub mod store;
pub mod text;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

/// A dev account created at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevAccount {
    /// Account id.
    pub account: String,
    /// Token to create (a random one when `None`).
    pub token: Option<String>,
}

/// Validated settings of a control plane.
#[derive(Debug, Clone)]
pub struct Config {
    /// REST listen address.
    pub http_listen: SocketAddr,
    /// gRPC (Registry) listen address.
    pub grpc_listen: SocketAddr,
    /// SQLite path, `sqlite:` URL or `postgres://` URL.
    pub database: String,
    /// Shared secret of agents (both directions).
    pub agent_secret: String,
    /// How often agents heartbeat.
    pub heartbeat_interval: Duration,
    /// How long a machine keeps its Durable Objects after its last call
    /// (see [`fleet::lease_ended`]); `None`: [`fleet::DEFAULT_LEASE_INTERVALS`]
    /// heartbeat intervals.
    pub durable_object_lease: Option<Duration>,
    /// A Durable Object placement no machine has placed, confirmed or
    /// listed for this long is deleted (the object itself went with its
    /// isolate, reclaimed when idle); its next request places it afresh.
    pub durable_object_ttl: Duration,
    /// Extra time given to agents beyond a capture's duration.
    pub capture_slack: Duration,
    /// Most concurrent captures of one script.
    pub max_captures_per_script: usize,
    /// Largest wasm upload accepted.
    pub max_wasm_bytes: usize,
    /// Create this account and token at start.
    pub dev: Option<DevAccount>,
    /// Directory the dashboard (`/`, `/assets/…`) is served from.
    pub dashboard_dir: std::path::PathBuf,
    /// Serve the REST API over TLS with these PEM files.
    pub tls: Option<server::TlsFiles>,
    /// Bounds of the REST listener.
    pub http: server::HttpLimits,
    /// What one capture accepts from agents.
    pub capture_limits: capture::Limits,
    /// Sessions (and their profiles) older than this are deleted in the
    /// background; `None`: kept forever.
    pub retention: Option<Duration>,
    /// Continuous-profiling windows that ended longer ago than this are
    /// deleted in the background.
    pub history_retention: Duration,
    /// Forward every stored window to Grafana Pyroscope; `None`: off.
    pub pyroscope: Option<history::pyroscope::PyroscopeConfig>,
    /// The clock (manual in tests).
    pub clock: clock::Clock,
}

/// Default of [`Config::retention`]: 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default of [`Config::history_retention`]: 7 days.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Windows deleted per statement by the history sweep.
pub const HISTORY_SWEEP_BATCH: usize = 1_000;
/// How often retention runs.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(600);
/// Default of [`Config::durable_object_ttl`].
pub const DEFAULT_DURABLE_OBJECT_TTL: Duration = Duration::from_secs(3600);
/// Shortest [`Config::durable_object_ttl`]: ten times
/// [`registry::TOUCH_EVERY`], how often heartbeats mark listed objects seen.
pub const MIN_DURABLE_OBJECT_TTL: Duration = Duration::from_secs(600);
/// Placements deleted per statement by the Durable Object sweep.
pub const DURABLE_OBJECT_SWEEP_BATCH: usize = 500;

impl Config {
    /// Defaults for everything but the database and secret.
    pub fn new(database: impl Into<String>, agent_secret: impl Into<String>) -> Self {
        Config {
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            database: database.into(),
            agent_secret: agent_secret.into(),
            heartbeat_interval: Duration::from_secs(5),
            durable_object_lease: None,
            durable_object_ttl: DEFAULT_DURABLE_OBJECT_TTL,
            capture_slack: Duration::from_secs(2),
            max_captures_per_script: 2,
            max_wasm_bytes: 64 << 20,
            dev: None,
            dashboard_dir: dashboard::default_dir(),
            tls: None,
            http: server::HttpLimits::default(),
            capture_limits: capture::Limits::default(),
            retention: Some(DEFAULT_RETENTION),
            history_retention: DEFAULT_HISTORY_RETENTION,
            pyroscope: None,
            clock: clock::Clock::system(),
        }
    }

    /// The Durable Object lease in effect.
    pub fn durable_object_lease(&self) -> Duration {
        self.durable_object_lease
            .unwrap_or(self.heartbeat_interval * fleet::DEFAULT_LEASE_INTERVALS)
    }

    /// Checks the settings, naming the one that is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.agent_secret.len() < 8 {
            anyhow::bail!("agent secret: must be at least 8 characters");
        }
        if self
            .agent_secret
            .chars()
            .any(|c| c.is_control() || c == ' ')
        {
            anyhow::bail!("agent secret: must not contain spaces or control characters");
        }
        if self.heartbeat_interval < Duration::from_millis(50)
            || self.heartbeat_interval > Duration::from_secs(300)
        {
            anyhow::bail!(
                "heartbeat interval: must be 50 ms – 300 s (got {:?})",
                self.heartbeat_interval
            );
        }
        if let Some(lease) = self.durable_object_lease {
            let min = self.heartbeat_interval * fleet::MIN_LEASE_INTERVALS;
            if lease < min || lease > Duration::from_secs(3600) {
                anyhow::bail!(
                    "durable object lease: must be {} heartbeat intervals ({} ms) – 1 h, \
                     so it outlasts the liveness window of 2.5 intervals (got {} ms)",
                    fleet::MIN_LEASE_INTERVALS,
                    min.as_millis(),
                    lease.as_millis()
                );
            }
        }
        if self.durable_object_ttl < MIN_DURABLE_OBJECT_TTL
            || self.durable_object_ttl < 2 * self.durable_object_lease()
        {
            anyhow::bail!(
                "durable object ttl: at least {} min and twice the lease ({} ms) (got {} s)",
                MIN_DURABLE_OBJECT_TTL.as_secs() / 60,
                self.durable_object_lease().as_millis(),
                self.durable_object_ttl.as_secs()
            );
        }
        if self.capture_slack > Duration::from_secs(60) {
            anyhow::bail!("capture slack: at most 60 s (got {:?})", self.capture_slack);
        }
        if self.http.max_connections == 0 {
            anyhow::bail!("max connections: must be at least 1");
        }
        if self.http.header_timeout.is_zero() || self.http.body_idle_timeout.is_zero() {
            anyhow::bail!("header and body timeouts: must be more than 0");
        }
        if self
            .retention
            .is_some_and(|r| r < Duration::from_secs(3600))
        {
            anyhow::bail!(
                "retention: at least 1 h (got {:?})",
                self.retention.unwrap_or_default()
            );
        }
        if self.history_retention < Duration::from_secs(3600) {
            anyhow::bail!(
                "history retention: at least 1 h (got {:?})",
                self.history_retention
            );
        }
        if self.max_captures_per_script == 0 {
            anyhow::bail!("max captures per script: must be at least 1");
        }
        store::database_url(&self.database).map_err(anyhow::Error::from)?;
        if let Some(dev) = &self.dev
            && let Some(t) = &dev.token
            && t.len() < 16
        {
            anyhow::bail!("dev token: must be at least 16 characters");
        }
        Ok(())
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    /// Where REST listens.
    pub http_addr: SocketAddr,
    /// Where the Registry listens.
    pub grpc_addr: SocketAddr,
    /// The dev token, when a dev account was asked for.
    pub dev_token: Option<String>,
    /// Sessions found unfinished at start and marked failed.
    pub interrupted_sessions: Vec<String>,
    /// The database.
    pub store: Arc<store::Store>,
    /// The fleet.
    pub fleet: Arc<fleet::Fleet>,
    /// The clock everything reads.
    pub clock: clock::Clock,
    /// Whether the REST API is served over TLS.
    pub tls: bool,
    retention: Option<Duration>,
    history_retention: Duration,
    durable_object_ttl: Duration,
    http_task: tokio::task::JoinHandle<()>,
    grpc_task: tokio::task::JoinHandle<()>,
    housekeeping_task: tokio::task::JoinHandle<()>,
    replica_task: tokio::task::JoinHandle<()>,
    /// This replica.
    pub replica: Arc<replica::Replica>,
    pyroscope_task: Option<tokio::task::JoinHandle<()>>,
}

impl ControlPlane {
    /// Opens the database, fails sessions a previous process left
    /// unfinished, binds both listeners and serves until dropped or
    /// [`ControlPlane::stop`]ped.
    pub async fn start(config: Config) -> Result<ControlPlane> {
        config.validate()?;
        let store = Arc::new(
            store::Store::open(&config.database)
                .await
                .context("opening the database")?,
        );
        let dev_token = match &config.dev {
            Some(dev) => {
                let token = match &dev.token {
                    Some(t) => {
                        store.ensure_account(&dev.account).await?;
                        store.add_token(&dev.account, t).await?;
                        t.clone()
                    }
                    None => store.create_token(&dev.account).await?,
                };
                Some(token)
            }
            None => None,
        };
        let metrics = Arc::new(metrics::Metrics::default());
        let fleet = Arc::new(fleet::Fleet::with_lease(
            config.heartbeat_interval,
            config.durable_object_lease(),
            config.clock.clone(),
        ));
        let (replica, interrupted) = replica::Replica::start(store.clone(), fleet.clone())
            .await
            .context("starting this replica")?;
        let captures = capture::Captures::new(
            store.clone(),
            metrics.clone(),
            capture::CaptureSettings {
                agent_secret: config.agent_secret.clone(),
                slack: config.capture_slack,
                max_per_script: config.max_captures_per_script,
                limits: config.capture_limits,
                replica_id: replica.id().to_owned(),
            },
            config.clock.clone(),
        );
        let tls = config.tls.as_ref().map(server::tls_acceptor).transpose()?;
        let state = api::AppState {
            store: store.clone(),
            fleet: fleet.clone(),
            replica: replica.clone(),
            captures,
            metrics: metrics.clone(),
            max_wasm_bytes: config.max_wasm_bytes,
            clock: config.clock.clone(),
        };

        let http = tokio::net::TcpListener::bind(config.http_listen)
            .await
            .with_context(|| format!("binding the REST listener on {}", config.http_listen))?;
        let http_addr = http.local_addr()?;
        let grpc = tokio::net::TcpListener::bind(config.grpc_listen)
            .await
            .with_context(|| format!("binding the gRPC listener on {}", config.grpc_listen))?;
        let grpc_addr = grpc.local_addr()?;

        let router = api::app(state).merge(dashboard::routes(config.dashboard_dir.clone()));
        let serving_tls = tls.is_some();
        let http_task = tokio::spawn(server::serve(http, router, config.http, tls));
        let (pyroscope, pyroscope_task) = match &config.pyroscope {
            Some(c) => {
                let (f, task) = history::pyroscope::Forwarder::start(
                    c.clone(),
                    metrics.clone(),
                    config.clock.clone(),
                )
                .map_err(anyhow::Error::msg)?;
                (Some(f), Some(task))
            }
            None => (None, None),
        };
        let registry = tonic::service::interceptor::InterceptedService::new(
            edgeprof_proto::v1::registry_server::RegistryServer::new(
                registry::RegistryService::new(store.clone(), fleet.clone(), metrics)
                    .with_pyroscope(pyroscope)
                    .with_replica(replica.clone()),
            )
            .max_decoding_message_size(16 << 20),
            registry::AgentAuth::new(&config.agent_secret),
        );
        let grpc_task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(grpc);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(registry)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!("gRPC server: {e}");
            }
        });
        let housekeeping_task = {
            let (store, clock) = (store.clone(), config.clock.clone());
            let (retention, ttl) = (config.retention, config.durable_object_ttl);
            let history = config.history_retention;
            tokio::spawn(async move {
                loop {
                    if let Some(retention) = retention
                        && let Err(e) = sweep(&store, retention, clock.now_ms()).await
                    {
                        tracing::error!("retention: {e:#}");
                    }
                    if let Err(e) = sweep_durable_objects(&store, ttl, clock.now_ms()).await {
                        tracing::error!("durable object placements: {e:#}");
                    }
                    if let Err(e) = sweep_history(&store, history, clock.now_ms()).await {
                        tracing::error!("history retention: {e:#}");
                    }
                    if let Err(e) = compact_history(&store, clock.now_ms()).await {
                        tracing::error!("history compaction: {e:#}");
                    }
                    tokio::time::sleep(RETENTION_INTERVAL).await;
                }
            })
        };
        let replica_task = tokio::spawn(replica.clone().run());
        Ok(ControlPlane {
            http_addr,
            grpc_addr,
            dev_token,
            interrupted_sessions: interrupted,
            store,
            fleet,
            clock: config.clock.clone(),
            tls: serving_tls,
            retention: config.retention,
            history_retention: config.history_retention,
            durable_object_ttl: config.durable_object_ttl,
            http_task,
            grpc_task,
            housekeeping_task,
            replica_task,
            replica,
            pyroscope_task,
        })
    }

    /// Runs retention once now (as the background task does every
    /// [`RETENTION_INTERVAL`]); what it deleted.
    pub async fn sweep_retention(&self) -> Result<store::Deleted> {
        match self.retention {
            Some(r) => sweep(&self.store, r, self.clock.now_ms()).await,
            None => Ok(store::Deleted::default()),
        }
    }

    /// Deletes Durable Object placements unseen for the time to live now
    /// (as the background task does every [`RETENTION_INTERVAL`]); how many.
    pub async fn sweep_durable_objects(&self) -> Result<u64> {
        sweep_durable_objects(&self.store, self.durable_object_ttl, self.clock.now_ms()).await
    }

    /// Deletes continuous-profiling windows past the history retention now
    /// (as the background task does every [`RETENTION_INTERVAL`]); how many.
    pub async fn sweep_history(&self) -> Result<u64> {
        sweep_history(&self.store, self.history_retention, self.clock.now_ms()).await
    }

    /// Runs one compaction pass now (as the background task does after
    /// retention every [`RETENTION_INTERVAL`]); what it did.
    pub async fn compact_history(&self) -> Result<history::compact::Compacted> {
        compact_history(&self.store, self.clock.now_ms()).await
    }

    /// Waits until a server stops (which only happens on an error).
    pub async fn wait(&mut self) -> Result<()> {
        tokio::select! {
            r = &mut self.http_task => r.context("REST server")?,
            r = &mut self.grpc_task => r.context("gRPC server")?,
        }
        anyhow::bail!("a server stopped unexpectedly")
    }

    /// Stops both servers.
    pub fn stop(&self) {
        self.http_task.abort();
        self.grpc_task.abort();
        self.housekeeping_task.abort();
        self.replica_task.abort();
        if let Some(t) = &self.pyroscope_task {
            t.abort();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deletes sessions (and their profiles) older than `retention` at
/// `now_ms`, in batches of [`store::RETENTION_BATCH`], yielding between
/// batches so requests keep being served.
pub async fn sweep(
    store: &store::Store,
    retention: Duration,
    now_ms: i64,
) -> Result<store::Deleted> {
    let cutoff = now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    let mut total = store::Deleted::default();
    loop {
        let d = store
            .delete_sessions_before(cutoff, store::RETENTION_BATCH)
            .await?;
        total.sessions += d.sessions;
        total.profiles += d.profiles;
        if d.sessions < store::RETENTION_BATCH as u64 {
            break;
        }
        tokio::task::yield_now().await;
    }
    if total.sessions > 0 {
        tracing::info!(
            sessions = total.sessions,
            profiles = total.profiles,
            "retention: deleted sessions older than {} days",
            retention.as_secs() / 86_400
        );
    }
    Ok(total)
}

/// Deletes Durable Object placements last seen more than `ttl` before
/// `now_ms`, in batches of [`DURABLE_OBJECT_SWEEP_BATCH`], yielding between
/// batches. Safe beside other replicas: each delete checks the age again.
pub async fn sweep_durable_objects(
    store: &store::Store,
    ttl: Duration,
    now_ms: i64,
) -> Result<u64> {
    let cutoff = now_ms.saturating_sub(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
    let total = in_batches(DURABLE_OBJECT_SWEEP_BATCH, || {
        store.delete_durable_objects_unseen_before(cutoff, DURABLE_OBJECT_SWEEP_BATCH)
    })
    .await?;
    if total > 0 {
        tracing::info!(
            placements = total,
            "durable objects unseen for {} min: placements reclaimed",
            ttl.as_secs() / 60
        );
    }
    Ok(total)
}

/// Deletes continuous-profiling windows that ended more than `retention`
/// before `now_ms`, in batches of [`HISTORY_SWEEP_BATCH`], yielding between
/// batches. Safe beside other replicas: each batch is one statement.
pub async fn sweep_history(store: &store::Store, retention: Duration, now_ms: i64) -> Result<u64> {
    let cutoff = now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    let total = in_batches(HISTORY_SWEEP_BATCH, || {
        store.delete_windows_before(cutoff, HISTORY_SWEEP_BATCH)
    })
    .await?;
    if total > 0 {
        tracing::info!(
            windows = total,
            "history retention: deleted windows older than {} h",
            retention.as_secs() / 3600
        );
    }
    Ok(total)
}

/// One compaction pass of the continuous-profiling history at `now_ms`
/// ([`history::compact`]); safe beside other replicas.
pub async fn compact_history(
    store: &store::Store,
    now_ms: i64,
) -> Result<history::compact::Compacted> {
    let done = history::compact::compact(store, now_ms).await?;
    if done.blocks > 0 || done.raced > 0 || done.unreadable > 0 {
        tracing::info!(
            blocks = done.blocks,
            sources = done.sources,
            raced = done.raced,
            unreadable = done.unreadable,
            "history compaction"
        );
    }
    Ok(done)
}

/// Runs `delete` (one bounded statement deleting at most `batch` rows)
/// until a run deletes fewer, yielding between runs so requests keep being
/// served; the rows deleted in all.
async fn in_batches<F, Fut>(batch: usize, mut delete: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = store::Result<u64>>,
{
    let mut total = 0;
    loop {
        let n = delete().await?;
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}
