//! A Durable Object lives in exactly one isolate on one machine, even when
//! its machine stalls: real agents frozen with SIGSTOP, real gRPC, the
//! counter worker's answers as the evidence.

use std::time::{Duration, Instant};

use edgeprof_e2e::cluster::worker_host;
use edgeprof_e2e::{Cluster, ClusterOptions};

use crate::{state_dir, worker};

const OWNER: &str = "lhr-m01";
const LEASE: Duration = Duration::from_secs(8);

/// `POST …/increment` on `base`: the status and the body.
/// (status, body, Retry-After seconds) of one increment through `base`.
fn increment(
    client: &reqwest::blocking::Client,
    base: &str,
    id: &str,
) -> (u16, String, Option<u64>) {
    match client
        .post(format!("{base}/do/counter-object/{id}/increment"))
        .header("host", worker_host("counter-object", "dev"))
        .send()
    {
        Ok(r) => {
            let retry = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            (r.status().as_u16(), r.text().unwrap_or_default(), retry)
        }
        Err(e) => (0, format!("transport error: {e}"), None),
    }
}

/// Increments through `base` until one succeeds (the object may be between
/// machines for a moment); returns the counter's answer.
fn increment_ok(client: &reqwest::blocking::Client, base: &str, id: &str) -> u64 {
    let start = Instant::now();
    loop {
        let (status, body, _) = increment(client, base, id);
        if status == 200 {
            return body
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("the counter answers a number, got {body:?}"));
        }
        assert!(
            status == 503 && start.elapsed() < Duration::from_secs(30),
            "via {base}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bug this pins: an owner that missed the liveness window had its
/// object placed again on the next machine asking, and kept serving its own
/// copy when it came back, so one counter answered [1,1,2,2,3,3].
#[test]
fn durable_object_never_lives_twice_when_its_machine_stalls() {
    let Some(wasm) = worker("counter-object") else {
        return;
    };
    let mut o = ClusterOptions::new(state_dir("placement"));
    o.data_centers = 1;
    o.machines_per_dc = 3;
    o.heartbeat = Duration::from_millis(1000);
    o.durable_object_lease = Some(LEASE);
    let mut cluster = Cluster::start(o).expect("the cluster starts");
    cluster.deploy("counter-object", &wasm, 100).unwrap();
    let url = |id: &str| {
        cluster
            .machines()
            .find(|(_, m)| m.id == id)
            .map(|(_, m)| m.http.clone())
            .unwrap()
    };
    let (a, b, c) = (url(OWNER), url("lhr-m02"), url("lhr-m03"));
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let id = "cd".repeat(32);

    // Placed on the owner by its first request there.
    let mut answers: Vec<u64> = (0..3).map(|_| increment_ok(&client, &a, &id)).collect();
    assert_eq!(answers, [1, 2, 3]);

    // The owner freezes past the liveness window (2.5 heartbeats), well
    // inside its lease. A machine that never saw the object asks the
    // control plane: it must not get a second copy.
    cluster.pause_agent(OWNER).unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    for _ in 0..3 {
        let (status, body, retry) = increment(&client, &b, &id);
        assert_eq!(
            status, 503,
            "no second copy while {OWNER} holds its lease: {body}"
        );
        // Retry-After: at most the rest of the owner's lease.
        assert!(
            retry.is_some_and(|r| (1..=LEASE.as_secs()).contains(&r)),
            "Retry-After {retry:?}: {body}"
        );
        assert!(
            body.contains(&format!("lives on machine {OWNER}")) && body.contains("retry"),
            "the answer says why: {body}"
        );
    }
    cluster.resume_agent(OWNER).unwrap();
    // Back: one counter, whichever machine is asked.
    for base in [&b, &a, &b, &a] {
        answers.push(increment_ok(&client, base, &id));
    }
    assert_eq!(
        answers,
        (1..=7).collect::<Vec<u64>>(),
        "one object, one state"
    );

    // Frozen past its lease: the object moves, once, to the machine that
    // asks (its state stayed with the frozen copy, so it starts over).
    cluster.pause_agent(OWNER).unwrap();
    let paused = Instant::now();
    // Past the liveness window first: a machine still counted live is
    // where the control plane sends requests, and this one answers nothing.
    std::thread::sleep(Duration::from_millis(3500));
    let moved = increment_ok(&client, &c, &id);
    // The owner's last heartbeat came at most about one interval before
    // the pause.
    assert!(
        paused.elapsed() >= LEASE - Duration::from_secs(2),
        "moved {:?} after the pause, before the lease ({LEASE:?}) could have run out",
        paused.elapsed()
    );
    assert_eq!(moved, 1, "a fresh copy on lhr-m03");
    cluster.resume_agent(OWNER).unwrap();
    // The old owner's copy (at 7) never answers again: through the old
    // owner, through a machine that remembers the old owner, and through
    // the new one, the counter goes on from the new copy.
    let mut after = vec![moved];
    for base in [&a, &b, &c, &a, &b, &c] {
        after.push(increment_ok(&client, base, &id));
    }
    assert_eq!(
        after,
        (1..=7).collect::<Vec<u64>>(),
        "one object, one state after the move"
    );
}
