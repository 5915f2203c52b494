//! Compaction of the continuous-profiling history, on SQLite and
//! PostgreSQL, with windows pushed through the real gRPC hop and queried
//! over real HTTP: the merged profile (per stack and per function) and the
//! timeline of a range are the same before and after 10 s → 1 min and
//! 1 min → 10 min compaction while the stored windows drop; two passes
//! racing count nothing twice; a late window for a compacted minute is
//! refused with its reason; retention deletes compacted blocks by age; a
//! blob that no longer decodes is left out of its block and left stored.
//! Time moves only by the test clock.

use std::collections::BTreeMap;
use std::time::Duration;

use edgeprof_proto::v1;

use crate::support;

const TEN_MIN: i64 = 600_000;
/// Ten-minute chunks of windows pushed: 130 min in all.
const CHUNKS: i64 = 13;

/// What a user sees of a range: the merged profile's value per stack and
/// per leaf function, its labels, its requests comment, and the timeline's
/// points at a 10 min step.
#[derive(Debug, PartialEq)]
struct Seen {
    stacks: Vec<(String, i64)>,
    functions: BTreeMap<String, i64>,
    sources: Vec<(String, String, String, Option<String>)>,
    requests: Vec<String>,
    timeline: serde_json::Value,
}

async fn seen(cp: &support::Cp, from: i64, to: i64) -> Seen {
    let (status, body, bytes) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/history/profile?from={from}&to={to}"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let p = edgeprof_pprof::decode(&bytes).expect("a gzip'd pprof");
    let stacks = edgeprof_pprof::collapse(&p, None).unwrap();
    let mut functions = BTreeMap::new();
    for (stack, v) in &stacks {
        let leaf = stack.rsplit(';').next().unwrap().to_owned();
        *functions.entry(leaf).or_insert(0) += v;
    }
    let requests = p
        .comment
        .iter()
        .map(|&c| edgeprof_pprof::string(&p, c).to_owned())
        .filter(|c| c.starts_with("requests: "))
        .collect();
    let (status, timeline, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/history/timeline?from={from}&to={to}&step=10m&group_by=machine"
        ))
        .await;
    assert_eq!(status, 200, "{timeline}");
    Seen {
        stacks,
        functions,
        sources: support::sample_sources(&bytes),
        requests,
        timeline: timeline["series"].clone(),
    }
}

async fn push(
    r: &mut support::Registry,
    machine: &str,
    dc: &str,
    windows: Vec<v1::ProfileWindow>,
) -> v1::PushWindowsResponse {
    r.push_windows(v1::PushWindowsRequest {
        machine: Some(support::machine(machine, dc)),
        windows,
        dropped_total: 0,
    })
    .await
    .unwrap()
    .into_inner()
}

fn levels(rows: Vec<(i64, i64)>) -> BTreeMap<i64, i64> {
    rows.into_iter().collect()
}

/// Pushes 130 min of 10 s windows from two machines, each chunk of 10 min
/// when the clock is at its end (as agents do); the first window's start.
async fn fill(cp: &support::Cp, version: &str) -> i64 {
    let now = cp.cp.clock.now_ms();
    let t0 = (now / TEN_MIN + 1) * TEN_MIN;
    cp.advance(Duration::from_millis((t0 + TEN_MIN - now) as u64));
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    for chunk in 0..CHUNKS {
        for (m, dc, isolate) in [("m1", "lhr", "i1"), ("m2", "fra", "i2")] {
            let windows = (0..60)
                .map(|k| {
                    let start = t0 + chunk * TEN_MIN + k * 10_000;
                    support::labeled_window(version, isolate, start, (k % 7) as u64 + 1)
                })
                .collect();
            let resp = push(&mut r, m, dc, windows).await;
            assert_eq!((resp.accepted, resp.rejected.len()), (60, 0), "{resp:?}");
        }
        if chunk + 1 < CHUNKS {
            cp.advance(Duration::from_millis(TEN_MIN as u64));
        }
    }
    t0
}

