//! The Pyroscope forwarder against a receiver in the test: a real HTTP
//! server that decodes every POST body as Pyroscope's `push.v1.PushRequest`
//! (no Pyroscope server can be installed here), fed through the real gRPC
//! `Registry.PushWindows`: the series' labels and profiles, retries after
//! 503 delivering everything exactly once, a 400 dropping and counting the
//! batch, and a dead or hanging Pyroscope never slowing ingest.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use edgeprof_control_plane::history::pyroscope::PyroscopeConfig;
use edgeprof_proto::pyroscope::push::v1::PushRequest;
use edgeprof_proto::v1;
use prost::Message;

use crate::support;

/// How the receiver answers: these statuses first, then `then` forever
/// (`None`: never answers).
struct Script {
    first: Vec<u16>,
    then: Option<u16>,
}

#[derive(Default)]
struct Received {
    /// Pushes answered 200, decoded.
    ok: Vec<PushRequest>,
    /// Every POST seen (any answer), with its content type.
    posts: Vec<(String, Option<String>)>,
    /// POSTs being held unanswered now.
    held: usize,
}

/// Counts a held POST until its handler is dropped (the client gave up).
struct Held(Arc<Mutex<Received>>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.lock().unwrap().held -= 1;
    }
}

struct Receiver {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    changed: tokio::sync::watch::Receiver<usize>,
}

impl Receiver {
    async fn start(script: Script) -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let script = Arc::new(Mutex::new(script));
        let (tx, changed) = tokio::sync::watch::channel(0usize);
        let tx = Arc::new(tx);
        let handler = {
            let received = received.clone();
            move |path: axum::extract::OriginalUri, headers: HeaderMap, body: axum::body::Bytes| {
                let (received, script, tx) = (received.clone(), script.clone(), tx.clone());
                async move {
                    let status = {
                        let mut s = script.lock().unwrap();
                        if s.first.is_empty() {
                            s.then
                        } else {
                            Some(s.first.remove(0))
                        }
                    };
                    let content_type = headers
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_owned());
                    {
                        let mut r = received.lock().unwrap();
                        r.posts.push((path.0.to_string(), content_type));
                        match status {
                            Some(200) => {
                                r.ok.push(PushRequest::decode(body).expect("a PushRequest"))
                            }
                            None => r.held += 1,
                            Some(_) => {}
                        }
                    }
                    let held = status.is_none().then(|| Held(received.clone()));
                    tx.send_modify(|n| *n += 1);
                    match status {
                        Some(s) => (StatusCode::from_u16(s).unwrap(), "answer"),
                        None => {
                            let _held = held;
                            std::future::pending().await
                        }
                    }
                }
            }
        };
        let app =
            axum::Router::new().route("/push.v1.PusherService/Push", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            addr,
            received,
            changed,
        }
    }

    /// Waits (at most 20 s) until `done` holds of what was received.
    async fn wait_until(&mut self, what: &str, done: impl Fn(&Received) -> bool) {
        let received = self.received.clone();
        let waited = tokio::time::timeout(
            Duration::from_secs(20),
            self.changed.wait_for(|_| done(&received.lock().unwrap())),
        )
        .await
        .map(|_| ());
        assert!(waited.is_ok(), "timed out waiting for {what}");
    }
}

/// A receiver answering as `script`, and a control plane forwarding to it.
async fn forwarding_to(script: Script) -> (tempfile::TempDir, Receiver, support::Cp) {
    let (dir, db) = support::sqlite();
    let rx = Receiver::start(script).await;
    let cp = start_cp(&db, &format!("http://{}", rx.addr), Duration::from_secs(2)).await;
    (dir, rx, cp)
}

/// A control plane forwarding to `url`, each push given up after `timeout`.
async fn start_cp(db: &str, url: &str, timeout: Duration) -> support::Cp {
    let mut c = support::config(db);
    let mut p = PyroscopeConfig::new(url, None).unwrap();
    p.timeout = timeout;
    c.pyroscope = Some(p);
    support::Cp::start(c).await
}

/// Pushes `n` windows of a new version through gRPC; the windows.
async fn push(cp: &support::Cp, n: usize) -> Vec<v1::ProfileWindow> {
    let version = cp.deploy("api", None).await;
    let start = cp.cp.clock.now_ms() - 60_000;
    let windows: Vec<_> = (0..n)
        .map(|i| {
            let pprof = support::isolate_profile(&format!("i{i}"));
            support::profile_window(&version, start + i as i64 * 10_000, pprof, 1)
        })
        .collect();
    push_again(cp, &windows).await;
    windows
}

/// Pushes `windows` (again, as an agent does when a reply was lost). A
/// push that waited on Pyroscope would hang as long as the forwarder's
/// timeout; a minute's deadline turns that into a failure.
async fn push_again(cp: &support::Cp, windows: &[v1::ProfileWindow]) {
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let resp = tokio::time::timeout(
        Duration::from_secs(60),
        r.push_windows(v1::PushWindowsRequest {
            machine: Some(support::machine("m1", "lhr")),
            windows: windows.to_vec(),
            dropped_total: 0,
        }),
    )
    .await
    .expect("PushWindows answered without waiting on Pyroscope")
    .expect("PushWindows")
    .into_inner();
    assert_eq!(resp.accepted, windows.len() as u32, "{:?}", resp.rejected);
}

