//! The case studies the profiler exists for (issue 6), on the local edge:
//! capture the buggy and the fixed version under the same traffic and
//! compare what the profiles say per request.

use std::time::Duration;

use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};
use edgeprof_pprof::{SampleIndex, TopOptions};

use crate::{state_dir, worker};

/// (flat, cum) of `function` in the `cpu` values of `profile`.
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

/// Requests the isolates of `version` served in the last 60 s, per `targets`.
fn requests(cluster: &Cluster, script: &str, version: &str) -> u64 {
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
        .sum()
}

fn capture(
    cluster: &Cluster,
    script: &str,
    version: &str,
    file: &std::path::Path,
) -> edgeprof_pprof::Profile {
    let out = cluster
        .cli()
        .args([
            "profile",
            script,
            "--version",
            version,
            "--duration",
            "4s",
            "-o",
        ])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "profile {script} {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    edgeprof_pprof::decode(&std::fs::read(file).unwrap()).unwrap()
}

/// Deploys the buggy and fixed builds 50/50, runs traffic, captures both
/// versions over the same window; returns (buggy, fixed) profiles and
/// request counts.
fn buggy_and_fixed(
    test: &str,
    script: &str,
) -> Option<(
    (edgeprof_pprof::Profile, u64),
    (edgeprof_pprof::Profile, u64),
)> {
    let buggy = worker(script)?;
    let fixed = worker(&format!("{script}-fixed"))?;
    let mut o = ClusterOptions::new(state_dir(test));
    o.data_centers = 1;
    o.machines_per_dc = 2;
    o.heartbeat = Duration::from_millis(1000);
    let cluster = Cluster::start(o).unwrap();
    let v1 = cluster.deploy(script, &buggy, 100).unwrap();
    let v2 = cluster.deploy(script, &fixed, 50).unwrap();
    let load = Traffic::start(
        &cluster,
        TrafficMix {
            targets: vec![(
                1,
                Target::Script {
                    script: script.into(),
                    path: "/".into(),
                },
            )],
            rate: 30.0,
            max_duration: Duration::from_secs(60),
            max_requests: 10_000,
            concurrency: 4,
        },
    );
    for v in [&v1, &v2] {
        let start = std::time::Instant::now();
        while requests(&cluster, script, v) < 10 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{script} {v} serves no traffic after 60 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let dir = state_dir(test);
    let (p1, p2) = std::thread::scope(|s| {
        let a = s.spawn(|| capture(&cluster, script, &v1, &dir.join("v1.pprof")));
        let b = s.spawn(|| capture(&cluster, script, &v2, &dir.join("v2.pprof")));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (r1, r2) = (
        requests(&cluster, script, &v1),
        requests(&cluster, script, &v2),
    );
    drop(load);
    assert!(
        r1 > 20 && r2 > 20,
        "both versions served traffic ({r1}, {r2})"
    );
    Some(((p1, r1), (p2, r2)))
}

#[test]
fn redundant_json_replacer_stands_out_and_the_fix_removes_it() {
    let Some(((p1, r1), (p2, r2))) = buggy_and_fixed("case-json", "json-gateway") else {
        return;
    };
    let f = "json_gateway::replacer";
    let (_, cum1, total1) = cpu_of(&p1, f);
    let (_, cum2, _) = cpu_of(&p2, f);
    let share = cum1 as f64 / total1 as f64;
    assert!(
        share > 0.05,
        "{f} is above 5 % of v1's CPU (got {:.1} %)",
        share * 100.0
    );
    let per_request_ratio = (cum1 as f64 / r1 as f64) / (cum2.max(1) as f64 / r2 as f64);
    assert!(
        per_request_ratio >= 2.5,
        "v2 spends ≥ 2.5× less CPU per request in {f} (ratio {per_request_ratio:.2})"
    );
    // Self-recursion: some v1 stack holds the replacer twice.
    let recursive = p1.sample.iter().any(|s| {
        edgeprof_pprof::stack_frames(&p1, s)
            .iter()
            .filter(|fr| fr.function == f)
            .count()
            >= 2
    });
    assert!(recursive, "{f} calls itself in v1's stacks");
}