async fn check(db: &str) {
    let cp = support::Cp::start(support::config(db)).await;
    let version = cp.deploy("api", None).await;
    let t0 = fill(&cp, &version).await;
    let (from, to) = (t0, t0 + CHUNKS * TEN_MIN);
    let before = seen(&cp, from, to).await;
    assert_eq!(before.requests, ["requests: 6084"], "{before:?}");
    assert_eq!(
        levels(cp.cp.store.windows_per_level().await.unwrap()),
        BTreeMap::from([(0, 2 * 60 * CHUNKS)])
    );

    // Now is t0 + 130 min: the minutes that ended 65 min ago (1 h plus
    // the replicas' clock skew) become 1 min blocks; later ones stay.
    let done = cp.cp.compact_history().await.unwrap();
    assert_eq!(
        (done.blocks, done.sources, done.raced),
        (2 * 65, 2 * 6 * 65, 0)
    );
    assert_eq!(
        levels(cp.cp.store.windows_per_level().await.unwrap()),
        BTreeMap::from([(0, 2 * 6 * 65), (1, 2 * 65)])
    );
    assert_eq!(seen(&cp, from, to).await, before);
    // A second pass finds nothing more to do.
    assert_eq!(cp.cp.compact_history().await.unwrap().blocks, 0);

    // A late window for a compacted minute is refused, naming why.
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let resp = push(
        &mut r,
        "m1",
        "lhr",
        vec![support::labeled_window(&version, "i1", t0 + 5_000, 1)],
    )
    .await;
    assert_eq!(resp.accepted, 0, "{resp:?}");
    assert_eq!(resp.rejected.len(), 1, "{resp:?}");
    assert!(
        resp.rejected[0].starts_with(&format!(
            "window 0: start_unix_ms {}: more than 60 min",
            t0 + 5_000
        )) && resp.rejected[0].contains("compacted"),
        "{resp:?}"
    );
    assert_eq!(seen(&cp, from, to).await, before);

    // A day later everything is level 1, then level 2: 13 blocks of 10 min
    // per machine.
    cp.advance(Duration::from_secs(25 * 3600));
    let done = cp.cp.compact_history().await.unwrap();
    assert_eq!(done.raced, 0);
    assert_eq!(
        levels(cp.cp.store.windows_per_level().await.unwrap()),
        BTreeMap::from([(2, 2 * CHUNKS)])
    );
    assert_eq!(seen(&cp, from, to).await, before);

    // Retention deletes the blocks by age: none at 5 days, all past 7.
    cp.advance(Duration::from_secs(4 * 24 * 3600));
    assert_eq!(cp.cp.sweep_history().await.unwrap(), 0);
    assert_eq!(seen(&cp, from, to).await, before);
    cp.advance(Duration::from_secs(2 * 24 * 3600));
    assert_eq!(cp.cp.sweep_history().await.unwrap(), (2 * CHUNKS) as u64);
    let (status, body, _) = cp
        .get(&format!(
            "/v1/accounts/acme/scripts/api/history/profile?from={from}&to={to}"
        ))
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &"no_history".into())
    );
}

/// Two replicas' passes at once over the same database read the same
/// sources; the one that stores a block first wins, the other rolls back,
/// and the range reads as before.
async fn check_race(db: &str) {
    let cp = support::Cp::start(support::config(db)).await;
    let version = cp.deploy("api", None).await;
    let t0 = fill(&cp, &version).await;
    let (from, to) = (t0, t0 + CHUNKS * TEN_MIN);
    let before = seen(&cp, from, to).await;
    cp.advance(Duration::from_secs(25 * 3600));
    // A second replica: its own pool and write lock on the same database.
    let replica = edgeprof_control_plane::store::Store::open(db)
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        cp.cp.compact_history(),
        edgeprof_control_plane::compact_history(&replica, cp.cp.clock.now_ms())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        a.raced + b.raced > 0,
        "the passes did not overlap: {a:?} {b:?}"
    );
    // Each level-1 block (13 × 6 per machine) and level-2 block (13 per
    // machine) is stored once.
    assert_eq!(
        a.blocks + b.blocks,
        2 * (CHUNKS * 10 + CHUNKS) as u64,
        "{a:?} {b:?}"
    );
    assert_eq!(
        levels(cp.cp.store.windows_per_level().await.unwrap()),
        BTreeMap::from([(2, 2 * CHUNKS)])
    );
    assert_eq!(seen(&cp, from, to).await, before);
}

