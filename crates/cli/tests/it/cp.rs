//! A real control plane on loopback (in-process, SQLite in a temp dir) for
//! the online commands, fed real gRPC heartbeats, with agents that answer
//! `NodeAgent.Capture` over real gRPC with a real pprof.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use edgeprof_control_plane::{Config, ControlPlane, DevAccount};
use edgeprof_proto::{rest, v1};

use crate::support::edgeprof;

pub const SECRET: &str = "cli-test-secret";

/// A tiny valid wasm module.
fn wasm() -> Vec<u8> {
    b"\0asm\x01\0\0\0".to_vec()
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A heartbeat entry: `isolate` of `api` at `version`, busy, with memory and
/// (evictions, memory evictions).
pub fn status(
    isolate: &str,
    version: &str,
    memory_bytes: u64,
    ev: (u64, u64),
) -> v1::IsolateStatus {
    v1::IsolateStatus {
        isolate_id: isolate.into(),
        script: "api".into(),
        version_id: version.into(),
        account: "acme".into(),
        requests_last_60s: 10,
        last_request_unix_ms: now_ms() - 100,
        durable_objects: Vec::new(),
        memory_bytes,
        evictions: ev.0,
        memory_evictions: ev.1,
    }
}

/// A real control plane on loopback with the dev account `acme`; with its
/// runtime, temp dir and the CLI's connection flags.
pub struct Running {
    pub cp: ControlPlane,
    pub rt: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
    pub conn: Vec<String>,
}

impl Running {
    pub fn start() -> Running {
        Running::start_with(|_| {}, "http")
    }

    /// Starts with `adjust(config)` applied; `scheme` is the URL the CLI
    /// is given (`https` for a control plane terminating TLS).
    pub fn start_with(adjust: impl FnOnce(&mut Config), scheme: &str) -> Running {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(
            dir.path().join("cp.sqlite").to_string_lossy().into_owned(),
            SECRET,
        );
        config.http_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.grpc_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.heartbeat_interval = Duration::from_secs(60);
        config.dev = Some(DevAccount {
            account: "acme".into(),
            token: None,
        });
        adjust(&mut config);
        let cp = rt
            .block_on(ControlPlane::start(config))
            .expect("control plane starts");
        let token = cp.dev_token.clone().expect("dev token");
        let url = format!("{scheme}://{}", cp.http_addr);
        let conn = ["--url", &url, "--token", &token, "--account", "acme"]
            .map(str::to_owned)
            .to_vec();
        Running { cp, rt, dir, conn }
    }

    /// `edgeprof ARGS` with the connection flags.
    pub fn run(&self, args: &[&str]) -> crate::support::Run {
        let conn: Vec<&str> = self.conn.iter().map(String::as_str).collect();
        edgeprof(&[args, &conn[..]].concat())
    }

    /// Deploys a tiny module as a version of `api` with `weight`; its id.
    pub fn deploy(&self, weight: Option<u32>) -> String {
        let wasm_path = self.dir.path().join("api.wasm");
        std::fs::write(&wasm_path, wasm()).unwrap();
        let w = weight.map(|w| w.to_string());
        let mut args = vec!["deploy", "api", wasm_path.to_str().unwrap(), "--json"];
        if let Some(w) = &w {
            args.extend(["--weight", w]);
        }
        let deploy = self.run(&args);
        assert_eq!(deploy.code, Some(0), "{}", deploy.stderr);
        let version: edgeprof_proto::rest::UploadedVersion =
            serde_json::from_str(&deploy.stdout).unwrap();
        version.id
    }

    /// A deployed `api` served by isolate `i1` of an agent `m1` that has
    /// heartbeated; the version id.
    pub fn serve_api(&self) -> String {
        let version = self.deploy(None);
        let machine = self.agent("m1", &version);
        self.heartbeat(&machine, vec![status("i1", &version, 1 << 20, (0, 0))]);
        version
    }

    /// `edgeprof profile api --duration 1s -o FILE --json`, which must
    /// succeed; the session.
    pub fn capture(&self, file: &Path) -> rest::Session {
        let run = self.run(&[
            "profile",
            "api",
            "--duration",
            "1s",
            "-o",
            file.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stderr
                .contains("5 requests began on the profiled isolates during the 1s capture"),
            "{}",
            run.stderr
        );
        serde_json::from_str(&run.stdout).unwrap()
    }

    /// One heartbeat of `machine` with `isolates`, over gRPC.
    pub fn heartbeat(&self, machine: &v1::Machine, isolates: Vec<v1::IsolateStatus>) {
        self.rt.block_on(async {
            let mut client = registry(self.cp.grpc_addr).await;
            client
                .heartbeat(v1::HeartbeatRequest {
                    machine: Some(machine.clone()),
                    isolates,
                    isolates_omitted: 0,
                    evicted: Vec::new(),
                    ..Default::default()
                })
                .await
                .expect("heartbeat accepted");
        });
    }

    /// One `Registry.PushWindows` of `machine` (continuous-profiling
    /// windows, as an agent ships them), over gRPC; every window must be
    /// accepted.
    pub fn push_windows(&self, machine: &v1::Machine, windows: Vec<v1::ProfileWindow>) {
        let resp = self.rt.block_on(async {
            let mut client = registry(self.cp.grpc_addr).await;
            client
                .push_windows(v1::PushWindowsRequest {
                    machine: Some(machine.clone()),
                    windows,
                    dropped_total: 0,
                })
                .await
                .expect("push accepted")
                .into_inner()
        });
        assert!(resp.rejected.is_empty(), "windows refused: {resp:?}");
    }

    /// Starts an agent for machine `id` in `lhr` whose isolates run
    /// `version` of `api` and answer a capture with [`isolate_profile`];
    /// the machine it claims to be.
    pub fn agent(&self, id: &str, version: &str) -> v1::Machine {
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let machine = v1::Machine {
            id: id.into(),
            data_center: "lhr".into(),
            grpc_address: addr.to_string(),
            http_address: "http://127.0.0.1:9".into(),
        };
        let service = Agent {
            machine: machine.clone(),
            version: version.to_owned(),
        };
        self.rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(v1::node_agent_server::NodeAgentServer::new(service))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        machine
    }
}

/// A Registry client authenticated with the agents' secret.
pub async fn registry(
    addr: SocketAddr,
) -> v1::registry_client::RegistryClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        impl tonic::service::Interceptor,
    >,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {SECRET}").parse().unwrap();
    v1::registry_client::RegistryClient::with_interceptor(
        channel,
        move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", auth.clone());
            Ok(r)
        },
    )
}

