//! Unit tests of the API: capture-body validation, errors without a token,
//! and the REST reference (`docs/api.md`) against the router's routes.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use tower::ServiceExt;

use super::captures::validate;
use super::extract::parse_json;
use super::*;
use crate::capture::{CaptureSettings, Limits};
use crate::clock::Clock;

/// `Ok(summary)` or `Err((code, message part))`.
fn check(body: &str, async_form: bool, expect: Result<&str, (&str, &str)>) {
    let got = parse_json(body.as_bytes()).and_then(|b| validate(b, async_form));
    match (got, expect) {
        (Ok(b), Ok(summary)) => {
            let s = format!(
                "{} {}ms do={} dc={} script={} version={}",
                b.kind,
                b.duration.as_millis(),
                b.durable_object.map_or("-".into(), |d| d.to_string()),
                b.data_center.as_deref().unwrap_or("-"),
                b.script.as_deref().unwrap_or("-"),
                b.version.as_deref().unwrap_or("-"),
            );
            assert_eq!(s, summary, "{body}");
        }
        (Err(e), Err((code, part))) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.code, code, "{body}: {}", e.message);
            assert!(
                e.message.contains(part),
                "{body}: `{}` lacks `{part}`",
                e.message
            );
        }
        (got, expect) => panic!("{body}: got {got:?}, expected {expect:?}"),
    }
}

#[test]
fn capture_bodies() {
    let id = "AB".repeat(32);
    check("", false, Ok("cpu 10000ms do=- dc=- script=- version=-"));
    check(
        r#"{"duration_ms": 1000, "profile_type": "heap"}"#,
        false,
        Ok("heap 1000ms do=- dc=- script=- version=-"),
    );
    check(
        r#"{"duration_ms": 50000, "data_center": "lhr"}"#,
        false,
        Ok("cpu 50000ms do=- dc=lhr script=- version=-"),
    );
    check(
        &format!(r#"{{"namespace_id": "chat", "actor_id": "{id}"}}"#),
        false,
        Ok(&format!(
            "cpu 10000ms do=chat:{} dc=- script=- version=-",
            id.to_lowercase()
        )),
    );
    check(
        r#"{"script": "api"}"#,
        true,
        Ok("cpu 10000ms do=- dc=- script=api version=latest"),
    );
    let cases: &[(&str, bool, &str, &str)] = &[
        (
            r#"{"duration_ms": 999}"#,
            false,
            "invalid_duration",
            "got 999",
        ),
        (
            r#"{"duration_ms": 50001}"#,
            false,
            "invalid_duration",
            "between 1000 and 50000",
        ),
        (
            r#"{"duration_ms": -5}"#,
            false,
            "invalid_duration",
            "duration_ms: must be a whole number of milliseconds",
        ),
        (
            r#"{"duration_ms": 1.5}"#,
            false,
            "invalid_duration",
            "invalid type: floating point `1.5`",
        ),
        (
            r#"{"profile_type": 3}"#,
            false,
            "invalid_profile_type",
            "profile_type: must be `cpu` or `heap` (expected value",
        ),
        (
            r#"{"profile_type": "CPU"}"#,
            false,
            "invalid_profile_type",
            "unknown variant `CPU`",
        ),
        (
            r#"{"durations_ms": 1000}"#,
            false,
            "invalid_body",
            "unknown field `durations_ms`",
        ),
        ("[1]", false, "invalid_body", "body: must be a JSON object"),
        ("{", false, "invalid_body", "EOF"),
        (r#"{} {}"#, false, "invalid_body", "not valid JSON"),
        (
            r#"{"script": "api"}"#,
            false,
            "invalid_body",
            "script: given in the URL",
        ),
        (
            r#"{"script": "a b"}"#,
            true,
            "invalid_name",
            "script: `a b`",
        ),
        (
            r#"{"namespace_id": "", "actor_id": "00"}"#,
            false,
            "invalid_durable_object",
            "namespace_id",
        ),
    ];
    for (body, async_form, code, part) in cases {
        check(body, *async_form, Err((code, part)));
    }
    check(
        &format!(r#"{{"namespace_id": "chat", "actor_id": "{id}", "data_center": "lhr"}}"#),
        false,
        Err(("invalid_data_center", "cannot be combined")),
    );
    // Echoed input is bounded.
    let long = format!(r#"{{"profile_type": "{}"}}"#, "x".repeat(5000));
    let e = parse_json::<edgeprof_proto::rest::CaptureRequest>(long.as_bytes()).unwrap_err();
    assert!(e.message.len() < 400, "{} bytes", e.message.len());
}

async fn state() -> (tempfile::TempDir, AppState) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    let store = Arc::new(Store::open(db.to_str().unwrap()).await.unwrap());
    let metrics = Arc::new(Metrics::default());
    let fleet = Arc::new(Fleet::new(Duration::from_secs(5)));
    let replica = Arc::new(crate::replica::Replica::new(store.clone(), fleet.clone()));
    let state = AppState {
        store: store.clone(),
        fleet,
        captures: Captures::new(
            store,
            metrics.clone(),
            CaptureSettings {
                agent_secret: "secret-secret".into(),
                slack: Duration::from_secs(1),
                max_per_script: 2,
                limits: Limits::default(),
                replica_id: replica.id().to_owned(),
            },
            Clock::system(),
        ),
        replica,
        metrics,
        max_wasm_bytes: 1 << 20,
        clock: Clock::system(),
    };
    (dir, state)
}

async fn call(state: &AppState, method: &str, uri: &str) -> (StatusCode, serde_json::Value) {
    let resp = app(state.clone())
        .oneshot(
            axum::http::Request::builder()
                .method(method)
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

#[tokio::test]
async fn errors_without_a_token_and_for_unknown_routes() {
    let (_dir, state) = state().await;
    let (status, v) = call(&state, "GET", "/v1/accounts/acme/scripts").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"]["code"], "missing_token");
    let (status, v) = call(&state, "GET", "/v1/nothing/here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("docs/api.md"), "{message}");
    assert!(!message.contains("DESIGN.md"), "{message}");
    let (status, v) = call(&state, "PATCH", "/v1/accounts/acme/scripts").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

/// `### METHOD /path` headings of docs/api.md.
fn documented() -> BTreeSet<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md");
    let text = std::fs::read_to_string(path).expect("docs/api.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("### "))
        .filter_map(|h| {
            let (m, p) = h.trim().split_once(' ')?;
            let p = p.trim().trim_matches('`');
            (m.chars().all(|c| c.is_ascii_uppercase()) && p.starts_with('/'))
                .then(|| (m.to_owned(), p.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn the_rest_reference_matches_the_router() {
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented(),
        routed,
        "docs/api.md's `### METHOD /path` headings differ from api::ROUTES"
    );
    // And every listed route is served: neither the 404 nor the 405
    // fallback answers it.
    let (_dir, state) = state().await;
    for (method, path) in ROUTES {
        let uri = path
            .replace("{account}", "acme")
            .replace("{script}", "api")
            .replace("{version}", "latest")
            .replace("{id}", "0123456789abcdef");
        let (status, v) = call(&state, method, &uri).await;
        assert!(
            status != StatusCode::METHOD_NOT_ALLOWED && v["error"]["code"] != "not_found",
            "{method} {path}: {status} {v}"
        );
    }
}
