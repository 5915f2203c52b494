//! Issue 6, scenario 3 — memory pressure: under load the worker with
//! leftover instrumentation shows p99.9 memory above the 128 MiB limit and
//! "Exceeded Memory" evictions, its heap capture puts most of `alloc_space`
//! in the instrumentation, and the fixed version stays below the limit with
//! no evictions. Asserted through `edgeprof targets --json`, the REST memory
//! view and `edgeprof profile --type heap`, as a user would look.

use std::time::{Duration, Instant};

use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};
use edgeprof_pprof::{SampleIndex, TopOptions};
use serde_json::Value;

use crate::{state_dir, worker};

const SCRIPT: &str = "leftover-instrumentation";
const LIMIT: u64 = 128 << 20;

/// `edgeprof targets SCRIPT --json`.
fn targets(cluster: &Cluster) -> Value {
    let out = cluster
        .cli()
        .args(["targets", SCRIPT, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgeprof targets: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The memory view of `version` in a `…/memory` document.
fn version_memory<'a>(doc: &'a Value, version: &str) -> &'a Value {
    doc["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["version_id"] == version)
        .unwrap_or_else(|| panic!("no memory view of {version} in {doc}"))
}

/// `GET …/scripts/SCRIPT/memory?version=…` over REST.
fn rest_memory(cluster: &Cluster, version: &str) -> Value {
    let resp = reqwest::blocking::Client::new()
        .get(format!(
            "{}/v1/accounts/{}/scripts/{SCRIPT}/memory?version={version}",
            cluster.url, cluster.account
        ))
        .bearer_auth(&cluster.token)
        .send()
        .unwrap();
    assert!(resp.status().is_success(), "memory view: {}", resp.status());
    resp.json().unwrap()
}

/// Requests `version`'s isolates served in the last 60 s.
fn recent_requests(doc: &Value, version: &str) -> u64 {
    doc["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["version_id"] == version)
        .filter_map(|t| t["requests_last_60s"].as_u64())
        .sum()
}

#[test]
fn leftover_instrumentation_exceeds_memory_and_its_heap_profile_says_why() {
    let Some(buggy) = worker(SCRIPT) else {
        return;
    };
    let Some(fixed) = worker(&format!("{SCRIPT}-fixed")) else {
        return;
    };
    let mut o = ClusterOptions::new(state_dir("memory"));
    o.data_centers = 1;
    o.machines_per_dc = 1;
    o.heartbeat = Duration::from_millis(1000);
    let cluster = Cluster::start(o).expect("the cluster starts");
    let v1 = cluster.deploy(SCRIPT, &buggy, 50).unwrap();
    let v2 = cluster.deploy(SCRIPT, &fixed, 50).unwrap();
    // One connection, so each version runs in one isolate that the
    // leftover instrumentation fills (64 KiB kept per request: about 2000
    // requests of v1 reach the limit). Bounded in requests and time.
    let load = Traffic::start(
        &cluster,
        TrafficMix {
            targets: vec![(
                1,
                Target::Script {
                    script: SCRIPT.into(),
                    path: "/trace/me".into(),
                },
            )],
            rate: 400.0,
            max_duration: Duration::from_secs(150),
            max_requests: 30_000,
            concurrency: 1,
        },
    );
    let start = Instant::now();
    while recent_requests(&targets(&cluster), &v1) < 50 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "v1 serves no traffic after 60 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Why memory grows: a heap capture of v1 while the traffic runs.
    let heap_file = state_dir("memory").join("v1-heap.pprof");
    let out = cluster
        .cli()
        .args([
            "profile",
            SCRIPT,
            "--version",
            &v1,
            "--type",
            "heap",
            "--duration",
            "5s",
            "-o",
        ])
        .arg(&heap_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgeprof profile --type heap: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // That memory grows: wait until the platform has seen v1 evicted.
    let evicted = |doc: &Value| version_memory(doc, &v1)["evictions"]["exceeded_memory"].as_u64();
    while evicted(&rest_memory(&cluster, &v1)).unwrap_or(0) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "no Exceeded Memory eviction of v1 after {:?} ({} requests sent): {}",
            start.elapsed(),
            load.sent(),
            rest_memory(&cluster, &v1)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let counts = load.stop();
    assert!(
        counts.get(SCRIPT).is_some_and(|c| c.ok > 0),
        "traffic was served: {counts:?}"
    );

    // What the user sees in `edgeprof targets --json` …
    let doc = targets(&cluster);
    let memory = &doc["memory"];
    let (m1, m2) = (version_memory(memory, &v1), version_memory(memory, &v2));
    let p999 = |v: &Value| v["memory_bytes"]["p999"].as_u64().unwrap_or(0);
    assert!(
        p999(m1) > LIMIT,
        "v1's p99.9 is above the 128 MiB limit: {m1}"
    );
    assert!(
        m1["evictions"]["exceeded_memory"].as_u64().unwrap() > 0,
        "v1 was evicted for Exceeded Memory: {m1}"
    );
    assert!(
        m2["memory_bytes"]["samples"].as_u64().unwrap() > 0,
        "v2 reported memory: {m2}"
    );
    assert!(p999(m2) < LIMIT, "v2 stays below the limit: {m2}");
    assert_eq!(
        m2["evictions"],
        serde_json::json!({"exceeded_memory": 0, "total": 0}),
        "v2 was never evicted"
    );
    // … agrees with the REST API.
    for (v, view) in [(&v1, m1), (&v2, m2)] {
        let rest = rest_memory(&cluster, v);
        let rest = version_memory(&rest, v);
        assert_eq!(rest["evictions"], view["evictions"], "{v}");
        assert_eq!(
            p999(rest) > LIMIT,
            p999(view) > LIMIT,
            "{v}: {rest} vs {view}"
        );
    }

    eprintln!(
        "memory: v1 p99.9 {} B, {} Exceeded Memory evictions; v2 p99.9 {} B over {} readings",
        p999(m1),
        m1["evictions"]["exceeded_memory"],
        p999(m2),
        m2["memory_bytes"]["samples"]
    );

    // Why: the instrumentation allocates most of v1's bytes.
    let profile = edgeprof_pprof::decode(&std::fs::read(&heap_file).unwrap()).unwrap();
    let top = edgeprof_pprof::top(
        &profile,
        &TopOptions {
            sample_index: Some(SampleIndex::Name("alloc_space".into())),
            node_fraction: 0.0,
            ..TopOptions::default()
        },
    )
    .unwrap();
    let instrumentation = top
        .rows
        .iter()
        .find(|r| r.function.ends_with("record_instrumentation"))
        .unwrap_or_else(|| {
            panic!(
                "record_instrumentation is in the heap profile: {:?}",
                top.rows.iter().map(|r| &r.function).collect::<Vec<_>>()
            )
        });
    let share = instrumentation.cum as f64 / top.total as f64;
    eprintln!(
        "memory: record_instrumentation cum {:.1} % of alloc_space ({} bytes, {} stacks)",
        share * 100.0,
        top.total,
        profile.sample.len()
    );
    // Per request the instrumentation allocates 192 KiB (64 KiB of trace,
    // ~64 KiB of `format!` strings, 64 KiB of scratch) against 64 KiB for
    // `render` and 64 KiB for the SDK's response encoding: 60 % of the
    // bytes. The profile is sampled (512 KiB mean, ~650 samples here), so
    // its share varies by about ±2 points around that; the user-visible
    // claim is that the instrumentation holds most of the bytes and far more
    // than the real work.
    let render = top
        .rows
        .iter()
        .find(|r| r.function.ends_with("::render"))
        .map_or(0, |r| r.cum);
    assert!(
        share >= 0.5 && instrumentation.cum > render,
        "record_instrumentation and its callees hold most of alloc_space and more than render \
         (got {:.1} % of {} bytes; render {render})",
        share * 100.0,
        top.total
    );
}
