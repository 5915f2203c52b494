//! Shared fixtures: databases (a temp SQLite file; a fresh schema in the
//! machine's PostgreSQL), a control plane on loopback, and stand-in agents.
//!
//! The agents here are real tonic `NodeAgent` servers on loopback that
//! answer `Capture` with profiles built by `edgeprof_pprof::ProfileBuilder`.
//! They stand in for the node agent only at the control plane's own
//! boundary (the gRPC contract); the real agent is tested in its own crate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeprof_control_plane::clock::Clock;
use edgeprof_control_plane::{Config, ControlPlane, DevAccount};
use edgeprof_pprof::{LineSpec, MappingSpec, ProfileBuilder};
use edgeprof_proto::v1;
use tonic::{Request, Response, Status};

pub const SECRET: &str = "test-agent-secret";

/// A fresh SQLite database file (kept alive by the returned dir).
pub fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cp.sqlite").to_string_lossy().into_owned();
    (dir, path)
}

/// A fresh schema in the test PostgreSQL, as a URL whose search_path points
/// at it; `None` (with the reason printed) only outside CI when nothing
/// listens on the port.
pub async fn postgres() -> Option<String> {
    let base = std::env::var("EDGEPROF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let reachable = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect("127.0.0.1:5432"),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    if !reachable && base.contains("127.0.0.1:5432") {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but nothing listens on 127.0.0.1:5432 for the PostgreSQL storage tests"
        );
        eprintln!("skipping the PostgreSQL case: nothing listens on 127.0.0.1:5432 (CI unset)");
        return None;
    }
    sqlx::any::install_default_drivers();
    let schema = format!("edgeprof_test_{}", hex::encode(rand::random::<[u8; 6]>()));
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&base)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut conn)
        .await
        .expect("create a test schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}options=-c%20search_path%3D{schema}"))
}

/// Drops the schema [`postgres`] made for `url`.
pub async fn drop_postgres_schema(url: &str) {
    let (base, schema) = url
        .split_once("options=-c%20search_path%3D")
        .expect("a url from postgres()");
    let base = base.trim_end_matches(['?', '&']);
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(base)
        .await
        .expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .expect("drop the test schema");
}

/// Test settings: loopback, ephemeral ports, a dev account `acme` plus
/// tokens created by [`Cp::token`].
pub fn config(database: &str) -> Config {
    let mut c = Config::new(database, SECRET);
    c.http_listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.grpc_listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.capture_slack = Duration::from_millis(1500);
    c.dev = Some(DevAccount {
        account: "acme".into(),
        token: None,
    });
    // Liveness, leases and memory windows move only when a test advances
    // the clock: no test sleeps to let time pass.
    c.clock = Clock::manual();
    c
}

/// A running control plane with a REST client.
pub struct Cp {
    pub cp: ControlPlane,
    pub http: reqwest::Client,
    pub token: String,
}

impl Cp {
    pub async fn start(config: Config) -> Cp {
        let cp = ControlPlane::start(config)
            .await
            .expect("control plane starts");
        let token = cp.dev_token.clone().expect("dev token");
        Cp {
            cp,
            http: reqwest::Client::new(),
            token,
        }
    }

