//! `edgeprof targets` against a real control plane on loopback, fed real
//! heartbeats over gRPC: memory per isolate and the per-version line.

use edgeprof_proto::v1;

use crate::cp::{Running, status};

const MIB: u64 = 1 << 20;

#[test]
fn targets_show_memory_per_isolate_and_per_version() {
    let running = Running::start();
    // Deploy through the CLI itself.
    let version = running.deploy(None);

    // 100 heartbeats of two isolates: i1 at 1..=100 MiB, i2 at 2 MiB.
    let machine = v1::Machine {
        id: "m1".into(),
        data_center: "lhr".into(),
        grpc_address: "127.0.0.1:9".into(),
        http_address: "http://127.0.0.1:9".into(),
    };
    for k in 1..=100u64 {
        running.heartbeat(
            &machine,
            vec![
                status("i1", &version, k * MIB, (5, 3)),
                status("i2", &version, 2 * MIB, (5, 3)),
            ],
        );
    }

    let run = running.run(&["targets", "api"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].contains("memory"), "{}", run.stdout);
    let i1 = lines.iter().find(|l| l.contains(" i1 ")).expect("i1 row");
    assert!(i1.contains("100.0 MiB"), "{i1}");
    let i2 = lines.iter().find(|l| l.contains(" i2 ")).expect("i2 row");
    assert!(i2.contains("2.0 MiB"), "{i2}");
    // 200 readings: 100 at 2 MiB and 1..=100 MiB; nearest rank.
    let summary = format!(
        "version {}: memory p50 2.0 MiB p99 98.0 MiB p99.9 100.0 MiB max 100.0 MiB (200 readings, last 300 s); Exceeded Memory evictions 3 (of 5)",
        &version[..12]
    );
    assert!(lines.contains(&summary.as_str()), "{}", run.stdout);

    let run = running.run(&["targets", "api", "--json", "--version", &version]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["targets"].as_array().unwrap().len(), 2);
    let v = &doc["memory"]["versions"][0];
    assert_eq!(v["version_id"], version.as_str());
    assert_eq!(v["memory_bytes"]["p999"], 100 * MIB);
    assert_eq!(v["evictions"]["exceeded_memory"], 3);
}

#[test]
fn versions_and_rollout_shift_traffic() {
    let running = Running::start();
    let v1 = running.deploy(None);
    let v2 = running.deploy(Some(0));
    let share = |stdout: &str, id: &str| -> String {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id} in:\n{stdout}"));
        row.split_whitespace().nth(2).unwrap().to_owned()
    };
    // Uploaded with weight 0: listed, serving nothing.
    let run = running.run(&["versions", "api"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (share(&run.stdout, &v1), share(&run.stdout, &v2)),
        ("100.0%".into(), "0.0%".into()),
        "{}",
        run.stdout
    );
    // Gradual rollout of v2 by prefix and by `latest` (newest deployed = v1).
    let differ = v1
        .chars()
        .zip(v2.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let p2 = &v2[..differ.max(7) + 1];
    let run = running.run(&["rollout", "api", &format!("{p2}=25"), "latest=75"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        (share(&run.stdout, &v1), share(&run.stdout, &v2)),
        ("75.0%".into(), "25.0%".into()),
        "{}",
        run.stdout
    );
    // A bad entry is refused with the field named, and nothing changes.
    let run = running.run(&["rollout", "api", "nope=100"]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("versions[0].version_id: `nope` is not `latest`"),
        "{}",
        run.stderr
    );
    let run = running.run(&["rollout", "api", "100"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("expected VERSION=WEIGHT"),
        "{}",
        run.stderr
    );
    let run = running.run(&["versions", "api", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        doc["deployment"],
        serde_json::json!([{"version_id": v1, "weight": 75}, {"version_id": v2, "weight": 25}])
    );
}

#[test]
fn deploy_compiles_a_wat_file_and_refuses_what_is_neither() {
    let running = Running::start();
    let dir = running.dir.path();
    let wat = dir.join("tiny.wat");
    std::fs::write(&wat, "(module (func (export \"f\")))").unwrap();
    let ok = running.run(&["deploy", "api", wat.to_str().unwrap(), "--json"]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    let version: edgeprof_proto::rest::UploadedVersion = serde_json::from_str(&ok.stdout).unwrap();
    assert!(!version.id.is_empty());

    let bad_wat = dir.join("bad.wat");
    std::fs::write(&bad_wat, "(module (func (export \"f\")").unwrap();
    let bad = running.run(&["deploy", "api", bad_wat.to_str().unwrap()]);
    assert_eq!(bad.code, Some(1));
    assert!(
        bad.stderr
            .contains(&format!("{}: not valid WAT", bad_wat.display())),
        "{}",
        bad.stderr
    );

    let text = dir.join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let refused = running.run(&["deploy", "api", text.to_str().unwrap()]);
    assert_eq!(refused.code, Some(1));
    assert!(
        refused
            .stderr
            .contains("not a WebAssembly module (no \\0asm header"),
        "{}",
        refused.stderr
    );
    // Only the WAT version was stored.
    let versions = running.run(&["versions", "api", "--json"]);
    assert_eq!(versions.code, Some(0), "{}", versions.stderr);
    assert_eq!(
        versions.stdout.matches("\"id\"").count(),
        1,
        "{}",
        versions.stdout
    );
}
