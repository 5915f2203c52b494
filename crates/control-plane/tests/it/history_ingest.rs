//! `Registry.PushWindows` through a real gRPC hop: valid windows are stored
//! once however often they are pushed, and every refused window is named
//! with its cause while the rest of its batch is stored.

use edgeprof_control_plane::store::{Store, WindowFilter};
use edgeprof_proto::rest::ProfileKind;
use edgeprof_proto::v1;

use crate::support;

fn window(version: &str, start: i64, pprof: Vec<u8>) -> v1::ProfileWindow {
    support::profile_window(version, start, pprof, 5)
}

#[tokio::test]
async fn pushed_windows_are_stored_once_and_bad_ones_are_named() {
    let (_dir, db) = support::sqlite();
    let cp = support::Cp::start(support::config(&db)).await;
    let v = cp.deploy("api", None).await;
    let other = cp.deploy("web", None).await;
    let now = cp.cp.clock.now_ms();
    let start = now - 60_000;
    let good = window(&v, start, support::isolate_profile("i1"));
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;

    let mut batch = vec![good.clone()];
    // Each refused for its own reason.
    batch.push(window(&other, start, support::isolate_profile("i1")));
    let mut backwards = good.clone();
    backwards.end_unix_ms = backwards.start_unix_ms;
    batch.push(backwards);
    let mut future = good.clone();
    future.start_unix_ms = now + 3_600_000;
    future.end_unix_ms = now + 3_610_000;
    batch.push(future);
    batch.push(window(&v, start + 10_000, b"not a profile".to_vec()));
    batch.push(window(&v, start + 20_000, vec![0; (4 << 20) + 1]));
    let mut heap = window(&v, start + 30_000, support::isolate_profile("i1"));
    heap.kind = v1::ProfileKind::Heap as i32;
    batch.push(heap);
    let mut foreign = good.clone();
    foreign.account = "intruder".into();
    batch.push(foreign);

    let resp = r
        .push_windows(v1::PushWindowsRequest {
            machine: Some(support::machine("m1", "lhr")),
            windows: batch,
            dropped_total: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.accepted, 1, "{resp:?}");
    let expect = [
        "window 1: acme/api: no version",
        "window 2: start_unix_ms",
        "window 3: end_unix_ms",
        "window 4: pprof:",
        "window 5: pprof: 4194305 bytes, at most 4194304",
        "window 6: pprof: no `alloc_space` sample type",
        "window 7: intruder/api: no version",
    ];
    assert_eq!(resp.rejected.len(), expect.len(), "{:?}", resp.rejected);
    for (got, want) in resp.rejected.iter().zip(expect) {
        assert!(got.starts_with(want), "{got:?} starts with {want:?}");
    }

    // A retried push is accepted and stored once.
    let again = r
        .push_windows(v1::PushWindowsRequest {
            machine: Some(support::machine("m1", "lhr")),
            windows: vec![good],
            dropped_total: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.accepted, again.rejected.len()), (1, 0));

    let store = Store::open(&db).await.unwrap();
    let filter = WindowFilter {
        account: "acme",
        script: "api",
        kind: ProfileKind::Cpu,
        from_ms: 0,
        to_ms: i64::MAX,
        version_id: None,
        data_center: None,
        machine_id: None,
    };
    let (count, _bytes) = store.window_totals(&filter).await.unwrap();
    assert_eq!(count, 1, "one window stored");
    let mut seen = Vec::new();
    store
        .for_each_window(&filter, |w| {
            seen.push((w.machine_id, w.data_center, w.requests, w.value));
            std::future::ready(Ok::<(), ()>(()))
        })
        .await
        .unwrap()
        .unwrap();
    let profile = edgeprof_pprof::decode(&support::isolate_profile("i1")).unwrap();
    let cpu: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(seen, [("m1".to_owned(), "lhr".to_owned(), 5, cpu)]);

    // Without the agent secret nothing is read or stored.
    let mut wrong = support::registry_client(cp.cp.grpc_addr, "not-the-secret").await;
    let err = wrong
        .push_windows(v1::PushWindowsRequest {
            machine: Some(support::machine("m1", "lhr")),
            windows: vec![window(&v, start + 40_000, support::isolate_profile("i1"))],
            dropped_total: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(store.window_totals(&filter).await.unwrap().0, 1);

    // Retention (7 days by default) deletes exactly the expired window.
    assert_eq!(
        cp.cp.sweep_history().await.unwrap(),
        0,
        "nothing expired yet"
    );
    cp.advance(std::time::Duration::from_secs(7 * 24 * 3600));
    let fresh = cp.cp.clock.now_ms() - 60_000;
    let resp = r
        .push_windows(v1::PushWindowsRequest {
            machine: Some(support::machine("m1", "lhr")),
            windows: vec![window(&v, fresh, support::isolate_profile("i2"))],
            dropped_total: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.accepted, 1, "{resp:?}");
    assert_eq!(cp.cp.sweep_history().await.unwrap(), 1);
    let mut starts = Vec::new();
    store
        .for_each_window(&filter, |w| {
            starts.push(w.start_ms);
            std::future::ready(Ok::<(), ()>(()))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(starts, [fresh], "the window within retention is kept");
}
