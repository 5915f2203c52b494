//! Issue 4's capture path: fleet capture with labels, Durable Objects,
//! a failing agent, and the CLI's exit codes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use edgeprof_e2e::cluster::worker_host;
use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};

use crate::{state_dir, worker};

/// The values of label `key` over all samples.
pub fn labels(profile: &edgeprof_pprof::Profile, key: &str) -> BTreeSet<String> {
    let s = |i: i64| edgeprof_pprof::string(profile, i).to_owned();
    profile
        .sample
        .iter()
        .flat_map(|sample| sample.label.iter())
        .filter(|l| s(l.key) == key)
        .map(|l| s(l.str))
        .collect()
}

fn start(test: &str, dcs: usize, per_dc: usize) -> Cluster {
    let mut o = ClusterOptions::new(state_dir(test));
    o.data_centers = dcs;
    o.machines_per_dc = per_dc;
    o.heartbeat = Duration::from_millis(1000);
    Cluster::start(o).expect("the cluster starts")
}

fn traffic(cluster: &Cluster, targets: Vec<(u32, Target)>, rate: f64) -> Traffic {
    Traffic::start(
        cluster,
        TrafficMix {
            targets,
            rate,
            max_duration: Duration::from_secs(120),
            max_requests: 100_000,
            concurrency: 8,
        },
    )
}

