//! Continuous profiling on the local edge (issue 13): every isolate is
//! profiled in the background, so the history of a script answers what an
//! on-demand capture would have, for any past range; a rollout of the fix
//! shows as a drop of CPU per request in the timeline, while on-demand
//! captures keep working beside it.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};
use serde_json::Value;

use crate::{assert_go_pprof_opens, state_dir, worker};

/// Window length of this test's agents: shorter than the 10 s default so the
/// test sees several steps on either side of the rollout in a minute.
const WINDOW: Duration = Duration::from_secs(2);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs `edgeprof ARGS`; panics with its stderr unless it succeeds.
fn cli(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster.cli().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "edgeprof {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `edgeprof timeline json-gateway --json` from `from_ms` with `extra` flags.
fn timeline(cluster: &Cluster, from_ms: i64, extra: &[&str]) -> Value {
    let from = from_ms.to_string();
    let mut args = vec![
        "timeline",
        "json-gateway",
        "--from",
        &from,
        "--step",
        "2s",
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&cli(cluster, &args)).unwrap()
}

/// (CPU ns, requests) summed over the points of every series whose step
/// starts in `[from_ms, to_ms)`.
fn sum_points(doc: &Value, from_ms: i64, to_ms: i64) -> (u64, u64) {
    let mut sum = (0, 0);
    for series in doc["series"].as_array().into_iter().flatten() {
        for p in series["points"].as_array().into_iter().flatten() {
            let t = p[0].as_i64().unwrap();
            if (from_ms..to_ms).contains(&t) {
                sum.0 += p[1].as_u64().unwrap();
                sum.1 += p[2].as_u64().unwrap();
            }
        }
    }
    sum
}

/// Requests of `version` in the steps from `from_ms` on of the timeline
/// `doc` grouped by version.
fn requests_of(doc: &Value, version: &str, from_ms: i64) -> u64 {
    doc["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["key"] == version)
        .flat_map(|s| s["points"].as_array().cloned().unwrap_or_default())
        .filter(|p| p[0].as_i64().unwrap() >= from_ms)
        .map(|p| p[2].as_u64().unwrap())
        .sum()
}

/// Polls `ready` every 500 ms until it yields `None`; panics with `what`
/// and the last `Some(state)` it yielded after `limit`.
fn wait(limit: Duration, what: &str, mut ready: impl FnMut() -> Option<String>) {
    let start = Instant::now();
    while let Some(state) = ready() {
        assert!(
            start.elapsed() < limit,
            "{what} (waited {limit:?}); last seen: {state}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn top_functions(cluster: &Cluster, file: &Path, n: usize) -> Vec<String> {
    let out = cli(
        cluster,
        &[
            "top",
            file.to_str().unwrap(),
            "--json",
            "-n",
            &n.to_string(),
        ],
    );
    let doc: Value = serde_json::from_str(&out).unwrap();
    doc["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["function"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn history_shows_the_bug_and_the_rollout_of_its_fix_halves_cpu_per_request() {
    let (Some(buggy), Some(fixed)) = (worker("json-gateway"), worker("json-gateway-fixed")) else {
        return;
    };
    let dir = state_dir("history");
    let mut o = ClusterOptions::new(&dir);
    o.data_centers = 2;
    o.machines_per_dc = 1;
    o.continuous_window = WINDOW;
    let cluster = Cluster::start(o).unwrap();
    // As on `cargo xtask cluster`: a gradual rollout of the fix, 10 % of
    // the traffic, which `latest` (the newest deployed version) names.
    let v1 = cluster.deploy("json-gateway", &buggy, 90).unwrap();
    let v2 = cluster.deploy("json-gateway", &fixed, 10).unwrap();
    // Queries start a minute earlier (the control plane answers `to = now`
    // rounded to a step, which may precede this clock's reading).
    let started = now_ms();
    let since = started - 60_000;
    let traffic = Traffic::start(
        &cluster,
        TrafficMix {
            targets: vec![(
                1,
                Target::Script {
                    script: "json-gateway".into(),
                    path: "/".into(),
                },
            )],
            rate: 40.0,
            max_duration: Duration::from_secs(240),
            max_requests: 9_000,
            concurrency: 4,
        },
    );

    // Some windows of both versions' history.
    wait(
        Duration::from_secs(90),
        "json-gateway's v1 has 300 requests in its history, v2 20",
        || {
            let doc = timeline(&cluster, since, &["--group-by", "version"]);
            (requests_of(&doc, &v1, since) < 300 || requests_of(&doc, &v2, since) < 20)
                .then(|| doc.to_string())
        },
    );
    let file = dir.join("history-1m.pprof");
    let summary = cli(
        &cluster,
        &[
            "history",
            "json-gateway",
            "--from",
            "-1m",
            "-o",
            file.to_str().unwrap(),
        ],
    );
    assert!(summary.contains("history-1m.pprof"), "{summary}");
    let top = top_functions(&cluster, &file, 5);
    assert!(
        top.iter().any(|f| f == "json_gateway::replacer"),
        "json_gateway::replacer is among the top 5 functions of the last minute: {top:?}"
    );
    assert_go_pprof_opens(&file);
    let profile = edgeprof_pprof::decode(&std::fs::read(&file).unwrap()).unwrap();
    let comments: Vec<&str> = profile
        .comment
        .iter()
        .map(|&c| edgeprof_pprof::string(&profile, c))
        .collect();
    assert!(
        comments.iter().any(|c| c.starts_with("requests: ")),
        "{comments:?}"
    );

    // The fix goes out to all traffic; an on-demand capture in the same
    // minute works beside the continuous profiler.
    let rollout_ms = now_ms();
    let out = cli(&cluster, &["rollout", "json-gateway", "latest=100"]);
    assert!(out.contains("100.0%"), "{out}");
    let capture = dir.join("capture.pprof");
    let session: Value = serde_json::from_str(&cli(
        &cluster,
        &[
            "profile",
            "json-gateway",
            "--version",
            "latest",
            "--duration",
            "3s",
            "--json",
            "-o",
            capture.to_str().unwrap(),
        ],
    ))
    .unwrap();
    assert_eq!(session["status"], "done", "{session}");
    let captured = edgeprof_pprof::decode(&std::fs::read(&capture).unwrap()).unwrap();
    assert!(
        !captured.sample.is_empty(),
        "the capture during continuous profiling has samples"
    );

    // Steps that start a window after the rollout hold the fix alone, and
    // steps after the capture hold no 1 kHz sampling: during a capture the
    // continuous windows take the capture's samples, whose own cost (a
    // backtrace per millisecond, in a debug build) is CPU of the isolate.
    let capture_done_ms = now_ms();
    let window_ms = WINDOW.as_millis() as i64;
    let after = (rollout_ms + 2 * window_ms).max(capture_done_ms + window_ms);
    wait(
        Duration::from_secs(120),
        "the fixed version has 300 requests in the timeline after the rollout",
        || {
            let doc = timeline(&cluster, since, &["--group-by", "version"]);
            (requests_of(&doc, &v2, after) < 300).then(|| doc.to_string())
        },
    );
    drop(traffic);
    let by_version = timeline(&cluster, since, &["--group-by", "version"]);
    for v in [&v1, &v2] {
        assert!(
            requests_of(&by_version, v, since) > 0,
            "the timeline grouped by version has points for {v}: {by_version}"
        );
    }
    let all = timeline(&cluster, since, &[]);
    let (cpu_before, req_before) = sum_points(&all, started, rollout_ms - window_ms);
    let (cpu_after, req_after) = sum_points(&all, after, i64::MAX);
    assert!(req_before > 100 && req_after > 100, "{all}");
    let before = cpu_before as f64 / req_before as f64;
    let later = cpu_after as f64 / req_after as f64;
    eprintln!(
        "CPU per request: before the rollout {:.0} µs ({req_before} requests), after {:.0} µs ({req_after} requests), ratio {:.2}",
        before / 1e3,
        later / 1e3,
        before / later
    );
    assert!(
        before / later >= 2.0,
        "the timeline's CPU per request drops at least 2× after the rollout of the fix: {:.0} µs → {:.0} µs \
         (rollout at {rollout_ms}, capture done at {capture_done_ms}, later steps from {after}): {all}",
        before / 1e3,
        later / 1e3
    );
}
