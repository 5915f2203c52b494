//! The windows table on both engines: a retried insert is stored once,
//! totals and timelines read the index columns, retention deletes by age.

use edgeprof_control_plane::store::{NewWindow, Store, TimelineColumn, WindowFilter};
use edgeprof_proto::rest::ProfileKind;

use crate::support;

fn window(machine: &str, start_ms: i64, value: i64) -> NewWindow {
    NewWindow {
        account: "acme".into(),
        script: "api".into(),
        version_id: "v1".into(),
        data_center: "lhr".into(),
        machine_id: machine.into(),
        kind: ProfileKind::Cpu,
        level: 0,
        start_ms,
        end_ms: start_ms + 10_000,
        samples: 2,
        requests: 3,
        value,
        bytes: 100,
        pprof: vec![1, 2, 3],
    }
}

async fn check(db: &str) {
    let store = Store::open(db).await.unwrap();
    let ws = vec![window("m1", 1_000_000, 5), window("m2", 1_010_000, 7)];
    assert_eq!(store.insert_windows(ws.clone()).await.unwrap(), 2);
    assert_eq!(
        store.insert_windows(ws.clone()).await.unwrap(),
        0,
        "a retry is stored once"
    );
    let f = WindowFilter {
        account: "acme",
        script: "api",
        kind: ProfileKind::Cpu,
        from_ms: 1_000_000,
        to_ms: 1_060_000,
        version_id: None,
        data_center: None,
        machine_id: None,
    };
    assert_eq!(store.window_totals(&f).await.unwrap(), (2, 200));
    let rows = store
        .window_timeline(&f, TimelineColumn::Machine, 60_000, 1_000)
        .await
        .unwrap();
    let got: Vec<_> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.step, r.value, r.requests))
        .collect();
    assert_eq!(got, vec![("m1", 0, 5, 3), ("m2", 0, 7, 3)]);
    assert_eq!(
        store.delete_windows_before(1_015_000, 500).await.unwrap(),
        1
    );
    assert_eq!(store.window_totals(&f).await.unwrap(), (1, 100));
}

#[tokio::test]
async fn windows_on_sqlite() {
    let (_dir, db) = support::sqlite();
    check(&db).await;
}

#[tokio::test]
async fn windows_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check(&url).await;
    support::drop_postgres_schema(&url).await;
}
