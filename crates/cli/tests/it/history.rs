//! `edgeprof history` and `edgeprof timeline` against a real control plane
//! on loopback, fed continuous-profiling windows over gRPC
//! (`Registry.PushWindows`) as agents ship them: the merged pprof and its
//! summary line, the timeline as JSON and as a table, and the server's 400
//! and 404 shown as one line.

use std::path::Path;

use edgeprof_pprof::{Merger, Profile};
use edgeprof_proto::{rest, v1};

use crate::cp::{Running, isolate_profile, now_ms};
use crate::support::edgeprof_raw;

const STEP: i64 = 60_000;

fn machine(id: &str, dc: &str) -> v1::Machine {
    v1::Machine {
        id: id.into(),
        data_center: dc.into(),
        grpc_address: "127.0.0.1:9".into(),
        http_address: "http://127.0.0.1:9".into(),
    }
}

/// A 10 s CPU window of `isolate` at `version` from `start`, as an agent
/// ships it: [`isolate_profile`] (1 ms CPU) labelled with the isolate, and
/// its own `requests: N`.
fn window(version: &str, isolate: &str, start: i64, requests: u64) -> v1::ProfileWindow {
    let p = edgeprof_pprof::decode(&isolate_profile(isolate)).unwrap();
    let mut m = Merger::new();
    m.add_labeled(&p, &[("isolate", isolate)]).unwrap();
    let mut p = m.finish().unwrap();
    edgeprof_pprof::add_comment(&mut p, &format!("requests: {requests}"));
    v1::ProfileWindow {
        account: "acme".into(),
        script: "api".into(),
        version_id: version.into(),
        kind: v1::ProfileKind::Cpu as i32,
        start_unix_ms: start,
        end_unix_ms: start + 10_000,
        pprof: edgeprof_pprof::encode(&p),
        samples: 1,
        requests,
    }
}

/// A control plane holding two versions of `api`, `v1` in lhr only and
/// `v2` in lhr and fra: 4 ms of CPU, 100 requests, in two steps of a
/// minute a few minutes ago. Returns the versions.
fn seeded() -> (Running, String, String) {
    let running = Running::start();
    let v1_id = running.deploy(None);
    let v2_id = running.deploy(None);
    let t0 = (now_ms() / STEP - 3) * STEP;
    running.push_windows(
        &machine("m1", "lhr"),
        vec![
            window(&v1_id, "i1", t0, 10),
            window(&v1_id, "i1", t0 + 10_000, 20),
            window(&v2_id, "i2", t0 + STEP, 30),
        ],
    );
    running.push_windows(
        &machine("m2", "fra"),
        vec![window(&v2_id, "i3", t0 + STEP, 40)],
    );
    (running, v1_id, v2_id)
}

