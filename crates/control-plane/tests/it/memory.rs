//! The per-version memory view (`…/scripts/{script}/memory`), fed by real
//! heartbeats over gRPC: percentiles over the window, isolates now,
//! eviction counters, and the endpoint's errors.

use std::time::Duration;

use edgeprof_proto::v1;

use crate::support::{self, Cp, Registry};

const MIB: u64 = 1 << 20;

fn machine(id: &str, dc: &str) -> v1::Machine {
    v1::Machine {
        id: id.into(),
        data_center: dc.into(),
        grpc_address: "127.0.0.1:9".into(),
        http_address: "http://127.0.0.1:9".into(),
    }
}

fn status(
    isolate: &str,
    version: &str,
    memory_bytes: u64,
    (evictions, memory_evictions): (u64, u64),
) -> v1::IsolateStatus {
    v1::IsolateStatus {
        isolate_id: isolate.into(),
        script: "api".into(),
        version_id: version.into(),
        account: "acme".into(),
        requests_last_60s: 5,
        last_request_unix_ms: 0,
        durable_objects: Vec::new(),
        memory_bytes,
        evictions,
        memory_evictions,
    }
}

async fn beat(client: &mut Registry, m: &v1::Machine, isolates: Vec<v1::IsolateStatus>) {
    client
        .heartbeat(v1::HeartbeatRequest {
            machine: Some(m.clone()),
            isolates,
            isolates_omitted: 0,
            evicted: Vec::new(),
            ..Default::default()
        })
        .await
        .expect("heartbeat accepted");
}

fn stats(v: &serde_json::Value) -> [u64; 5] {
    let m = &v["memory_bytes"];
    [
        m["p50"].as_u64().unwrap(),
        m["p99"].as_u64().unwrap(),
        m["p999"].as_u64().unwrap(),
        m["max"].as_u64().unwrap(),
        m["samples"].as_u64().unwrap(),
    ]
}

#[tokio::test]
async fn memory_view_from_heartbeats() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v1_id = cp.deploy("api", None).await;
    let v2_id = cp.deploy("api", Some(10)).await;
    let unreported = cp.deploy("api", Some(10)).await;
    let mut client = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let (m1, m2) = (machine("m1", "lhr"), machine("m2", "sjc"));

    // m1: 1000 heartbeats of one v1 isolate at 1..=1000 MiB, its version's
    // counters repeated on a second isolate at 0 bytes.
    for k in 1..=1000u64 {
        beat(
            &mut client,
            &m1,
            vec![
                status("i1", &v1_id, k * MIB, (0, 0)),
                status("i2", &v2_id, 0, (4, 3)),
                status("i3", &v2_id, 0, (4, 3)),
            ],
        )
        .await;
    }
    // m2: a v2 isolate, with its own eviction counters.
    beat(
        &mut client,
        &m2,
        vec![status("j1", &v2_id, 7 * MIB, (2, 1))],
    )
    .await;

    let (code, body, _) = cp.get("/v1/accounts/acme/scripts/api/memory").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["script"], "api");
    let versions = body["versions"].as_array().unwrap();
    // Newest first; the version no agent reported is left out.
    let ids: Vec<&str> = versions
        .iter()
        .map(|v| v["version_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![v2_id.as_str(), v1_id.as_str()]);
    let (v2, v1) = (&versions[0], &versions[1]);

    // Nearest rank over 1000 readings 1..=1000 MiB.
    assert_eq!(
        stats(v1),
        [500 * MIB, 990 * MIB, 999 * MIB, 1000 * MIB, 1000]
    );
    assert_eq!(v1["window_s"], 300);
    assert_eq!(
        v1["isolates"],
        serde_json::json!([{"machine": "m1", "data_center": "lhr", "isolate": "i1",
                            "memory_bytes": 1000 * MIB}])
    );
    assert_eq!(
        v1["evictions"],
        serde_json::json!({"exceeded_memory": 0, "total": 0})
    );

    // v2: 2000 zero readings from m1 and one 7 MiB from m2; m1's counters
    // count once, plus m2's.
    assert_eq!(stats(v2), [0, 0, 0, 7 * MIB, 2001]);
    assert_eq!(
        v2["evictions"],
        serde_json::json!({"exceeded_memory": 4, "total": 6})
    );
    let isolates: Vec<(&str, &str)> = v2["isolates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["machine"].as_str().unwrap(),
                i["isolate"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(isolates, vec![("m1", "i2"), ("m1", "i3"), ("m2", "j1")]);

    // One version by prefix; a version nothing reported still answers.
    let (code, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/memory?version={}&window_s=60",
            &v1_id[..v1_id.len() - 4]
        ))
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["versions"].as_array().unwrap().len(), 1);
    assert_eq!(body["versions"][0]["version_id"], v1_id.as_str());
    assert_eq!(body["versions"][0]["window_s"], 60);
    assert_eq!(stats(&body["versions"][0])[4], 1000);
    let (code, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/memory?version={unreported}"
        ))
        .await;
    assert_eq!(code, 200, "{body}");
    let v = &body["versions"][0];
    assert_eq!(v["memory_bytes"]["samples"], 0);
    assert!(v["memory_bytes"]["p99"].is_null(), "{body}");
    assert_eq!(v["isolates"], serde_json::json!([]));

    // A short window holds only the readings since: wait it out, beat once.
    cp.advance(Duration::from_millis(3500));
    beat(
        &mut client,
        &m1,
        vec![status("i1", &v1_id, 3 * MIB, (1, 1))],
    )
    .await;
    let (code, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/memory?version={v1_id}&window_s=3"
        ))
        .await;
    assert_eq!(code, 200, "{body}");
    let v = &body["versions"][0];
    assert_eq!(stats(v), [3 * MIB, 3 * MIB, 3 * MIB, 3 * MIB, 1]);
    assert_eq!(
        v["evictions"],
        serde_json::json!({"exceeded_memory": 1, "total": 1})
    );
    // The full window still has everything.
    let (_, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/memory?version={v1_id}"
        ))
        .await;
    assert_eq!(stats(&body["versions"][0])[4], 1001);
}

