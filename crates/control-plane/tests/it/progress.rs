//! A session's progress while its capture runs: an agent that answers at
//! once is counted (with its failure) while the others still capture, not
//! only when the last one answers.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{self, Agent, Behavior, Cp};

#[tokio::test]
async fn an_early_answer_shows_in_the_progress_while_others_capture() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v = cp.deploy("api", None).await;
    let slow = Agent::start(
        "slow",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i1", "api", &v)],
    )
    .await;
    let broken = Agent::start(
        "broken",
        "nrt",
        Behavior::Fail,
        vec![support::isolate("i2", "api", &v)],
    )
    .await;
    for a in [&slow, &broken] {
        a.heartbeat(cp.cp.grpc_addr).await;
    }
    // Long enough that the slow agent is still capturing when the broken
    // one's failure is recorded, even on a loaded machine.
    let duration_ms = 20_000;
    let (status, started, _, _) = cp
        .post_json(
            "/v1/accounts/acme/profiles",
            Some(&cp.token),
            &json!({"script": "api", "duration_ms": duration_ms}),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    let id = started["id"].as_str().unwrap();
    let t0 = Instant::now();
    let session = loop {
        let (status, s, _) = cp.get(&format!("/v1/accounts/acme/profiles/{id}")).await;
        assert_eq!(status, 200, "{s}");
        if s["progress"]["machines_answered"] == 1 {
            break s;
        }
        assert_eq!(
            s["status"], "capturing",
            "the session ended before showing the early answer: {s}"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(duration_ms),
            "no progress shown while the slow agent captures: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(session["status"], "capturing", "{session}");
    assert_eq!(
        session["progress"],
        json!({"machines_total": 2, "machines_answered": 1})
    );
    let failures = session["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{session}");
    assert_eq!(failures[0]["machine"], "broken");
    assert!(
        failures[0]["reason"]
            .as_str()
            .unwrap()
            .contains("sampler crashed"),
        "{session}"
    );
}
