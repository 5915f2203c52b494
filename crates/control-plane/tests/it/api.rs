//! REST: validation, auth and limits, each with its specific 4xx.

use serde_json::{Value, json};

use crate::support::{self, Agent, Behavior, Cp};

const SYNC: &str = "/v1/accounts/acme/scripts/api/versions/latest/profile";

async fn expect_error(
    cp: &Cp,
    path: &str,
    token: Option<&str>,
    body: Value,
    status: u16,
    code: &str,
    message_part: &str,
) {
    let (got, json, _, _) = cp.post_json(path, token, &body).await;
    assert_eq!(got, status, "{path} {body}: {json}");
    assert_eq!(json["error"]["code"], code, "{json}");
    let message = json["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(message_part),
        "message `{message}` should contain `{message_part}`"
    );
}

#[tokio::test]
async fn bad_inputs_get_their_specific_4xx() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let t = cp.token.clone();
    let t = Some(t.as_str());
    let v = cp.deploy("api", None).await;
    let agent = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i1", "api", &v)],
    )
    .await;
    agent.heartbeat(cp.cp.grpc_addr).await;

    expect_error(
        &cp,
        SYNC,
        t,
        json!({"duration_ms": 0}),
        400,
        "invalid_duration",
        "duration_ms: must be between 1000 and 50000",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"duration_ms": 60000}),
        400,
        "invalid_duration",
        "got 60000",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"duration_ms": "10s"}),
        400,
        "invalid_duration",
        "duration_ms",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"profile_type": "wall"}),
        400,
        "invalid_profile_type",
        "profile_type: must be `cpu` or `heap` (unknown variant `wall`",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"duraton_ms": 1000}),
        400,
        "invalid_body",
        "duraton_ms: unknown field",
    )
    .await;
    expect_error(
        &cp,
        "/v1/accounts/acme/scripts/nope/versions/latest/profile",
        t,
        json!({}),
        404,
        "unknown_script",
        "script `nope` not found",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"namespace_id": "rooms", "actor_id": "abc"}),
        400,
        "invalid_durable_object",
        "actor_id: must be 64 hexadecimal characters",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"namespace_id": "rooms", "actor_id": "z".repeat(64)}),
        400,
        "invalid_durable_object",
        "actor_id",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"namespace_id": "rooms"}),
        400,
        "invalid_durable_object",
        "actor_id: required with namespace_id",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"actor_id": "a".repeat(64)}),
        400,
        "invalid_durable_object",
        "namespace_id: required",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"data_center": "LHR!"}),
        400,
        "invalid_data_center",
        "data_center",
    )
    .await;
    expect_error(
        &cp,
        "/v1/accounts/acme/scripts/api/versions/abc/profile",
        t,
        json!({}),
        400,
        "invalid_version",
        "at least 8 characters",
    )
    .await;
    expect_error(
        &cp,
        "/v1/accounts/acme/scripts/api/versions/ffffffffff/profile",
        t,
        json!({}),
        404,
        "unknown_version",
        "not found",
    )
    .await;
    expect_error(
        &cp,
        "/v1/accounts/acme/profiles",
        t,
        json!({"version": "latest"}),
        400,
        "invalid_body",
        "script: required",
    )
    .await;

    // A DO no isolate hosts, a data center without traffic: no recent executions.
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"namespace_id": "rooms", "actor_id": "a".repeat(64)}),
        404,
        "no_recent_executions",
        "no recent executions were found for durable object rooms:",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        t,
        json!({"data_center": "nrt"}),
        404,
        "no_recent_executions",
        &format!("no recent executions were found for version {v} of `api` in data center `nrt`"),
    )
    .await;

    // Ambiguous prefix: version ids are time-ordered (UUIDv7), so versions
    // uploaded together share their first characters.
    let mut ids = vec![v.clone()];
    let prefix = loop {
        ids.push(cp.deploy("api", Some(0)).await);
        let (a, b) = (&ids[ids.len() - 2], &ids[ids.len() - 1]);
        let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
        if common >= 8 {
            break a[..8].to_owned();
        }
    };
    expect_error(
        &cp,
        &format!("/v1/accounts/acme/scripts/api/versions/{prefix}/profile"),
        t,
        json!({}),
        409,
        "ambiguous_version",
        &format!("prefix `{prefix}` matches"),
    )
    .await;
    // A unique prefix resolves (and then finds no traffic for that version).
    let last = ids.last().unwrap();
    expect_error(
        &cp,
        &format!("/v1/accounts/acme/scripts/api/versions/{last}/profile"),
        t,
        json!({}),
        404,
        "no_recent_executions",
        &format!("version {last}"),
    )
    .await;

    // Upload validation.
    let resp = cp
        .http
        .post(cp.url("/v1/accounts/acme/scripts/api/versions?weight=150"))
        .bearer_auth(&cp.token)
        .body(support::wasm_module("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("weight: must be a whole number from 0 to 100")
    );
    let resp = cp
        .http
        .post(cp.url("/v1/accounts/acme/scripts/api/versions"))
        .bearer_auth(&cp.token)
        .body("not wasm")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("not a WebAssembly module")
    );
}

