//! The control plane tried as an attacker would, bounded in count and time
//! and on loopback only: the binary runs as its own process so its peak
//! resident memory (VmHWM) is its own.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{DEV_TOKEN, Running, start_with};
use crate::support::{self, Agent, Behavior};

const MIB: u64 = 1 << 20;

fn addr(cp: &Running) -> String {
    cp.http.trim_start_matches("http://").to_owned()
}

/// Sends `POST path` announcing `len` body bytes without a token, then
/// streams zeros until the server answers or hangs up; returns the status
/// line.
async fn unauthenticated_upload(addr: &str, path: &str, len: u64) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/wasm\r\nContent-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![0u8; 1 << 20];
        let mut sent = 0u64;
        while sent < len {
            let n = chunk.len().min((len - sent) as usize);
            if w.write_all(&chunk[..n]).await.is_err() {
                break; // the server hung up: it did not want the body
            }
            sent += n as u64;
        }
    });
    let mut answer = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(20), r.read(&mut answer))
        .await
        .expect("an answer within 20 s")
        .unwrap_or(0);
    writer.abort();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_unauthenticated_63_mib_uploads_are_refused_before_their_bodies() {
    let (_dir, db) = support::sqlite();
    let cp = start_with(&db, &[]);
    let a = addr(&cp);
    let path = "/v1/accounts/dev/scripts/api/versions";
    let uploads: Vec<_> = (0..20)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { unauthenticated_upload(&a, path, 63 * MIB).await })
        })
        .collect();
    for u in uploads {
        let status = u.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    }
    let peak = cp.peak_rss();
    assert!(
        peak < 150 * MIB,
        "peak RSS {} MiB with 20 × 63 MiB unauthenticated uploads",
        peak / MIB
    );
    // A JSON route refuses a large authenticated body with 413, naming the
    // limit, without buffering it.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/accounts/dev/profiles", cp.http))
        .bearer_auth(DEV_TOKEN)
        .header("content-type", "application/json")
        .body(vec![b' '; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "body_too_large", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("65536 bytes"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_thousand_half_open_connections_neither_stop_healthz_nor_stay_open() {
    let (_dir, db) = support::sqlite();
    let cp = start_with(&db, &["--header-timeout-ms", "1500"]);
    let a = addr(&cp);
    let mut idle = Vec::with_capacity(2000);
    for i in 0..2000 {
        let mut s = TcpStream::connect(&a).await.unwrap();
        // Half of them start a request and never finish its headers.
        if i % 2 == 0 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        idle.push(s);
    }
    let health = tokio::time::timeout(
        Duration::from_secs(1),
        reqwest::get(format!("{}/healthz", cp.http)),
    )
    .await
    .expect("/healthz answers within 1 s beside 2,000 half-open connections")
    .unwrap();
    assert_eq!(health.status(), 200);
    // Every one of them is closed by the server once the header timeout
    // has passed (bounded wait: well past 1.5 s).
    let closed = idle.into_iter().map(|mut s| {
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let started = std::time::Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
                    Ok(Ok(_)) => continue, // a 408 before the close is fine
                    Err(_) => panic!("a half-open connection is still open after 15 s"),
                }
            }
        })
    });
    for c in closed {
        c.await.unwrap();
    }
}

