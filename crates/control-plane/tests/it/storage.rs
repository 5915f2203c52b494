//! The store against both engines: the same migrations and queries.

use edgeprof_control_plane::store::{DurableObjectKey, MachineRecord, SessionRow, Store};
use edgeprof_proto::rest::{DeploymentEntry, ProfileKind, SessionStatus};

use crate::support;

fn session(id: &str, status: SessionStatus) -> SessionRow {
    SessionRow {
        id: id.into(),
        account: "acme".into(),
        script: "api".into(),
        version_id: "v".into(),
        version_selector: "latest".into(),
        kind: ProfileKind::Cpu,
        duration_ms: 1000,
        data_center: Some("lhr".into()),
        durable_object: None,
        status,
        error: None,
        targets_json: "[]".into(),
        failures_json: "[]".into(),
        machines_total: 2,
        machines_answered: 0,
        created_at_ms: 1,
        updated_at_ms: 1,
        requests: None,
    }
}

/// A time base for placements, in Unix ms.
const T: i64 = 1_700_000_000_000;

async fn check_store(db: &str) {
    let store = Store::open(db).await.expect("open and migrate");

    // Tokens: stored hashed, scoped to one account.
    let token = store.create_token("acme").await.unwrap();
    assert!(token.starts_with("edp_"), "{token}");
    assert_eq!(
        store.token_account(&token).await.unwrap().as_deref(),
        Some("acme")
    );
    assert_eq!(store.token_account("edp_wrong").await.unwrap(), None);

    // Versions and deployments with weights.
    let (v1, d1) = store
        .add_version("acme", "api", b"\0asm1", None)
        .await
        .unwrap();
    assert_eq!(
        d1,
        vec![DeploymentEntry {
            version_id: v1.id.clone(),
            weight: 100
        }]
    );
    let (v2, d2) = store
        .add_version("acme", "api", b"\0asm2", Some(10))
        .await
        .unwrap();
    assert_eq!(
        d2,
        vec![
            DeploymentEntry {
                version_id: v1.id.clone(),
                weight: 90
            },
            DeploymentEntry {
                version_id: v2.id.clone(),
                weight: 10
            },
        ]
    );
    assert_eq!(store.deployment("acme", "api").await.unwrap().len(), 2);
    assert_eq!((v1.seq, v2.seq), (1, 2));
    assert_eq!(v2.wasm_bytes, 5);
    let listed = store.versions("acme", "api").await.unwrap();
    assert_eq!(listed.iter().map(|v| v.seq).collect::<Vec<_>>(), vec![2, 1]);
    let by_prefix = store
        .versions_with_prefix("acme", "api", &v2.id[..36])
        .await
        .unwrap();
    assert_eq!(by_prefix, vec![v2.clone()]);
    let (owner, v, wasm) = store.version_wasm(&v1.id).await.unwrap().unwrap();
    assert_eq!(
        (owner.as_str(), v.id.as_str(), wasm.as_slice()),
        ("acme", v1.id.as_str(), &b"\0asm1"[..])
    );
    assert_eq!(store.scripts("acme").await.unwrap()[0].versions, 2);
    assert!(store.script_exists("acme", "api").await.unwrap());
    assert!(!store.script_exists("other", "api").await.unwrap());
    let g = store.deployment_generation().await.unwrap();
    assert_eq!(g, 2);
    let all = store.all_deployments().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].versions[0].2, v1.wasm_sha256);

    // Durable Object placement sticks to its first machine until the
    // caller's rule says the owner lost it; each placement gets a later
    // `placed_at_ms`, which names it.
    let key = DurableObjectKey {
        account: "acme",
        script: "api",
        namespace: "rooms",
        object_id: "ab",
    };
    let first = store
        .place_durable_object(&key, ("m1", &v1.id), T, |_, _| true)
        .await
        .unwrap();
    assert!(first.created);
    let p = store
        .place_durable_object(&key, ("m2", &v1.id), T, |_, _| false)
        .await
        .unwrap();
    assert_eq!(
        (p.machine_id.as_str(), p.created, p.placed_at_ms),
        ("m1", false, first.placed_at_ms)
    );
    // The rule sees the owner and its last recorded heartbeat (none: m1
    // never registered).
    let seen = std::sync::Mutex::new(Vec::new());
    let moved = store
        .place_durable_object(&key, ("m2", &v1.id), T, |owner, heartbeat_ms| {
            seen.lock().unwrap().push((owner.to_owned(), heartbeat_ms));
            owner == "m1"
        })
        .await
        .unwrap();
    assert_eq!(seen.into_inner().unwrap(), vec![("m1".to_owned(), None)]);
    assert_eq!((moved.machine_id.as_str(), moved.created), ("m2", true));
    assert!(moved.placed_at_ms > first.placed_at_ms);
    store
        .upsert_machine(&MachineRecord {
            id: "m2".into(),
            data_center: "lhr".into(),
            grpc_address: "127.0.0.1:1".into(),
            http_address: "http://127.0.0.1:2".into(),
            last_heartbeat_ms: 1234,
        })
        .await
        .unwrap();
    let p = store
        .place_durable_object(&key, ("m3", &v1.id), T + 5, |owner, heartbeat_ms| {
            assert_eq!((owner, heartbeat_ms), ("m2", Some(1234)));
            false
        })
        .await
        .unwrap();
    assert_eq!(
        (p.machine_id.as_str(), p.placed_at_ms),
        ("m2", moved.placed_at_ms)
    );
    assert_eq!(
        store
            .machine("m2")
            .await
            .unwrap()
            .map(|m| m.last_heartbeat_ms),
        Some(1234)
    );
    assert_eq!(store.machine("nope").await.unwrap(), None);
    // Listed objects placed on another machine than the one asking.
    let other = DurableObjectKey {
        object_id: "cd",
        ..key
    };
    store
        .place_durable_object(&other, ("m1", &v1.id), T, |_, _| false)
        .await
        .unwrap();
    let heard = |m: &'static str,
                 account: &'static str,
                 objects: &'static [(&'static str, &'static str)],
                 seen: Option<i64>| {
        let store = &store;
        async move {
            store
                .durable_objects_heard(m, account, "api", objects, seen)
                .await
                .unwrap()
        }
    };
    let pair = |n: &str, i: &str| (n.to_owned(), i.to_owned());
    assert_eq!(
        heard(
            "m1",
            "acme",
            &[
                ("rooms", "ab"),
                ("rooms", "cd"),
                ("rooms", "ef"),
                ("hall", "ab")
            ],
            None
        )
        .await,
        vec![pair("rooms", "ab")],
        "only the listed objects placed on another machine, namespace and id"
    );
    assert_eq!(
        heard("m2", "acme", &[("rooms", "ab"), ("rooms", "cd")], None).await,
        vec![pair("rooms", "cd")]
    );
    assert!(
        heard("m1", "other", &[("rooms", "ab")], None)
            .await
            .is_empty()
    );

    // Reclamation: a placement unseen for the time to live goes; one its
    // owner listed or confirmed meanwhile stays. Both are now at most T + 5.
    assert_eq!(store.durable_object_count().await.unwrap(), 2);
    assert!(
        heard("m1", "acme", &[("rooms", "cd")], Some(T + 100))
            .await
            .is_empty()
    );
    // m2 listing "cd" (not its own) does not keep it; m1 listing "ab"
    // (m2's) does not keep that.
    heard("m2", "acme", &[("rooms", "cd")], Some(T + 200)).await;
    heard("m1", "acme", &[("rooms", "ab")], Some(T + 200)).await;
    assert_eq!(
        edgeprof_control_plane::sweep_durable_objects(
            &store,
            std::time::Duration::from_millis(50),
            T + 150
        )
        .await
        .unwrap(),
        1,
        "ab, last seen at T + 5, goes; cd, seen at T + 100, stays"
    );
    assert!(
        store
            .place_durable_object(&other, ("m9", &v1.id), T + 300, |_, _| false)
            .await
            .unwrap()
            .machine_id
            == "m1",
        "cd kept its placement"
    );
    let again = store
        .place_durable_object(&key, ("m3", &v1.id), T + 300, |_, _| false)
        .await
        .unwrap();
    assert!(
        again.created && again.machine_id == "m3",
        "ab placed afresh: {again:?}"
    );
    // The owner asking again confirms it: seen then, so a later sweep keeps it.
    store
        .place_durable_object(&key, ("m3", &v1.id), T + 900, |_, _| false)
        .await
        .unwrap();
    // A machine whose heartbeat omitted isolates keeps all its objects.
    assert_eq!(
        store.durable_objects_all_seen("m1", T + 900).await.unwrap(),
        1
    );
    assert_eq!(
        edgeprof_control_plane::sweep_durable_objects(
            &store,
            std::time::Duration::from_millis(50),
            T + 920
        )
        .await
        .unwrap(),
        0
    );
    assert_eq!(
        edgeprof_control_plane::sweep_durable_objects(
            &store,
            std::time::Duration::from_millis(50),
            T + 2_000
        )
        .await
        .unwrap(),
        2
    );
    assert_eq!(store.durable_object_count().await.unwrap(), 0);

    // Sessions: every state change recorded; profiles stored.
    store
        .create_session(&session("s-done", SessionStatus::Pending))
        .await
        .unwrap();
    store
        .set_session_status("s-done", SessionStatus::Capturing, None, None)
        .await
        .unwrap();
    store.set_session_progress("s-done", 2, "[]").await.unwrap();
    store
        .set_session_status("s-done", SessionStatus::Merging, None, None)
        .await
        .unwrap();
    store.store_profile("s-done", b"pprof bytes").await.unwrap();
    store.set_session_requests("s-done", 1234).await.unwrap();
    store
        .set_session_status("s-done", SessionStatus::Done, None, None)
        .await
        .unwrap();
    store
        .create_session(&session("s-stuck", SessionStatus::Pending))
        .await
        .unwrap();
    store
        .set_session_status("s-stuck", SessionStatus::Capturing, None, None)
        .await
        .unwrap();
    drop(store);

    // Reopening migrates nothing twice and keeps everything; unfinished
    // sessions are failed with the reason.
    let store = Store::open(db).await.expect("reopen");
    assert_eq!(
        store.fail_interrupted_sessions(false).await.unwrap(),
        vec!["s-stuck".to_owned()]
    );
    let done = store.session("acme", "s-done").await.unwrap().unwrap();
    assert_eq!((done.status.as_str(), done.machines_answered), ("done", 2));
    assert_eq!(done.requests, Some(1234));
    assert_eq!(
        store
            .session_events("s-done")
            .await
            .unwrap()
            .iter()
            .map(|e| e.status.as_str())
            .collect::<Vec<_>>(),
        vec!["pending", "capturing", "merging", "done"]
    );
    assert_eq!(
        store.profile("s-done").await.unwrap().as_deref(),
        Some(&b"pprof bytes"[..])
    );
    let stuck = store.session("acme", "s-stuck").await.unwrap().unwrap();
    assert_eq!(stuck.status, SessionStatus::Failed);
    assert_eq!(stuck.requests, None, "never merged: not known");
    assert_eq!(
        stuck.error.as_deref(),
        Some("interrupted: the control plane restarted while the session was capturing")
    );
    assert_eq!(
        store.session("other", "s-done").await.unwrap(),
        None,
        "sessions are per account"
    );
    let history = store.sessions("acme", Some("api"), 10).await.unwrap();
    assert_eq!(history.len(), 2);
    assert!(
        store
            .sessions("acme", Some("nope"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.token_account(&token).await.unwrap().as_deref(),
        Some("acme")
    );
}

#[tokio::test]
async fn store_on_sqlite() {
    let (_dir, path) = support::sqlite();
    check_store(&path).await;
}

#[tokio::test]
async fn store_on_postgres() {
    let Some(url) = support::postgres().await else {
        return;
    };
    check_store(&url).await;
    support::drop_postgres_schema(&url).await;
}

#[tokio::test]
async fn bad_database_settings_name_the_problem() {
    let e = Store::open("mysql://localhost/x")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("unsupported scheme"), "{e}");
    let e = Store::open("postgres://postgres@127.0.0.1:1/none")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot connect"), "{e}");
}

/// `sslmode` in the URL reaches PostgreSQL over TLS (sqlx with rustls): the
/// store opens and migrates, and the server reports the session encrypted.
#[tokio::test]
async fn postgres_over_tls_with_sslmode_in_the_url() {
    let Some(url) = support::postgres().await else {
        return;
    };
    let tls_url = format!("{url}&sslmode=require");
    let store = Store::open(&tls_url).await.expect("open over TLS");
    store.ping().await.unwrap();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&tls_url)
        .await
        .unwrap();
    let row = sqlx::query("SELECT CAST(ssl AS TEXT) FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let ssl: String = sqlx::Row::try_get(&row, 0).unwrap();
    assert_eq!(ssl, "true");
    drop(store);
    support::drop_postgres_schema(&url).await;
}
