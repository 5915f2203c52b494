//! Durable Object placement over real gRPC: an object moves only after its
//! owner has been silent for longer than its lease, heartbeats name the
//! objects that moved, a restarted control plane waits out a lease, and
//! machines asking at once agree on one owner. Time is the control plane's
//! manual clock, advanced by the tests: nothing sleeps.

use std::time::Duration;

use edgeprof_proto::v1;

use crate::support::{self, Cp, Registry};

const HEARTBEAT: Duration = Duration::from_millis(200);
const LEASE: Duration = Duration::from_millis(3000);

fn machine(id: &str) -> v1::Machine {
    v1::Machine {
        id: id.into(),
        data_center: "lhr".into(),
        grpc_address: format!("{id}.invalid:1"),
        http_address: format!("http://{id}.invalid:2"),
    }
}

fn config(db: &str) -> edgeprof_control_plane::Config {
    let mut c = support::config(db);
    c.heartbeat_interval = HEARTBEAT;
    c.durable_object_lease = Some(LEASE);
    c
}

fn object_id(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn object_ref(account: &str, id: &str) -> v1::DurableObjectRef {
    v1::DurableObjectRef {
        account: account.into(),
        script: "rooms".into(),
        namespace: "rooms".into(),
        object_id: id.into(),
    }
}

async fn place(
    r: &mut Registry,
    m: &str,
    object: &str,
) -> Result<v1::PlaceDurableObjectResponse, tonic::Status> {
    place_as(r, m, "acme", object).await
}

async fn place_as(
    r: &mut Registry,
    m: &str,
    account: &str,
    object: &str,
) -> Result<v1::PlaceDurableObjectResponse, tonic::Status> {
    r.place_durable_object(v1::PlaceDurableObjectRequest {
        machine: Some(machine(m)),
        account: account.into(),
        script: "rooms".into(),
        namespace: "rooms".into(),
        object_id: object.into(),
    })
    .await
    .map(|r| r.into_inner())
}

/// One heartbeat from `m` whose one isolate hosts `objects`.
async fn beat(r: &mut Registry, m: &str, version: &str, objects: &[&str]) -> v1::HeartbeatResponse {
    beat_as(r, m, "acme", version, objects).await
}

/// One heartbeat from `m` whose one isolate, of `account/rooms`, hosts
/// `objects`.
async fn beat_as(
    r: &mut Registry,
    m: &str,
    account: &str,
    version: &str,
    objects: &[&str],
) -> v1::HeartbeatResponse {
    r.heartbeat(v1::HeartbeatRequest {
        machine: Some(machine(m)),
        isolates: vec![v1::IsolateStatus {
            isolate_id: format!("{m}-1"),
            script: "rooms".into(),
            version_id: version.into(),
            account: account.into(),
            durable_objects: objects.iter().map(|o| format!("rooms:{o}")).collect(),
            ..Default::default()
        }],
        isolates_omitted: 0,
        evicted: Vec::new(),
        ..Default::default()
    })
    .await
    .expect("heartbeat accepted")
    .into_inner()
}

/// Advances `cp`'s clock by `by`, `m` heartbeating (with no objects)
/// every half interval on the way, as a live machine does.
async fn advance_beating(cp: &Cp, r: &mut Registry, m: &str, version: &str, by: Duration) {
    let mut left = by;
    while !left.is_zero() {
        let step = left.min(HEARTBEAT / 2);
        cp.advance(step);
        left -= step;
        beat(r, m, version, &[]).await;
    }
}

fn owner(p: &v1::PlaceDurableObjectResponse) -> &str {
    p.owner.as_ref().map_or("", |o| o.id.as_str())
}

/// The bug this pins: an owner that missed the liveness window (2.5
/// heartbeat intervals) had its object placed again on the next machine
/// that asked, while it kept serving its own copy, so one object lived
/// twice (a counter answered [1,1,2,2,3,3]).
#[tokio::test]
async fn owner_past_the_liveness_window_keeps_its_object_until_its_lease_ends() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(config(&db)).await;
    let version = cp.deploy("rooms", None).await;
    let addr = cp.cp.grpc_addr;
    let mut r = support::registry_client(addr, support::SECRET).await;
    let x = object_id(0xab);

    let first = place(&mut r, "m1", &x).await.unwrap();
    assert_eq!(owner(&first), "m1", "placed on the first machine to ask");
    assert_eq!(first.durable_object_lease_ms, LEASE.as_millis() as u32);
    assert!(first.placed_at_ms > 0);
    let mut m2 = support::registry_client(addr, support::SECRET).await;
    beat(&mut m2, "m2", &version, &[]).await;

    // m1 silent past the liveness window, well inside its lease: m2 is told
    // to retry, not given the object.
    advance_beating(&cp, &mut m2, "m2", &version, HEARTBEAT * 5).await;
    let err = place(&mut r, "m2", &x).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{}", err.message());
    let retry_ms: u64 = err
        .metadata()
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("retry-after-ms metadata");
    assert!(
        retry_ms <= LEASE.as_millis() as u64,
        "retry after {retry_ms} ms, within the lease"
    );
    let msg = err.message();
    assert!(
        msg.contains(&format!("durable object rooms:{x} lives on machine m1"))
            && msg.contains("lease")
            && msg.contains("retry"),
        "{msg}"
    );

    // m1 is back: its heartbeat listing the object names nothing moved, and
    // m2 is sent to m1, same placement.
    let hb = beat(&mut r, "m1", &version, &[&x]).await;
    assert_eq!(hb.durable_objects_elsewhere, Vec::new());
    assert_eq!(hb.durable_object_lease_ms, LEASE.as_millis() as u32);
    let to_m1 = place(&mut r, "m2", &x).await.unwrap();
    assert_eq!(
        (
            owner(&to_m1),
            to_m1.placed_at_ms,
            to_m1.owner.as_ref().unwrap().http_address.as_str()
        ),
        ("m1", first.placed_at_ms, "http://m1.invalid:2")
    );

    // m1 silent for longer than the lease: the object moves to m2, as a new
    // placement.
    let mut silent = Duration::ZERO;
    let moved = loop {
        // While m1 counts as live m2 is sent there, then told to retry.
        match place(&mut r, "m2", &x).await {
            Ok(p) if owner(&p) == "m2" => break p,
            Ok(p) => assert_eq!((owner(&p), p.placed_at_ms), ("m1", first.placed_at_ms)),
            Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{}", e.message()),
        }
        assert!(
            silent < LEASE * 3,
            "not moved {silent:?} after m1 went silent"
        );
        advance_beating(&cp, &mut m2, "m2", &version, HEARTBEAT).await;
        silent += HEARTBEAT;
    };
    assert!(
        silent >= LEASE,
        "moved after {silent:?}, before the lease of {LEASE:?} ran out"
    );
    assert_eq!(owner(&moved), "m2");
    assert!(moved.placed_at_ms > first.placed_at_ms, "a new placement");

    // m1 wakes up still listing it: the answer names it so m1 drops it,
    // and asking sends m1 to m2.
    let hb = beat(&mut r, "m1", &version, &[&x]).await;
    assert_eq!(hb.durable_objects_elsewhere, vec![object_ref("acme", &x)]);
    let back = place(&mut r, "m1", &x).await.unwrap();
    assert_eq!(
        (owner(&back), back.placed_at_ms),
        ("m2", moved.placed_at_ms)
    );
}