    /// Moves the control plane's clock forward.
    pub fn advance(&self, by: Duration) {
        self.cp.clock.advance(by);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.cp.http_addr, path)
    }

    pub async fn token(&self, account: &str) -> String {
        self.cp.store.create_token(account).await.expect("token")
    }

    /// Uploads `wasm` as a new version of `acme/script`; returns its id.
    pub async fn deploy(&self, script: &str, weight: Option<u32>) -> String {
        let mut url = self.url(&format!("/v1/accounts/acme/scripts/{script}/versions"));
        if let Some(w) = weight {
            url.push_str(&format!("?weight={w}"));
        }
        let resp = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .body(wasm_module(script))
            .send()
            .await
            .expect("upload");
        assert_eq!(resp.status(), 201, "upload: {}", resp.text().await.unwrap());
        let v: serde_json::Value = resp.json().await.unwrap();
        v["id"].as_str().unwrap().to_owned()
    }

    pub async fn post_json(
        &self,
        path: &str,
        token: Option<&str>,
        body: &serde_json::Value,
    ) -> (u16, serde_json::Value, reqwest::header::HeaderMap, Vec<u8>) {
        let mut req = self.http.post(self.url(path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap().to_vec();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, json, headers, bytes)
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value, Vec<u8>) {
        let resp = self
            .http
            .get(self.url(path))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap().to_vec();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, json, bytes)
    }

    /// Starts an asynchronous capture (`POST …/profiles` with `body`) and
    /// waits for its session to end; returns the session.
    pub async fn capture_session(&self, body: &serde_json::Value) -> serde_json::Value {
        let (status, started, _, _) = self
            .post_json("/v1/accounts/acme/profiles", Some(&self.token), body)
            .await;
        assert_eq!(status, 202, "{started}");
        let id = started["id"].as_str().expect("a session id");
        self.wait_session(id, Duration::from_secs(10)).await
    }

    /// Polls a session until it leaves pending/capturing/merging.
    pub async fn wait_session(&self, id: &str, limit: Duration) -> serde_json::Value {
        let t0 = std::time::Instant::now();
        loop {
            let (status, s, _) = self.get(&format!("/v1/accounts/acme/profiles/{id}")).await;
            assert_eq!(status, 200, "{s}");
            if matches!(s["status"].as_str(), Some("done" | "partial" | "failed")) {
                return s;
            }
            assert!(
                t0.elapsed() < limit,
                "session {id} still {} after {limit:?}",
                s["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A tiny valid wasm module (header + a custom section naming the script).
pub fn wasm_module(name: &str) -> Vec<u8> {
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    let payload_name = b"edgeprof-test";
    let mut section = vec![payload_name.len() as u8];
    section.extend_from_slice(payload_name);
    section.extend_from_slice(name.as_bytes());
    m.push(0); // custom section id
    m.push(section.len() as u8);
    m.extend(section);
    m
}

/// What a stand-in agent does when asked to capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// Waits the duration, then answers with one profile per isolate.
    Answer,
    /// Never answers.
    Hang,
    /// Answers at once with an error status.
    Fail,
    /// Answers at once with a gzip'd profile that inflates to 100 MiB.
    Bomb,
    /// Answers at once with an 8 MiB error for each isolate.
    HugeError,
}

/// 102 KB of gzip that inflate to 100 MiB of zeros (made once).
pub fn gzip_bomb() -> &'static [u8] {
    static BOMB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BOMB.get_or_init(|| {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..100 {
            e.write_all(&chunk).unwrap();
        }
        e.finish().unwrap()
    })
}

/// An isolate a stand-in agent reports.
#[derive(Debug, Clone)]
pub struct FakeIsolate {
    pub id: String,
    pub script: String,
    pub version_id: String,
    pub durable_objects: Vec<String>,
    pub recent_requests: u64,
    /// Requests it reports having served during a capture (`None`: an
    /// agent that does not count them).
    pub capture_requests: Option<u64>,
}

/// A stand-in agent: a `NodeAgent` server and the machine it claims to be.
pub struct Agent {
    pub machine: v1::Machine,
    pub isolates: Vec<FakeIsolate>,
    /// Isolate ids each Capture call asked for, in call order.
    pub asked: Arc<Mutex<Vec<Vec<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct AgentService {
    machine: v1::Machine,
    behavior: Behavior,
    isolates: HashMap<String, FakeIsolate>,
    asked: Arc<Mutex<Vec<Vec<String>>>>,
}

/// The profile a stand-in isolate returns: two stacks whose leaf names the
/// isolate, so tests can tell the sources apart.
pub fn isolate_profile(isolate: &str) -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 1_000_000);
    let m = b.mapping(&MappingSpec {
        filename: "worker.wasm",
        build_id: "test",
        ..Default::default()
    });
    let leaf = b.function(&format!("work_{isolate}"), "", "src/lib.rs", 10);
    let root = b.function("handle_request", "", "src/lib.rs", 1);
    let l_leaf = b.location(
        m,
        0x10,
        &[LineSpec {
            function_id: leaf,
            line: 12,
            column: 0,
        }],
    );
    let l_root = b.location(
        m,
        0x20,
        &[LineSpec {
            function_id: root,
            line: 3,
            column: 0,
        }],
    );
    b.add_sample(&[l_leaf, l_root], &[3, 3_000_000], &[]);
    b.add_sample(&[l_root], &[1, 1_000_000], &[]);
    edgeprof_pprof::encode(&b.build())
}

#[tonic::async_trait]
impl v1::node_agent_server::NodeAgent for AgentService {
    async fn capture(
        &self,
        request: Request<v1::CaptureRequest>,
    ) -> Result<Response<v1::CaptureResponse>, Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth != format!("Bearer {SECRET}") {
            return Err(Status::unauthenticated("wrong secret"));
        }
        let req = request.into_inner();
        self.asked.lock().unwrap().push(req.isolate_ids.clone());
        match self.behavior {
            Behavior::Hang => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            Behavior::Fail => return Err(Status::internal("sampler crashed")),
            Behavior::Bomb | Behavior::HugeError => {
                let bomb = self.behavior == Behavior::Bomb;
                let isolates = req
                    .isolate_ids
                    .iter()
                    .map(|id| v1::IsolateCapture {
                        isolate_id: id.clone(),
                        pprof: if bomb {
                            gzip_bomb().to_vec()
                        } else {
                            Vec::new()
                        },
                        error: if bomb {
                            String::new()
                        } else {
                            "e".repeat(8 << 20)
                        },
                        ..Default::default()
                    })
                    .collect();
                return Ok(Response::new(v1::CaptureResponse {
                    machine: Some(self.machine.clone()),
                    isolates,
                }));
            }
            Behavior::Answer => {}
        }
        tokio::time::sleep(Duration::from_millis(u64::from(req.duration_ms))).await;
        let isolates = req
            .isolate_ids
            .iter()
            .map(|id| match self.isolates.get(id) {
                Some(i) => v1::IsolateCapture {
                    isolate_id: id.clone(),
                    script: i.script.clone(),
                    version_id: i.version_id.clone(),
                    durable_objects: i.durable_objects.clone(),
                    pprof: isolate_profile(id),
                    samples: 2,
                    dropped: 0,
                    error: String::new(),
                    requests: i.capture_requests,
                },
                None => v1::IsolateCapture {
                    isolate_id: id.clone(),
                    error: format!("no isolate {id} here"),
                    ..Default::default()
                },
            })
            .collect();
        Ok(Response::new(v1::CaptureResponse {
            machine: Some(self.machine.clone()),
            isolates,
        }))
    }
}

