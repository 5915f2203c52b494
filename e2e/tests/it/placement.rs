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

/// The agent's `edgeprof_agent_durable_object_placements_total` for
/// `reason`, read from its `/metrics`.
fn placements(client: &reqwest::blocking::Client, operator: &str, reason: &str) -> u64 {
    let text = client
        .get(format!("{operator}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("the agent's /metrics answers");
    let series = format!("edgeprof_agent_durable_object_placements_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

/// Increments each of `ids` once through `base`, 16 at a time; returns
/// the counters' answers in the order of `ids`.
fn increment_all(client: &reqwest::blocking::Client, base: &str, ids: &[String]) -> Vec<u64> {
    let chunk = ids.len().div_ceil(16);
    std::thread::scope(|s| {
        let parts: Vec<_> = ids
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|id| increment_ok(client, base, id))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().unwrap()).collect()
    })
}

/// Issue 15: a heartbeat carried at most 2,000 isolates, so a machine
/// hosting more Durable Objects stopped renewing the leases of the rest
/// (seen: 1,688 targets listed while the agent held 6,442 isolates). A
/// machine with 5,000 objects keeps every lease: two leases later,
/// every object answers from its isolate here without asking the control
/// plane again (the agent's placement counter says so: no lease ended),
/// its state intact, and the control plane lists all 5,000 as targets.
#[test]
fn a_machine_with_5000_durable_objects_keeps_every_lease() {
    let Some(wasm) = worker("counter-object") else {
        return;
    };
    const N: usize = 5000;
    let lease = LEASE;
    let mut o = ClusterOptions::new(state_dir("many-objects"));
    o.data_centers = 1;
    o.machines_per_dc = 1;
    o.heartbeat = Duration::from_millis(1000);
    o.durable_object_lease = Some(lease);
    o.continuous_hz = 0;
    o.agent_args = [
        "--max-isolates",
        "5100",
        "--max-isolates-per-account",
        "5100",
        "--idle-isolate-secs",
        "3600",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let mut cluster = Cluster::start(o).expect("the cluster starts");
    cluster.deploy("counter-object", &wasm, 100).unwrap();
    let (base, operator) = cluster
        .machines()
        .next()
        .map(|(_, m)| (m.http.clone(), m.operator.clone()))
        .unwrap();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let ids: Vec<String> = (0..N).map(|n| format!("{n:064x}")).collect();

    let started = Instant::now();
    let first = increment_all(&client, &base, &ids);
    assert!(first.iter().all(|c| *c == 1), "each object starts at 1");
    eprintln!("{N} objects placed in {:.1?}", started.elapsed());
    if let Some(pid) = cluster.agent_pid("lhr-m01") {
        // What bounds --max-isolates (MAPS_PER_ISOLATE in the agent).
        let maps =
            std::fs::read_to_string(format!("/proc/{pid}/maps")).map_or(0, |m| m.lines().count());
        eprintln!("the agent holds them in {maps} memory maps");
    }
    let placed = Instant::now();
    assert_eq!(placements(&client, &operator, "new"), N as u64);

    // Every heartbeat in between renews every lease, or some run out.
    // Lease expiry is time passing; nothing else to wait on.
    std::thread::sleep((lease * 2).saturating_sub(placed.elapsed()));
    let second = increment_all(&client, &base, &ids);
    assert!(
        second.iter().all(|c| *c == 2),
        "every object kept its state: {} did not",
        second.iter().filter(|c| **c != 2).count()
    );
    assert_eq!(
        placements(&client, &operator, "lease_ended"),
        0,
        "no object outlived its lease"
    );
    assert_eq!(placements(&client, &operator, "new"), N as u64);
    let targets = cluster.get_json("/scripts/counter-object/targets").unwrap();
    let mut listed: Vec<&str> = targets["targets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["durable_objects"].as_array().unwrap())
        .filter_map(|d| d.as_str()?.split_once(':').map(|(_, id)| id))
        .collect();
    listed.sort_unstable();
    assert_eq!(listed.len(), N, "the control plane lists every object");
    assert_eq!(listed, ids.iter().map(String::as_str).collect::<Vec<_>>());

    cluster.stop();
}