#[tokio::test]
async fn tokens_are_scoped_to_one_account() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    cp.deploy("api", None).await;
    let other = cp.token("globex").await;
    let resp = cp
        .http
        .post(cp.url("/v1/accounts/globex/scripts/secret/versions"))
        .bearer_auth(&other)
        .body(support::wasm_module("secret"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    expect_error(
        &cp,
        SYNC,
        None,
        json!({}),
        401,
        "missing_token",
        "missing `Authorization: Bearer <token>`",
    )
    .await;
    expect_error(
        &cp,
        SYNC,
        Some("edp_0000"),
        json!({}),
        401,
        "invalid_token",
        "unknown or revoked",
    )
    .await;
    // acme's token on globex's script, and globex's on acme's: 403, and the
    // answer does not tell whether the script exists.
    for path in [
        "/v1/accounts/globex/scripts/secret/versions/latest/profile",
        "/v1/accounts/globex/scripts/missing/versions/latest/profile",
    ] {
        expect_error(
            &cp,
            path,
            Some(&cp.token),
            json!({}),
            403,
            "forbidden",
            "cannot access account `globex`",
        )
        .await;
    }
    expect_error(
        &cp,
        SYNC,
        Some(&other),
        json!({}),
        403,
        "forbidden",
        "cannot access account `acme`",
    )
    .await;
    for path in [
        "/v1/accounts/globex/scripts",
        "/v1/accounts/globex/profiles",
        "/v1/accounts/globex/scripts/secret/targets",
    ] {
        let (status, body, _) = cp.get(path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // Each account sees only its own scripts.
    let (status, body, _) = cp.get("/v1/accounts/acme/scripts").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = body["scripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["api"]);
}

#[tokio::test]
async fn versions_deployment_and_health() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(support::config(&db)).await;
    let v1 = cp.deploy("api", None).await;
    let v2 = cp.deploy("api", Some(10)).await;
    let (status, body, _) = cp.get("/v1/accounts/acme/scripts/api/versions").await;
    assert_eq!(status, 200);
    let weights: Vec<(String, u64)> = body["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_owned(),
                v["weight"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(weights, vec![(v2.clone(), 10), (v1.clone(), 90)]);
    let resp = cp
        .http
        .put(cp.url("/v1/accounts/acme/scripts/api/deployment"))
        .bearer_auth(&cp.token)
        .json(&json!({"versions": [{"version_id": v2, "weight": 100}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, body, _) = cp.get("/v1/accounts/acme/scripts/api/deployment").await;
    assert_eq!(body["versions"], json!([{"version_id": v2, "weight": 100}]));
    let put = |versions: serde_json::Value| {
        let req = cp
            .http
            .put(cp.url("/v1/accounts/acme/scripts/api/deployment"))
            .bearer_auth(&cp.token)
            .json(&json!({ "versions": versions }));
        async move {
            let resp = req.send().await.unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    // Entries name versions as any selector does; the stored id is resolved.
    // (UUIDv7 ids made in the same second share their first characters.)
    let differ = v1
        .chars()
        .zip(v2.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let (p1, p2) = (&v1[..differ.max(7) + 1], &v2[..differ.max(7) + 1]);
    let (status, body) = put(json!([
        {"version_id": p1, "weight": 70},
        {"version_id": "latest", "weight": 30}
    ]))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["versions"],
        json!([{"version_id": v1, "weight": 70}, {"version_id": v2, "weight": 30}])
    );
    let bad: &[(serde_json::Value, u16, &str)] = &[
        (
            json!([{"version_id": "nope", "weight": 1}]),
            400,
            "versions[0].version_id: `nope` is not `latest`, a version id or a prefix of one",
        ),
        (
            json!([{"version_id": v2, "weight": 1}, {"version_id": "0123456789", "weight": 1}]),
            404,
            "versions[1].version_id: version `0123456789` of script `api` not found",
        ),
        (
            json!([{"version_id": v2, "weight": 1}, {"version_id": p2, "weight": 1}]),
            400,
            "listed twice",
        ),
        (
            json!([{"version_id": v2, "weight": 101}]),
            400,
            "versions[0].weight: at most 100 (got 101)",
        ),
    ];
    for (versions, code, message) in bad {
        let (status, body) = put(versions.clone()).await;
        assert_eq!(status, *code, "{versions}: {body}");
        let got = body["error"]["message"].as_str().unwrap();
        assert!(
            got.contains(message),
            "{versions}: `{got}` lacks `{message}`"
        );
    }
    // A refused change leaves the deployment as it was.
    let (_, body, _) = cp.get("/v1/accounts/acme/scripts/api/deployment").await;
    assert_eq!(
        body["versions"],
        json!([{"version_id": v1, "weight": 70}, {"version_id": v2, "weight": 30}])
    );
    let (status, body, _) = cp.get("/v1/accounts/acme/scripts/nope/versions").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_script"))
    );
    let (status, body, _) = cp.get("/v1/accounts/acme/profiles/0000").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_session"))
    );
    for limit in ["0", "abc", "1001"] {
        let (status, body, _) = cp
            .get(&format!("/v1/accounts/acme/profiles?limit={limit}"))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_limit")),
            "{limit}"
        );
    }
    let (status, _, raw) = cp.get("/healthz").await;
    assert_eq!((status, raw.as_slice()), (200, &b"ok\n"[..]));
    let (status, body, _) = cp.get("/v1/nothing").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}