impl Agent {
    /// Starts a stand-in agent for `machine_id` in `data_center`.
    pub async fn start(
        machine_id: &str,
        data_center: &str,
        behavior: Behavior,
        isolates: Vec<FakeIsolate>,
    ) -> Agent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let machine = v1::Machine {
            id: machine_id.into(),
            data_center: data_center.into(),
            grpc_address: addr.to_string(),
            http_address: format!("http://127.0.0.1:{}", addr.port() + 1),
        };
        let asked = Arc::new(Mutex::new(Vec::new()));
        let service = AgentService {
            machine: machine.clone(),
            behavior,
            isolates: isolates.iter().map(|i| (i.id.clone(), i.clone())).collect(),
            asked: asked.clone(),
        };
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(
                    v1::node_agent_server::NodeAgentServer::new(service)
                        .max_encoding_message_size(usize::MAX),
                )
                .serve_with_incoming(incoming)
                .await;
        });
        Agent {
            machine,
            isolates,
            asked,
            task,
        }
    }

    /// Sends one heartbeat to the control plane's Registry.
    pub async fn heartbeat(&self, registry: SocketAddr) {
        self.heartbeat_as(registry, "acme").await;
    }

    /// Sends one heartbeat, with every isolate owned by `account`.
    pub async fn heartbeat_as(&self, registry: SocketAddr, account: &str) {
        let mut client = registry_client(registry, SECRET).await;
        client
            .heartbeat(self.heartbeat_message(account, 0))
            .await
            .expect("heartbeat accepted");
    }

    /// The heartbeat of round `round`, every isolate owned by `account`:
    /// its requests grow by one and its memory reading changes with each
    /// round (round 0: the isolate's requests, 1 MiB).
    pub fn heartbeat_message(&self, account: &str, round: u64) -> v1::HeartbeatRequest {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        v1::HeartbeatRequest {
            machine: Some(self.machine.clone()),
            isolates: self
                .isolates
                .iter()
                .map(|i| v1::IsolateStatus {
                    isolate_id: i.id.clone(),
                    script: i.script.clone(),
                    version_id: i.version_id.clone(),
                    account: account.into(),
                    requests_last_60s: i.recent_requests + round,
                    last_request_unix_ms: if i.recent_requests > 0 { now - 500 } else { 0 },
                    durable_objects: i.durable_objects.clone(),
                    memory_bytes: ((round % 7) + 1) << 20,
                    evictions: 0,
                    memory_evictions: 0,
                })
                .collect(),
            isolates_omitted: 0,
            evicted: Vec::new(),
            ..Default::default()
        }
    }
}

