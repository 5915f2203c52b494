//! The node agent: one per machine of the edge.
//!
//! It hosts isolates (Wasmtime instances, through `edgeprof-sampler`) for the
//! script versions the control plane deploys, serves their HTTP traffic,
//! enforces the per-isolate memory limit, reports its isolates in heartbeats
//! to the control plane's `Registry`, and answers `NodeAgent.Capture` by
//! profiling the named isolates while their traffic keeps running. It also
//! profiles every isolate continuously at a low rate and ships the windows
//! to the control plane (`continuous`).
//!
//! Modules: [`config`] (flags → validated config), `hosting` (isolates on
//! their threads, pools per version, Durable Objects), `ingress` (HTTP),
//! `lease` (which Durable Objects may be served, and until when),
//! `registry` (control plane client), `capture` (gRPC service),
//! `continuous` (background windows: collect, queue, ship), `metrics`,
//! `native` (pprof-rs self-profile), `simulate` (many simulated machines
//! in one process, for tests and benchmarks).
//!
//! Architecture invariant: the agent never touches the database and keeps no
//! state that must survive it (deployments and placements live in the control
//! plane); it defines no wire types (they come from `edgeprof-proto`).

mod capture;
pub mod config;
mod continuous;
mod hosting;
mod ingress;
mod lease;
mod metrics;
mod native;
mod registry;
mod simulate;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use edgeprof_proto::v1;
use edgeprof_sampler::{Limits, Runtime, RuntimeConfig};
use tokio::task::JoinHandle;

pub use config::{Args, Config};