#[tokio::test]
async fn machines_asking_at_once_agree_on_one_owner() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(config(&db)).await;
    cp.deploy("rooms", None).await;
    let addr = cp.cp.grpc_addr;
    let machines = ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"];
    let mut r = support::registry_client(addr, support::SECRET).await;
    for m in machines {
        beat(&mut r, m, "v", &[]).await;
    }
    let x = object_id(0x5e);
    let asks = machines.map(|m| {
        let x = x.clone();
        tokio::spawn(async move {
            let mut r = support::registry_client(addr, support::SECRET).await;
            place(&mut r, m, &x).await.unwrap()
        })
    });
    let mut answers = Vec::new();
    for a in asks {
        let p = a.await.unwrap();
        answers.push((owner(&p).to_owned(), p.placed_at_ms));
    }
    answers.dedup();
    assert_eq!(answers.len(), 1, "one owner, one placement: {answers:?}");
}

/// Placements outlive a control plane's restart, and the restarted process
/// has not heard from anyone yet: it must wait out a full lease before it
/// moves an object, since the owner may still be serving it.
#[tokio::test]
async fn a_restarted_control_plane_waits_out_a_lease_before_moving_objects() {
    let (_dir, db) = support::sqlite();
    let x = object_id(0x42);
    {
        let cp = Cp::start(config(&db)).await;
        cp.deploy("rooms", None).await;
        let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
        assert_eq!(owner(&place(&mut r, "m1", &x).await.unwrap()), "m1");
        cp.cp.stop();
    }
    let cp = Cp::start(config(&db)).await;
    let addr = cp.cp.grpc_addr;
    let mut r = support::registry_client(addr, support::SECRET).await;
    let mut m2 = support::registry_client(addr, support::SECRET).await;
    // m1's last heartbeat in the database is older than the liveness window.
    let mut since_start = HEARTBEAT * 4;
    advance_beating(&cp, &mut m2, "m2", "v", since_start).await;
    let moved = loop {
        match place(&mut r, "m2", &x).await {
            Ok(p) => break p,
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable, "{}", e.message());
                assert!(
                    e.message().contains("lives on machine m1"),
                    "{}",
                    e.message()
                );
                assert!(since_start < LEASE * 3, "never moved: {}", e.message());
                advance_beating(&cp, &mut m2, "m2", "v", HEARTBEAT).await;
                since_start += HEARTBEAT;
            }
        }
    };
    assert!(
        since_start >= LEASE,
        "moved {since_start:?} after the restart, inside the lease"
    );
    assert_eq!(owner(&moved), "m2");
}

