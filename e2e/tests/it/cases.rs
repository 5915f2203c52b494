//! The case studies the profiler exists for (issue 6), on the local edge:
//! capture the buggy and the fixed version under the same traffic and
//! compare what the profiles say per request, dividing by the requests each
//! capture counted (as `edgeprof profile` reports them).

use std::path::Path;
use std::time::Duration;

use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};
use edgeprof_pprof::{SampleIndex, TopOptions};

use crate::{state_dir, worker};

/// (flat, cum, total) of `function` in the `cpu` values of `profile`.
fn cpu_of(profile: &edgeprof_pprof::Profile, function: &str) -> (i64, i64, i64) {
    let report = edgeprof_pprof::top(
        profile,
        &TopOptions {
            sample_index: Some(SampleIndex::Name("cpu".into())),
            node_fraction: 0.0,
            ..TopOptions::default()
        },
    )
    .unwrap();
    let row = report.rows.iter().find(|r| r.function == function);
    (
        row.map_or(0, |r| r.flat),
        row.map_or(0, |r| r.cum),
        report.total,
    )
}

/// Requests each isolate of `version` served in the last 60 s, per
/// `targets`: only to wait for traffic (a capture counts its own).
fn requests_last_60s(cluster: &Cluster, script: &str, version: &str) -> Vec<u64> {
    let out = cluster
        .cli()
        .args(["targets", script, "--version", version, "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["requests_last_60s"].as_u64())
        .collect()
}

/// A capture as `edgeprof profile` shows it: the profile and the requests
/// the profiled isolates began during it.
struct Capture {
    profile: edgeprof_pprof::Profile,
    requests: u64,
}

impl Capture {
    /// CPU nanoseconds per request under `function` (its cum).
    fn cpu_per_request(&self, function: &str) -> f64 {
        cpu_of(&self.profile, function).1 as f64 / self.requests.max(1) as f64
    }
}

fn capture(cluster: &Cluster, script: &str, version: &str, load: &Load, file: &Path) -> Capture {
    let out = cluster
        .cli()
        .args([
            "profile",
            script,
            "--version",
            version,
            "--duration",
            &format!("{}s", load.capture_secs),
            "--json",
            "-o",
        ])
        .arg(file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "profile {script} {version}: {stderr}");
    let session: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let requests = session["requests"]
        .as_u64()
        .unwrap_or_else(|| panic!("the session counts requests: {session}"));
    // The same count where a user sees it: the CLI's summary, the pprof's
    // comment, `go tool pprof`'s header.
    assert!(
        stderr.contains(&format!(
            "{requests} requests began on the profiled isolates"
        )),
        "{stderr}"
    );
    let profile = edgeprof_pprof::decode(&std::fs::read(file).unwrap()).unwrap();
    let comments: Vec<&str> = profile
        .comment
        .iter()
        .map(|&c| edgeprof_pprof::string(&profile, c))
        .collect();
    let comment = format!("requests: {requests}");
    assert_eq!(comments, [comment.as_str()]);
    if let Some(top) = go_pprof_top(file) {
        assert!(top.lines().any(|l| l == comment), "{top}");
    }
    Capture { profile, requests }
}

/// `go tool pprof -top FILE`, or `None` (after saying why) without Go
/// outside CI.
fn go_pprof_top(file: &Path) -> Option<String> {
    match std::process::Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(file)
        .output()
    {
        Ok(out) => {
            assert!(
                out.status.success(),
                "go tool pprof -top {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the go tool pprof check: cannot run go: {e}");
            None
        }
        Err(e) => panic!("cannot run go tool pprof: {e}"),
    }
}

/// Traffic to the script (both versions) and how long each capture lasts.
struct Load {
    requests_per_sec: f64,
    capture_secs: u32,
}

/// Deploys the buggy and fixed builds 50/50, runs traffic, captures both
/// versions over the same window; returns the (buggy, fixed) captures.
fn buggy_and_fixed(test: &str, script: &str, load: &Load) -> Option<(Capture, Capture)> {
    let buggy = worker(script)?;
    let fixed = worker(&format!("{script}-fixed"))?;
    let mut o = ClusterOptions::new(state_dir(test));
    o.data_centers = 1;
    o.machines_per_dc = 2;
    o.heartbeat = Duration::from_millis(1000);
    let cluster = Cluster::start(o).unwrap();
    let v1 = cluster.deploy(script, &buggy, 50).unwrap();
    let v2 = cluster.deploy(script, &fixed, 50).unwrap();
    let traffic = Traffic::start(
        &cluster,
        TrafficMix {
            targets: vec![(
                1,
                Target::Script {
                    script: script.into(),
                    path: "/".into(),
                },
            )],
            rate: load.requests_per_sec,
            max_duration: Duration::from_secs(150),
            max_requests: 10_000,
            concurrency: 4,
        },
    );
    // Every machine serves both versions: wait until each of their
    // isolates has traffic, so that a capture holds all of a version's
    // requests, not those of the one machine that reported first.
    let machines = 2;
    for v in [&v1, &v2] {
        let start = std::time::Instant::now();
        loop {
            let per_isolate = requests_last_60s(&cluster, script, v);
            if per_isolate.iter().filter(|&&n| n >= 3).count() >= machines {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{script} {v}: not every machine serves traffic after 60 s (requests per isolate {per_isolate:?})"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let dir = state_dir(test);
    let (c1, c2) = std::thread::scope(|s| {
        let a = s.spawn(|| capture(&cluster, script, &v1, load, &dir.join("v1.pprof")));
        let b = s.spawn(|| capture(&cluster, script, &v2, load, &dir.join("v2.pprof")));
        (a.join().unwrap(), b.join().unwrap())
    });
    drop(traffic);
    assert!(
        c1.requests > 20 && c2.requests > 20,
        "both versions served traffic during the captures ({}, {})",
        c1.requests,
        c2.requests
    );
    Some((c1, c2))
}

#[test]
fn redundant_json_replacer_stands_out_and_the_fix_removes_it() {
    let load = Load {
        requests_per_sec: 30.0,
        capture_secs: 4,
    };
    let Some((v1, v2)) = buggy_and_fixed("case-json", "json-gateway", &load) else {
        return;
    };
    let f = "json_gateway::replacer";
    let (_, cum1, total1) = cpu_of(&v1.profile, f);
    let share = cum1 as f64 / total1 as f64;
    let per_request_ratio = v1.cpu_per_request(f) / v2.cpu_per_request(f).max(1.0);
    eprintln!(
        "{f}: {:.1} % of v1's CPU; per request v1 {:.0} ns ({} requests), v2 {:.0} ns ({} requests), v1/v2 {per_request_ratio:.2}",
        share * 100.0,
        v1.cpu_per_request(f),
        v1.requests,
        v2.cpu_per_request(f),
        v2.requests
    );
    assert!(
        share > 0.05,
        "{f} is above 5 % of v1's CPU (got {:.1} %)",
        share * 100.0
    );
    assert!(
        per_request_ratio >= 2.5,
        "v2 spends ≥ 2.5× less CPU per request in {f} (ratio {per_request_ratio:.2})"
    );
    // Self-recursion: some v1 stack holds the replacer twice.
    let p1 = &v1.profile;
    let recursive = p1.sample.iter().any(|s| {
        edgeprof_pprof::stack_frames(p1, s)
            .iter()
            .filter(|fr| fr.function == f)
            .count()
            >= 2
    });
    assert!(recursive, "{f} calls itself in v1's stacks");
}

#[test]
fn duplicate_metrics_call_halves_the_builders_cpu_per_request_in_the_fix() {
    // Requests of 1.5–3.5 ms: twice the json case's traffic and 6 s
    // captures give each version ~180 requests, so the ratio is read to
    // about ±0.05 (4 s at 30/s, ~60 requests each, spread 0.42–0.59).
    let load = Load {
        requests_per_sec: 60.0,
        capture_secs: 6,
    };
    let Some((v1, v2)) = buggy_and_fixed("case-metrics", "metrics-twice", &load) else {
        return;
    };
    let f = "metrics_twice::build_metrics";
    let (before, after) = (v1.cpu_per_request(f), v2.cpu_per_request(f));
    let ratio = after / before;
    eprintln!(
        "{f} per request: v1 {before:.0} ns ({} requests), v2 {after:.0} ns ({} requests), v2/v1 {ratio:.3}",
        v1.requests, v2.requests
    );
    assert!(
        (0.35..=0.65).contains(&ratio),
        "the fix builds the metrics once, not twice: its CPU per request in {f} is 0.5 ± 0.15 of before (got {ratio:.3}: {after:.0} / {before:.0} ns)"
    );
}