/// Waits until `edgeprof targets` lists isolates on `want` machines.
fn wait_for_targets(cluster: &Cluster, script: &str, want: usize) {
    let start = Instant::now();
    loop {
        let out = cluster
            .cli()
            .args(["targets", script, "--json"])
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let machines: BTreeSet<String> = doc["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["machine"].as_str().map(str::to_owned))
            .collect();
        if machines.len() >= want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {machines:?} serve {script} after 30 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn fleet_capture_covers_every_serving_machine_and_no_other() {
    let Some(wasm) = worker("json-gateway") else {
        return;
    };
    let cluster = start("fleet", 2, 2);
    cluster.deploy("json-gateway", &wasm, 100).unwrap();
    let load = traffic(
        &cluster,
        vec![(
            1,
            Target::Script {
                script: "json-gateway".into(),
                path: "/".into(),
            },
        )],
        80.0,
    );
    wait_for_targets(&cluster, "json-gateway", 4);

    let out_file = state_dir("fleet").join("out.pprof");
    let out = cluster
        .cli()
        .args(["profile", "json-gateway", "--duration", "3s", "-o"])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "edgeprof profile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(load);

    let profile = edgeprof_pprof::decode(&std::fs::read(&out_file).unwrap()).unwrap();
    assert!(!profile.sample.is_empty(), "the capture has samples");
    let machines: BTreeSet<String> = cluster.machines().map(|(_, m)| m.id.clone()).collect();
    assert_eq!(
        labels(&profile, "machine"),
        machines,
        "every serving machine is in the labels, and no other"
    );
    assert_eq!(
        labels(&profile, "data_center"),
        ["lhr", "sjc"].map(String::from).into()
    );
    assert!(
        labels(&profile, "isolate").len() >= 4,
        "one isolate label per serving isolate"
    );
    let every_sample_labelled = profile.sample.iter().all(|s| s.label.len() >= 3);
    assert!(
        every_sample_labelled,
        "every sample carries data_center, machine and isolate"
    );
    crate::assert_go_pprof_opens(&out_file);

    // Operators' endpoints on an agent: Prometheus text and a native profile.
    let (_, machine) = cluster.machines().next().unwrap();
    let client = reqwest::blocking::Client::new();
    let metrics = client
        .get(format!("{}/metrics", machine.operator))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let ok_requests: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("edgeprof_agent_requests_total{outcome=\"ok\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no request counter in /metrics:\n{metrics}"));
    assert!(ok_requests > 0, "the agent counted the requests it served");
    assert!(
        metrics.contains("edgeprof_agent_request_duration_seconds_bucket"),
        "{metrics}"
    );
    let native = client
        .get(format!(
            "{}/debug/pprof/profile?seconds=1",
            machine.operator
        ))
        .send()
        .unwrap();
    assert!(
        native.status().is_success(),
        "native profile: {}",
        native.status()
    );
    let native =
        edgeprof_pprof::decode(&native.bytes().unwrap()).expect("the agent's own profile decodes");
    // Regression test for issue 10: they answered anyone on the worker port.
    for path in ["/metrics", "/debug/pprof/profile?seconds=1"] {
        let status = client
            .get(format!("{}{path}", machine.http))
            .send()
            .unwrap()
            .status();
        assert_eq!(status, 404, "{path} on the worker port");
    }
    assert_eq!(
        edgeprof_pprof::sample_types(&native),
        [("samples", "count"), ("cpu", "nanoseconds")]
    );
}

#[test]
fn durable_object_lives_in_one_isolate_and_its_capture_names_it() {
    let Some(wasm) = worker("counter-object") else {
        return;
    };
    let cluster = start("durable-object", 2, 1);
    cluster.deploy("counter-object", &wasm, 100).unwrap();
    let id = "ab".repeat(32);
    let client = reqwest::blocking::Client::new();
    let machines: Vec<String> = cluster.machines().map(|(_, m)| m.http.clone()).collect();
    // First request through one machine, the next through another: one counter.
    let mut seen = Vec::new();
    for (i, base) in machines.iter().cycle().take(6).enumerate() {
        let r = client
            .post(format!("{base}/do/counter-object/{id}/increment"))
            .header("host", worker_host("counter-object", &cluster.account))
            .send()
            .unwrap();
        assert!(
            r.status().is_success(),
            "request {i} via {base}: {}",
            r.status()
        );
        seen.push(r.text().unwrap());
    }
    let counts: Vec<u64> = seen
        .iter()
        .map(|t| {
            t.trim()
                .parse()
                .unwrap_or_else(|_| panic!("counter answers a number, got {t:?}"))
        })
        .collect();
    assert_eq!(
        counts,
        (1..=6).collect::<Vec<u64>>(),
        "one object, one state, whichever machine is asked"
    );

    let load = traffic(
        &cluster,
        vec![(
            1,
            Target::DurableObject {
                namespace: "counter-object".into(),
                id: id.clone(),
                path: "/increment".into(),
            },
        )],
        50.0,
    );
    std::thread::sleep(Duration::from_secs(2));
    let out_file = state_dir("durable-object").join("do.pprof");
    let out = cluster
        .cli()
        .args([
            "profile",
            "counter-object",
            "--duration",
            "2s",
            "--durable-object",
        ])
        .arg(format!("counter-object:{id}"))
        .arg("-o")
        .arg(&out_file)
        .output()
        .unwrap();
    drop(load);
    assert!(
        out.status.success(),
        "edgeprof profile --durable-object failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = edgeprof_pprof::decode(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(
        labels(&profile, "isolate").len(),
        1,
        "samples from the object's isolate only"
    );
    assert_eq!(
        labels(&profile, "durable_object"),
        [format!("counter-object:{id}")].into()
    );
}

#[test]
fn killed_agent_gives_partial_naming_it_and_exit_3() {
    let Some(wasm) = worker("json-gateway") else {
        return;
    };
    let mut cluster = start("fault", 2, 2);
    cluster.deploy("json-gateway", &wasm, 100).unwrap();
    let load = traffic(
        &cluster,
        vec![(
            1,
            Target::Script {
                script: "json-gateway".into(),
                path: "/".into(),
            },
        )],
        80.0,
    );
    wait_for_targets(&cluster, "json-gateway", 4);

    let out_file = state_dir("fault").join("partial.pprof");
    let child = cluster
        .cli()
        .args(["profile", "json-gateway", "--duration", "4s", "-o"])
        .arg(&out_file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    cluster.kill_agent("sjc-m02").unwrap();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "partial capture exits 3: {stderr}"
    );
    assert!(
        stderr.contains("sjc-m02"),
        "the missing machine is named: {stderr}"
    );
    assert!(
        took < Duration::from_secs(4 + 2 + 3),
        "partial within duration + slack (took {took:?})"
    );
    let profile = edgeprof_pprof::decode(&std::fs::read(&out_file).unwrap()).unwrap();
    let machines = labels(&profile, "machine");
    assert!(
        machines.contains("lhr-m01") && !machines.contains("sjc-m02"),
        "{machines:?}"
    );

    // The rest of the edge keeps serving: every surviving machine answers,
    // and once the dead one has left the registry a capture is whole again.
    let http = reqwest::blocking::Client::new();
    for (_, m) in cluster.machines().filter(|(_, m)| m.id != "sjc-m02") {
        let status = http
            .get(format!("{}/", m.http))
            .header("host", worker_host("json-gateway", &cluster.account))
            .send()
            .map(|r| r.status().as_u16());
        assert_eq!(status.ok(), Some(200), "{} still serves", m.id);
    }
    let start = Instant::now();
    while cluster.live_machines().unwrap() > 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the killed agent leaves the registry"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = state_dir("fault").join("after.pprof");
    let out = cluster
        .cli()
        .args(["profile", "json-gateway", "--duration", "2s", "-o"])
        .arg(&after)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = edgeprof_pprof::decode(&std::fs::read(&after).unwrap()).unwrap();
    let machines = labels(&profile, "machine");
    assert!(
        machines.len() == 3 && !machines.contains("sjc-m02"),
        "{machines:?}"
    );
    drop(load);
}

#[test]
fn idle_version_gives_no_recent_executions() {
    let Some(wasm) = worker("json-gateway") else {
        return;
    };
    let cluster = start("idle", 1, 1);
    cluster.deploy("json-gateway", &wasm, 100).unwrap();
    let out = cluster
        .cli()
        .args(["profile", "json-gateway", "--duration", "1s", "-o"])
        .arg(state_dir("idle").join("never.pprof"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("no recent executions"),
        "{stderr}"
    );
}