/// Function names in a profile file.
pub fn functions(file: &Path) -> Vec<String> {
    let profile = edgeprof_pprof::decode(&std::fs::read(file).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    profile
        .function
        .iter()
        .map(|f| edgeprof_pprof::string(&profile, f.name).to_owned())
        .collect()
}

/// What an isolate's capture returns: one sample of 1 ms CPU in a function
/// named after the isolate.
pub fn isolate_profile(isolate: &str) -> Vec<u8> {
    let mut b =
        edgeprof_pprof::ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    let f = b.function(&format!("work_{isolate}"), "", "src/lib.rs", 1);
    let l = b.location(
        0,
        0,
        &[edgeprof_pprof::LineSpec {
            function_id: f,
            line: 1,
            column: 0,
        }],
    );
    b.add_sample(&[l], &[1, 1_000_000], &[]);
    edgeprof_pprof::encode(&b.build())
}

/// A `NodeAgent` that profiles for the asked duration and answers every
/// asked isolate with [`isolate_profile`].
#[derive(Clone)]
struct Agent {
    machine: v1::Machine,
    version: String,
}

#[tonic::async_trait]
impl v1::node_agent_server::NodeAgent for Agent {
    async fn capture(
        &self,
        request: tonic::Request<v1::CaptureRequest>,
    ) -> Result<tonic::Response<v1::CaptureResponse>, tonic::Status> {
        let auth = request.metadata().get("authorization");
        if auth.and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {SECRET}")) {
            return Err(tonic::Status::unauthenticated("wrong agent secret"));
        }
        let req = request.into_inner();
        tokio::time::sleep(Duration::from_millis(u64::from(req.duration_ms))).await;
        let isolates = req
            .isolate_ids
            .iter()
            .map(|id| v1::IsolateCapture {
                isolate_id: id.clone(),
                script: "api".into(),
                version_id: self.version.clone(),
                durable_objects: Vec::new(),
                pprof: isolate_profile(id),
                samples: 1,
                dropped: 0,
                error: String::new(),
                requests: Some(5),
            })
            .collect();
        Ok(tonic::Response::new(v1::CaptureResponse {
            machine: Some(self.machine.clone()),
            isolates,
        }))
    }
}