#[tokio::test]
async fn a_lease_shorter_than_three_heartbeat_intervals_is_refused() {
    let (_dir, db) = support::sqlite();
    let mut c = config(&db);
    c.durable_object_lease = Some(HEARTBEAT * 2);
    let err = edgeprof_control_plane::ControlPlane::start(c)
        .await
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "durable object lease: must be 3 heartbeat intervals (600 ms) – 1 h, \
         so it outlasts the liveness window of 2.5 intervals (got 400 ms)"
    );
}

/// Placements of objects no machine uses any more are deleted once unseen
/// for the time to live (7,000 random ids once left 7,000 rows for good);
/// an object its owner keeps listing stays where it is; a reclaimed object
/// is placed afresh on its next request. The list of objects placed
/// elsewhere names the account: the same `namespace:id` in two accounts
/// is two objects.
#[tokio::test]
async fn unused_placements_are_reclaimed_and_moved_objects_name_their_account() {
    let (_dir, db) = support::sqlite();
    let mut c = config(&db);
    let ttl = edgeprof_control_plane::MIN_DURABLE_OBJECT_TTL;
    c.durable_object_ttl = ttl;
    let cp = Cp::start(c).await;
    let version = cp.deploy("rooms", None).await;
    cp.cp.store.ensure_account("other").await.unwrap();
    let (other, _) = cp
        .cp
        .store
        .add_version("other", "rooms", &support::wasm_module("rooms"), None)
        .await
        .unwrap();
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    let (kept, unused) = (object_id(1), object_id(2));
    assert_eq!(owner(&place(&mut r, "m1", &kept).await.unwrap()), "m1");
    assert_eq!(owner(&place(&mut r, "m1", &unused).await.unwrap()), "m1");
    assert_eq!(
        owner(&place_as(&mut r, "m2", "other", &kept).await.unwrap()),
        "m2",
        "another account's object of the same name is another object"
    );
    let hb = beat_as(&mut r, "m1", "other", &other.id, &[&kept]).await;
    assert_eq!(
        hb.durable_objects_elsewhere,
        vec![object_ref("other", &kept)]
    );
    let hb = beat(&mut r, "m1", &version, &[&kept]).await;
    assert_eq!(hb.durable_objects_elsewhere, Vec::new());

    // Past the time to live, m1 listing `kept` and m2 listing the other
    // account's all along.
    let mut passed = Duration::ZERO;
    while passed <= ttl + Duration::from_secs(60) {
        cp.advance(Duration::from_secs(20));
        passed += Duration::from_secs(20);
        beat(&mut r, "m1", &version, &[&kept]).await;
        beat_as(&mut r, "m2", "other", &other.id, &[&kept]).await;
    }
    let count = || async { cp.cp.store.durable_object_count().await.unwrap() };
    assert_eq!(count().await, 3);
    assert_eq!(cp.cp.sweep_durable_objects().await.unwrap(), 1);
    assert_eq!(count().await, 2, "only the unused object's placement went");
    assert_eq!(cp.cp.sweep_durable_objects().await.unwrap(), 0);
    let kept_on = place(&mut r, "m3", &kept).await.unwrap();
    assert_eq!(
        owner(&kept_on),
        "m1",
        "a listed object stays with its owner"
    );
    let fresh = place(&mut r, "m3", &unused).await.unwrap();
    assert_eq!(owner(&fresh), "m3", "a reclaimed object is placed afresh");
    assert_eq!(count().await, 3);
}

