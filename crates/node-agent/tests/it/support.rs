//! A control plane implemented here (a real tonic `Registry` server on a
//! loopback port, recording what agents push) and an agent started
//! in-process against it, serving a WAT worker in real Wasmtime isolates.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use edgeprof_node_agent::{Args, Config, RunningAgent};
use edgeprof_proto::v1::{self, registry_server};
use tonic::{Request, Response, Status};

pub const SECRET: &str = "test-agent-secret";
pub const ACCOUNT: &str = "acme";
pub const SCRIPT: &str = "api";
pub const VERSION: &str = "api-v1";
/// Host of the script under the agent's zone.
pub const HOST: &str = "api.acme.localhost";

/// Each request spins a few milliseconds in `work` and reports one sampled
/// allocation of 1 MiB from it.
pub const WORKER: &str = r#"(module
  (import "edgeprof" "heap_alloc" (func $heap_alloc (param i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func $spin (param $n i32) (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  (func $work (call $spin (i32.const 5000000)) (call $heap_alloc (i32.const 4096) (i32.const 1048576)))
  (func (export "edgeprof_handle") (param i32 i32) (result i64) (call $work) (i64.const 12)))"#;

/// What the control plane saw and how it behaves.
#[derive(Debug, Default)]
pub struct State {
    /// Answer `PushWindows` with `Unavailable` (and record nothing).
    pub away: AtomicBool,
    /// `PushWindows` calls refused while away.
    pub refused: AtomicU64,
    /// Accepted `PushWindows` calls, in order.
    pub pushes: Mutex<Vec<v1::PushWindowsRequest>>,
    /// The isolates of the latest heartbeat.
    pub isolates: Mutex<Vec<v1::IsolateStatus>>,
    /// Answer every call with `Unavailable`, as a replica that cannot be
    /// reached does.
    pub down: AtomicBool,
    /// Heartbeats answered.
    pub heartbeats: AtomicU64,
}

#[derive(Debug, Clone)]
struct Service(Arc<State>);

impl Service {
    /// `Unavailable` while the test has this control plane down, then the
    /// agent-secret check.
    fn admit<T>(&self, r: &Request<T>) -> Result<(), Status> {
        if self.0.down.load(Ordering::SeqCst) {
            return Err(Status::unavailable("this test's control plane is down"));
        }
        authorized(r)
    }
}

fn authorized<T>(r: &Request<T>) -> Result<(), Status> {
    let expected = format!("Bearer {SECRET}");
    match r
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
    {
        Some(v) if v == expected => Ok(()),
        _ => Err(Status::unauthenticated("wrong agent secret")),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tonic::async_trait]
impl registry_server::Registry for Service {
    async fn register(
        &self,
        r: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        self.admit(&r)?;
        Ok(Response::new(v1::RegisterResponse {
            heartbeat_interval_ms: 200,
        }))
    }

    async fn heartbeat(
        &self,
        r: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        self.admit(&r)?;
        *self.0.isolates.lock().unwrap() = r.into_inner().isolates;
        self.0.heartbeats.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(v1::HeartbeatResponse {
            deployment_generation: 1,
            durable_object_lease_ms: 60_000,
            ..Default::default()
        }))
    }

    async fn get_deployment(
        &self,
        r: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<v1::GetDeploymentResponse>, Status> {
        self.admit(&r)?;
        Ok(Response::new(v1::GetDeploymentResponse {
            generation: 1,
            scripts: vec![v1::DeployedScript {
                account: ACCOUNT.into(),
                script: SCRIPT.into(),
                versions: vec![v1::DeployedVersion {
                    version_id: VERSION.into(),
                    weight: 1,
                    wasm_sha256: sha256_hex(WORKER.as_bytes()),
                }],
            }],
        }))
    }

    async fn get_script_version(
        &self,
        r: Request<v1::GetScriptVersionRequest>,
    ) -> Result<Response<v1::GetScriptVersionResponse>, Status> {
        self.admit(&r)?;
        Ok(Response::new(v1::GetScriptVersionResponse {
            version_id: VERSION.into(),
            script: SCRIPT.into(),
            account: ACCOUNT.into(),
            wasm: WORKER.as_bytes().to_vec(),
            wasm_sha256: sha256_hex(WORKER.as_bytes()),
        }))
    }

    async fn place_durable_object(
        &self,
        r: Request<v1::PlaceDurableObjectRequest>,
    ) -> Result<Response<v1::PlaceDurableObjectResponse>, Status> {
        self.admit(&r)?;
        Ok(Response::new(v1::PlaceDurableObjectResponse {
            owner: r.into_inner().machine,
            version_id: VERSION.into(),
            placed_at_ms: 1,
            durable_object_lease_ms: 60_000,
        }))
    }

    async fn push_windows(
        &self,
        r: Request<v1::PushWindowsRequest>,
    ) -> Result<Response<v1::PushWindowsResponse>, Status> {
        self.admit(&r)?;
        if self.0.away.load(Ordering::Acquire) {
            self.0.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::unavailable("the control plane is restarting"));
        }
        let req = r.into_inner();
        let accepted = req.windows.len() as u32;
        self.0.pushes.lock().unwrap().push(req);
        Ok(Response::new(v1::PushWindowsResponse {
            accepted,
            rejected: Vec::new(),
        }))
    }
}

/// The control plane: its state and URL; it stops when dropped.
pub struct ControlPlane {
    pub state: Arc<State>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ControlPlane {
    pub async fn start() -> ControlPlane {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        let service = registry_server::RegistryServer::new(Service(state.clone()))
            .max_decoding_message_size(16 << 20);
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        ControlPlane { state, url, task }
    }

    /// The windows received, once each (as the real control plane stores
    /// them: by account, script, version, kind and start).
    pub fn windows(&self) -> BTreeMap<(String, String, String, i32, i64), v1::ProfileWindow> {
        let mut out = BTreeMap::new();
        for push in self.state.pushes.lock().unwrap().iter() {
            for w in &push.windows {
                let key = (
                    w.account.clone(),
                    w.script.clone(),
                    w.version_id.clone(),
                    w.kind,
                    w.start_unix_ms,
                );
                out.entry(key).or_insert_with(|| w.clone());
            }
        }
        out
    }

    /// `(requests, samples)` summed over the received windows of `kind`.
    pub fn totals(&self, kind: v1::ProfileKind) -> (u64, u64) {
        self.windows()
            .values()
            .filter(|w| w.kind == kind as i32)
            .fold((0, 0), |(r, s), w| (r + w.requests, s + w.samples))
    }
}

/// An agent against `cp` with 1 s windows at 100 Hz; `flags` add to or
/// replace the defaults.
pub async fn agent(cp: &ControlPlane, flags: &[(&str, &str)]) -> RunningAgent {
    let mut set: BTreeMap<&str, &str> = [
        ("--data-center", "lhr"),
        ("--machine-id", "lhr-m01"),
        ("--control-plane", cp.url.as_str()),
        ("--agent-secret", SECRET),
        ("--http-listen", "127.0.0.1:0"),
        ("--grpc-listen", "127.0.0.1:0"),
        ("--operator-listen", "127.0.0.1:0"),
        ("--heartbeat-ms", "200"),
        ("--continuous-window", "1s"),
        ("--continuous-hz", "100"),
    ]
    .into_iter()
    .collect();
    set.extend(flags.iter().copied());
    let mut argv = vec!["edgeprof-node-agent"];
    for (k, v) in set {
        argv.extend([k, v]);
    }
    let config = Config::try_from(Args::try_parse_from(argv).unwrap()).unwrap();
    edgeprof_node_agent::start(config).await.unwrap()
}

/// Sends `GET path` to the script through the agent's ingress; `200` expected.
pub async fn get(agent: &RunningAgent, path: &str) {
    let resp = reqwest::Client::new()
        .get(format!("http://{}{path}", agent.http))
        .header("host", HOST)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert_eq!(
        status,
        200,
        "{path}: {}",
        resp.text().await.unwrap_or_default()
    );
}

/// The value of a series on the agent's `/metrics` (`name{labels}` as
/// written there), 0 if absent.
pub async fn metric(agent: &RunningAgent, series: &str) -> u64 {
    let text = reqwest::get(format!("http://{}/metrics", agent.operator))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (at most `secs`) until `done` holds, polling.
pub async fn wait_until<F, Fut>(what: &str, secs: u64, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
