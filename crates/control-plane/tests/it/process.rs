//! The binary as an operator runs it: restarts keep sessions and profiles
//! and fail interrupted sessions; `token create`; `--check-config`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::support::{self, Agent, Behavior};

const BIN: &str = env!("CARGO_BIN_EXE_edgeprof-control-plane");
pub const DEV_TOKEN: &str = "edp_dev_token_for_tests_0123456789";

pub struct Running {
    pub child: Child,
    pub http: String,
    pub grpc: std::net::SocketAddr,
}

impl Running {
    /// The process's peak resident set (VmHWM), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb * 1024
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(db: &str) -> Running {
    start_with(db, &[])
}

/// The binary on `db` with a dev account `dev` (token [`DEV_TOKEN`]) and
/// `extra` flags.
pub fn start_with(db: &str, extra: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args([
            "--database",
            db,
            "--http-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--agent-secret",
            support::SECRET,
            "--dev",
            "--dev-token",
            DEV_TOKEN,
            "--capture-slack-ms",
            "30000",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the control plane");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut http, mut grpc) = (None, None);
    let mut seen = Vec::new();
    while http.is_none() || grpc.is_none() {
        let Some(Ok(line)) = lines.next() else {
            panic!("control plane exited before listening: {seen:#?}");
        };
        if let Some(rest) = line.strip_prefix("edgeprof-control-plane: REST on ") {
            http = Some(rest.to_owned());
        }
        if let Some(rest) = line.strip_prefix("edgeprof-control-plane: gRPC Registry on ") {
            grpc = Some(rest.parse().unwrap());
        }
        seen.push(line);
    }
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Running {
        child,
        http: http.unwrap(),
        grpc: grpc.unwrap(),
    }
}

async fn get(http: &reqwest::Client, url: String) -> (u16, serde_json::Value, Vec<u8>) {
    let resp = http.get(url).bearer_auth(DEV_TOKEN).send().await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap().to_vec();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or_default(),
        bytes,
    )
}

async fn wait_status(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    want: &[&str],
) -> serde_json::Value {
    for _ in 0..200 {
        let (_, s, _) = get(http, format!("{base}/v1/accounts/dev/profiles/{id}")).await;
        if want.contains(&s["status"].as_str().unwrap_or("")) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {id} never reached {want:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_sessions_and_profiles_and_fails_interrupted_ones() {
    let (_dir, db) = support::sqlite();
    let http = reqwest::Client::new();
    let cp = start(&db);
    let base = cp.http.clone();

    let upload = |script: &str| {
        http.post(format!("{base}/v1/accounts/dev/scripts/{script}/versions"))
            .bearer_auth(DEV_TOKEN)
            .body(support::wasm_module(script))
            .send()
    };
    let v_fast: serde_json::Value = upload("fast").await.unwrap().json().await.unwrap();
    let v_slow: serde_json::Value = upload("slow").await.unwrap().json().await.unwrap();
    let fast = Agent::start(
        "m-fast",
        "lhr",
        Behavior::Answer,
        vec![(support::isolate("i1", "fast", v_fast["id"].as_str().unwrap()))],
    )
    .await;
    let slow = Agent::start(
        "m-slow",
        "sjc",
        Behavior::Hang,
        vec![support::isolate(
            "i2",
            "slow",
            v_slow["id"].as_str().unwrap(),
        )],
    )
    .await;
    fast.heartbeat_as(cp.grpc, "dev").await;
    slow.heartbeat_as(cp.grpc, "dev").await;

    let start_capture = |script: &str, ms: u64| {
        http.post(format!("{base}/v1/accounts/dev/profiles"))
            .bearer_auth(DEV_TOKEN)
            .json(&json!({"script": script, "duration_ms": ms}))
            .send()
    };
    let done: serde_json::Value = start_capture("fast", 1000)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let done_id = done["id"].as_str().unwrap().to_owned();
    wait_status(&http, &base, &done_id, &["done"]).await;
    let (_, _, pprof_before) = get(
        &http,
        format!("{base}/v1/accounts/dev/profiles/{done_id}/pprof"),
    )
    .await;
    assert_eq!(support::sample_sources(&pprof_before).len(), 1);

    let stuck: serde_json::Value = start_capture("slow", 5000)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stuck_id = stuck["id"].as_str().unwrap().to_owned();
    wait_status(&http, &base, &stuck_id, &["capturing"]).await;

    // Kill -9 mid-capture, then start again on the same database.
    drop(cp);
    let cp = start(&db);
    let base = cp.http.clone();
    let (status, s, _) = get(&http, format!("{base}/v1/accounts/dev/profiles/{done_id}")).await;
    assert_eq!((status, s["status"].as_str()), (200, Some("done")));
    let (status, _, pprof_after) = get(
        &http,
        format!("{base}/v1/accounts/dev/profiles/{done_id}/pprof"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(pprof_after, pprof_before);
    let (_, s, _) = get(&http, format!("{base}/v1/accounts/dev/profiles/{stuck_id}")).await;
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(
        s["error"],
        "interrupted: the control plane restarted while the session was capturing"
    );
    let events: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(events, vec!["pending", "capturing", "failed"]);
    let (status, err, _) = get(
        &http,
        format!("{base}/v1/accounts/dev/profiles/{stuck_id}/pprof"),
    )
    .await;
    assert_eq!(status, 409);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed and has no profile")
    );
    let (_, history, _) = get(&http, format!("{base}/v1/accounts/dev/profiles")).await;
    assert_eq!(history["profiles"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn token_create_and_check_config() {
    let (_dir, db) = support::sqlite();
    let out = Command::new(BIN)
        .args(["token", "create", "--account", "zeta", "--database", &db])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(token.starts_with("edp_") && token.len() > 40, "{token}");

    let cp = start(&db);
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("{}/v1/accounts/zeta/scripts", cp.http))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = http
        .get(format!("{}/v1/accounts/dev/scripts", cp.http))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);

    let check = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["--check-config"])
            .args(args)
            .env("EDGEPROF_DATABASE", &db)
            .env_remove("EDGEPROF_AGENT_SECRET")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(&[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("agent secret: required"), "{err}");
    let (code, err) = check(&["--agent-secret", "short"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("agent secret: must be at least 8 characters"),
        "{err}"
    );
    let (code, err) = check(&[
        "--agent-secret",
        "long-enough",
        "--heartbeat-interval-ms",
        "1",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("heartbeat interval: must be 50 ms"), "{err}");
    let (code, err) = check(&["--agent-secret", "long-enough"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("configuration OK"));
    let (code, err) = check(&["--agent-secret", "long-enough", "--database", "mysql://x"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("unsupported scheme"), "{err}");
    let (code, err) = check(&["token", "create", "--account", "bad name!"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--account: `bad name!` must be"), "{err}");
}

/// `deploy/control-plane/control-plane.env.example` as `KEY=VALUE` pairs.
fn example_env() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/control-plane/control-plane.env.example");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: `{l}` is not KEY=VALUE", path.display()));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Runs `--check-config` with exactly `env` (nothing inherited).
fn check_config_with(env: &[(String, String)]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("--check-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn example_environment_passes_check_config() {
    let env = example_env();
    let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for key in [
        "EDGEPROF_DATABASE",
        "EDGEPROF_HTTP_LISTEN",
        "EDGEPROF_GRPC_LISTEN",
        "EDGEPROF_AGENT_SECRET",
    ] {
        assert!(keys.contains(&key), "the example sets {key}: {keys:?}");
    }
    // The example's database host is the operator's; every other setting is
    // checked as written, against the test PostgreSQL and an SQLite file.
    let with_database = |url: &str| -> Vec<(String, String)> {
        env.iter()
            .map(|(k, v)| {
                let v = if k == "EDGEPROF_DATABASE" { url } else { v };
                (k.clone(), v.to_owned())
            })
            .collect()
    };
    let (_dir, sqlite) = support::sqlite();
    let mut databases = vec![sqlite];
    let postgres = support::postgres().await;
    databases.extend(postgres.clone());
    for db in &databases {
        let (code, err) = check_config_with(&with_database(db));
        assert_eq!(code, Some(0), "{db}: {err}");
        assert!(err.contains("configuration OK"), "{db}: {err}");
    }
    if let Some(url) = postgres {
        support::drop_postgres_schema(&url).await;
    }

    // One bad value in an otherwise good file: the error names the setting.
    let mut bad = with_database(&databases[0]);
    for (k, v) in bad.iter_mut() {
        if k == "EDGEPROF_HEARTBEAT_INTERVAL_MS" {
            *v = "1".into();
        }
    }
    let (code, err) = check_config_with(&bad);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("heartbeat interval: must be 50 ms"), "{err}");
}