async fn capture_from(behavior: Behavior) -> (Running, serde_json::Value, tempfile::TempDir) {
    let (dir, db) = support::sqlite();
    let cp = start_with(&db, &[]);
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/v1/accounts/dev/scripts/api/versions", cp.http))
        .bearer_auth(DEV_TOKEN)
        .body(support::wasm_module("api"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let v: edgeprof_proto::rest::UploadedVersion = resp.json().await.unwrap();
    let agent = Agent::start(
        "m1",
        "lhr",
        behavior,
        vec![support::isolate("i1", "api", &v.id)],
    )
    .await;
    agent.heartbeat_as(cp.grpc, "dev").await;
    let resp = http
        .post(format!("{}/v1/accounts/dev/profiles", cp.http))
        .bearer_auth(DEV_TOKEN)
        .json(&serde_json::json!({"script": "api", "duration_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let started: edgeprof_proto::rest::SessionStarted = resp.json().await.unwrap();
    let url = format!("{}/v1/accounts/dev/profiles/{}", cp.http, started.id);
    for _ in 0..400 {
        let s: serde_json::Value = http
            .get(&url)
            .bearer_auth(DEV_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if matches!(s["status"].as_str(), Some("done" | "partial" | "failed")) {
            drop(agent);
            return (cp, s, dir);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the capture never ended");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profile_inflating_to_100_mib_is_refused_by_name() {
    assert!(support::gzip_bomb().len() < 200 << 10, "the bomb is small");
    let (cp, s, _dir) = capture_from(Behavior::Bomb).await;
    assert_eq!(s["status"], "failed", "{s}");
    let reason = s["failures"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("unreadable profile (at most 33554432 bytes inflated per isolate)"),
        "{reason}"
    );
    assert!(s["error"].as_str().unwrap().contains(reason), "{s}");
    let peak = cp.peak_rss();
    assert!(peak < 300 * MIB, "peak RSS {} MiB", peak / MIB);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_8_mib_agent_error_is_stored_truncated() {
    let (cp, s, _dir) = capture_from(Behavior::HugeError).await;
    assert_eq!(s["status"], "failed", "{s}");
    let reason = s["failures"][0]["reason"].as_str().unwrap();
    assert!(reason.len() < 1100, "{} bytes stored", reason.len());
    assert!(reason.ends_with("(8388608 bytes)"), "{}", &reason[1000..]);
    // And the session list stays small.
    let list = reqwest::Client::new()
        .get(format!("{}/v1/accounts/dev/profiles", cp.http))
        .bearer_auth(DEV_TOKEN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(
        list.len() < 32 << 10,
        "{} bytes of session list",
        list.len()
    );
}

#[tokio::test]
async fn long_and_hostile_names_get_short_named_refusals() {
    let (_dir, db) = support::sqlite();
    let cp = crate::support::Cp::start(support::config(&db)).await;
    cp.deploy("api", None).await;
    // A 5,000-character version selector is refused without being echoed.
    let long = "f".repeat(5000);
    let (status, body, raw) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/targets?version={long}"
        ))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_version"))
    );
    assert!(raw.len() < 400, "{} bytes: {body}", raw.len());
    // Script names are DNS labels, and the agent's own paths are reserved.
    for (name, code, part) in [
        ("healthz", "reserved_name", "script: `healthz` is reserved"),
        ("do", "reserved_name", "script: `do` is reserved"),
        (
            "My_Script",
            "invalid_name",
            "script: `My_Script` must be a DNS label",
        ),
        (
            "-api",
            "invalid_name",
            "not starting or ending with a hyphen",
        ),
    ] {
        let resp = cp
            .http
            .post(cp.url(&format!("/v1/accounts/acme/scripts/{name}/versions")))
            .bearer_auth(&cp.token)
            .body(support::wasm_module(name))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{name}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(part), "{name}: {message}");
    }
    // A body that is not JSON by its type: 415 in the same shape; a query
    // parameter nobody knows: 400 naming it.
    let resp = cp
        .http
        .post(cp.url("/v1/accounts/acme/profiles"))
        .bearer_auth(&cp.token)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    let (status, body, _) = cp.get("/v1/accounts/acme/profiles?scirpt=api").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_query"))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `scirpt`"),
        "{body}"
    );
    // So are account ids.
    let (status, body, _) = cp.get("/v1/accounts/Acme_Corp/scripts").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("account: `Acme_Corp` must be a DNS label"),
        "{body}"
    );
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let (_dir, db) = support::sqlite();
    let mut config = support::config(&db);
    config.http.body_idle_timeout = Duration::from_millis(300);
    let cp = crate::support::Cp::start(config).await;
    let mut s = TcpStream::connect(cp.cp.http_addr).await.unwrap();
    let head = format!(
        "POST /v1/accounts/acme/profiles HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"script\"",
        cp.token
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // ...and nothing more: the server answers once the pause is too long.
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("answered and closed within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_timeout\""), "{text}");
}