fn read(path: &Path) -> Profile {
    edgeprof_pprof::decode(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cpu_ns(p: &Profile) -> i64 {
    p.sample.iter().map(|s| s.value[1]).sum()
}

fn requests_comments(p: &Profile) -> Vec<String> {
    p.comment
        .iter()
        .map(|&c| edgeprof_pprof::string(p, c).to_owned())
        .filter(|c| c.starts_with("requests: "))
        .collect()
}

#[test]
fn history_writes_the_merged_profile_and_says_what_it_holds() {
    let (running, v1_id, _) = seeded();
    let dir = tempfile::tempdir().unwrap();

    // Defaults: the last hour of CPU; the summary on stdout as -o is a file.
    let file = dir.path().join("api.pprof");
    let path = file.to_str().unwrap();
    let run = running.run(&["history", "api", "-o", path]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let p = read(&file);
    assert_eq!(cpu_ns(&p), 4_000_000, "four windows of 1 ms");
    assert_eq!(requests_comments(&p), ["requests: 100"]);
    let bytes = std::fs::metadata(&file).unwrap().len();
    assert_eq!(
        run.stdout,
        format!(
            "wrote {path}: {bytes} bytes, {} samples, 4.0 ms cpu, requests: 100\n",
            p.sample.len()
        )
    );

    // `-o -`: the profile on stdout, the summary on stderr; a relative
    // `--from` given as its own argument; filtered by version.
    let mut args = vec![
        "history",
        "api",
        "--from",
        "-15m",
        "--version",
        &v1_id,
        "-o",
        "-",
    ];
    args.extend(running.conn.iter().map(String::as_str));
    let out = edgeprof_raw(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let p = edgeprof_pprof::decode(&out.stdout).expect("stdout is the pprof");
    assert_eq!(cpu_ns(&p), 2_000_000);
    assert_eq!(requests_comments(&p), ["requests: 30"]);
    assert_eq!(
        stderr,
        format!(
            "edgeprof: wrote the profile to stdout: {} bytes, {} sample{}, 2.0 ms cpu, requests: 30\n",
            out.stdout.len(),
            p.sample.len(),
            if p.sample.len() == 1 { "" } else { "s" }
        )
    );

    // By data center.
    let fra = dir.path().join("fra.pprof");
    let run = running.run(&[
        "history",
        "api",
        "--data-center",
        "fra",
        "-o",
        fra.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("1.0 ms cpu, requests: 40"),
        "{}",
        run.stdout
    );
    assert_eq!(cpu_ns(&read(&fra)), 1_000_000);
}

#[test]
fn timeline_as_json_and_as_a_table() {
    let (running, v1_id, v2_id) = seeded();

    let run = running.run(&[
        "timeline",
        "api",
        "--json",
        "--group-by",
        "version",
        "--step",
        "1m",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let t: rest::Timeline = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(t.step_ms, 60_000);
    let mut want = [v1_id.clone(), v2_id.clone()];
    want.sort();
    let keys: Vec<&str> = t.series.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, want);
    let sums = |key: &str| {
        let s = t.series.iter().find(|s| s.key == key).unwrap();
        s.points.iter().fold((0, 0), |(v, r), p| (v + p.1, r + p.2))
    };
    assert_eq!(sums(&v1_id), (2_000_000, 30));
    assert_eq!(sums(&v2_id), (2_000_000, 70));

    // The table: one row per data center with its totals and a sparkline
    // of its minutes (lhr: 2 ms then 1 ms; fra: only the second minute).
    let run = running.run(&["timeline", "api", "--group-by", "data-center"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(
        lines[0].starts_with("key         cpu   requests    cpu/request  "),
        "{}",
        run.stdout
    );
    let fra = "fra      1.0 ms         40       0.025 ms  ";
    let lhr = "lhr      3.0 ms         60       0.050 ms  ";
    assert!(lines[1].starts_with(fra), "{}", run.stdout);
    assert!(lines[2].starts_with(lhr), "{}", run.stdout);
    let spark = |line: &str, prefix: &str| line[prefix.len()..].to_owned();
    let (fra_line, lhr_line) = (spark(lines[1], fra), spark(lines[2], lhr));
    assert!(fra_line.ends_with(" █"), "{fra_line:?}");
    assert!(lhr_line.ends_with("█▅"), "{lhr_line:?}");
    // One axis for every row: their last minute is the same column, one
    // bar a minute over the hour (61 minutes it touches at most, or 62 if
    // a minute began between the CLI's clock and the server's).
    assert_eq!(
        fra_line.chars().count(),
        lhr_line.chars().count(),
        "{}",
        run.stdout
    );
    assert!(lines[0].contains(" 1m per bar, "), "{}", run.stdout);
    assert!(
        (56..=62).contains(&lhr_line.chars().count()),
        "{lhr_line:?}"
    );

    // No heap windows: nothing on stdout, a note on stderr.
    let run = running.run(&["timeline", "api", "--type", "heap"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "edgeprof: no heap history of api from -1h to now\n"
    );
}

#[test]
fn bad_ranges_and_empty_history_are_one_line_errors() {
    let (running, _, _) = seeded();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("never.pprof");
    let path = file.to_str().unwrap();

    for args in [
        vec!["history", "api", "--from", "yesterday", "-o", path],
        vec!["timeline", "api", "--from=yesterday"],
    ] {
        let run = running.run(&args);
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        let line = run.stderr.trim_end();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.contains(": from: `yesterday` is not RFC 3339") && line.contains("HTTP 400"),
            "{args:?}: {line}"
        );
    }

    let run = running.run(&["history", "api", "--machine", "nowhere", "-o", path]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("edgeprof: history api: no continuous-profiling cpu windows")
            && run.stderr.contains("machine nowhere")
            && run.stderr.trim_end().ends_with("(HTTP 404, no_history)"),
        "{}",
        run.stderr
    );
    assert!(!file.exists(), "nothing written on an error");
}