/// Merged totals and skipped windows of a range, as the profile route
/// says them.
async fn merged(cp: &support::Cp, from: i64, to: i64) -> (Vec<(String, i64)>, String) {
    let resp = cp
        .http
        .get(cp.url(&format!(
            "/v1/accounts/acme/scripts/api/history/profile?from={from}&to={to}"
        )))
        .bearer_auth(&cp.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let skipped = resp.headers()["x-edgeprof-skipped-windows"]
        .to_str()
        .unwrap()
        .to_owned();
    let p = edgeprof_pprof::decode(&resp.bytes().await.unwrap()).unwrap();
    (edgeprof_pprof::collapse(&p, None).unwrap(), skipped)
}

/// A stored window whose blob no longer decodes is left out of its block,
/// logged, and left where it is: queries still skip and count it.
async fn check_unreadable(db: &str) {
    let cp = support::Cp::start(support::config(db)).await;
    let version = cp.deploy("api", None).await;
    let now = cp.cp.clock.now_ms();
    let t0 = (now / 60_000 + 1) * 60_000;
    cp.advance(Duration::from_millis((t0 + 60_000 - now) as u64));
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let windows = (0..6)
        .map(|k| support::labeled_window(&version, "i1", t0 + k * 10_000, 1))
        .collect();
    assert_eq!(push(&mut r, "m1", "lhr", windows).await.accepted, 6);
    cp.cp
        .store
        .insert_windows(vec![edgeprof_control_plane::store::NewWindow {
            account: "acme".into(),
            script: "api".into(),
            version_id: version.clone(),
            data_center: "lhr".into(),
            machine_id: "m1".into(),
            kind: edgeprof_proto::rest::ProfileKind::Cpu,
            level: 0,
            start_ms: t0 + 5_000,
            end_ms: t0 + 15_000,
            samples: 1,
            requests: 1,
            value: 1,
            bytes: 9,
            pprof: b"not gzip!".to_vec(),
        }])
        .await
        .unwrap();
    let (from, to) = (t0, t0 + 60_000);
    let (stacks, skipped) = merged(&cp, from, to).await;
    assert_eq!(skipped, "1");
    cp.advance(Duration::from_secs(2 * 3600));
    let done = cp.cp.compact_history().await.unwrap();
    assert_eq!((done.blocks, done.sources, done.unreadable), (1, 6, 1));
    assert_eq!(
        levels(cp.cp.store.windows_per_level().await.unwrap()),
        BTreeMap::from([(0, 1), (1, 1)])
    );
    assert_eq!(merged(&cp, from, to).await, (stacks, skipped));
    // The block is made: the unreadable window is not read again.
    assert_eq!(cp.cp.compact_history().await.unwrap(), Default::default());
}

#[tokio::test]
async fn compaction_keeps_a_range_on_sqlite() {
    let (_dir, db) = support::sqlite();
    check(&db).await;
}

#[tokio::test]
async fn compaction_keeps_a_range_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check(&url).await;
    support::drop_postgres_schema(&url).await;
}

#[tokio::test]
async fn racing_compactions_count_once_on_sqlite() {
    let (_dir, db) = support::sqlite();
    check_race(&db).await;
}

#[tokio::test]
async fn racing_compactions_count_once_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check_race(&url).await;
    support::drop_postgres_schema(&url).await;
}

#[tokio::test]
async fn unreadable_windows_stay_out_of_blocks_on_sqlite() {
    let (_dir, db) = support::sqlite();
    check_unreadable(&db).await;
}

#[tokio::test]
async fn unreadable_windows_stay_out_of_blocks_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check_unreadable(&url).await;
    support::drop_postgres_schema(&url).await;
}