async fn outcome(cp: &support::Cp, outcome: &str) -> u64 {
    let (status, _, body) = cp.get("/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let prefix = format!("edgeprof_pyroscope_windows_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` in\n{text}"))
        .parse()
        .unwrap()
}

fn samples(r: &Received) -> usize {
    r.ok.iter()
        .flat_map(|p| &p.series)
        .map(|s| s.samples.len())
        .sum()
}

#[tokio::test]
async fn pyroscope_receives_labelled_series_with_the_windows_profiles() {
    let (_dir, mut rx, cp) = forwarding_to(Script {
        first: vec![],
        then: Some(200),
    })
    .await;
    let windows = push(&cp, 2).await;
    rx.wait_until("two windows", |r| samples(r) == 2).await;
    {
        let r = rx.received.lock().unwrap();
        for (path, content_type) in &r.posts {
            assert_eq!(path, "/push.v1.PusherService/Push");
            assert_eq!(content_type.as_deref(), Some("application/proto"));
        }
        let series: Vec<_> = r.ok.iter().flat_map(|p| &p.series).collect();
        assert_eq!(series.len(), 1, "one (script, version, dc, machine, kind)");
        let labels: Vec<_> = series[0]
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("__name__", "process_cpu"),
                ("account", "acme"),
                ("data_center", "lhr"),
                ("machine", "m1"),
                ("service_name", "api"),
                ("version", windows[0].version_id.as_str()),
            ]
        );
        for (sample, w) in series[0].samples.iter().zip(&windows) {
            assert_eq!(
                edgeprof_pprof::decode(&sample.raw_profile).unwrap(),
                edgeprof_pprof::decode(&w.pprof).unwrap()
            );
        }
    }
    assert_eq!(outcome(&cp, "sent").await, 2);
}

#[tokio::test]
async fn pyroscope_503_then_200_gets_every_window_exactly_once() {
    let (_dir, mut rx, cp) = forwarding_to(Script {
        first: vec![503, 429, 503],
        then: Some(200),
    })
    .await;
    let windows = push(&cp, 3).await;
    rx.wait_until("three windows after retries", |r| samples(r) == 3)
        .await;
    // A later push is forwarded too, and nothing twice: not even a push an
    // agent retries (stored before, so not new).
    let more = push(&cp, 2).await;
    push_again(&cp, &more).await;
    // The queue is sent in order: once the last push's window is in, a
    // duplicate of the retried push would be too.
    let last = push(&cp, 1).await;
    rx.wait_until("six windows", |r| samples(r) >= 6).await;
    {
        let r = rx.received.lock().unwrap();
        let mut got: Vec<_> =
            r.ok.iter()
                .flat_map(|p| &p.series)
                .flat_map(|s| &s.samples)
                .map(|s| s.raw_profile.clone())
                .collect();
        let mut want: Vec<_> = windows
            .iter()
            .chain(&more)
            .chain(&last)
            .map(|w| w.pprof.clone())
            .collect();
        assert_eq!(got.len(), want.len(), "windows received");
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert!(r.posts.len() >= 6, "three refusals, then three pushes");
    }
    assert_eq!(outcome(&cp, "sent").await, 6);
    assert_eq!(outcome(&cp, "refused").await, 0);
}

#[tokio::test]
async fn pyroscope_400_drops_and_counts_the_batch() {
    let (_dir, mut rx, cp) = forwarding_to(Script {
        first: vec![],
        then: Some(400),
    })
    .await;
    push(&cp, 2).await;
    rx.wait_until("a push", |r| !r.posts.is_empty()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while outcome(&cp, "refused").await != 2 {
        assert!(Instant::now() < deadline, "refused windows never counted");
        tokio::task::yield_now().await;
    }
    assert_eq!(outcome(&cp, "sent").await, 0);
    assert_eq!(rx.received.lock().unwrap().posts.len(), 1, "not retried");
}

#[tokio::test]
async fn pyroscope_dead_or_hanging_never_slows_push_windows() {
    // Nothing listens: every push fails at once and is retried in the
    // background, while ingest keeps accepting.
    let (_dir, db) = support::sqlite();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cp = start_cp(&db, &format!("http://{closed}"), Duration::from_secs(2)).await;
    for _ in 0..3 {
        push(&cp, 4).await;
    }
    assert_eq!(outcome(&cp, "sent").await, 0);

    // A Pyroscope that takes the request and never answers, with a
    // forwarder that would wait an hour for it: pushes are answered while
    // its first POST is still held.
    let (_dir, db) = support::sqlite();
    let mut rx = Receiver::start(Script {
        first: vec![],
        then: None,
    })
    .await;
    let cp = start_cp(
        &db,
        &format!("http://{}", rx.addr),
        Duration::from_secs(3600),
    )
    .await;
    push(&cp, 2).await;
    rx.wait_until("a push that is never answered", |r| r.held == 1)
        .await;
    push(&cp, 2).await;
    let r = rx.received.lock().unwrap();
    assert_eq!(
        (r.posts.len(), r.held),
        (1, 1),
        "the first POST is still held and nothing else was sent"
    );
}
