//! REST capture admission: the per-script limit and the one-capture-per-isolate
//! rule, each a 429 that says what to wait for.

use std::time::Duration;

use serde_json::json;

use crate::support::{self, Agent, Behavior, Cp};

const SYNC: &str = "/v1/accounts/acme/scripts/api/versions/latest/profile";

/// Agents `m1` in lhr (isolate `i1`) and `m2` in sjc (`i2`) running
/// version `v` of `api`, registered by a heartbeat.
async fn lhr_and_sjc_agents(cp: &Cp, v: &str) -> Vec<Agent> {
    let mut agents = Vec::new();
    for (machine, dc, isolate) in [("m1", "lhr", "i1"), ("m2", "sjc", "i2")] {
        let agent = Agent::start(
            machine,
            dc,
            Behavior::Answer,
            vec![support::isolate(isolate, "api", v)],
        )
        .await;
        agent.heartbeat(cp.cp.grpc_addr).await;
        agents.push(agent);
    }
    agents
}

#[tokio::test]
async fn too_many_captures_of_one_script_get_429_with_retry_after() {
    let (_dir, db) = support::sqlite();
    let mut config = support::config(&db);
    config.max_captures_per_script = 2;
    let cp = Cp::start(config).await;
    let v = cp.deploy("api", None).await;
    let _agents = lhr_and_sjc_agents(&cp, &v).await;
    // Two captures of different isolates (one per data center) run at once.
    let mut running = Vec::new();
    for dc in ["lhr", "sjc"] {
        let body = json!({"script": "api", "duration_ms": 3000, "data_center": dc});
        let (status, json, _, _) = cp
            .post_json("/v1/accounts/acme/profiles", Some(&cp.token), &body)
            .await;
        assert_eq!(status, 202, "{json}");
        assert_eq!(json["status"], "pending");
        running.push(json["id"].as_str().unwrap().to_owned());
    }
    let body = json!({"script": "api", "duration_ms": 3000});
    let (status, json, headers, _) = cp
        .post_json("/v1/accounts/acme/profiles", Some(&cp.token), &body)
        .await;
    assert_eq!(status, 429, "{json}");
    assert_eq!(json["error"]["code"], "too_many_captures");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("2 captures of this script are already running (the limit)"),
        "{json}"
    );
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "Retry-After {retry}");
    // The sync endpoint shares the limit.
    let (status, _, headers, _) = cp
        .post_json(SYNC, Some(&cp.token), &json!({"duration_ms": 1000}))
        .await;
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    // Once they finish, captures are accepted again.
    for id in &running {
        cp.wait_session(id, Duration::from_secs(20)).await;
    }
    let (status, json, _, _) = cp
        .post_json(SYNC, Some(&cp.token), &json!({"duration_ms": 1000}))
        .await;
    assert_eq!(status, 200, "{json}");
    let (_, metrics, raw) = cp.get("/metrics").await;
    let _ = metrics;
    let text = String::from_utf8(raw).unwrap();
    assert!(
        text.contains("edgeprof_captures_rate_limited_total 2"),
        "{text}"
    );
    assert!(
        text.contains("edgeprof_captures_finished_total{status=\"done\"} 3"),
        "{text}"
    );
}

/// Regression: a second capture of an isolate already being captured was
/// admitted (the per-script limit allowed it) and then failed on the agent
/// ("a Cpu capture is already running on this isolate") as a `failed`
/// session. It is now refused up front, naming the isolates, with the time
/// until they are free.
#[tokio::test]
async fn a_capture_of_isolates_already_being_captured_gets_429_naming_them() {
    let (_dir, db) = support::sqlite();
    let mut config = support::config(&db);
    config.max_captures_per_script = 4;
    let cp = Cp::start(config).await;
    let v = cp.deploy("api", None).await;
    let _agents = lhr_and_sjc_agents(&cp, &v).await;
    let capture = |body: serde_json::Value| {
        let cp = &cp;
        async move {
            let (status, json, headers, _) = cp
                .post_json("/v1/accounts/acme/profiles", Some(&cp.token), &body)
                .await;
            let retry = headers
                .get("retry-after")
                .map(|h| h.to_str().unwrap().parse::<u64>().unwrap());
            (status, json, retry)
        }
    };
    let (status, json, _) =
        capture(json!({"script": "api", "duration_ms": 3000, "data_center": "lhr"})).await;
    assert_eq!(status, 202, "{json}");
    // The whole fleet includes lhr's isolate: refused, though under the limit.
    let (status, json, retry) = capture(json!({"script": "api", "duration_ms": 1000})).await;
    assert_eq!(status, 429, "{json}");
    assert_eq!(
        json["error"]["message"].as_str().unwrap(),
        format!(
            "a running capture already profiles 1 of these isolates (m1/i1); an isolate is profiled by one capture at a time; retry in {} s",
            retry.unwrap()
        )
    );
    assert!((1..=5).contains(&retry.unwrap()), "{retry:?}");
    // Other isolates of the script can be captured meanwhile.
    let (status, json, _) =
        capture(json!({"script": "api", "duration_ms": 1000, "data_center": "sjc"})).await;
    assert_eq!(status, 202, "{json}");
    let id = json["id"].as_str().unwrap().to_owned();
    let done = cp.wait_session(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "done", "{done}");
}