/// A running agent: its bound addresses and its tasks.
#[derive(Debug)]
pub struct RunningAgent {
    /// Where the HTTP ingress listens.
    pub http: SocketAddr,
    /// Where the gRPC `NodeAgent` service listens.
    pub grpc: SocketAddr,
    /// Where the operator endpoints listen.
    pub operator: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// What [`run_until_shutdown`] stops: one agent or a simulated edge.
enum Stopper {
    Agent(RunningAgent),
    Simulated(simulate::SimulatedEdge),
}

impl Stopper {
    fn shutdown(self) {
        match self {
            Stopper::Agent(a) => a.shutdown(),
            Stopper::Simulated(s) => s.shutdown(),
        }
    }
}

impl RunningAgent {
    /// Stops serving (in-process use: tests and benchmarks).
    pub fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Starts the agent: binds both listeners, then registers and heartbeats in
/// the background (retrying while the control plane is unreachable).
pub async fn start(config: Config) -> Result<RunningAgent> {
    let runtime = wasm_runtime(config.sampling_interval)?;
    start_on(config, runtime).await
}

/// The Wasmtime engine and epoch ticker for agents sampling every `tick`.
fn wasm_runtime(tick: Duration) -> Result<Runtime> {
    Runtime::new(RuntimeConfig {
        tick,
        ..RuntimeConfig::default()
    })
    .context("cannot start the WebAssembly runtime")
}

/// [`start`] on an engine the caller made, so several machines of a
/// simulation share one (`simulate`); its tick must be the config's
/// sampling interval.
async fn start_on(config: Config, runtime: Runtime) -> Result<RunningAgent> {
    let limits = Limits {
        memory_bytes: usize::try_from(config.isolate_memory_bytes).unwrap_or(usize::MAX),
        cpu_per_request: config.request_cpu_limit,
        ..Limits::default()
    };
    let metrics = Arc::new(metrics::Metrics::default());

    let http_listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", config.http_listen))?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", config.grpc_listen))?;
    let operator_listener = tokio::net::TcpListener::bind(config.operator_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen for the operator endpoints on {}",
                config.operator_listen
            )
        })?;
    let operator = operator_listener.local_addr()?;
    let http = http_listener.local_addr()?;
    let grpc = grpc_listener.local_addr()?;

    let machine = v1::Machine {
        id: config.machine_id.clone(),
        data_center: config.data_center.clone(),
        grpc_address: format!("{}:{}", config.advertise_host, grpc.port()),
        http_address: format!("http://{}:{}", config.advertise_host, http.port()),
    };
    let mut hosting = hosting::Hosting::new(
        runtime,
        limits,
        hosting::Caps {
            per_version: config.max_isolates_per_version,
            machine: config.max_isolates,
            account: config.max_isolates_per_account,
        },
        config.machine_id.clone(),
        metrics.clone(),
    );
    if let Some(c) = &config.continuous {
        let interval = continuous::cpu_interval(c.hz, config.sampling_interval);
        tracing::info!(
            "continuous profiling: CPU every {interval:?} ({} Hz asked, ticks of {:?}) and heap, in windows of {:?}",
            c.hz,
            config.sampling_interval,
            c.window
        );
        hosting = hosting.with_continuous(interval);
    }
    let hosting = Arc::new(hosting);
    let registry = Arc::new(registry::Registry::new(
        &config.control_planes,
        config.agent_secret.clone(),
        machine.clone(),
    )?);

    let ingress = ingress::Ingress {
        hosting: hosting.clone(),
        registry: registry.clone(),
        metrics: metrics.clone(),
        remote_objects: Default::default(),
        zone: config.zone.clone(),
        secret: config.agent_secret.as_str().into(),
        http: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(60))
            .build()?,
    };
    let mut tasks = Vec::new();
    let operator_app = ingress::operator_app(ingress.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = axum::serve(http_listener, ingress::app(ingress)).await {
            tracing::error!("HTTP ingress stopped: {e}");
        }
    }));
    tasks.push(tokio::spawn(async move {
        if let Err(e) = axum::serve(operator_listener, operator_app).await {
            tracing::error!("operator listener stopped: {e}");
        }
    }));

    let service = capture::CaptureService {
        hosting: hosting.clone(),
        machine: machine.clone(),
        secret: config.agent_secret.clone(),
        default_interval: config.sampling_interval,
        metrics: metrics.clone(),
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
    tasks.push(tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(
                v1::node_agent_server::NodeAgentServer::new(service)
                    .max_decoding_message_size(16 << 20)
                    .max_encoding_message_size(256 << 20),
            )
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = result {
            tracing::error!("gRPC server stopped: {e}");
        }
    }));

    let heartbeat = config.heartbeat;
    let (hb_hosting, hb_registry) = (hosting.clone(), registry.clone());
    tasks.push(tokio::spawn(async move {
        let mut interval = heartbeat;
        loop {
            match hb_registry.register().await {
                Ok(ms) => {
                    if ms > 0 {
                        interval = Duration::from_millis(u64::from(ms));
                    }
                    tracing::info!(machine = %hb_registry.machine.id, "registered with the control plane");
                    break;
                }
                Err(e) => {
                    tracing::warn!("{e:#}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        if let Err(e) = hb_registry.refresh_deployment().await {
            tracing::warn!("{e:#}");
        }
        loop {
            if let Err(e) = hb_registry.heartbeat(&hb_hosting).await {
                tracing::warn!("{e:#}");
                // The control plane may have restarted and forgotten us.
                let _ = hb_registry.register().await;
            }
            tokio::time::sleep(interval).await;
        }
    }));

    if let Some(c) = config.continuous {
        tasks.extend(continuous::start(
            c,
            hosting.clone(),
            registry.clone(),
            metrics.clone(),
        ));
    }

    let idle = config.idle_isolate;
    let reclaim_hosting = hosting.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5).min(idle)).await;
            let n = reclaim_hosting.reclaim_idle(idle);
            if n > 0 {
                tracing::info!("reclaimed {n} idle isolates");
            }
        }
    }));

    if let Some(path) = &config.ready_file {
        let doc = serde_json::json!({"http": machine.http_address, "grpc": machine.grpc_address, "operator": format!("http://{operator}"), "pid": std::process::id()});
        std::fs::write(path, doc.to_string())
            .with_context(|| format!("{}: cannot write the ready file", path.display()))?;
    }
    tracing::info!(%http, %grpc, %operator, machine = %config.machine_id, dc = %config.data_center, "node agent listening");
    Ok(RunningAgent {
        http,
        grpc,
        operator,
        tasks,
    })
}

/// Runs the agent (or, with `--simulate-machines`, the simulated machines)
/// until Ctrl-C or SIGTERM.
pub async fn run_until_shutdown(config: Config) -> Result<()> {
    let agent = match config.simulate.clone() {
        Some(sim) => Stopper::Simulated(simulate::start(config, sim).await?),
        None => Stopper::Agent(start(config).await?),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    agent.shutdown();
    Ok(())
}
