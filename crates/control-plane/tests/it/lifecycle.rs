//! What is deleted, on SQLite and PostgreSQL: retention of old sessions and
//! their profiles (in batches), API tokens listed and revoked (REST and
//! `edgeprof-control-plane token list|revoke`), and version deletion, which
//! is refused while the version has weight.

use std::process::Command;
use std::time::Duration;

use edgeprof_control_plane::store::SessionRow;
use edgeprof_proto::rest::{ProfileKind, SessionStatus, TokenList};
use serde_json::json;

use crate::support::{self, Agent, Behavior, Cp};

const DAY: Duration = Duration::from_secs(86_400);

fn old_session(id: String, created_at_ms: i64) -> SessionRow {
    SessionRow {
        id,
        account: "acme".into(),
        script: "api".into(),
        version_id: "v".into(),
        version_selector: "latest".into(),
        kind: ProfileKind::Cpu,
        duration_ms: 1000,
        data_center: None,
        durable_object: None,
        status: SessionStatus::Done,
        error: None,
        targets_json: "[]".into(),
        failures_json: "[]".into(),
        machines_total: 1,
        machines_answered: 1,
        created_at_ms,
        updated_at_ms: created_at_ms,
        requests: None,
    }
}

async fn retention(db: &str) {
    let cp = Cp::start(support::config(db)).await;
    let v = cp.deploy("api", None).await;
    let agent = Agent::start(
        "m1",
        "lhr",
        Behavior::Answer,
        vec![support::isolate("i1", "api", &v)],
    )
    .await;
    agent.heartbeat(cp.cp.grpc_addr).await;
    let old = cp
        .capture_session(&json!({"script": "api", "duration_ms": 1000}))
        .await;
    assert_eq!(old["status"], "done", "{old}");
    let old_id = old["id"].as_str().unwrap().to_owned();
    // A thousand more sessions of that age: retention needs three batches.
    let created = cp.cp.clock.now_ms();
    for n in 0..1001 {
        let row = old_session(format!("old-{n:04}"), created);
        cp.cp.store.create_session(&row).await.unwrap();
        cp.cp.store.store_profile(&row.id, b"p").await.unwrap();
    }
    cp.advance(31 * DAY);
    let fresh = old_session("fresh".into(), cp.cp.clock.now_ms());
    cp.cp.store.create_session(&fresh).await.unwrap();

    let deleted = cp.cp.sweep_retention().await.unwrap();
    assert_eq!((deleted.sessions, deleted.profiles), (1002, 1002));
    let (status, list, _) = cp.get("/v1/accounts/acme/profiles?limit=1000").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["fresh"]);
    let (status, body, _) = cp
        .get(&format!("/v1/accounts/acme/profiles/{old_id}/pprof"))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_session"))
    );
    // Nothing more is old enough.
    let again = cp.cp.sweep_retention().await.unwrap();
    assert_eq!(again.sessions, 0);
}

async fn tokens_and_versions(db: &str) {
    let cp = Cp::start(support::config(db)).await;
    let second = cp.token("acme").await;
    let (status, list, _) = cp.get("/v1/accounts/acme/tokens").await;
    assert_eq!(status, 200);
    let list: TokenList = serde_json::from_value(list).unwrap();
    assert_eq!(list.tokens.len(), 2);
    assert_eq!(list.tokens.iter().filter(|t| t.current).count(), 1);
    let other = list.tokens.iter().find(|t| !t.current).unwrap().id.clone();
    // The second token works, is revoked by id, and then is refused.
    let with = |token: &str| {
        cp.http
            .get(cp.url("/v1/accounts/acme/scripts"))
            .bearer_auth(token.to_owned())
            .send()
    };
    assert_eq!(with(&second).await.unwrap().status(), 200);
    let revoke = |id: String| {
        cp.http
            .delete(cp.url(&format!("/v1/accounts/acme/tokens/{id}")))
            .bearer_auth(cp.token.clone())
            .send()
    };
    assert_eq!(revoke(other.clone()).await.unwrap().status(), 204);
    let refused = with(&second).await.unwrap();
    assert_eq!(refused.status(), 401);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_token");
    let again = revoke(other).await.unwrap();
    assert_eq!(again.status(), 404);
    assert_eq!(revoke("nothex".into()).await.unwrap().status(), 400);

    // Versions: the deployed one cannot be deleted, an undeployed one can.
    let v1 = cp.deploy("api", None).await;
    let v2 = cp.deploy("api", None).await;
    let delete = |v: &str| {
        cp.http
            .delete(cp.url(&format!("/v1/accounts/acme/scripts/api/versions/{v}")))
            .bearer_auth(cp.token.clone())
            .send()
    };
    let refused = delete(&v2).await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "version_deployed");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("weight 100"),
        "{body}"
    );
    assert_eq!(delete(&v1).await.unwrap().status(), 204);
    let (_, versions, _) = cp.get("/v1/accounts/acme/scripts/api/versions").await;
    let ids: Vec<&str> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![v2.as_str()]);
    cp.cp.stop();
    drop(cp);

    // The operator's commands on the same database.
    let bin = env!("CARGO_BIN_EXE_edgeprof-control-plane");
    let run = |args: &[&str]| {
        let out = Command::new(bin)
            .args(["--database", db])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let token = run(&["token", "create", "--account", "ops"]);
    let id = edgeprof_control_plane::store::token_id(token.trim());
    let listed = run(&["token", "list", "--account", "ops"]);
    assert!(listed.contains(&id), "{listed}");
    run(&["token", "revoke", &id]);
    let listed = run(&["token", "list"]);
    assert!(!listed.contains(&id), "{listed}");
    let out = Command::new(bin)
        .args(["--database", db, "token", "revoke", &id])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no token with id"));
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_on_sqlite() {
    let (_dir, db) = support::sqlite();
    retention(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    retention(&url).await;
    support::drop_postgres_schema(&url).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_versions_on_sqlite() {
    let (_dir, db) = support::sqlite();
    tokens_and_versions(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_versions_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    tokens_and_versions(&url).await;
    support::drop_postgres_schema(&url).await;
}