#[tokio::test]
async fn a_durable_object_ttl_under_ten_minutes_is_refused() {
    let (_dir, db) = support::sqlite();
    let mut c = config(&db);
    c.durable_object_ttl = Duration::from_secs(300);
    let err = edgeprof_control_plane::ControlPlane::start(c)
        .await
        .unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "durable object ttl: at least 10 min and twice the lease (3000 ms) (got 300 s)"
    );
}

/// Isolates `ns` of `m`, each with a recent request, isolate `n` hosting
/// the object `{n:064x}`.
fn hosting_isolates(
    m: &str,
    version: &str,
    ns: impl Iterator<Item = usize>,
) -> Vec<v1::IsolateStatus> {
    ns.map(|n| v1::IsolateStatus {
        isolate_id: format!("{m}-{n}"),
        script: "rooms".into(),
        version_id: version.into(),
        account: "acme".into(),
        durable_objects: vec![format!("rooms:{n:064x}")],
        requests_last_60s: 1,
        ..Default::default()
    })
    .collect()
}

/// Chunk `chunk` of `chunks` of heartbeat `id` from `m`.
async fn beat_chunk(
    r: &mut Registry,
    m: &str,
    (id, chunk, chunks): (u64, u32, u32),
    isolates: Vec<v1::IsolateStatus>,
) -> Result<v1::HeartbeatResponse, tonic::Status> {
    r.heartbeat(v1::HeartbeatRequest {
        machine: Some(machine(m)),
        isolates,
        heartbeat_id: id,
        chunk,
        chunks,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// The isolates `GET …/rooms/targets` lists on `m` (each once).
async fn targets_on(cp: &Cp, m: &str) -> std::collections::BTreeSet<String> {
    let (status, body, raw) = cp.get("/v1/accounts/acme/scripts/rooms/targets").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    let listed: Vec<String> = body["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["machine"] == m)
        .map(|t| t["isolate"].as_str().unwrap().to_owned())
        .collect();
    let once: std::collections::BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(once.len(), listed.len(), "an isolate listed twice");
    once
}

/// Issue 15: a heartbeat carried at most 2,000 isolates, so a machine
/// hosting more Durable Objects stopped renewing the rest (1,688 targets
/// listed while its agent held 6,442 isolates). A machine with 5,000
/// objects sends its heartbeat in chunks: every isolate is a target, each
/// chunk's answer names the objects *it* listed that live elsewhere, a
/// complete heartbeat replaces the list (a chunk sent twice counts once)
/// and one with a chunk missing changes nothing.
#[tokio::test]
async fn a_heartbeat_in_chunks_lists_every_isolate_and_only_a_complete_one_changes_the_list() {
    let (_dir, db) = support::sqlite();
    let cp = Cp::start(config(&db)).await;
    let version = cp.deploy("rooms", None).await;
    let mut r = support::registry_client(cp.cp.grpc_addr, support::SECRET).await;
    // Object 4321 already lives on m2.
    let moved = format!("{:064x}", 4321);
    assert_eq!(owner(&place(&mut r, "m2", &moved).await.unwrap()), "m2");

    const N: usize = 5000;
    let all: std::collections::BTreeSet<String> = (0..N).map(|n| format!("m1-{n}")).collect();
    let ranges = [0..2000, 2000..4000, 4000..N];
    for (i, range) in ranges.iter().enumerate() {
        let hb = beat_chunk(
            &mut r,
            "m1",
            (7, i as u32, 3),
            hosting_isolates("m1", &version, range.clone()),
        )
        .await
        .expect("each chunk is accepted");
        let elsewhere: Vec<&str> = hb
            .durable_objects_elsewhere
            .iter()
            .map(|d| d.object_id.as_str())
            .collect();
        if i == 2 {
            assert_eq!(elsewhere, vec![moved.as_str()], "the chunk listing it");
        } else {
            assert!(elsewhere.is_empty(), "chunk {i}: {elsewhere:?}");
        }
    }
    assert_eq!(
        targets_on(&cp, "m1").await,
        all,
        "every isolate is a target"
    );

    // Isolate 17 is gone; the heartbeat saying so loses its middle chunk
    // (and its last lists a new isolate, 9999).
    let without_17 = || (0..N).filter(|n| *n != 17);
    let chunk = |c: usize| hosting_isolates("m1", &version, without_17().skip(c * 2000).take(2000));
    cp.advance(HEARTBEAT);
    beat_chunk(&mut r, "m1", (8, 0, 3), chunk(0)).await.unwrap();
    let mut last = chunk(2);
    last.extend(hosting_isolates("m1", &version, 9999..10_000));
    beat_chunk(&mut r, "m1", (8, 2, 3), last).await.unwrap();
    assert_eq!(
        targets_on(&cp, "m1").await,
        all,
        "an incomplete heartbeat changes nothing"
    );
    // A complete one replaces the list; its first chunk, retried, counts once.
    cp.advance(HEARTBEAT);
    for c in [0, 0, 1, 2] {
        beat_chunk(&mut r, "m1", (9, c as u32, 3), chunk(c))
            .await
            .unwrap();
    }
    let mut expected = all.clone();
    expected.remove("m1-17");
    assert_eq!(targets_on(&cp, "m1").await, expected);

    // An unchunked heartbeat still replaces the list.
    beat_chunk(
        &mut r,
        "m1",
        (0, 0, 0),
        hosting_isolates("m1", &version, 0..1),
    )
    .await
    .unwrap();
    assert_eq!(
        targets_on(&cp, "m1").await,
        ["m1-0".to_owned()].into_iter().collect()
    );

    // Bounds, with the field and the limit.
    let err = beat_chunk(&mut r, "m1", (10, 0, 51), Vec::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "chunks: at most 50 per heartbeat (got 51)");
    let err = beat_chunk(&mut r, "m1", (10, 3, 3), Vec::new())
        .await
        .unwrap_err();
    assert_eq!(err.message(), "chunk: must be below chunks (3) (got 3)");
}
