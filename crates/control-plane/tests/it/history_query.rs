//! The history routes over windows pushed through the real gRPC hop, on
//! SQLite and PostgreSQL: a range's windows merged into one pprof (labels
//! kept, one `requests: N`), filtered by version and data center; a
//! timeline grouped by version and data center with aligned steps; every
//! bad query a 400 naming its field; other accounts refused.

use edgeprof_pprof::Profile;
use edgeprof_proto::v1;

use crate::support;

const STEP: i64 = 60_000;

fn cpu(p: &Profile) -> i64 {
    p.sample.iter().map(|s| s.value[1]).sum()
}

fn comments(p: &Profile) -> Vec<String> {
    p.comment
        .iter()
        .map(|&c| edgeprof_pprof::string(p, c).to_owned())
        .collect()
}

async fn profile(cp: &support::Cp, query: &str) -> Profile {
    let (status, body, bytes) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/history/profile?{query}"
        ))
        .await;
    assert_eq!(status, 200, "{query}: {body}");
    edgeprof_pprof::decode(&bytes).expect("a valid gzip'd pprof")
}

async fn check(db: &str) {
    let cp = support::Cp::start(support::config(db)).await;
    let v1_id = cp.deploy("api", None).await;
    let v2_id = cp.deploy("api", None).await;
    let now = cp.cp.clock.now_ms();
    // Two whole steps ago, so the windows sit in two steps of the timeline.
    let t0 = (now / STEP - 3) * STEP;
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    for (m, dc, windows) in [
        (
            "m1",
            "lhr",
            vec![
                support::labeled_window(&v1_id, "i1", t0, 10),
                support::labeled_window(&v1_id, "i1", t0 + 10_000, 20),
                support::labeled_window(&v2_id, "i2", t0 + STEP, 30),
            ],
        ),
        (
            "m2",
            "fra",
            vec![support::labeled_window(&v2_id, "i3", t0 + STEP, 40)],
        ),
    ] {
        let resp = r
            .push_windows(v1::PushWindowsRequest {
                machine: Some(support::machine(m, dc)),
                windows,
                dropped_total: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(resp.rejected.is_empty(), "{resp:?}");
    }
    let one = cpu(&edgeprof_pprof::decode(&support::isolate_profile("i1")).unwrap());

    // Everything: four windows merged, every sample labelled with where it
    // ran, one summed `requests` comment.
    let all = profile(&cp, "type=cpu&from=-1h").await;
    assert_eq!(cpu(&all), 4 * one);
    let sources = support::sample_sources(&edgeprof_pprof::encode(&all));
    assert_eq!(
        sources,
        [
            ("fra".into(), "m2".into(), "i3".into(), None),
            ("lhr".into(), "m1".into(), "i1".into(), None),
            ("lhr".into(), "m1".into(), "i2".into(), None),
        ]
    );
    let c = comments(&all);
    assert_eq!(
        c.iter()
            .filter(|c| c.starts_with("requests: "))
            .collect::<Vec<_>>(),
        ["requests: 100"],
        "{c:?}"
    );
    assert!(
        c.iter()
            .any(|c| c.starts_with("edgeprof history: cpu windows of `api`")),
        "{c:?}"
    );

    // Filters: by version, by data center, by machine.
    let old = profile(&cp, &format!("from=-1h&version={v1_id}")).await;
    assert_eq!(cpu(&old), 2 * one);
    assert!(comments(&old).contains(&"requests: 30".to_owned()));
    let fra = profile(&cp, "from=-1h&data_center=fra").await;
    assert_eq!(cpu(&fra), one);
    let m1_new = profile(&cp, &format!("from=-1h&machine=m1&version={v2_id}")).await;
    assert_eq!(cpu(&m1_new), one);
    // An RFC 3339 range holding only the first step.
    let from = humantime::format_rfc3339(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(t0 as u64),
    );
    let first = profile(&cp, &format!("from={from}&to={}", t0 + STEP)).await;
    assert_eq!(cpu(&first), 2 * one);

    // Timelines: steps aligned to the step, CPU and requests per step.
    let (status, tl, _) = cp
        .get("/v1/accounts/acme/scripts/api/history/timeline?from=-1h&step=1m&group_by=version")
        .await;
    assert_eq!(status, 200, "{tl}");
    assert_eq!(tl["step_ms"], STEP);
    let mut want = vec![
        (v1_id.clone(), serde_json::json!([[t0, 2 * one, 30]])),
        (v2_id.clone(), serde_json::json!([[t0 + STEP, 2 * one, 70]])),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let got: Vec<(String, serde_json::Value)> = tl["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["key"].as_str().unwrap().to_owned(), s["points"].clone()))
        .collect();
    assert_eq!(got, want);
    let (_, tl, _) = cp
        .get("/v1/accounts/acme/scripts/api/history/timeline?from=-1h&step=1m&group_by=data_center")
        .await;
    let keys: Vec<&str> = tl["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["fra", "lhr"]);
    let (_, tl, _) = cp
        .get("/v1/accounts/acme/scripts/api/history/timeline?from=-1h&step=10m")
        .await;
    assert_eq!(tl["series"][0]["key"], "all");
    let total: u64 = tl["series"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[2].as_u64().unwrap())
        .sum();
    assert_eq!(total, 100, "{tl}");

    // Bad queries: a 400 naming the field; no data: a 404 saying why.
    for (query, code, starts) in [
        (
            "profile?from=yesterday",
            "invalid_time",
            "from: `yesterday`",
        ),
        ("profile?from=-1h&to=soon", "invalid_time", "to: `soon`"),
        (
            "profile?from=now&to=-1h",
            "invalid_range",
            "to: must be after from",
        ),
        ("profile?from=-40d", "invalid_range", "from, to:"),
        ("profile?from=-1h&type=wall", "invalid_query", "type:"),
        (
            "profile?to=now",
            "invalid_query",
            "query: missing field `from`",
        ),
        ("profile?from=-1h&version=zz", "invalid_version", "version:"),
        (
            "timeline?from=-1d&step=1s",
            "invalid_step",
            "step: 1000 ms makes 86400 points",
        ),
        (
            "timeline?from=-1h&group_by=isolate",
            "invalid_query",
            "group_by:",
        ),
        (
            "profile?from=-1h&data_center=",
            "invalid_filter",
            "data_center:",
        ),
    ] {
        let (status, body, _) = cp
            .get(&format!("/v1/accounts/acme/scripts/api/history/{query}"))
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}: {body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with(starts), "{query}: {msg:?}");
    }
    let (status, body, _) = cp
        .get("/v1/accounts/acme/scripts/api/history/profile?from=-1h&type=heap")
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &"no_history".into())
    );
    let (status, body, _) = cp
        .get("/v1/accounts/acme/scripts/nope/history/timeline?from=-1h")
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &"unknown_script".into())
    );

    // Another account's token reads nothing of acme's history.
    let other = cp.token("globex").await;
    let resp = cp
        .http
        .get(cp.url("/v1/accounts/acme/scripts/api/history/profile?from=-1h"))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}

#[tokio::test]
async fn history_on_sqlite() {
    let (_dir, db) = support::sqlite();
    check(&db).await;
}

#[tokio::test]
async fn history_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check(&url).await;
    support::drop_postgres_schema(&url).await;
}
