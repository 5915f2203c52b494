//! Two control-plane processes on one PostgreSQL, as `deploy/` runs them
//! behind a load balancer: agents heartbeat to one, people ask the other,
//! and the answers agree; capture admission is shared; when one replica is
//! killed mid-capture, the other fails its session saying so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use serde_json::{Value, json};

use crate::process::{self, DEV_TOKEN, Running};
use crate::support::{self, Agent, Behavior};

const FLAGS: &[&str] = &[
    "--heartbeat-interval-ms",
    "1000",
    "--max-captures-per-script",
    "2",
];

struct Client {
    http: reqwest::Client,
}

impl Client {
    async fn get(&self, base: &str, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{base}/v1/accounts/dev{path}"))
            .bearer_auth(DEV_TOKEN)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }

    async fn capture(&self, base: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{base}/v1/accounts/dev/profiles"))
            .bearer_auth(DEV_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }

    async fn upload(&self, base: &str, script: &str) -> String {
        let resp = self
            .http
            .post(format!("{base}/v1/accounts/dev/scripts/{script}/versions"))
            .bearer_auth(DEV_TOKEN)
            .body(support::wasm_module(script))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let v: Value = resp.json().await.unwrap();
        v["id"].as_str().unwrap().to_owned()
    }

    /// Polls a session on `base` until its status is one of `want`.
    async fn wait(&self, base: &str, id: &str, want: &[&str], limit: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let (status, s) = self.get(base, &format!("/profiles/{id}")).await;
            assert_eq!(status, 200, "{s}");
            if want.contains(&s["status"].as_str().unwrap_or("")) {
                return s;
            }
            assert!(
                t0.elapsed() < limit,
                "session {id} still {} after {limit:?} (waiting for {want:?}): {s}",
                s["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One heartbeat of `agent` (account `dev`) whose readings change with
/// `round`, so the replicas' memory windows can be compared.
async fn beat(registry: &mut support::Registry, agent: &Agent, round: u64) {
    registry
        .heartbeat(agent.heartbeat_message("dev", round))
        .await
        .expect("heartbeat accepted");
}

/// Starts two replicas on `db` at the same moment (both migrate it).
fn two_replicas(db: &str) -> (Running, Running) {
    std::thread::scope(|s| {
        let a = s.spawn(|| process::start_with(db, FLAGS));
        let b = s.spawn(|| process::start_with(db, FLAGS));
        (a.join().unwrap(), b.join().unwrap())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_agree_share_admission_and_fail_a_stopped_ones_captures() {
    let Some(db) = support::postgres().await else {
        return;
    };
    let (a, b) = two_replicas(&db);
    let (base_a, base_b) = (a.http.clone(), b.http.clone());
    let c = Client {
        http: reqwest::Client::new(),
    };
    // Versions uploaded through A are B's too (the database).
    let v_api = c.upload(&base_a, "api").await;
    let v_stuck = c.upload(&base_b, "stuck").await;
    let v_split = c.upload(&base_a, "split").await;
    let agents = Arc::new(vec![
        Agent::start(
            "m1",
            "lhr",
            Behavior::Answer,
            vec![support::isolate("i1", "api", &v_api)],
        )
        .await,
        Agent::start(
            "m2",
            "sjc",
            Behavior::Answer,
            vec![support::isolate("i2", "api", &v_api)],
        )
        .await,
        Agent::start(
            "m3",
            "sjc",
            Behavior::Hang,
            vec![support::isolate("i3", "stuck", &v_stuck)],
        )
        .await,
    ]);
    // Every agent heartbeats to A only, every 500 ms; a round holds the
    // lock, so a reader holding it sees no heartbeat in between.
    let round_lock = Arc::new(tokio::sync::Mutex::new(0u64));
    let mut registry = support::registry_client(a.grpc, support::SECRET).await;
    {
        let mut round = round_lock.lock().await;
        for agent in agents.iter() {
            beat(&mut registry, agent, *round).await;
        }
        *round += 1;
    }
    let beats = {
        let (agents, round_lock) = (agents.clone(), round_lock.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut round = round_lock.lock().await;
                for agent in agents.iter() {
                    beat(&mut registry, agent, *round).await;
                }
                *round += 1;
            }
        })
    };

    // B knows what A heard: the same targets and memory, right after a
    // heartbeat (B reads the fleet log before it answers).
    for _ in 0..3 {
        let round = round_lock.lock().await;
        for path in [
            "/scripts/api/targets",
            "/scripts/api/memory",
            "/scripts/stuck/targets",
        ] {
            let (sa, from_a) = c.get(&base_a, path).await;
            let (sb, from_b) = c.get(&base_b, path).await;
            assert_eq!((sa, sb), (200, 200), "{from_a} {from_b}");
            assert_eq!(from_a, from_b, "{path} after heartbeat round {round}");
        }
        let seen = *round;
        drop(round);
        // Compare again after the next round.
        let t0 = Instant::now();
        while *round_lock.lock().await == seen {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no heartbeat round after {seen}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (_, targets) = c.get(&base_b, "/scripts/api/targets").await;
    let machines: Vec<&str> = targets["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["machine"].as_str().unwrap())
        .collect();
    assert_eq!(machines, ["m1", "m2"], "{targets}");
    let (_, memory) = c.get(&base_b, "/scripts/api/memory").await;
    assert!(
        memory["versions"][0]["memory_bytes"]["samples"].as_u64() >= Some(4),
        "B counts A's readings: {memory}"
    );

    // One heartbeat's chunks may reach different replicas: both see all.
    let mut to_b = support::registry_client(b.grpc, support::SECRET).await;
    let mut to_a = support::registry_client(a.grpc, support::SECRET).await;
    let m4 = support::machine("m4", "fra");
    for (n, registry) in [&mut to_a, &mut to_b].into_iter().enumerate() {
        let isolate = format!("i4{n}");
        registry
            .heartbeat(v1::HeartbeatRequest {
                machine: Some(m4.clone()),
                isolates: vec![v1::IsolateStatus {
                    isolate_id: isolate,
                    script: "split".into(),
                    version_id: v_split.clone(),
                    account: "dev".into(),
                    requests_last_60s: 5,
                    ..Default::default()
                }],
                heartbeat_id: 77,
                chunk: n as u32,
                chunks: 2,
                ..Default::default()
            })
            .await
            .expect("chunk accepted");
    }
    for base in [&base_a, &base_b] {
        let (_, t) = c.get(base, "/scripts/split/targets").await;
        let isolates: Vec<&str> = t["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["isolate"].as_str().unwrap())
            .collect();
        assert_eq!(isolates, ["i40", "i41"], "{base}: {t}");
    }

    // A capture through B reaches every machine A heard from.
    let (status, started) = c
        .capture(&base_b, json!({"script": "api", "duration_ms": 1000}))
        .await;
    assert_eq!(status, 202, "{started}");
    let id = started["id"].as_str().unwrap().to_owned();
    let done = c
        .wait(
            &base_a,
            &id,
            &["done", "partial", "failed"],
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(done["status"], "done", "{done}");
    let resp = c
        .http
        .get(format!("{base_a}/v1/accounts/dev/profiles/{id}/pprof"))
        .bearer_auth(DEV_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sources = support::sample_sources(&resp.bytes().await.unwrap());
    let machines: Vec<&str> = sources.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(machines, ["m1", "m2"], "{sources:?}");

    // Admission is shared: an isolate busy through A is busy through B,
    // and the per-script limit counts both replicas' captures.
    let lhr = json!({"script": "api", "duration_ms": 3000, "data_center": "lhr"});
    let (status, first) = c.capture(&base_a, lhr.clone()).await;
    assert_eq!(status, 202, "{first}");
    let (status, refused) = c.capture(&base_b, lhr).await;
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("a running capture already profiles 1 of these isolates (m1/i1)"),
        "{refused}"
    );
    let sjc = json!({"script": "api", "duration_ms": 3000, "data_center": "sjc"});
    let (status, second) = c.capture(&base_b, sjc).await;
    assert_eq!(status, 202, "{second}");
    let (status, refused) = c
        .capture(&base_a, json!({"script": "api", "duration_ms": 1000}))
        .await;
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("2 captures of this script are already running (the limit)"),
        "{refused}"
    );
    for (base, s) in [(&base_b, &first), (&base_a, &second)] {
        let id = s["id"].as_str().unwrap();
        let s = c
            .wait(
                base,
                id,
                &["done", "partial", "failed"],
                Duration::from_secs(30),
            )
            .await;
        assert_eq!(s["status"], "done", "{s}");
    }

    // B is killed while it runs a capture: A fails the session, naming
    // the stopped replica, and frees its slot.
    let (status, stuck) = c
        .capture(&base_b, json!({"script": "stuck", "duration_ms": 20000}))
        .await;
    assert_eq!(status, 202, "{stuck}");
    let stuck_id = stuck["id"].as_str().unwrap().to_owned();
    c.wait(&base_a, &stuck_id, &["capturing"], Duration::from_secs(10))
        .await;
    drop(b);
    let failed = c
        .wait(
            &base_a,
            &stuck_id,
            &["done", "partial", "failed"],
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.starts_with("interrupted: control-plane replica ")
            && error.contains("stopped while it was capturing")
            && error.ends_with("start the capture again"),
        "{error}"
    );
    // A still serves, and the stopped replica's slot is free again.
    let (status, again) = c
        .capture(&base_a, json!({"script": "api", "duration_ms": 1000}))
        .await;
    assert_eq!(status, 202, "{again}");
    let s = c
        .wait(
            &base_a,
            again["id"].as_str().unwrap(),
            &["done", "partial", "failed"],
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(s["status"], "done", "{s}");
    beats.abort();
    drop(a);
    support::drop_postgres_schema(&db).await;
}
