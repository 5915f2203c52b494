//! `edgeprof targets` against a real control plane on loopback, fed real
//! heartbeats over gRPC: memory per isolate and the per-version line.

use std::net::SocketAddr;
use std::time::Duration;

use edgeprof_control_plane::{Config, ControlPlane, DevAccount};
use edgeprof_proto::v1;

use crate::support::edgeprof;

const SECRET: &str = "cli-test-secret";
const MIB: u64 = 1 << 20;

/// A tiny valid wasm module.
fn wasm() -> Vec<u8> {
    b"\0asm\x01\0\0\0".to_vec()
}

fn status(isolate: &str, version: &str, memory_bytes: u64, ev: (u64, u64)) -> v1::IsolateStatus {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    v1::IsolateStatus {
        isolate_id: isolate.into(),
        script: "api".into(),
        version_id: version.into(),
        account: "acme".into(),
        requests_last_60s: 10,
        last_request_unix_ms: now - 100,
        durable_objects: Vec::new(),
        memory_bytes,
        evictions: ev.0,
        memory_evictions: ev.1,
    }
}

/// A real control plane on loopback with the dev account `acme`; returns
/// it with its runtime, temp dir and the CLI's connection flags.
struct Running {
    cp: ControlPlane,
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    conn: Vec<String>,
}

impl Running {
    fn start() -> Running {
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
        let cp = rt
            .block_on(ControlPlane::start(config))
            .expect("control plane starts");
        let token = cp.dev_token.clone().expect("dev token");
        let url = format!("http://{}", cp.http_addr);
        let conn = ["--url", &url, "--token", &token, "--account", "acme"]
            .map(str::to_owned)
            .to_vec();
        Running { cp, rt, dir, conn }
    }

    /// `edgeprof ARGS` with the connection flags.
    fn run(&self, args: &[&str]) -> crate::support::Run {
        let conn: Vec<&str> = self.conn.iter().map(String::as_str).collect();
        edgeprof(&[args, &conn[..]].concat())
    }

    /// Deploys a tiny module as a version of `api` with `weight`; its id.
    fn deploy(&self, weight: Option<u32>) -> String {
        let wasm_path = self.dir.path().join("api.wasm");
        std::fs::write(&wasm_path, wasm()).unwrap();
        let w = weight.map(|w| w.to_string());
        let mut args = vec!["deploy", "api", wasm_path.to_str().unwrap(), "--json"];
        if let Some(w) = &w {
            args.extend(["--weight", w]);
        }
        let deploy = self.run(&args);
        assert_eq!(deploy.code, Some(0), "{}", deploy.stderr);
        let version: serde_json::Value = serde_json::from_str(&deploy.stdout).unwrap();
        version["id"].as_str().expect("version id").to_owned()
    }
}

#[test]
fn targets_show_memory_per_isolate_and_per_version() {
    let running = Running::start();
    let (cp, rt) = (&running.cp, &running.rt);
    // Deploy through the CLI itself.
    let version = running.deploy(None);

    // 100 heartbeats of two isolates: i1 at 1..=100 MiB, i2 at 2 MiB.
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cp.grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {SECRET}").parse().unwrap();
        let mut client = v1::registry_client::RegistryClient::with_interceptor(
            channel,
            move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", auth.clone());
                Ok(r)
            },
        );
        let machine = v1::Machine {
            id: "m1".into(),
            data_center: "lhr".into(),
            grpc_address: "127.0.0.1:9".into(),
            http_address: "http://127.0.0.1:9".into(),
        };
        for k in 1..=100u64 {
            client
                .heartbeat(v1::HeartbeatRequest {
                    machine: Some(machine.clone()),
                    isolates: vec![
                        status("i1", &version, k * MIB, (5, 3)),
                        status("i2", &version, 2 * MIB, (5, 3)),
                    ],
                    isolates_omitted: 0,
                    evicted: Vec::new(),
                })
                .await
                .expect("heartbeat accepted");
        }
    });

    let run = running.run(&["targets", "api"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].contains("memory"), "{}", run.stdout);
    let i1 = lines.iter().find(|l| l.contains(" i1 ")).expect("i1 row");
    assert!(i1.contains("100.0 MiB"), "{i1}");
    let i2 = lines.iter().find(|l| l.contains(" i2 ")).expect("i2 row");
    assert!(i2.contains("2.0 MiB"), "{i2}");
    // 200 readings: 100 at 2 MiB and 1..=100 MiB; nearest rank.
    let summary = format!(
        "version {}: memory p50 2.0 MiB p99 98.0 MiB p99.9 100.0 MiB max 100.0 MiB (200 readings, last 300 s); Exceeded Memory evictions 3 (of 5)",
        &version[..12]
    );
    assert!(lines.contains(&summary.as_str()), "{}", run.stdout);

    let run = running.run(&["targets", "api", "--json", "--version", &version]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["targets"].as_array().unwrap().len(), 2);
    let v = &doc["memory"]["versions"][0];
    assert_eq!(v["version_id"], version.as_str());
    assert_eq!(v["memory_bytes"]["p999"], 100 * MIB);
    assert_eq!(v["evictions"]["exceeded_memory"], 3);
}

#[test]
fn versions_and_rollout_shift_traffic() {
    let running = Running::start();
    let v1 = running.deploy(None);
    let v2 = running.deploy(Some(0));
    let share = |stdout: &str, id: &str| -> String {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id} in:\n{stdout}"));
        row.split_whitespace().nth(2).unwrap().to_owned()
    };
    // Uploaded with weight 0: listed, serving nothing.
    let run = running.run(&["versions", "api"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (share(&run.stdout, &v1), share(&run.stdout, &v2)),
        ("100.0%".into(), "0.0%".into()),
        "{}",
        run.stdout
    );
    // Gradual rollout of v2 by prefix and by `latest` (newest deployed = v1).
    let differ = v1
        .chars()
        .zip(v2.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let p2 = &v2[..differ.max(7) + 1];
    let run = running.run(&["rollout", "api", &format!("{p2}=25"), "latest=75"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (share(&run.stdout, &v1), share(&run.stdout, &v2)),
        ("75.0%".into(), "25.0%".into()),
        "{}",
        run.stdout
    );
    // A bad entry is refused with the field named, and nothing changes.
    let run = running.run(&["rollout", "api", "nope=100"]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("versions[0].version_id: `nope` is not `latest`"),
        "{}",
        run.stderr
    );
    let run = running.run(&["rollout", "api", "100"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("expected VERSION=WEIGHT"),
        "{}",
        run.stderr
    );
    let run = running.run(&["versions", "api", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        doc["deployment"],
        serde_json::json!([{"version_id": v1, "weight": 75}, {"version_id": v2, "weight": 25}])
    );
}
