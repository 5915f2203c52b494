//! Continuous profiling end to end through a real gRPC hop: an agent in
//! this process profiles its isolates of a WAT worker in the background and
//! pushes 1 s windows to a `Registry` server implemented in
//! [`crate::support`], which records them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use edgeprof_proto::v1::{self, ProfileKind};

use crate::support::{
    ACCOUNT, ControlPlane, SCRIPT, SECRET, VERSION, agent, get, metric, wait_until,
};

const OBJECT: &str = "00000000000000000000000000000000000000000000000000000000000000a1";
const DROPPED: &str = "edgeprof_agent_continuous_windows_dropped_total";

/// `(label key, value)` pairs of every sample of a profile.
fn labels(p: &edgeprof_pprof::Profile) -> Vec<Vec<(String, String)>> {
    let s = |i: i64| edgeprof_pprof::string(p, i).to_owned();
    p.sample
        .iter()
        .map(|x| x.label.iter().map(|l| (s(l.key), s(l.str))).collect())
        .collect()
}

fn comments(p: &edgeprof_pprof::Profile) -> Vec<String> {
    p.comment
        .iter()
        .map(|&i| edgeprof_pprof::string(p, i).to_owned())
        .collect()
}

/// Requests sent to the script until `stop` is set, counted.
fn traffic(
    agent: &edgeprof_node_agent::RunningAgent,
) -> (Arc<AtomicBool>, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let (stop, sent) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s, n, http) = (stop.clone(), sent.clone(), agent.http);
    let task = tokio::spawn(async move {
        let client = reqwest::Client::new();
        while !s.load(Ordering::Acquire) {
            let r = client
                .get(format!("http://{http}/"))
                .header("host", crate::support::HOST)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            n.fetch_add(1, Ordering::AcqRel);
        }
    });
    (stop, sent, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_carry_the_version_its_isolates_samples_and_requests() {
    let cp = ControlPlane::start().await;
    let agent = agent(&cp, &[]).await;
    for _ in 0..30 {
        get(&agent, "/").await;
    }
    for _ in 0..10 {
        get(&agent, &format!("/do/counter/{OBJECT}/")).await;
    }
    wait_until(
        "every request is in a CPU and a heap window",
        30,
        || async { cp.totals(ProfileKind::Cpu).0 >= 40 && cp.totals(ProfileKind::Heap).0 >= 40 },
    )
    .await;
    let (cpu_requests, cpu_samples) = cp.totals(ProfileKind::Cpu);
    let (heap_requests, heap_samples) = cp.totals(ProfileKind::Heap);
    assert_eq!((cpu_requests, heap_requests), (40, 40));
    assert!(cpu_samples > 0, "no CPU samples");
    // One sampled allocation per request.
    assert_eq!(heap_samples, 40);

    let (mut isolates, mut objects) = (Vec::new(), Vec::new());
    for w in cp.windows().values() {
        assert_eq!(
            (w.account.as_str(), w.script.as_str(), w.version_id.as_str()),
            (ACCOUNT, SCRIPT, VERSION)
        );
        assert_eq!(w.end_unix_ms - w.start_unix_ms, 1000, "{w:?}");
        assert_eq!(w.start_unix_ms % 1000, 0, "aligned to the wall clock");
        let p = edgeprof_pprof::decode(&w.pprof).unwrap();
        assert!(
            comments(&p).contains(&format!("requests: {}", w.requests)),
            "{:?}",
            comments(&p)
        );
        for sample in labels(&p) {
            let isolate = sample.iter().find(|(k, _)| k == "isolate");
            isolates.push(isolate.expect("every sample names its isolate").1.clone());
            if let Some((_, o)) = sample.iter().find(|(k, _)| k == "durable_object") {
                objects.push(o.clone());
            }
        }
    }
    assert!(
        isolates.iter().all(|i| i.starts_with("lhr-m01-")),
        "{isolates:?}"
    );
    isolates.sort();
    isolates.dedup();
    assert!(
        isolates.len() >= 2,
        "the pool's and the object's: {isolates:?}"
    );
    assert!(!objects.is_empty());
    assert!(
        objects.iter().all(|o| *o == format!("counter:{OBJECT}")),
        "{objects:?}"
    );
    assert_eq!(
        metric(&agent, &format!("{DROPPED}{{reason=\"queue_full\"}}")).await,
        0
    );
    assert!(metric(&agent, "edgeprof_agent_continuous_windows_shipped_total").await >= 2);
    assert!(metric(&agent, "edgeprof_agent_continuous_shipped_bytes_total").await > 0);
    agent.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_capture_during_continuous_profiling_has_its_samples_and_so_do_the_windows() {
    let cp = ControlPlane::start().await;
    let agent = agent(&cp, &[]).await;
    get(&agent, "/").await;
    let state = cp.state.clone();
    wait_until("a heartbeat lists the isolate", 30, || {
        let state = state.clone();
        async move { !state.isolates.lock().unwrap().is_empty() }
    })
    .await;
    let isolate = cp.state.isolates.lock().unwrap()[0].isolate_id.clone();

    let (stop, sent, task) = traffic(&agent);
    let mut client =
        v1::node_agent_client::NodeAgentClient::connect(format!("http://{}", agent.grpc))
            .await
            .unwrap();
    let mut req = tonic::Request::new(v1::CaptureRequest {
        session_id: "s1".into(),
        isolate_ids: vec![isolate.clone()],
        kind: ProfileKind::Cpu as i32,
        duration_ms: 1500,
        interval_us: 1000,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    let capture = client.capture(req).await.unwrap().into_inner();
    stop.store(true, Ordering::Release);
    task.await.unwrap();
    let sent = sent.load(Ordering::Acquire) + 1;

    let iso = &capture.isolates[0];
    assert_eq!(
        (iso.isolate_id.as_str(), iso.error.as_str()),
        (isolate.as_str(), "")
    );
    assert!(iso.samples > 0 && iso.requests > Some(0), "{iso:?}");
    let p = edgeprof_pprof::decode(&iso.pprof).unwrap();
    assert_eq!(p.period, 1_000_000, "the capture's own interval");
    // The continuous captures kept running beside it: every request is in
    // a window, and the windows have samples of their own.
    wait_until("every request is in a CPU window", 30, || async {
        cp.totals(ProfileKind::Cpu).0 >= sent
    })
    .await;
    let (requests, samples) = cp.totals(ProfileKind::Cpu);
    assert_eq!(requests, sent);
    assert!(samples > 0);
    for w in cp.windows().values() {
        let p = edgeprof_pprof::decode(&w.pprof).unwrap();
        if w.kind == ProfileKind::Cpu as i32 {
            assert_eq!(p.period, 10_000_000, "100 Hz");
        }
    }
    agent.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_wait_while_the_control_plane_is_away_and_all_arrive_once_it_is_back() {
    let cp = ControlPlane::start().await;
    cp.state.away.store(true, Ordering::Release);
    let agent = agent(&cp, &[]).await;
    let mut sent = 0;
    // Requests in at least two windows, all refused while away.
    for _ in 0..2 {
        let queued = metric(&agent, "edgeprof_agent_continuous_queue_windows").await;
        for _ in 0..10 {
            get(&agent, "/").await;
            sent += 1;
        }
        wait_until("the windows wait in the queue", 30, || async {
            metric(&agent, "edgeprof_agent_continuous_queue_windows").await >= queued + 2
        })
        .await;
    }
    wait_until("pushes were refused", 30, || async {
        cp.state.refused.load(Ordering::Acquire) >= 2
    })
    .await;
    assert!(cp.state.pushes.lock().unwrap().is_empty());

    cp.state.away.store(false, Ordering::Release);
    wait_until("every window arrived", 60, || async {
        cp.totals(ProfileKind::Cpu).0 >= sent && cp.totals(ProfileKind::Heap).0 >= sent
    })
    .await;
    assert_eq!(cp.totals(ProfileKind::Cpu).0, sent);
    assert_eq!(cp.totals(ProfileKind::Heap), (sent, sent));
    let pushes = cp.state.pushes.lock().unwrap().clone();
    assert!(pushes.iter().all(|p| p.dropped_total == 0), "nothing lost");
    assert!(
        pushes
            .iter()
            .all(|p| p.machine.as_ref().unwrap().id == "lhr-m01")
    );
    for reason in ["queue_full", "expired", "rejected", "oversized"] {
        assert_eq!(
            metric(&agent, &format!("{DROPPED}{{reason=\"{reason}\"}}")).await,
            0
        );
    }
    agent.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tiny_buffer_windows_older_than_it_are_dropped_and_counted() {
    let cp = ControlPlane::start().await;
    cp.state.away.store(true, Ordering::Release);
    let agent = agent(&cp, &[("--continuous-buffer", "1s")]).await;
    let (stop, sent, task) = traffic(&agent);
    let expired = format!("{DROPPED}{{reason=\"expired\"}}");
    wait_until("windows expire unsent", 60, || async {
        metric(&agent, &expired).await >= 2
    })
    .await;
    cp.state.away.store(false, Ordering::Release);
    // Traffic goes on, so fresh windows arrive once the control plane is
    // back, and their push says what was lost.
    let state = cp.state.clone();
    wait_until("a push reports the loss", 60, || {
        let state = state.clone();
        async move {
            state
                .pushes
                .lock()
                .unwrap()
                .iter()
                .any(|p| p.dropped_total >= 2)
        }
    })
    .await;
    stop.store(true, Ordering::Release);
    task.await.unwrap();
    let lost = metric(&agent, &expired).await;
    assert!(lost >= 2);
    assert!(
        cp.totals(ProfileKind::Cpu).0 < sent.load(Ordering::Acquire),
        "some requests' windows were lost"
    );
    agent.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolate_reclaimed_mid_window_still_delivers_that_window() {
    let cp = ControlPlane::start().await;
    let agent = agent(
        &cp,
        &[("--continuous-window", "5s"), ("--idle-isolate-secs", "1")],
    )
    .await;
    // Just after a boundary, so the isolate (idle for 1 s, reclaimed within
    // a second more) is usually gone before its window ends; if the machine
    // is too slow for that, the window is cut while it lives, which passes
    // too.
    wait_until("a window has just begun", 10, || async {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        ms % 5000 < 300
    })
    .await;
    for _ in 0..20 {
        get(&agent, "/").await;
    }
    wait_until("the idle isolate is reclaimed", 30, || async {
        metric(&agent, "edgeprof_agent_isolates").await == 0
    })
    .await;
    wait_until("its window arrived", 30, || async {
        cp.totals(ProfileKind::Cpu).0 >= 20 && cp.totals(ProfileKind::Heap).0 >= 20
    })
    .await;
    assert_eq!(cp.totals(ProfileKind::Cpu).0, 20);
    assert_eq!(cp.totals(ProfileKind::Heap), (20, 20));
    assert!(cp.totals(ProfileKind::Cpu).1 > 0);
    agent.shutdown();
}
