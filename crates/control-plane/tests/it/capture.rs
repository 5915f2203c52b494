//! Fleet captures through the control plane: fan-out to every target
//! machine, labelled merge, partial results, Durable Objects, heartbeat
//! expiry, and the Registry's own calls.

use std::time::{Duration, Instant};

use edgeprof_proto::v1;
use serde_json::json;

use crate::support::{self, Agent, Behavior, Cp, FakeIsolate};

fn src(dc: &str, machine: &str, isolate: &str) -> (String, String, String, Option<String>) {
    (dc.into(), machine.into(), isolate.into(), None)
}

#[tokio::test]
async fn fleet_capture_merges_every_target_machine_with_labels() {
    let (_dir, db) = support::sqlite();
    fleet_capture(&db).await;
}

#[tokio::test]
async fn fleet_capture_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    fleet_capture(&url).await;
    support::drop_postgres_schema(&url).await;
}

async fn fleet_capture(db: &str) {
    let cp = Cp::start(support::config(db)).await;
    let old = cp.deploy("api", None).await;
    let v = cp.deploy("api", Some(50)).await;
    let other = cp.deploy("billing", None).await;

    let m1 = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![
            support::isolate("i1", "api", &v),
            support::isolate("i2", "api", &v),
            support::isolate("old1", "api", &old),
        ],
    )
    .await;
    let m2 = Agent::start(
        "m2",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i3", "api", &v)],
    )
    .await;
    let m3 = Agent::start(
        "m3",
        "sjc",
        Behavior::Answer,
        vec![
            support::isolate("i4", "api", &v),
            FakeIsolate {
                recent_requests: 0,
                ..support::isolate("idle", "api", &v)
            },
        ],
    )
    .await;
    // Runs only another version and another script: never asked.
    let m4 = Agent::start(
        "m4",
        "sjc",
        Behavior::Answer,
        vec![
            support::isolate("old2", "api", &old),
            support::isolate("b1", "billing", &other),
        ],
    )
    .await;
    for a in [&m1, &m2, &m3, &m4] {
        a.heartbeat(cp.cp.grpc_addr).await;
    }

    // Targets: isolates of the version with recent requests.
    let (status, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/targets?version={v}"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let targets: Vec<(&str, &str, &str)> = body["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["data_center"].as_str().unwrap(),
                t["machine"].as_str().unwrap(),
                t["isolate"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        vec![
            ("lhr", "m1", "i1"),
            ("lhr", "m1", "i2"),
            ("lhr", "m2", "i3"),
            ("sjc", "m3", "i4")
        ]
    );

    // Synchronous, Cloudflare-shaped: the gzip'd merged pprof.
    let t0 = Instant::now();
    let (status, _, headers, bytes) = cp
        .post_json(
            &format!(
                "/v1/accounts/acme/scripts/api/versions/{}/profile",
                &v[..13]
            ),
            Some(&cp.token),
            &json!({"duration_ms": 1000, "profile_type": "cpu"}),
        )
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert!(
        t0.elapsed() < Duration::from_millis(1000 + 1500 + 1000),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["x-edgeprof-status"], "done");
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip'd");
    assert_eq!(
        support::sample_sources(&bytes),
        vec![
            src("lhr", "m1", "i1"),
            src("lhr", "m1", "i2"),
            src("lhr", "m2", "i3"),
            src("sjc", "m3", "i4")
        ]
    );
    // Each machine was asked once, for exactly its target isolates.
    assert_eq!(
        *m1.asked.lock().unwrap(),
        vec![vec!["i1".to_owned(), "i2".to_owned()]]
    );
    assert_eq!(*m3.asked.lock().unwrap(), vec![vec!["i4".to_owned()]]);
    assert!(m4.asked.lock().unwrap().is_empty());
    // Values are summed over isolates: 4 isolates × 4 samples.
    let p = edgeprof_pprof::decode(&bytes).unwrap();
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 16);

    // Asynchronous, with one data center only.
    let (status, started, _, _) = cp
        .post_json(
            "/v1/accounts/acme/profiles",
            Some(&cp.token),
            &json!({"script": "api", "version": v, "duration_ms": 1000, "data_center": "sjc"}),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    let id = started["id"].as_str().unwrap();
    let session = cp.wait_session(id, Duration::from_secs(5)).await;
    assert_eq!(session["status"], "done", "{session}");
    assert_eq!(
        session["progress"],
        json!({"machines_total": 1, "machines_answered": 1})
    );
    assert_eq!(session["missing_machines"], json!([]));
    assert_eq!(session["targets"].as_array().unwrap().len(), 1);
    let events: Vec<&str> = session["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(events, vec!["pending", "capturing", "merging", "done"]);
    let (status, _, pprof) = cp
        .get(&format!("/v1/accounts/acme/profiles/{id}/pprof"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        support::sample_sources(&pprof),
        vec![src("sjc", "m3", "i4")]
    );

    // History lists both, newest first.
    let (_, history, _) = cp.get("/v1/accounts/acme/profiles?script=api").await;
    let rows = history["profiles"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["id"], id);
    assert_eq!(rows[0]["profile_type"], "cpu");
    assert_eq!(rows[1]["status"], "done");
}

#[tokio::test]
async fn a_hanging_agent_makes_the_session_partial_naming_it() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await; // slack 1.5 s
    let v = cp.deploy("api", None).await;
    let good = Agent::start(
        "good",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i1", "api", &v)],
    )
    .await;
    let stuck = Agent::start(
        "stuck",
        "sjc",
        Behavior::Hang,
        vec![support::isolate("i2", "api", &v)],
    )
    .await;
    let broken = Agent::start(
        "broken",
        "nrt",
        Behavior::Fail,
        vec![support::isolate("i3", "api", &v)],
    )
    .await;
    for a in [&good, &stuck, &broken] {
        a.heartbeat(cp.cp.grpc_addr).await;
    }
    let t0 = Instant::now();
    let (status, started, _, _) = cp
        .post_json(
            "/v1/accounts/acme/profiles",
            Some(&cp.token),
            &json!({"script": "api", "duration_ms": 1000}),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    let session = cp
        .wait_session(started["id"].as_str().unwrap(), Duration::from_secs(10))
        .await;
    let elapsed = t0.elapsed();
    assert!(
        elapsed < Duration::from_millis(1000 + 1500 + 1500),
        "partial after {elapsed:?}, not within duration + slack"
    );
    assert_eq!(session["status"], "partial", "{session}");
    assert_eq!(session["missing_machines"], json!(["broken", "stuck"]));
    let failures = session["failures"].as_array().unwrap();
    let reason = |m: &str| {
        failures.iter().find(|f| f["machine"] == m).unwrap()["reason"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        reason("stuck").contains("did not answer within 2.5 s"),
        "{}",
        reason("stuck")
    );
    assert!(
        reason("broken").contains("sampler crashed"),
        "{}",
        reason("broken")
    );
    let (status, _, pprof) = cp
        .get(&format!(
            "/v1/accounts/acme/profiles/{}/pprof",
            started["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        support::sample_sources(&pprof),
        vec![src("lhr", "good", "i1")]
    );

    // The synchronous endpoint says the same in headers.
    let (status, _, headers, bytes) = cp
        .post_json(
            "/v1/accounts/acme/scripts/api/versions/latest/profile",
            Some(&cp.token),
            &json!({"duration_ms": 1000}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-edgeprof-status"], "partial");
    assert_eq!(headers["x-edgeprof-missing-machines"], "broken,stuck");
    assert_eq!(
        support::sample_sources(&bytes),
        vec![src("lhr", "good", "i1")]
    );

    // Nothing answers: failed, with every machine's reason; 502 when synchronous.
    drop(good);
    let (status, err, _, _) = cp
        .post_json(
            "/v1/accounts/acme/scripts/api/versions/latest/profile",
            Some(&cp.token),
            &json!({"duration_ms": 1000}),
        )
        .await;
    assert_eq!(status, 502, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    for m in ["good", "stuck", "broken"] {
        assert!(message.contains(m), "{message}");
    }
}

#[tokio::test]
async fn durable_object_capture_targets_its_one_isolate() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("rooms", None).await;
    let id = "ab".repeat(32);
    let dobj = format!("chat:{id}");
    let owner = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![
            FakeIsolate {
                durable_objects: vec![dobj.clone()],
                recent_requests: 0,
                ..support::isolate("do1", "rooms", &v)
            },
            support::isolate("plain", "rooms", &v),
        ],
    )
    .await;
    let elsewhere = Agent::start(
        "m2",
        "sjc",
        Behavior::Answer,
        vec![support::isolate("plain2", "rooms", &v)],
    )
    .await;
    owner.heartbeat(cp.cp.grpc_addr).await;
    elsewhere.heartbeat(cp.cp.grpc_addr).await;
    let (status, _, _, bytes) = cp
        .post_json(
            "/v1/accounts/acme/scripts/rooms/versions/latest/profile",
            Some(&cp.token),
            &json!({"duration_ms": 1000, "namespace_id": "chat", "actor_id": id.to_uppercase()}),
        )
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(
        support::sample_sources(&bytes),
        vec![("lhr".into(), "m1".into(), "do1".into(), Some(dobj.clone()))]
    );
    assert!(elsewhere.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_machine_that_stops_heartbeating_drops_out_of_targets() {
    let (_dir, db) = support::sqlite();
    let mut config = support::config(&db);
    config.heartbeat_interval = Duration::from_millis(400);
    let cp = Cp::start(config).await;
    let v = cp.deploy("api", None).await;
    let a = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i1", "api", &v)],
    )
    .await;
    let b = Agent::start(
        "m2",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i2", "api", &v)],
    )
    .await;
    a.heartbeat(cp.cp.grpc_addr).await;
    b.heartbeat(cp.cp.grpc_addr).await;
    let machines = |body: &serde_json::Value| -> Vec<String> {
        body["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["machine"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, body, _) = cp.get("/v1/accounts/acme/scripts/api/targets").await;
    assert_eq!(machines(&body), vec!["m1", "m2"]);
    // m1 keeps heartbeating, m2 goes silent; after 3 intervals m2 is gone.
    for _ in 0..3 {
        cp.advance(Duration::from_millis(400));
        a.heartbeat(cp.cp.grpc_addr).await;
    }
    let (_, body, _) = cp.get("/v1/accounts/acme/scripts/api/targets").await;
    assert_eq!(machines(&body), vec!["m1"]);
    cp.advance(Duration::from_millis(1200));
    let (status, err, _, _) = cp
        .post_json(
            "/v1/accounts/acme/scripts/api/versions/latest/profile",
            Some(&cp.token),
            &json!({"duration_ms": 1000}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["code"], "no_recent_executions");
    // Coming back is just heartbeating again.
    b.heartbeat(cp.cp.grpc_addr).await;
    let (_, body, _) = cp.get("/v1/accounts/acme/scripts/api/targets").await;
    assert_eq!(machines(&body), vec!["m2"]);
    let (_, metrics, raw) = cp.get("/metrics").await;
    let _ = metrics;
    assert!(
        String::from_utf8(raw)
            .unwrap()
            .contains("edgeprof_live_machines 1")
    );
}

#[tokio::test]
async fn registry_requires_the_agent_secret_and_serves_deployments_and_placements() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("rooms", None).await;
    let machine = |id: &str| v1::Machine {
        id: id.into(),
        data_center: "lhr".into(),
        grpc_address: format!("127.0.0.1:1{id}"),
        http_address: String::new(),
    };

    let mut wrong = support::registry_client(cp.cp.grpc_addr, "not-the-secret").await;
    let err = wrong
        .register(v1::RegisterRequest {
            machine: Some(machine("1")),
            agent_version: "t".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "wrong agent secret");

    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let reg = r
        .register(v1::RegisterRequest {
            machine: Some(machine("1")),
            agent_version: "t".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reg.heartbeat_interval_ms, 5000);
    r.register(v1::RegisterRequest {
        machine: Some(machine("2")),
        agent_version: "t".into(),
    })
    .await
    .unwrap();
    let err = r
        .register(v1::RegisterRequest {
            machine: None,
            agent_version: "t".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::InvalidArgument, "machine: required")
    );

    let d = r
        .get_deployment(v1::GetDeploymentRequest {
            machine: Some(machine("1")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.scripts.len(), 1);
    assert_eq!(
        (d.scripts[0].account.as_str(), d.scripts[0].script.as_str()),
        ("acme", "rooms")
    );
    assert_eq!(d.scripts[0].versions[0].version_id, v);
    assert_eq!(d.scripts[0].versions[0].weight, 100);
    let wasm = r
        .get_script_version(v1::GetScriptVersionRequest {
            version_id: v.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(wasm.wasm, support::wasm_module("rooms"));
    assert_eq!(wasm.wasm_sha256, d.scripts[0].versions[0].wasm_sha256);

    // First use places the object on the asking machine; another machine
    // asking later is sent to the owner.
    let place = |m: &str, id: &str| v1::PlaceDurableObjectRequest {
        machine: Some(machine(m)),
        account: "acme".into(),
        script: "rooms".into(),
        namespace: "chat".into(),
        object_id: id.into(),
    };
    let id = "0f".repeat(32);
    let first = r
        .place_durable_object(place("1", &id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.owner.unwrap().id, "1");
    assert_eq!(first.version_id, v);
    let second = r
        .place_durable_object(place("2", &id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.owner.unwrap().grpc_address, "127.0.0.1:11");
    let err = r.place_durable_object(place("2", "xyz")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("object_id: must be 64 hexadecimal characters"),
        "{}",
        err.message()
    );
}

/// The comments of a gzip'd pprof.
fn comments(pprof: &[u8]) -> Vec<String> {
    let p = edgeprof_pprof::decode(pprof).expect("valid pprof");
    p.comment
        .iter()
        .map(|&c| edgeprof_pprof::string(&p, c).to_owned())
        .collect()
}

#[tokio::test]
async fn requests_served_during_the_capture_are_summed_over_the_merged_isolates() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("api", None).await;
    let counted = |id: &str, n: u64| FakeIsolate {
        capture_requests: Some(n),
        ..support::isolate(id, "api", &v)
    };
    let m1 = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![counted("i1", 7), counted("i2", 11)],
    )
    .await;
    let m2 = Agent::start("m2", "sjc", Behavior::Answer, vec![counted("i3", 5)]).await;
    // Its isolate's requests are not in the profile, so not in the count.
    let broken = Agent::start("broken", "nrt", Behavior::Fail, vec![counted("i4", 1000)]).await;
    for a in [&m1, &m2, &broken] {
        a.heartbeat(cp.cp.grpc_addr).await;
    }
    let session = cp
        .capture_session(&json!({"script": "api", "duration_ms": 1000}))
        .await;
    let id = session["id"].as_str().unwrap();
    assert_eq!(session["status"], "partial", "{session}");
    assert_eq!(session["requests"], 7 + 11 + 5, "{session}");
    let (_, history, _) = cp.get("/v1/accounts/acme/profiles?script=api").await;
    assert_eq!(history["profiles"][0]["id"], id);
    assert_eq!(history["profiles"][0]["requests"], 23, "{history}");
    let (status, _, pprof) = cp
        .get(&format!("/v1/accounts/acme/profiles/{id}/pprof"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(comments(&pprof), vec!["requests: 23"]);

    // An agent that does not count requests: the total is unknown, not low.
    let old = Agent::start(
        "old",
        "fra",
        Behavior::Answer,
        vec![FakeIsolate {
            capture_requests: None,
            ..support::isolate("i5", "api", &v)
        }],
    )
    .await;
    old.heartbeat(cp.cp.grpc_addr).await;
    let session = cp
        .capture_session(&json!({"script": "api", "duration_ms": 1000, "data_center": "fra"}))
        .await;
    let id = session["id"].as_str().unwrap();
    assert_eq!(session["status"], "done", "{session}");
    assert_eq!(session["requests"], json!(null), "{session}");
    let (_, _, pprof) = cp
        .get(&format!("/v1/accounts/acme/profiles/{id}/pprof"))
        .await;
    assert!(comments(&pprof).is_empty());
}