type AuthFn = Box<dyn FnMut(Request<()>) -> Result<Request<()>, Status> + Send>;

pub type Registry = v1::registry_client::RegistryClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, AuthFn>,
>;

/// A Registry client presenting `secret`.
pub async fn registry_client(addr: SocketAddr, secret: &str) -> Registry {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the registry");
    let value: tonic::metadata::MetadataValue<_> = format!("Bearer {secret}").parse().unwrap();
    let interceptor: AuthFn = Box::new(move |mut r: Request<()>| {
        r.metadata_mut().insert("authorization", value.clone());
        Ok(r)
    });
    v1::registry_client::RegistryClient::with_interceptor(channel, interceptor)
}

/// An isolate of `acme/script` at `version` with recent traffic.
pub fn isolate(id: &str, script: &str, version: &str) -> FakeIsolate {
    FakeIsolate {
        id: id.into(),
        script: script.into(),
        version_id: version.into(),
        durable_objects: Vec::new(),
        recent_requests: 42,
        capture_requests: Some(10),
    }
}

/// `(data_center, machine, isolate)` of every sample of a gzip'd pprof,
/// deduplicated and sorted; panics if a sample lacks one of them.
pub fn sample_sources(pprof: &[u8]) -> Vec<(String, String, String, Option<String>)> {
    let p = edgeprof_pprof::decode(pprof).expect("valid pprof");
    let mut out: Vec<_> = p
        .sample
        .iter()
        .map(|s| {
            let get = |key: &str| {
                s.label
                    .iter()
                    .find(|l| edgeprof_pprof::string(&p, l.key) == key)
                    .map(|l| edgeprof_pprof::string(&p, l.str).to_owned())
            };
            (
                get("data_center").expect("data_center label on every sample"),
                get("machine").expect("machine label on every sample"),
                get("isolate").expect("isolate label on every sample"),
                get("durable_object"),
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A 10 s CPU window of `acme/api` at `version` from `start`, as an agent
/// pushes it.
pub fn profile_window(
    version: &str,
    start: i64,
    pprof: Vec<u8>,
    requests: u64,
) -> v1::ProfileWindow {
    v1::ProfileWindow {
        account: "acme".into(),
        script: "api".into(),
        version_id: version.into(),
        kind: v1::ProfileKind::Cpu as i32,
        start_unix_ms: start,
        end_unix_ms: start + 10_000,
        pprof,
        samples: 2,
        requests,
    }
}

/// A window as an agent ships it: `isolate`'s samples labelled with it,
/// and its own `requests: N`.
pub fn labeled_window(
    version: &str,
    isolate: &str,
    start: i64,
    requests: u64,
) -> v1::ProfileWindow {
    let p = edgeprof_pprof::decode(&isolate_profile(isolate)).unwrap();
    let mut m = edgeprof_pprof::Merger::new();
    m.add_labeled(&p, &[("isolate", isolate)]).unwrap();
    let mut p = m.finish().unwrap();
    edgeprof_pprof::add_comment(&mut p, &format!("requests: {requests}"));
    profile_window(version, start, edgeprof_pprof::encode(&p), requests)
}

/// A machine as an agent names itself in a push.
pub fn machine(id: &str, dc: &str) -> v1::Machine {
    v1::Machine {
        id: id.into(),
        data_center: dc.into(),
        grpc_address: "127.0.0.1:1".into(),
        http_address: String::new(),
    }
}