#[tokio::test]
async fn memory_endpoint_errors() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("api", None).await;
    let path = "/v1/accounts/acme/scripts/api/memory";

    for bad in ["0", "301", "abc", "-5", "1.5"] {
        let (code, body, _) = cp.get(&format!("{path}?window_s={bad}")).await;
        assert_eq!(code, 400, "window_s={bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_window");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("window_s") && msg.contains("1 to 300") && msg.contains(bad),
            "{msg}"
        );
    }
    let (code, body, _) = cp.get(&format!("{path}?version=0000000000")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_version");
    let (code, body, _) = cp.get(&format!("{path}?version=abc")).await;
    assert_eq!(code, 400, "{body}");
    let (code, body, _) = cp.get("/v1/accounts/acme/scripts/nope/memory").await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_script");
    let (code, body, _) = cp.get(&format!("{path}?version={v}")).await;
    assert_eq!(code, 200, "{body}");

    let resp = cp.http.get(cp.url(path)).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let other = cp.token("globex").await;
    let resp = cp
        .http
        .get(cp.url(path))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}

/// Before agents reported evicted isolates, an isolate evicted for
/// exceeding memory vanished from the next heartbeat with its last reading
/// below the limit, so p99.9 never showed the demand the limit cut off.
#[tokio::test]
async fn evicted_isolates_final_readings_count_but_are_not_listed() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("api", None).await;
    let mut client = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let m1 = machine("m1", "lhr");
    for k in 1..=9u64 {
        beat(
            &mut client,
            &m1,
            vec![status("i1", &v, 10 * k * MIB, (0, 0))],
        )
        .await;
    }
    // i1 tried to grow to 128 MiB + 64 KiB and was evicted; i2 replaced it.
    let tried = 128 * MIB + 64 * 1024;
    client
        .heartbeat(v1::HeartbeatRequest {
            machine: Some(m1.clone()),
            isolates: vec![status("i2", &v, MIB, (1, 1))],
            isolates_omitted: 0,
            evicted: vec![status("i1", &v, tried, (1, 1))],
            ..Default::default()
        })
        .await
        .expect("heartbeat accepted");

    let (code, body, _) = cp
        .get(&format!("/v1/accounts/acme/scripts/api/memory?version={v}"))
        .await;
    assert_eq!(code, 200, "{body}");
    let version = &body["versions"][0];
    // 9 readings of i1, its final one, and i2's: p99.9 is the final one.
    assert_eq!(stats(version), [50 * MIB, tried, tried, tried, 11]);
    assert_eq!(
        version["evictions"],
        serde_json::json!({"exceeded_memory": 1, "total": 1})
    );
    assert_eq!(
        version["isolates"],
        serde_json::json!([{"machine": "m1", "data_center": "lhr", "isolate": "i2",
                            "memory_bytes": MIB}]),
        "an evicted isolate is no longer listed"
    );
    // The version's only isolate evicted and none replacing it yet: its
    // eviction still counts.
    let m2 = machine("m2", "sjc");
    client
        .heartbeat(v1::HeartbeatRequest {
            machine: Some(m2),
            isolates: Vec::new(),
            isolates_omitted: 0,
            evicted: vec![status("j1", &v, tried, (1, 1))],
            ..Default::default()
        })
        .await
        .expect("heartbeat accepted");
    let (_, body, _) = cp
        .get(&format!("/v1/accounts/acme/scripts/api/memory?version={v}"))
        .await;
    assert_eq!(
        body["versions"][0]["evictions"],
        serde_json::json!({"exceeded_memory": 2, "total": 2})
    );
    let targets = cp.get("/v1/accounts/acme/scripts/api/targets").await.1;
    let listed: Vec<&str> = targets["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["isolate"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        vec!["i2"],
        "evicted isolates are not capture targets"
    );
}
